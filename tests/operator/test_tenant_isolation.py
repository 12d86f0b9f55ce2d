"""One tenant cannot hurt another through the names the operator derives or the objects it
reads as its own: injective base names, a planner memory it does not control left alone (and
said so), remembered decisions held to today's bounds, no drain of another PDCluster's pods."""

from __future__ import annotations

import copy
import itertools
import time

from test_planner_loop import NOW, NS, FakeKube, FakeWorkers, _cluster, _deployments, _pod
from test_planner_memory_guard import OWNER, _decision

from pdscale.operator.api import names
from pdscale.operator.api.pdcluster import MAX_ROLE_REPLICAS, PDClusterSpec
from pdscale.operator.loop.drain import Drains
from pdscale.operator.loop.fleet import pod_view
from pdscale.operator.loop.planner_loop import PlannerLoop
from pdscale.operator.loop.planning import clamp_decision, history_to_json
from pdscale.operator.loop.telemetry import Reporter
from pdscale.operator.render.builders import planned_replicas, planner_memory
from pdscale.planner.observe import Role
from pdscale.planner.solve import History


# -- names --------------------------------------------------------------------------------------
def test_a_name_shaped_like_a_hashed_one_does_not_map_onto_it():
    hashed = names.base_name("team.llm")
    assert hashed.startswith("team-llm-") and hashed != "team.llm"
    # 'team-llm-88439' is a valid name: kept as it is, it would share every child of team.llm
    assert names.base_name(hashed) != hashed
    assert names.child_name(hashed, "prefill") != names.child_name("team.llm", "prefill")


def test_base_names_are_distinct_over_ordinary_sanitized_long_and_hash_shaped_names():
    seeds = ["demo", "team.llm", "Team.LLM", "a" * 38, "a" * 39, "b" * 253, "x.y.z", "9lives",
             "p9lives", "demo-abcde", "demo-12345", "demo-1234", "demo-zzzzz"]
    found = list(seeds)
    found += [names.base_name(n) for n in seeds]  # every mapped name, as a name of its own
    found += [names.base_name(n) for n in found]
    distinct = sorted(set(found))
    mapped = {n: names.base_name(n) for n in distinct}
    for a, b in itertools.combinations(distinct, 2):
        assert mapped[a] != mapped[b], (a, b, mapped[a])


# -- the planner memory: only our own ----------------------------------------------------------
def _foreign_memory(kube: FakeKube, text: str) -> dict:
    """A ConfigMap of the memory's name that a tenant created: no owner reference to us."""
    cm = planner_memory(OWNER, text)
    cm["metadata"].pop("ownerReferences")
    cm["metadata"]["resourceVersion"] = "5"
    kube.objects[("ConfigMap", NS, "demo-planner")] = cm
    return copy.deepcopy(cm)


def _huge() -> str:
    # planned a second ago (the loop reads the wall clock): nothing new is planned this tick,
    # the remembered decision is the one in force
    return history_to_json(History(decisions=(_decision(prefill=100_000, decode=100_000),)),
                           time.time() - 1)


def test_a_memory_configmap_the_pdcluster_does_not_control_is_not_read_nor_written():
    kube, lists = _cluster("Auto")
    _deployments(kube)
    before = _foreign_memory(kube, _huge())
    loop = PlannerLoop(kube, worker_lists=lists)
    loop.tick_all()
    loop.tick_all()
    # left alone: not written over, not adopted
    assert kube.objects[("ConfigMap", NS, "demo-planner")] == before
    # nothing moved on its numbers
    planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
    assert "replicas" not in planner and kube.pod_patches == []
    assert planner["held"] is True and "not controlled by this PDCluster" in planner["explanation"]
    warned = [e for e in kube.events if e["reason"] == "PlannerMemoryForeign"]
    assert len(warned) == 1 and warned[0]["type"] == "Warning"
    assert "demo-planner" in warned[0]["message"]


def test_a_remembered_decision_is_held_to_the_bounds_when_loaded_and_when_applied():
    kube, lists = _cluster("Auto")
    _deployments(kube)
    cm = planner_memory(OWNER, _huge())  # ours, but holding what no spec allows
    cm["metadata"]["resourceVersion"] = "5"
    kube.objects[("ConfigMap", NS, "demo-planner")] = cm
    PlannerLoop(kube, worker_lists=lists).tick_all()
    spec = PDClusterSpec.model_validate(kube.get("PDCluster", NS, "demo")["spec"])
    replicas = kube.get("PDCluster", NS, "demo")["status"]["planner"]["replicas"]
    assert replicas["prefill"] <= spec.prefill.max_replicas
    assert replicas["decode"] <= spec.decode.max_replicas
    assert sum(replicas.values()) <= (spec.planner.node_budget or 10**9)


def test_clamping_keeps_minimums_and_shares_a_budget():
    spec = PDClusterSpec.model_validate(
        {**_cluster("Auto")[0].get("PDCluster", NS, "demo")["spec"]})
    bounded = clamp_decision(_decision(prefill=100_000, decode=100_000), spec)
    assert bounded.prefill <= spec.prefill.max_replicas and bounded.decode <= spec.decode.max_replicas
    assert bounded.prefill + bounded.decode <= (spec.planner.node_budget or 10**9)
    assert clamp_decision(_decision(prefill=0, decode=0), spec).prefill == spec.prefill.min_replicas
    same = _decision(prefill=1, decode=2)
    assert clamp_decision(same, spec) is same


def test_replicas_from_status_never_pass_the_crd_cap():
    doc = _cluster("Auto")[0].get("PDCluster", NS, "demo")
    spec = PDClusterSpec.model_validate(doc["spec"])
    out = planned_replicas(spec, {"planner": {"replicas": {"prefill": 100_000, "decode": 3}}})
    assert out["prefill"] == MAX_ROLE_REPLICAS and out["decode"] == 3


# -- pods: by owner, not by label ---------------------------------------------------------------
def test_the_planner_drains_nothing_through_deployments_another_pdcluster_controls():
    kube, _ = _cluster("Auto")
    _deployments(kube)
    for role in ("prefill", "decode"):  # the same names, another PDCluster's
        kube.objects[("Deployment", NS, f"demo-{role}")]["metadata"]["ownerReferences"] = [
            {"controller": True, "uid": "someone-else"}]
    body = kube.get("PDCluster", NS, "demo")
    spec = PDClusterSpec.model_validate(body["spec"])
    pods = {Role.PREFILL: [], Role.DECODE: [
        pod_view(_pod(f"demo-decode-{c}", "decode", f"10.0.0.{i}"), "decode")
        for i, c in enumerate("ab", 2)]}
    Drains(kube, Reporter(kube)).move(body, spec, pods, FakeWorkers(), set(),
                                      {Role.PREFILL: 1, Role.DECODE: 0}, NOW)
    assert kube.pod_patches == []
    assert "replicas" not in (kube.get("PDCluster", NS, "demo").get("status") or {}).get("planner", {})


class _PatchingKube(FakeKube):
    """FakeKube with the raw call drain.patch_pdcluster makes (the finalizer patch)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def _call(self, method, path, **_):  # type: ignore[no-untyped-def]
        self.calls.append((method, path))
        return {}


def test_a_deletion_takes_no_engine_of_another_pdcluster_out_of_its_router():
    from pdscale.operator.loop.drain import FINALIZER, DeletionDrain

    kube = _PatchingKube()
    base, _ = _cluster("Auto")
    kube.objects, kube.pods = base.objects, base.pods
    _deployments(kube)
    for role in ("prefill", "decode"):  # the names are another PDCluster's children
        kube.objects[("Deployment", NS, f"demo-{role}")]["metadata"]["ownerReferences"] = [
            {"controller": True, "uid": "someone-else"}]
    body = kube.get("PDCluster", NS, "demo")
    body["metadata"].update(deletionTimestamp="2027-01-15T08:00:00Z", finalizers=[FINALIZER])
    workers = FakeWorkers()

    class Lists:
        def of(self, spec, routers):  # type: ignore[no-untyped-def]
            return workers

    done = DeletionDrain(kube, Lists(), in_flight=lambda ip, port: 5).step(body, NOW)  # type: ignore[arg-type]
    assert workers.made == []  # no engine taken out of the other's router
    assert done and kube.calls and kube.calls[0][0] == "PATCH"  # our finalizer goes


def test_a_tick_selects_no_pod_whose_deployment_another_pdcluster_controls():
    """Two PDClusters whose names map alike: the second's loop must neither list the first's
    engines in a router, nor drain them, nor count them as its own."""
    kube, lists = _cluster("Auto")
    _deployments(kube)
    kube.objects[("Deployment", NS, "demo-router")] = {
        "kind": "Deployment", "metadata": {"name": "demo-router", "namespace": NS}, "spec": {"replicas": 1}}
    for role in ("prefill", "decode", "router"):
        kube.objects[("Deployment", NS, f"demo-{role}")]["metadata"]["ownerReferences"] = [
            {"controller": True, "uid": "the-first-pdcluster"}]
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert kube.pod_patches == []
    assert all(not made for made in lists.workers.made), lists.workers.made
    # ours again: the same tick lists them
    for role in ("prefill", "decode", "router"):
        kube.objects[("Deployment", NS, f"demo-{role}")]["metadata"]["ownerReferences"] = [
            {"controller": True, "uid": "uid-1"}]
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert lists.workers.made[-1]
