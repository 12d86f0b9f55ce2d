"""The kind tier's module: pdscale on a real kind cluster (``make e2e-kind`` runs it).

e2e/kind/run has made the cluster (a real kubelet and containerd), installed the chart with
helm (the operator runs as a container of the image ``make image`` builds, two replicas
electing a leader), loaded the serving image (e2e/kind/serving/build: the simulated engine
under SGLang's command, the real smg router, Debian's prometheus), made the node advertise
fake 8xH200 GPUs, and started Prometheus in the cluster. Here, in order:

1. a PDCluster (one prefill, one decode, planner in Auto through that Prometheus):
   engine and router pods run as containers of the serving image on the kind node;
2. load from a pod through the router's Service (kube-proxy, cluster DNS), for the whole run;
3. decode scaled up 1 -> 2 by its minReplicas, then down 2 -> 1 by its maxReplicas: the
   planner drains the instance it removes (DrainStarted, out of the router first, deleted once
   idle, DrainFinished);
4. the leading operator pod killed: the Deployment replaces it, the other replica takes the
   Lease, and the new leader acts (prefill 1 -> 2 by its bounds);
5. the planner read Prometheus (status.planner.metrics), and Prometheus scraped the engines;
6. the load ends: every request answered in full (0 failed).

Skipped unless PDSCALE_KIND_KUBECONFIG names the cluster's kubeconfig (e2e/kind/run sets it),
so the normal e2e tier never runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBECONFIG = os.environ.get("PDSCALE_KIND_KUBECONFIG", "")
pytestmark = [
    pytest.mark.kind,
    pytest.mark.skipif(not KUBECONFIG or not Path(KUBECONFIG).is_file(),
                       reason="the kind tier's cluster is not there (make e2e-kind runs this)"),
]

NS = "kind-e2e"  # made by e2e/kind/run, which has the operator serve it
NAME = "sim"
OPERATOR_NS = "pdscale"
LEASE = "pdscale-operator-leader"
PROMETHEUS = "http://prometheus.pdscale-monitoring.svc:9090"
SERVICE_URL = f"http://{NAME}-router.{NS}.svc:30000"
LOADGEN = "loadgen"
STOP_FILE = "/tmp/stop"


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    binary = os.environ.get("PDSCALE_KIND_KUBECTL", "kubectl")
    done = subprocess.run([binary, "--kubeconfig", KUBECONFIG, *args], input=input,
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def get(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json"))


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 300, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except AssertionError as exc:
            last = exc
        if last and not isinstance(last, AssertionError):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})")


def pods(role: str) -> list[dict[str, Any]]:
    items = get("pods", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME},pdscale.io/role={role}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def ready_pods(role: str, count: int) -> list[dict[str, Any]] | None:
    """The role's pods when exactly ``count`` exist (none terminating) and all are Ready."""
    ps = pods(role)
    if len(ps) == count and all(ready(p) for p in ps):
        return ps
    return None


def all_pods(role: str) -> list[dict[str, Any]]:
    """The role's pods, terminating ones included."""
    return get("pods", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME},pdscale.io/role={role}")["items"]


def bounds(role: str, low: int, high: int) -> None:
    """spec.<role>.minReplicas and maxReplicas: with the planner in Auto, the instances run
    are the planner's decision raised to the minimum; a lowered maximum is met by drains.
    (spec.<role>.replicas, only the start in Auto, must lie within them: set to the minimum.)"""
    kubectl("patch", "pdcluster", NAME, "-n", NS, "--type=merge",
            "-p", json.dumps({"spec": {role: {"replicas": low, "minReplicas": low,
                                                "maxReplicas": high}}}))


def prometheus_query(query: str) -> list[dict[str, Any]]:
    """An instant query to the in-cluster Prometheus, through the API server's Service proxy."""
    path = ("/api/v1/namespaces/pdscale-monitoring/services/prometheus:http/proxy/api/v1/query?"
            + urllib.parse.urlencode({"query": query}))
    answer = json.loads(kubectl("get", "--raw", path))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def pdcluster(image: str) -> dict[str, Any]:
    role = {"replicas": 1, "minReplicas": 1, "maxReplicas": 1, "warmupSeconds": 10,
            "preStopDrainSeconds": 5, "terminationGracePeriodSeconds": 60}
    par = {"tensorParallelSize": 8, "dataParallelSize": 8, "expertParallelSize": 8,
           "dataParallelAttention": True}
    return {
        "apiVersion": "pdscale.io/v1alpha1", "kind": "PDCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "model": {"servedName": "sim-model", "path": "/models/sim-model",
                      "maxContextLengthTokens": 32768},
            "engine": {"kind": "SGLang", "image": image, "port": 8000,
                       "env": [{"name": "PDSCALE_SIM_PROFILE", "value": "demo-sim"},
                               {"name": "PDSCALE_SIM_STARTUP_SECONDS", "value": "5"}]},
            "parallelism": {"prefill": par, "decode": par},
            "kvCache": {"pageSizeTokens": 64, "dtype": "FP8E4M3"},
            "kvTransfer": {"backend": "Mooncake", "bootstrapPort": 8998},
            "prefill": dict(role), "decode": dict(role),
            # admission as derived from demo-sim and a 5 s TTFT holds one request per prefill
            # and refuses after 2 s at the router: on this loaded machine a PD round trip through
            # real containers takes longer than the profile's, and the module asks for 0 refused
            "router": {"image": image, "replicas": 1, "port": 30000,
                       "admission": {"prefillInflightPerWorker": 8, "queueTimeoutSeconds": 60}},
            "slo": {"ttftMilliseconds": 5000, "tpotMilliseconds": 50, "percentile": 90},
            "planner": {"mode": "Auto", "profile": "demo-sim", "intervalSeconds": 10,
                        "nodeBudget": 4},
        },
    }


def loadgen_pod(image: str) -> dict[str, Any]:
    # chat at 1 req/s, prompts of about 100 words and answers of about 25 tokens; stops once
    # STOP_FILE exists, then awaits what it sent and prints its summary
    args = ["python", "-m", "pdscale.testbed.loadgen", "--url", SERVICE_URL, "--in-cluster",
            "--phases", "chat", "--phase-seconds", "1500", "--max-seconds", "1500",
            "--rate-scale", "0.01", "--token-scale", "0.05", "--stop-file", STOP_FILE]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": LOADGEN, "namespace": NS},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "loadgen", "image": image, "imagePullPolicy": "Never",
                                 "command": args}]},
    }


def lease_holder() -> str:
    return get("lease", LEASE, "-n", OPERATOR_NS)["spec"].get("holderIdentity") or ""


def operator_pods() -> list[dict[str, Any]]:
    items = get("pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=pdscale")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def test_pdcluster_on_kind_scales_drains_and_survives_its_operator() -> None:
    image = os.environ["PDSCALE_KIND_SERVING_IMAGE"]
    node = os.environ["PDSCALE_KIND_NODE"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(pdcluster(image)))

    # 1. engine and router pods: real containers of the serving image on the kind node
    for role in ("prefill", "decode", "router"):
        (p,) = wait_for(f"the {role} pod Ready", lambda r=role: ready_pods(r, 1), timeout=300)
        assert p["spec"]["nodeName"] == node
        (status,) = p["status"]["containerStatuses"]
        assert status["image"].endswith(image.split("/", 1)[1]) and status["imageID"], status
        assert "running" in status["state"], status
    engine = pods("decode")[0]["spec"]["containers"][0]
    assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "8"
    wait_for("the PDCluster Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in get("pdcluster", NAME, "-n", NS).get("status", {}).get("conditions", [])))

    # 2. load through the router's Service, from a pod, for the whole run
    kubectl("apply", "-f", "-", input=yaml.safe_dump(loadgen_pod(image)))
    wait_for("the load generator running", lambda: get("pod", LOADGEN, "-n", NS)
             .get("status", {}).get("phase") == "Running", timeout=120)
    time.sleep(20)

    # 3. decode 1 -> 2 (its minimum raised), then 2 -> 1 (its maximum lowered): the planner
    # drains the instance it removes (out of the router, deleted once idle)
    bounds("decode", 2, 2)
    wait_for("two Ready decode pods", lambda: ready_pods("decode", 2), timeout=300)
    time.sleep(20)
    before = {p["metadata"]["name"] for p in pods("decode")}
    bounds("decode", 1, 1)
    wait_for("one decode pod left (the other drained and gone)",
             lambda: len(all_pods("decode")) == 1, timeout=300)
    (kept,) = pods("decode")
    assert kept["metadata"]["name"] in before
    events = kubectl("get", "events", "-n", NS, "--field-selector",
                     f"involvedObject.kind=PDCluster,involvedObject.name={NAME}", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"DrainStarted", "DrainFinished"} <= reasons, sorted(reasons)

    # 4. the leading operator pod killed: replaced, the Lease moves, the new leader acts
    holder = wait_for("a Lease holder", lease_holder)
    victim = next(p["metadata"]["name"] for p in operator_pods()
                  if holder.startswith(p["metadata"]["name"]))
    kubectl("delete", "pod", victim, "-n", OPERATOR_NS, "--grace-period=0", "--force", "--wait=false")
    wait_for("another Lease holder", lambda: (h := lease_holder()) and h != holder and h, timeout=120)
    wait_for("two operator pods Ready again, the killed one replaced", lambda: len(
        [p for p in operator_pods() if ready(p) and p["metadata"]["name"] != victim]) == 2,
        timeout=300)
    bounds("prefill", 2, 2)
    wait_for("two Ready prefill pods (the new leader reconciles)",
             lambda: ready_pods("prefill", 2), timeout=300)
    time.sleep(15)

    # 5. the planner reads the in-cluster Prometheus, which scrapes the engines
    planner = wait_for("a planner decision from Prometheus's metrics", lambda: (
        s := get("pdcluster", NAME, "-n", NS).get("status", {}).get("planner") or {}
    ).get("metrics") not in (None, "not read") and s, timeout=180)
    print("planner:", json.dumps(planner))
    scraped = prometheus_query(f'sum by (role) (up{{namespace="{NS}",pdcluster="{NAME}"}})')
    assert {r["metric"].get("role") for r in scraped} >= {"prefill", "decode", "router"}, scraped

    # 6. the load ends: every request answered in full
    kubectl("exec", LOADGEN, "-n", NS, "--", "touch", STOP_FILE)
    phase = wait_for("the load generator done", lambda: get("pod", LOADGEN, "-n", NS)
                     .get("status", {}).get("phase") in ("Succeeded", "Failed") and
                     get("pod", LOADGEN, "-n", NS)["status"]["phase"], timeout=300)
    logs = kubectl("logs", LOADGEN, "-n", NS)
    print(logs)
    total = json.loads(next(line for line in logs.splitlines() if line.startswith("total "))[6:])
    assert total["requests"] >= 100, total
    assert total["failed"] == 0, total
    assert phase == "Succeeded"
