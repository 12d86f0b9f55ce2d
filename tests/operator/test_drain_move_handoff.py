"""``Drains.move`` over an in-memory API (the planner loop tests' fakes): a vLLM prefill out of
the router with nothing in flight is kept, with its reason in status, while a decode still
has a request waiting, and removed once none has; an SGLang prefill whose count came from
``/get_load`` is kept for the documented wait; one counted by ``/v1/loads`` is removed at
once. The engine probes are replaced by functions of the test's clock."""

from __future__ import annotations

from test_planner_loop import NOW, NS, FakeKube, FakeWorkers, _pod, _spec_doc

from pdscale.operator.api import names
from pdscale.operator.api.names import DRAINING_ANNOTATION
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.clients.engine_probe import EngineLoad, LoadSource
from pdscale.operator.clients.vllm_discovery import (
    HANDOFF_GRACE_SECONDS,
    NIXL_KV_LEASE_SECONDS,
    WAITING,
)
from pdscale.operator.loop.drain import Drains, get_load_wait_seconds
from pdscale.operator.loop.fleet import pod_view
from pdscale.operator.loop.telemetry import Reporter
from pdscale.operator.render import lws
from pdscale.planner.observe import Role


def _setup(sample: str) -> tuple[FakeKube, dict, PDClusterSpec]:
    kube = FakeKube()
    doc = _spec_doc(sample, mode="Auto", prometheusURL="http://127.0.0.1:9")
    doc["metadata"]["name"] = "demo"
    kube.objects[("PDCluster", NS, "demo")] = doc
    kube.pods = [_pod("demo-prefill-a", "prefill", "10.0.0.1"),
                 _pod("demo-prefill-b", "prefill", "10.0.0.2", draining=NOW - 1),
                 _pod("demo-decode-a", "decode", "10.0.1.1"),
                 _pod("demo-router-a", "router", "10.0.2.1")]
    for role in ("prefill", "decode"):
        kube.objects[("Deployment", NS, f"demo-{role}")] = {
            "kind": "Deployment", "metadata": {"name": f"demo-{role}", "namespace": NS,
                                               "ownerReferences": [{"controller": True, "uid": "uid-1"}]},
            "spec": {"replicas": 2 if role == "prefill" else 1}}
    return kube, doc, PDClusterSpec.model_validate(doc["spec"])


def _step(kube: FakeKube, drains: Drains, spec: PDClusterSpec, now: float) -> dict:
    body = kube.get("PDCluster", NS, "demo")
    pods = {role: [pod_view(p, role) for p in kube.list_pods(NS, names.selector_labels("demo", role))]
            for role in Role}
    drains.begin_tick()
    drains.move(body, spec, pods, FakeWorkers(), set(), {Role.PREFILL: 1, Role.DECODE: 1}, now)
    drains.end_tick()
    return kube.get("PDCluster", NS, "demo")["status"]["planner"]


def test_a_vllm_prefill_is_kept_while_a_decode_still_has_a_request_waiting():
    kube, _, spec = _setup("vllm-nixl-2p4d.yaml")
    decode_waiting = {"now": 1.0}
    read: list[str] = []

    def totals(ip: str, port: int) -> dict[str, float]:
        read.append(ip)
        return {WAITING: decode_waiting["now"], "vllm:num_requests_running": 3.0}

    drains = Drains(kube, Reporter(kube), vllm_totals=totals,
                    in_flight=lambda ip, port: EngineLoad(0 if ip == "10.0.0.2" else 5, LoadSource.VLLM_METRICS))
    planner = _step(kube, drains, spec, NOW)
    assert planner["replicas"]["prefill"] == 2
    assert planner["waiting"] == [
        "demo-prefill-b drains; a decode may still pull its KV (decodes not read yet); waits until "
        f"none may, or one NIXL lease ({NIXL_KV_LEASE_SECONDS:.0f} s) after it went idle"]
    planner = _step(kube, drains, spec, NOW + HANDOFF_GRACE_SECONDS)
    assert planner["replicas"]["prefill"] == 2 and "1 requests waiting at decodes" in planner["waiting"][0]
    assert read == ["10.0.1.1"]  # only the decode, only once the grace had passed
    decode_waiting["now"] = 0.0
    planner = _step(kube, drains, spec, NOW + HANDOFF_GRACE_SECONDS + 5)
    assert planner["replicas"]["prefill"] == 1 and planner["waiting"] == []
    assert [e["reason"] for e in kube.events if e["reason"].startswith("Drain")] == ["DrainFinished"]


def test_a_vllm_prefill_whose_decodes_never_clear_is_released_after_one_lease():
    kube, _, spec = _setup("vllm-nixl-2p4d.yaml")
    drains = Drains(kube, Reporter(kube), vllm_totals=lambda ip, port: {WAITING: 4.0},
                    in_flight=lambda ip, port: EngineLoad(0, LoadSource.VLLM_METRICS))
    assert _step(kube, drains, spec, NOW)["replicas"]["prefill"] == 2
    assert _step(kube, drains, spec, NOW + NIXL_KV_LEASE_SECONDS - 1)["replicas"]["prefill"] == 2
    assert _step(kube, drains, spec, NOW + NIXL_KV_LEASE_SECONDS)["replicas"]["prefill"] == 1


def test_an_sglang_prefill_counted_by_get_load_is_kept_for_the_documented_wait():
    kube, _, spec = _setup("demo-sim.yaml")
    wait = get_load_wait_seconds(spec)
    drains = Drains(kube, Reporter(kube), vllm_totals=lambda ip, port: None,
                    in_flight=lambda ip, port: EngineLoad(0, LoadSource.GET_LOAD))
    planner = _step(kube, drains, spec, NOW)
    assert planner["replicas"]["prefill"] == 2
    assert planner["waiting"] == [
        "demo-prefill-b drains; engine has no /v1/loads, and /get_load does not count KV still "
        f"being sent to decodes: waits {wait:.0f} s after it read 0 ({wait:.0f} s left)"]
    assert _step(kube, drains, spec, NOW + wait - 1)["replicas"]["prefill"] == 2
    assert _step(kube, drains, spec, NOW + wait)["replicas"]["prefill"] == 1


def test_an_sglang_prefill_counted_by_v1_loads_is_removed_once_idle():
    kube, _, spec = _setup("demo-sim.yaml")
    drains = Drains(kube, Reporter(kube), vllm_totals=lambda ip, port: None,
                    in_flight=lambda ip, port: EngineLoad(0, LoadSource.LOADS))
    planner = _step(kube, drains, spec, NOW)
    assert planner["replicas"]["prefill"] == 1 and planner["waiting"] == []


def test_auto_drains_a_role_of_groups_from_its_highest_index():
    # LWS removes the highest-index groups on a scale-down, whatever the drain picked: the
    # move drains those, not the least loaded (fleet.plan_group_actions), on the LWS's replicas
    kube, _, spec = _setup("sglang-glm-4p8d.yaml")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["decode"]["nodesPerInstance"] = 2
    doc["spec"]["parallelism"]["decode"] = {"tensorParallelSize": 16}
    spec = PDClusterSpec.model_validate(doc["spec"])
    del kube.objects[("Deployment", NS, "demo-decode")]  # a role of groups has none
    kube.objects[("LeaderWorkerSet", NS, "demo-decode")] = {
        "kind": "LeaderWorkerSet", "metadata": {"name": "demo-decode", "namespace": NS,
                                                "ownerReferences": [{"controller": True, "uid": "uid-1"}]},
        "spec": {"replicas": 3}}
    kube.pods = [p for p in kube.pods if p["metadata"]["labels"][names.LABEL_ROLE] != "decode"]
    for index in range(3):
        pod = _pod(f"demo-decode-{index}", "decode", f"10.0.1.{index + 1}")
        pod["metadata"]["labels"].update({lws.LABEL_GROUP_INDEX: str(index),
                                          lws.LABEL_WORKER_INDEX: "0"})
        kube.pods.append(pod)
    in_flight = {"10.0.1.1": 0, "10.0.1.2": 4, "10.0.1.3": 7}  # group 0 the least loaded
    drains = Drains(kube, Reporter(kube), vllm_totals=lambda ip, port: None,
                    in_flight=lambda ip, port: EngineLoad(in_flight.get(ip, 0), LoadSource.V1_LOADS))
    body = kube.get("PDCluster", NS, "demo")
    pods = {role: [pod_view(p, role) for p in kube.list_pods(NS, names.selector_labels("demo", role))]
            for role in Role}
    drains.begin_tick()
    drains.move(body, spec, pods, FakeWorkers(), set(), {Role.PREFILL: 1, Role.DECODE: 1}, NOW)
    drains.end_tick()
    draining = sorted(name for name, patch in kube.pod_patches
                      if DRAINING_ANNOTATION in patch["metadata"]["annotations"]
                      and name.startswith("demo-decode"))
    assert draining == ["demo-decode-1", "demo-decode-2"]
