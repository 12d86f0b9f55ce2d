"""The operator's RBAC against the real API server's audit log: run the operator as its own
ServiceAccount through a PDCluster's life (created, Ready, planned, drained, deleted) and read
back, from the API server's own record, every request it made. Each was granted (none was
refused), and every grant a request can show was used.

What an audit log cannot show, and where it is checked instead: permissions the server checks
beyond a request's verb (``kube.IMPLIED``: the create behind an apply that creates, the
finalizers update behind blockOwnerDeletion); test_rbac.py holds those to the code. The
namespace watch kopf makes only with ``watchNamespaces`` has a run of its own: the chart
installed with watchNamespaces, the operator as that release's ServiceAccount.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import POOL, pod_ready, sample, wait_for

from pdscale.operator.api import names
from pdscale.operator.api.names import DRAINING_ANNOTATION, LEASE_NAME
from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION
from pdscale.operator.clients.kube import IMPLIED, REQUESTS, Need
from pdscale.operator.render import rbac

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OPERATOR_USER = f"system:serviceaccount:{rbac.NAMESPACE}:{rbac.NAME}"


def audited(audit_log: Path, offset: int, user: str = OPERATOR_USER) -> list[tuple[Need, int, str]]:
    """(need, HTTP code, namespace or "") of every request ``user`` made after ``offset``; a 403
    counts only where the authorizer refused (code 0 where admission did)."""
    out = []
    with audit_log.open("rb") as f:
        f.seek(offset)
        for line in f:
            event = json.loads(line)
            ref = event.get("objectRef")
            if event["user"]["username"] != user or ref is None:
                continue  # non-resource requests (discovery) need no grant of ours
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            code = (event.get("responseStatus") or {}).get("code", 0)
            # a 403 from admission (an admission policy, a namespace being deleted: "unable to
            # create new content") is no RBAC refusal; the authorizer's own verdict says which
            if code == 403 and (event.get("annotations") or {}).get(
                    "authorization.k8s.io/decision") != "forbid":
                code = 0
            out.append((Need(ref.get("apiGroup", ""), resource, event["verb"]), code,
                        ref.get("namespace", "")))
    return out


def operator_requests(audit_log: Path, offset: int) -> list[tuple[Need, int]]:
    """(need, HTTP code) of every request the operator's identity made after ``offset``."""
    return [(need, code) for need, code, _ in audited(audit_log, offset)]


def test_every_request_is_granted_and_every_grant_is_used(cluster, admin_api, namespace,
                                                          lws_controller, run_operator):
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log (KUBECONFIG points elsewhere)")
    audit_log = cluster.local.audit_log
    # The Lease left by an earlier test would spare the operator its create.
    coordination = client.CoordinationV1Api(admin_api)
    try:
        coordination.delete_namespaced_lease(LEASE_NAME, rbac.NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    offset = audit_log.stat().st_size if audit_log.exists() else 0
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    # Auto with a Prometheus that refuses at once: the planner holds within the bounds, so a
    # lowered maximum drains a decode pod (the drain marks) with no metrics at all.
    # It plans in a PDPool that counts its nodes (no spec.nodes): the pool's reads and writes.
    doc = sample("demo-sim.yaml", "audit", **{"planner.prometheusURL": "http://127.0.0.1:9",
                                              "planner.pool": {"name": "audit-pool"}})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PDPool", "metadata": {"name": "audit-pool"},
        "spec": {"nodeSelector": {"pdscale.io/pool": POOL}, "members": [{"name": "audit"}]}})

    def pdcluster():
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit")

    def memory_version():
        try:
            return core.read_namespaced_config_map("audit-planner", namespace).metadata.resource_version
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # and a PDCluster of several nodes per instance: its engines are LeaderWorkerSets (the
    # real LWS controller's CRD, so kopf watches them too); its pods need not run
    groups = sample("sglang-deepseek-multinode.yaml", "audit-mn")

    def group_set():
        try:
            return custom.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", namespace,
                                                       "leaderworkersets", "audit-mn-decode")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    with run_operator():
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, groups)
        wait_for(group_set, timeout_seconds=120, what="the LeaderWorkerSet applied")
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit-mn")
        first = wait_for(memory_version, timeout_seconds=120, what="the planner's memory created")
        wait_for(lambda: memory_version() not in (None, first), timeout_seconds=60,
                 what="the planner's memory written again")
        # Both decodes Ready first: a pod still starting is cut without a drain (it holds no
        # request), and on a busy machine the second one can still be starting here.
        decode = ",".join(f"{k}={v}" for k, v in names.selector_labels("audit", "decode").items())
        wait_for(lambda: sum(pod_ready(p) for p in core.list_namespaced_pod(
                     namespace, label_selector=decode).items) >= 2,
                 timeout_seconds=120, what="both decode pods Ready")
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit",
                                              {"spec": {"decode": {"maxReplicas": 1, "replicas": 1}}})
        wait_for(lambda: any(DRAINING_ANNOTATION in (p.metadata.annotations or {}) for p in
                             core.list_namespaced_pod(namespace, label_selector=(
                                 "app.kubernetes.io/instance=audit")).items),
                 timeout_seconds=90, what="a decode pod marked draining")
        assert pdcluster()["metadata"].get("finalizers")
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit")

        def gone():
            try:
                pdcluster()
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, timeout_seconds=120, what="the PDCluster drained and deleted")
        # kopf's watches (server timeout 10 s here) are logged when they end
        wait_for(lambda: Need("apiextensions.k8s.io", "customresourcedefinitions", "watch") in
                 {n for n, _ in operator_requests(audit_log, offset)},
                 timeout_seconds=60, what="a finished CRD watch in the audit log")

    made = operator_requests(audit_log, offset)
    refused = sorted({(n, code) for n, code in made if code in (401, 403)})
    assert refused == [], f"the API server refused these: {refused}"
    granted = {Need(g, r, v) for rule in rbac.rules() + rbac.leader_rules()
               for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    used = {n for n, _ in made}
    assert used - granted == set(), "made, but not granted"
    assert granted - set(IMPLIED) - used == set(), "granted, but no request of this run used it"
    # and the code's declarations are what the server saw
    assert used == set(REQUESTS) | {n for n in rbac.KOPF_NEEDS
                                    if (n.group, n.resource) != rbac.NAMESPACES}


def _granted(rules: list[dict]) -> set[Need]:
    return {Need(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_with_watch_namespaces_the_chart_grants_what_the_operator_uses_there(
        cluster, operator_installed, admin_api, namespace, monkeypatch, tmp_path):
    """The chart installed with watchNamespaces, the operator run as its ServiceAccount and told
    the same: every request granted, the namespace observer's grants used, and no listing
    outside the watched namespace."""
    import subprocess
    import uuid

    import kopf
    from kopf.testing import KopfRunner

    from pdscale.testbed.localcluster import DEFAULT_BIN_DIR
    from pdscale.testbed.nodes import operator_kubeconfig

    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log (KUBECONFIG points elsewhere)")
    audit_log = cluster.local.audit_log
    chart = Path(__file__).resolve().parents[2] / "charts" / "pdscale"
    release = f"rbac-{uuid.uuid4().hex[:6]}"

    def helm(*args: str) -> None:
        subprocess.run([str(DEFAULT_BIN_DIR / "helm"), *args, "-n", namespace,
                        "--kubeconfig", str(cluster.kubeconfig)], check=True, timeout=120,
                       capture_output=True)

    helm("install", release, str(chart), "--set", "grafana.dashboard.enabled=false",
         "--set", "replicaCount=0", "--set", "tenantPolicy.admission=false",
         "--set", f"operator.watchNamespaces={{{namespace}}}", "--wait=false")
    try:
        kubeconfig = operator_kubeconfig(cluster.kubeconfig, tmp_path / "op.kubeconfig",
                                         namespace=namespace, create=False)
        for name, value in {"KUBECONFIG": str(kubeconfig), "PDSCALE_WATCH_NAMESPACES": namespace,
                            "PDSCALE_LEADER_NAMESPACE": namespace,
                            "PDSCALE_WATCH_TIMEOUT_SECONDS": "10"}.items():
            monkeypatch.setenv(name, value)
        offset = audit_log.stat().st_size
        user = f"system:serviceaccount:{namespace}:{rbac.NAME}"
        custom = client.CustomObjectsApi(admin_api)
        settings = kopf.OperatorSettings()
        settings.watching.server_timeout = 10
        with KopfRunner(["run", "--namespace", namespace, "--standalone", "-m",
                         "pdscale.operator.handlers"], settings=settings) as runner:
            # in a PDPool that counts its nodes: the one cluster-scoped read of the loop
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PDPool",
                "metadata": {"name": "watched-pool"},
                "spec": {"nodeSelector": {"pdscale.io/pool": POOL}, "members": [{"name": "watched"}]}})
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, sample("demo-sim.yaml", "watched",
                                                          **{"planner.mode": "Off",
                                                             "planner.pool": {"name": "watched-pool"}}))

            def ready():
                body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "watched")
                return any(x["type"] == "Ready" and x["status"] == "True"
                           for x in (body.get("status") or {}).get("conditions") or [])

            wait_for(ready, timeout_seconds=120, what="Ready")
            wait_for(lambda: Need("", "namespaces", "watch") in
                     {n for n, _, _ in audited(audit_log, offset, user)},
                     timeout_seconds=60, what="a finished namespace watch in the audit log")
        assert runner.exception is None
    finally:
        helm("uninstall", release)

    made = audited(audit_log, offset, user)
    assert made, "no request of the operator's identity in the audit log"
    refused = sorted({(n, code) for n, code, _ in made if code in (401, 403)})
    assert refused == [], f"the API server refused these: {refused}"
    granted = _granted(rbac.namespaced_rules() + rbac.watching_rules() + rbac.cluster_rules()
                       + rbac.leader_rules())
    used = {n for n, _, _ in made}
    assert used - granted == set(), "made, but not granted"
    assert _granted(rbac.watching_rules() + rbac.cluster_rules()) <= used
    cluster_scoped = {rbac.NAMESPACES, rbac.CRDS, rbac.NODES}
    outside = sorted({(n, ns) for n, _, ns in made
                      if (n.group, n.resource) not in cluster_scoped and ns != namespace})
    assert outside == [], f"requests outside the watched namespace: {outside}"
