"""Operator benchmark on the local control plane (or $KUBECONFIG): writes out/operator_bench.json.

1. apply-to-children: create a PDCluster (1 prefill, 1 decode, 1 router) and time until all
   children exist, and until status reports Ready (pods scheduled on fake H200 nodes and
   Ready); repeated --latency-runs times, one after another, with the operator running. The
   first PDCluster after the operator starts is reported separately.
2. scale: create --count PDClusters at once (replicas 0 for every role, so the fake nodes do
   not bound the test: the operator's work per PDCluster is the same children and one
   status), time until every one is reconciled (status.observedGeneration == generation,
   Ready, every child there), then restart the operator: it re-lists everything and reconciles every
   PDCluster again. Count the reconciles, and the writes: by the operator's own counter and
   by comparing every resourceVersion and the Events before and after. The target is zero.

The operator runs in this process under KopfRunner, as its own ServiceAccount with the RBAC
from operator/render/rbac.py.

    .venv/bin/python bench/operator_bench.py [--count 200] [--latency-runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

ROOT = pathlib.Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "pdscale.io", "v1alpha1", "pdclusters"
POOL = "bench"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _wait(fn, timeout_seconds: float, interval_seconds: float = 0.02):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval_seconds)
    raise TimeoutError("benchmark step timed out")


def _doc(name: str, replicas: int) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl-2p4d.yaml").read_text())
    doc["metadata"] = {"name": name}
    spec = doc["spec"]
    spec["model"].pop("weights")
    spec["model"]["path"] = "meta-llama/Llama-3.3-70B-Instruct"
    spec["placement"] = {"nodeSelector": {"pdscale.io/pool": POOL}}
    for role in ("prefill", "decode"):
        spec[role] = {"replicas": replicas, "minReplicas": 0, "maxReplicas": 4,
                      "warmupSeconds": 60, "preStopDrainSeconds": 5,
                      "terminationGracePeriodSeconds": 30}
    spec["router"]["replicas"] = replicas
    return doc


def _children_per_pdcluster(doc: dict[str, Any]) -> int:
    """How many children the builders make for one PDCluster (the count to wait for)."""
    from pdscale.operator.api.names import Owner
    from pdscale.operator.render.builders import build_children
    from pdscale.operator.render.checklist import validate

    spec, derived = validate(doc["spec"])
    return len(build_children(Owner(doc["metadata"]["name"], "bench"), spec, derived))


def _install(kubeconfig: pathlib.Path) -> None:
    from pdscale.operator.api import crd
    from pdscale.operator.render import rbac
    from pdscale.testbed.nodes import api_client, h200_node

    api = api_client(kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    rb = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    for create, body in ((ext.create_custom_resource_definition, crd.build_crd()),
                         (rb.create_cluster_role, rbac.cluster_role()),
                         (rb.create_cluster_role_binding, rbac.cluster_role_binding())):
        try:
            create(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
    _wait(lambda: any(c.type == "Established" and c.status == "True" for c in
                      ext.read_custom_resource_definition(crd.CRD_NAME).status.conditions or []), 30)
    cpu = h200_node("cpu-bench-000", "cpu")
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"):
        cpu["metadata"]["labels"].pop(key)
    cpu["spec"] = {}
    for field in ("capacity", "allocatable"):
        cpu["status"][field] = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    try:
        core.create_node(cpu)
    except ApiException as exc:
        if exc.status != 409:
            raise


class View:
    def __init__(self, api: client.ApiClient, ns: str):
        self.ns, self.co = ns, client.CustomObjectsApi(api)
        self.apps, self.core = client.AppsV1Api(api), client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)

    def child_count(self, instance: str | None = None) -> int:
        sel = f"app.kubernetes.io/instance={instance}" if instance else "app.kubernetes.io/managed-by=pdscale-operator"
        return sum(len(f(self.ns, label_selector=sel).items) for f in (
            self.apps.list_namespaced_deployment, self.core.list_namespaced_service,
            self.core.list_namespaced_service_account, self.rbac.list_namespaced_role,
            self.rbac.list_namespaced_role_binding, self.core.list_namespaced_config_map))

    def pdclusters(self) -> list[dict[str, Any]]:
        return self.co.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)["items"]

    def versions(self) -> dict[str, str]:
        out = {f"PDCluster/{p['metadata']['name']}": p["metadata"]["resourceVersion"] for p in self.pdclusters()}
        sel = "app.kubernetes.io/managed-by=pdscale-operator"
        for kind, f in (("Deployment", self.apps.list_namespaced_deployment),
                        ("Service", self.core.list_namespaced_service),
                        ("ServiceAccount", self.core.list_namespaced_service_account),
                        ("Role", self.rbac.list_namespaced_role),
                        ("RoleBinding", self.rbac.list_namespaced_role_binding),
                        ("ConfigMap", self.core.list_namespaced_config_map)):
            for item in f(self.ns, label_selector=sel).items:
                out[f"{kind}/{item.metadata.name}"] = item.metadata.resource_version
        return out

    def event_count(self) -> int:
        return len(self.core.list_namespaced_event(self.ns).items)


def _ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (p.get("status") or {}).get("conditions") or [])


def _runner():  # type: ignore[no-untyped-def]
    import kopf
    from kopf.testing import KopfRunner

    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    return KopfRunner(["run", "--all-namespaces", "--standalone", "-m", "pdscale.operator.handlers"],
                      settings=settings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--latency-runs", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "out" / "operator_bench.json"))
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from pdscale.testbed.localcluster import LocalCluster
    from pdscale.testbed.nodes import (
        api_client,
        ensure_h200_nodes,
        operator_kubeconfig,
        wait_nodes_ready,
    )

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="operator-bench-"))
    local = None
    if os.environ.get("KUBECONFIG"):
        admin = pathlib.Path(os.environ["KUBECONFIG"])
    else:
        _log("starting the local control plane")
        local = LocalCluster(workdir=workdir)
        local.start()
        admin = local.kubeconfig
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    try:
        op_kubeconfig = operator_kubeconfig(admin, workdir / "operator.kubeconfig")
        _install(admin)
        # Two nodes per latency run: a deleted run's pods keep their nodes through their
        # termination grace, and the next run must not wait for them.
        nodes = ensure_h200_nodes(admin, 2 * (args.latency_runs + 1), POOL)
        wait_nodes_ready(admin, [*nodes, "cpu-bench-000"])
        api = api_client(admin)
        core = client.CoreV1Api(api)
        os.environ["KUBECONFIG"] = str(op_kubeconfig)
        os.environ["PDSCALE_WATCH_TIMEOUT_SECONDS"] = "10"
        from pdscale.operator import handlers

        # 1. apply -> children, one PDCluster at a time, pods scheduled on fake H200 nodes.
        ns = "bench-latency"
        core.create_namespace({"metadata": {"name": ns}})
        view = View(api, ns)
        children_s, ready_s = [], []
        per_pdc = _children_per_pdcluster(_doc("x", 1))
        result["children_per_pdcluster"] = per_pdc
        first_after_start = None
        with _runner():
            # Run 0 is reported on its own: it also pays for the operator's start (login,
            # resource scan, first watch requests), which is not apply-to-children latency.
            for i in range(args.latency_runs + 1):
                name = f"lat-{i}"
                t0 = time.monotonic()
                view.co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _doc(name, 1))
                _wait(lambda n=name: view.child_count(n) == per_pdc, 60)
                children = time.monotonic() - t0
                _wait(lambda n=name: _ready(view.co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, n)), 120)
                ready = time.monotonic() - t0
                if i == 0:
                    first_after_start = {"children_seconds": round(children, 3), "ready_seconds": round(ready, 3)}
                else:
                    children_s.append(children)
                    ready_s.append(ready)
                view.co.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                _wait(lambda n=name: view.child_count(n) == 0, 120, 0.2)  # free the nodes
        result["apply_to_children"] = {
            "first_after_operator_start": first_after_start,
            "runs": len(children_s),
            "children_seconds": {"median": statistics.median(children_s), "max": max(children_s),
                                 "all": [round(x, 3) for x in children_s]},
            "ready_seconds": {"median": statistics.median(ready_s), "max": max(ready_s),
                              "all": [round(x, 3) for x in ready_s]},
            "target_seconds": 2.0,
            "met": max(children_s) < 2.0,
        }

        # 2. many PDClusters: first reconcile, then a restart that must write nothing.
        ns = "bench-scale"
        core.create_namespace({"metadata": {"name": ns}})
        view = View(api, ns)
        with _runner():
            t0 = time.monotonic()
            for i in range(args.count):
                view.co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _doc(f"s-{i:03d}", 0))
            created = time.monotonic() - t0

            def converged() -> bool:
                items = view.pdclusters()
                return len(items) == args.count and all(
                    (p.get("status") or {}).get("observedGeneration") == p["metadata"]["generation"]
                    and _ready(p) for p in items)
            _wait(converged, 900, 0.5)
            all_reconciled = time.monotonic() - t0
            _wait(lambda: view.child_count() == per_pdc * args.count, 300, 0.5)
            _log(f"{args.count} PDClusters created in {created:.1f} s, all Ready after {all_reconciled:.1f} s")
        time.sleep(2)
        before_versions, before_events = view.versions(), view.event_count()
        stats_before = dict(handlers.STATS)
        with _runner():
            t0 = time.monotonic()
            _wait(lambda: handlers.STATS["reconciles"] - stats_before["reconciles"] >= args.count, 900, 0.05)
            resync = time.monotonic() - t0
            time.sleep(5)  # late events, if any, would show up as writes
            after_stats = dict(handlers.STATS)
        after_versions, after_events = view.versions(), view.event_count()
        changed = sorted(k for k in before_versions if after_versions.get(k) != before_versions[k])
        result["steady_state"] = {
            "pdclusters": args.count,
            "children": per_pdc * args.count,
            "create_all_seconds": round(created, 2),
            "first_reconcile_all_ready_seconds": round(all_reconciled, 2),
            "restart_reconcile_all_seconds": round(resync, 2),
            "restart_reconciles": after_stats["reconciles"] - stats_before["reconciles"],
            "restart_reconciles_per_second": round(
                (after_stats["reconciles"] - stats_before["reconciles"]) / resync, 1),
            "restart_skipped_child_events": after_stats["skipped_child_events"] - stats_before["skipped_child_events"],
            "operator_counted_writes": after_stats["writes"] - stats_before["writes"],
            "objects_with_changed_resource_version": len(changed),
            "changed_examples": changed[:10],
            "new_events": after_events - before_events,
            "target": "zero writes",
            "met": not changed and after_stats["writes"] == stats_before["writes"]
            and after_events == before_events,
        }
        _log(json.dumps(result["steady_state"]))
    finally:
        if local is not None:
            local.stop()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
