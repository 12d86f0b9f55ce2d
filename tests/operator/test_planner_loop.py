"""The planner loop's parts without a cluster: the pure pieces (pod views, the memory's
ConfigMap, the worker-list choice, drain marks, the prefill waits) and one tick's order
against an in-memory API, fake routers and fake engine probes."""

from __future__ import annotations

import copy
import json
import pathlib
from dataclasses import replace

import yaml
from kubernetes.client.exceptions import ApiException

from pdscale.operator.api import names
from pdscale.operator.api.names import DELETION_COST_ANNOTATION, DRAINING_ANNOTATION
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.clients.routersync import SGLangWorkerList, WorkerSpec
from pdscale.operator.clients.vllm_discovery import Announcer, DiscoveryWorkerList, PrefillCount
from pdscale.operator.loop.drain import (
    Drains,
    PrefillWaits,
    drain_marks,
    drain_timeout_seconds,
    with_engine_state,
)
from pdscale.operator.loop.fleet import (
    PodView,
    pod_view,
)
from pdscale.operator.loop.planner_loop import PlannerLoop, pods_by_key
from pdscale.operator.loop.planner_memory import PlannerMemory
from pdscale.operator.loop.planning import EARLY_WAKE_SECONDS, plan_slot
from pdscale.operator.loop.telemetry import Reporter, decision_bound
from pdscale.operator.loop.workerlist import (
    WorkerLists,
    desired_workers,
    discovery_addresses,
    router_urls,
)
from pdscale.operator.render.builders import PLANNER_MEMORY_KEY, planner_memory
from pdscale.planner.decision import Decision
from pdscale.planner.observe import Role

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
NS = "serving"


def _spec_doc(sample: str = "demo-sim.yaml", **changes) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / sample).read_text())
    doc["metadata"].update(namespace=NS, uid="uid-1", generation=1, resourceVersion="1")
    doc["spec"]["planner"].update(changes)
    return doc


def _spec(sample: str = "demo-sim.yaml") -> PDClusterSpec:
    return PDClusterSpec.model_validate(_spec_doc(sample)["spec"])


def _pod(name: str, role: str, ip: str | None = "10.0.0.1", *, ready: bool = True,
         draining: float | None = None, deleting: bool = False, instance: str = "demo") -> dict:
    meta: dict = {"name": name, "namespace": NS, "creationTimestamp": "2027-01-15T08:00:00Z",
                  "labels": {names.LABEL_INSTANCE: instance, names.LABEL_ROLE: role,
                             names.LABEL_MANAGED_BY: names.MANAGER}}
    if draining is not None:
        meta["annotations"] = {DRAINING_ANNOTATION: f"{draining:.3f}"}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:30:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False",
                   "lastTransitionTime": "2027-01-15T08:01:00Z"}]
    status = {"conditions": conditions, **({"podIP": ip} if ip else {})}
    return {"metadata": meta, "status": status}


# -- pure parts -------------------------------------------------------------------------------
def test_a_pod_view_reads_the_api_dict_and_missing_fields_read_as_absent():
    view = pod_view(_pod("demo-decode-a", "decode", draining=NOW), "decode")
    assert (view.name, view.role, view.ip, view.ready, view.draining_since_seconds) == (
        "demo-decode-a", "decode", "10.0.0.1", True, NOW)
    assert view.created_at_seconds == NOW  # 2027-01-15T08:00:00Z
    assert view.ready_since_seconds == NOW + 60
    bare = pod_view({"metadata": {"name": "new"}}, "prefill")
    assert (bare.ip, bare.ready, bare.created_at_seconds, bare.ready_since_seconds,
            bare.deleting, bare.draining) == (None, False, 0.0, None, False, False)
    assert pod_view(_pod("x", "decode", deleting=True), "decode").deleting


def test_the_tick_listing_is_grouped_per_pdcluster_and_role():
    grouped = pods_by_key([_pod("a", "decode"), _pod("b", "router"), _pod("c", "decode")])
    assert {k: [p["metadata"]["name"] for p in v] for k, v in grouped.items()} == {
        (NS, "demo", "decode"): ["a", "c"], (NS, "demo", "router"): ["b"]}


def test_the_planner_memory_is_a_configmap_owned_by_its_pdcluster():
    owner = names.Owner(name="demo", namespace=NS, uid="uid-1")
    cm = planner_memory(owner, '{"version":1}')
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "demo-planner", NS)
    assert cm["data"] == {PLANNER_MEMORY_KEY: '{"version":1}'}
    assert cm["metadata"]["ownerReferences"] == names.owner_references(owner)
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert cm["metadata"]["labels"][names.LABEL_INSTANCE] == "demo"


def test_the_worker_list_is_chosen_once_from_the_router_kind():
    routers = [pod_view(_pod("r1", "router", "10.0.1.1"), "router"),
               pod_view(_pod("r2", "router", "10.0.1.2", ready=False), "router"),
               pod_view(_pod("r3", "router", "10.0.1.3", deleting=True), "router"),
               pod_view(_pod("r4", "router", None), "router")]
    lists = WorkerLists(Announcer(side_channel_port=5600))
    # smg (the default gateway): not only Ready routers, smg is not Ready until it has workers
    sglang = lists.of(_spec(), routers)
    assert isinstance(sglang, SGLangWorkerList) and not sglang.decode_picked_before_prefill
    assert sglang.addresses == ("http://10.0.1.1:30000", "http://10.0.1.2:30000") == tuple(
        router_urls(_spec(), routers))
    # sglang-router 0.3.2 is Ready without workers: only Ready routers
    doc = _spec_doc()["spec"]
    doc["router"]["gateway"] = "SGLangRouter"
    old = PDClusterSpec.model_validate(doc)
    sglang = lists.of(old, routers)
    assert sglang.addresses == ("http://10.0.1.1:30000",) == tuple(router_urls(old, routers))
    vllm_spec = _spec("vllm-nixl-2p4d.yaml")
    vllm = lists.of(vllm_spec, routers)
    assert isinstance(vllm, DiscoveryWorkerList) and vllm.decode_picked_before_prefill
    # not only Ready routers: vllm-router is not Ready until it has workers
    port = vllm_spec.router.discovery_port
    assert vllm.addresses == (f"10.0.1.1:{port}", f"10.0.1.2:{port}")
    assert list(vllm.addresses) == discovery_addresses(vllm_spec, routers)


def test_discovery_workers_are_announced_to_each_router_and_unknown_until_a_timeout():
    clock = [100.0]
    announcer = Announcer(side_channel_port=5600, clock=lambda: clock[0])
    workers = DiscoveryWorkerList(announcer, ("10.0.1.1:5557", "10.0.1.2:5557"))
    desired = frozenset({WorkerSpec("http://10.0.0.1:8000", "decode")})
    workers.make_equal(desired)
    assert announcer._desired == {"10.0.1.1:5557": desired, "10.0.1.2:5557": desired}
    assert workers.listed() is None  # a fresh announcer cannot know what an earlier one sent
    clock[0] += 60
    assert workers.listed() == set()
    assert SGLangWorkerList([]).listed() == set()  # no router: nothing listed


def test_the_routers_list_the_serving_pods_minus_those_about_to_drain():
    pods = {Role.PREFILL: [pod_view(_pod("p", "prefill", "10.0.0.1"), "prefill")],
            Role.DECODE: [pod_view(_pod("d1", "decode", "10.0.0.2"), "decode"),
                          pod_view(_pod("d2", "decode", "10.0.0.3"), "decode"),
                          pod_view(_pod("d3", "decode", "10.0.0.4", draining=NOW), "decode")]}
    spec = _spec()
    assert desired_workers(spec, pods, frozenset({"d2"})) == {
        WorkerSpec("http://10.0.0.1:8000", "prefill", 8998), WorkerSpec("http://10.0.0.2:8000", "decode")}


def test_drain_marks_set_and_clear_both_annotations():
    assert drain_marks(NOW) == {"metadata": {"annotations": {
        DRAINING_ANNOTATION: f"{NOW:.3f}", DELETION_COST_ANNOTATION: "-1000"}}}
    assert drain_marks(None) == {"metadata": {"annotations": {
        DRAINING_ANNOTATION: None, DELETION_COST_ANNOTATION: None}}}
    assert drain_timeout_seconds(_spec(), Role.DECODE) == 50.0


def test_only_draining_pods_are_probed_and_an_unknown_router_lists_them():
    pods = [pod_view(_pod("a", "decode", "10.0.0.1"), "decode"),
            pod_view(_pod("b", "decode", "10.0.0.2", draining=NOW), "decode")]
    asked: list[str | None] = []

    def probe(ip: str | None, port: int) -> int | None:
        asked.append(ip)
        return 3

    views = with_engine_state(pods, 8000, {"http://10.0.0.9:8000"}, probe)
    assert asked == ["10.0.0.2"] and views[0] == pods[0]
    assert (views[1].in_flight, views[1].in_router) == (3, False)
    assert with_engine_state(pods, 8000, None, probe)[1].in_router
    assert with_engine_state(pods, 8000, {"http://10.0.0.2:8000"}, probe)[1].in_router


def test_a_leaving_decode_waits_out_the_prefill_backlog_then_is_forgotten():
    waits = PrefillWaits()
    decode = [PodView("d1", "decode", "10.0.0.2", True, 0.0, draining_since_seconds=NOW)]
    waits.begin_tick()
    # a serving prefill that does not answer: the backlog cannot be taken yet
    assert waits.awaited(NS, decode, ["p1"], {"p1": None}, NOW, 5.0) == {"d1"}
    assert waits.backlogs == {}
    # taken: p1 had finished 10 and held 2; it must finish 2 more
    assert waits.awaited(NS, decode, ["p1"], {"p1": PrefillCount(10, 2)}, NOW + 1, 5.0) == {"d1"}
    assert waits.awaited(NS, decode, ["p1"], {"p1": PrefillCount(11, 1)}, NOW + 2, 5.0) == {"d1"}
    # done at NOW + 3; it lingers for the slowest prefill, then no longer waits
    assert waits.awaited(NS, decode, ["p1"], {"p1": PrefillCount(12, 0)}, NOW + 3, 5.0) == {"d1"}
    assert waits.awaited(NS, decode, ["p1"], {"p1": PrefillCount(12, 0)}, NOW + 9, 5.0) == set()
    waits.end_tick()
    assert list(waits.backlogs) == [(NS, "d1")]
    waits.begin_tick()
    waits.end_tick()  # no tick asked about d1: drained
    assert waits.backlogs == {}


def test_what_bound_a_decision_labels_its_counter():
    base = Decision(at_seconds=NOW, prefill=1, decode=2, predicted_ttft_seconds=0.1,
                    predicted_tpot_seconds=0.01, cost_gpu_hours=0.0, explanation="")
    assert decision_bound(base) == "slo"
    assert decision_bound(replace(base, shortfall=True)) == "shortfall"
    assert decision_bound(replace(base, held=True, shortfall=True)) == "held"


def test_a_decision_shows_the_refusals_it_read_in_status_and_as_a_gauge():
    """smg's admission refusals, as the planner read them, reach ``status.planner`` (integers:
    per minute, the ``Refused/min`` column of ``kubectl get pdc``) and the operator's gauge; a
    decision without a reading leaves both as they were."""
    from pdscale.operator.loop.telemetry import REFUSED
    from pdscale.planner.observe import Observation, Reading
    from pdscale.planner.prometheus import MetricsSnapshot

    kube = FakeKube()
    body = {"metadata": {"name": "demo", "namespace": NS, "uid": "u"}}
    kube.objects[("PDCluster", NS, "demo")] = copy.deepcopy(body)
    decision = Decision(at_seconds=NOW, prefill=1, decode=2, predicted_ttft_seconds=0.1,
                        predicted_tpot_seconds=0.01, cost_gpu_hours=0.0, explanation="")
    snapshot = MetricsSnapshot(readings={})
    Reporter(kube).decision(body, _spec(), decision, None, snapshot,
                            Observation(now_seconds=NOW, rejected_rps=Reading(0.4, NOW)))
    assert kube.get("PDCluster", NS, "demo")["status"]["planner"]["refusedRequestsPerMinute"] == 24
    assert REFUSED.labels(NS, "demo")._value.get() == 0.4
    Reporter(kube).decision(body, _spec(), decision, None, snapshot, Observation(now_seconds=NOW + 60))
    assert kube.get("PDCluster", NS, "demo")["status"]["planner"]["refusedRequestsPerMinute"] == 24
    assert REFUSED.labels(NS, "demo")._value.get() == 0.4


def test_a_scrape_that_shows_a_new_plan_time_shows_that_decisions_counts_wherever_it_falls():
    """A scrape runs in the metrics server's thread while the loop reports a decision. Here the
    whole decision is reported at each point of one scrape's collection in turn: whenever the
    scrape shows the new plan time, it shows the new recommended counts and decisions count
    too, which is what ``pdscale replay --prometheus`` joins on (planner/replay/recorded.py)."""
    from prometheus_client import REGISTRY

    from pdscale.operator.loop.telemetry import DECISIONS, LAST_PLAN, RECOMMENDED
    from pdscale.planner.observe import Observation
    from pdscale.planner.prometheus import MetricsSnapshot

    kube = FakeKube()
    ours = {LAST_PLAN._name, RECOMMENDED._name, DECISIONS._name}
    families = [f.name for f in REGISTRY.collect()]
    for point in range(len(families) + 1):
        name = f"scrape-{point}"
        body = {"metadata": {"name": name, "namespace": NS, "uid": name}}
        kube.objects[("PDCluster", NS, name)] = copy.deepcopy(body)
        first = Decision(at_seconds=NOW, prefill=1, decode=1, predicted_ttft_seconds=0.1,
                         predicted_tpot_seconds=0.01, cost_gpu_hours=0.0, explanation="")
        Reporter(kube).decision(body, _spec(), first, None, MetricsSnapshot(readings={}),
                                Observation(now_seconds=NOW))
        seen: dict[str, dict[str, float]] = {}
        for i, family in enumerate(REGISTRY.collect()):
            if i == point:  # the next decision, reported in the middle of the scrape
                nxt = Decision(at_seconds=NOW + 60, prefill=3, decode=4, predicted_ttft_seconds=0.1,
                               predicted_tpot_seconds=0.01, cost_gpu_hours=0.0, explanation="")
                Reporter(kube).decision(body, _spec(), nxt, first, MetricsSnapshot(readings={}),
                                        Observation(now_seconds=NOW + 60))
            if family.name in ours:
                seen[family.name] = {
                    s.labels.get("role", "") + s.name: s.value for s in family.samples
                    if s.labels.get("pdcluster") == name and not s.name.endswith("_created")}
        plan_time = seen[LAST_PLAN._name][LAST_PLAN._name]
        counts = (seen[RECOMMENDED._name]["prefill" + RECOMMENDED._name],
                  seen[RECOMMENDED._name]["decode" + RECOMMENDED._name])
        decided = sum(seen[DECISIONS._name].values())
        if plan_time == NOW + 60:
            assert (counts, decided) == ((3, 4), 2), (point, families[point:point + 1])
        else:
            assert plan_time == NOW, point


# -- one tick against an in-memory API ----------------------------------------------------------
class FakeKube:
    """The Kube calls the loop makes, on objects kept by (kind, namespace, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.pods: list[dict] = []
        self.events: list[dict] = []
        self.status_patches: list[dict] = []
        self.pod_patches: list[tuple[str, dict]] = []
        self.writes = 0

    def get(self, kind, namespace, name):
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def apply(self, manifest, *, force=True):
        self.writes += 1
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        old = self.objects.get(key) or {}
        obj = copy.deepcopy(manifest)
        if "status" in old:
            obj["status"] = old["status"]
        obj["metadata"]["resourceVersion"] = str(self.writes)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def create(self, manifest):
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        return self.apply(manifest)

    def patch_status(self, namespace, name, status):
        self.writes += 1
        self.status_patches.append(copy.deepcopy(status))
        obj = self.objects[("PDCluster", namespace, name)]
        for key, value in status.items():
            if isinstance(value, dict) and isinstance(obj.setdefault("status", {}).get(key), dict):
                obj["status"][key].update(copy.deepcopy(value))
            else:
                obj.setdefault("status", {})[key] = copy.deepcopy(value)
        return copy.deepcopy(obj)

    def create_event(self, event):
        self.writes += 1
        self.events.append(event)
        return event

    def patch_pod(self, namespace, name, patch):
        self.writes += 1
        self.pod_patches.append((name, patch))
        pod = next(p for p in self.pods if p["metadata"]["name"] == name)
        annotations = pod["metadata"].setdefault("annotations", {})
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        return copy.deepcopy(pod)

    def list_pods(self, namespace, labels):
        return [copy.deepcopy(p) for p in self.pods
                if namespace in (None, p["metadata"]["namespace"])
                and all(p["metadata"]["labels"].get(k) == v for k, v in labels.items())]

    def list_deployments(self, namespace, labels):
        return [copy.deepcopy(o) for (kind, ns, _), o in self.objects.items()
                if kind == "Deployment" and namespace in (None, ns)]

    def list_pdclusters(self):
        return [copy.deepcopy(o) for (kind, _, _), o in self.objects.items() if kind == "PDCluster"]

    def list_pdpools(self):
        return [copy.deepcopy(o) for (kind, _, _), o in self.objects.items() if kind == "PDPool"]


class FakeWorkers:
    def __init__(self, listed: set[str] | None = None, *, decode_picked_before_prefill: bool = False):
        self.addresses = ("http://10.0.1.1:30000",)
        self.decode_picked_before_prefill = decode_picked_before_prefill
        self._listed = set() if listed is None else listed
        self.made: list[frozenset[WorkerSpec]] = []

    def listed(self):
        return self._listed

    def make_equal(self, desired):
        self.made.append(desired)


class FakeWorkerLists:
    def __init__(self, workers: FakeWorkers):
        self.workers = workers
        self.kept: list[set[str]] = []

    def of(self, spec, routers):
        return self.workers

    def keep_only(self, addresses):
        self.kept.append(set(addresses))


def _cluster(mode: str) -> tuple[FakeKube, FakeWorkerLists]:
    kube = FakeKube()
    # nothing listens there: the metrics are unknown, so the planner holds
    doc = _spec_doc(mode=mode, prometheusURL="http://127.0.0.1:9")
    kube.objects[("PDCluster", NS, "demo")] = doc
    kube.pods = [_pod("demo-prefill-a", "prefill", "10.0.0.1"),
                 _pod("demo-decode-a", "decode", "10.0.0.2"),
                 _pod("demo-decode-b", "decode", "10.0.0.3"),
                 _pod("demo-router-a", "router", "10.0.1.1")]
    return kube, FakeWorkerLists(FakeWorkers())


def _deployments(kube: FakeKube) -> None:
    """The engine Deployments as the reconcile left them: the spec's 1 prefill, 2 decode."""
    for role, replicas in (("prefill", 1), ("decode", 2)):
        kube.objects[("Deployment", NS, f"demo-{role}")] = {
            "kind": "Deployment", "metadata": {"name": f"demo-{role}", "namespace": NS,
                                               "ownerReferences": [{"controller": True, "uid": "uid-1"}]},
            "spec": {"replicas": replicas}}


def test_a_recommend_tick_plans_reports_remembers_and_changes_nothing():
    kube, lists = _cluster("Recommend")
    loop = PlannerLoop(kube, worker_lists=lists)
    loop.tick_all()
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert planner["mode"] == "Recommend" and planner["held"] is True
    assert planner["recommended"] == {"prefill": 1, "decode": 2}
    assert planner["metricsAvailable"] is False and "replicas" not in planner
    assert [e["reason"] for e in kube.events if e["reason"].startswith("Planner")] == ["PlannerHolding"]
    memory = PlannerMemory(kube).load(NS, "demo")
    assert memory is not None and '"lastPlanAtSeconds"' in memory
    assert kube.get("ConfigMap", NS, "demo-planner")["metadata"]["ownerReferences"][0]["name"] == "demo"
    assert kube.pod_patches == []
    # every serving engine pod is a worker; the router pod is not
    assert {w.url for w in lists.workers.made[-1]} == {
        "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"}
    assert lists.kept == [{"http://10.0.1.1:30000"}]
    # within the planning interval the next tick plans nothing new
    patches = len(kube.status_patches)
    loop.tick_all()
    assert len(kube.status_patches) == patches



def test_a_first_plan_waits_for_the_fleet_the_reconcile_builds():
    """With the load unknown a first plan holds the counts it reads, and every later plan the
    last decision: read before the reconcile has created the decode pods it would hold decode
    at nothing (a pool member on a busy host read 1P0D and kept 1P1D of its 1P2D)."""
    kube, lists = _cluster("Recommend")
    built = kube.pods
    kube.pods = [p for p in built if p["metadata"]["labels"][names.LABEL_ROLE] != "decode"]
    loop = PlannerLoop(kube, worker_lists=lists)
    loop.tick_all()
    assert PlannerMemory(kube).load(NS, "demo") is None  # no plan, nothing remembered
    assert "planner" not in (kube.get("PDCluster", NS, "demo").get("status") or {})
    kube.pods = built
    loop.tick_all()
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert planner["recommended"] == {"prefill": 1, "decode": 2}  # the fleet it holds

def test_a_first_plan_holds_what_the_deployments_ask_for_not_the_pods_made_so_far():
    """Read between the reconcile's Deployments and their ReplicaSets' pods (a busy host), a
    first plan holding the pods it counts held a 1P2D at 1P1D, for good: the replicas asked
    for and not made yet are ordered, and held."""
    kube, lists = _cluster("Recommend")
    _deployments(kube)
    kube.pods = [p for p in kube.pods if p["metadata"]["name"] != "demo-decode-b"]
    PlannerLoop(kube, worker_lists=lists).tick_all()
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert planner["recommended"] == {"prefill": 1, "decode": 2}
    # and with no decode pod made at all, the Deployment alone says the fleet is built
    kube2, lists2 = _cluster("Recommend")
    _deployments(kube2)
    kube2.pods = [p for p in kube2.pods if p["metadata"]["labels"][names.LABEL_ROLE] != "decode"]
    PlannerLoop(kube2, worker_lists=lists2).tick_all()
    assert kube2.get("PDCluster", NS, "demo")["status"]["planner"]["recommended"] == {
        "prefill": 1, "decode": 2}


def test_plans_keep_the_interval_s_cadence_however_late_the_tick_that_runs_them():
    """Each plan fills the schedule's next slot (interval after the last), not the time its
    tick ran: ticks a few seconds apart, as the loop's, would otherwise stretch every
    interval by up to a tick. The tick says when the next plan falls due, for the loop to
    wake then."""
    kube, lists = _cluster("Recommend")
    loop = PlannerLoop(kube, worker_lists=lists)
    body, pods = kube.get("PDCluster", NS, "demo"), pods_by_key(kube.pods)
    interval = float(body["spec"]["planner"]["intervalSeconds"])

    def last_slot() -> float:
        return json.loads(PlannerMemory(kube).load(NS, "demo") or "{}")["lastPlanAtSeconds"]

    start = 1_000.0
    assert loop.tick(body, start, pods) == start + interval
    assert last_slot() == start
    decisions = len(kube.status_patches)
    # before the slot: nothing planned, the same due time
    assert loop.tick(body, start + interval - 1.0, pods) == start + interval
    assert len(kube.status_patches) == decisions
    # 2.7 s late: planned, stamped with its slot, the next one due a whole interval after it
    assert loop.tick(body, start + interval + 2.7, pods) == start + 2 * interval
    assert last_slot() == start + interval and len(kube.status_patches) > decisions
    # a plan a whole interval late starts the schedule again from that tick
    late = start + 4 * interval + 0.5
    assert loop.tick(body, late, pods) == late + interval and last_slot() == late


def test_plan_slots_of_ticks_every_few_seconds_stay_an_interval_apart():
    slots, last, now = [], None, 0.0
    while now < 200.0:
        slot = plan_slot(last, 10.0, now)
        if slot is not None:
            slots.append(slot)
            last = slot
        now += 2.7
    assert slots == [10.0 * k for k in range(len(slots))] and len(slots) == 20
    assert plan_slot(100.0, 10.0, 110.0 - EARLY_WAKE_SECONDS / 2) == 110.0  # woken a hair early
    assert plan_slot(100.0, 10.0, 109.0) is None


def test_an_off_tick_only_keeps_the_router_list():
    kube, lists = _cluster("Off")
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert kube.status_patches == [] and kube.get("ConfigMap", NS, "demo-planner") is None
    assert len(lists.workers.made) == 1


def test_drains_take_a_decode_out_of_the_router_then_remove_it_once_idle():
    kube, lists = _cluster("Auto")
    _deployments(kube)
    body = kube.get("PDCluster", NS, "demo")
    spec = PDClusterSpec.model_validate(body["spec"])
    drains = Drains(kube, Reporter(kube), in_flight=lambda ip, port: 0,
                    vllm_totals=lambda ip, port: None)
    workers = lists.workers
    targets = {Role.PREFILL: 1, Role.DECODE: 1}

    def views():
        return {role: [pod_view(p, role) for p in kube.list_pods(NS, names.selector_labels("demo", role))]
                for role in Role}

    drains.move(body, spec, views(), workers, set(), targets, NOW)
    # the router let go of it before it was marked
    assert len(workers.made) == 1 and len(workers.made[0]) == 2
    (leaving, patch), = kube.pod_patches
    assert patch == drain_marks(NOW)
    assert [e["reason"] for e in kube.events if e["reason"].startswith("Drain")] == ["DrainStarted"]
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert planner == {"replicas": {"prefill": 1, "decode": 2}, "waiting": []}

    body = kube.get("PDCluster", NS, "demo")
    drains.move(body, spec, views(), workers, set(), targets, NOW + 1)
    assert [e["reason"] for e in kube.events if e["reason"].startswith("Drain")] == [
        "DrainStarted", "DrainFinished"]
    assert kube.get("PDCluster", NS, "demo")["status"]["planner"]["replicas"] == {"prefill": 1, "decode": 1}
    finished, = (e for e in kube.events if e["reason"] == "DrainFinished")
    assert finished["message"] == f"decode pod {leaving}: drained, removing"


def test_a_drain_behind_a_router_that_picks_decodes_early_waits_for_the_prefills():
    kube, _ = _cluster("Auto")
    _deployments(kube)
    kube.pods[2] = _pod("demo-decode-b", "decode", "10.0.0.3", draining=NOW - 1)
    body = kube.get("PDCluster", NS, "demo")
    spec = PDClusterSpec.model_validate(body["spec"])
    drains = Drains(kube, Reporter(kube), in_flight=lambda ip, port: 0,
                    vllm_totals=lambda ip, port: None)  # the prefill does not answer
    workers = FakeWorkers(decode_picked_before_prefill=True)
    pods = {role: [pod_view(p, role) for p in kube.list_pods(NS, names.selector_labels("demo", role))]
            for role in Role}
    drains.move(body, spec, pods, workers, set(), {Role.PREFILL: 1, Role.DECODE: 1}, NOW)
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert planner["replicas"] == {"prefill": 1, "decode": 2}
    assert planner["waiting"] == ["demo-decode-b drains; requests queued at prefill may still be sent to it"]


def test_a_missing_deployment_moves_nothing():
    kube, lists = _cluster("Auto")
    body = kube.get("PDCluster", NS, "demo")
    drains = Drains(kube, Reporter(kube))
    drains.move(body, PDClusterSpec.model_validate(body["spec"]), {Role.PREFILL: [], Role.DECODE: []},
                lists.workers, set(), {Role.PREFILL: 1, Role.DECODE: 1}, NOW)
    assert kube.status_patches == [] and kube.events == []
