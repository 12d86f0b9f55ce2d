"""The PDPools' loop without a cluster: who joins a pool (the pool's author decides; a
PDCluster only asks), the joint plan over the members' own planners, the pool's status and
Events, and one tick of the loop against an in-memory API."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from pdscale.operator.api.pdcluster import PDClusterSpec, PoolRef
from pdscale.operator.api.pdpool import PDPoolSpec, pool_refusal
from pdscale.operator.loop.fleet import PodView
from pdscale.operator.loop.planning import planner_config
from pdscale.operator.loop.pool_planning import (
    MemberInput,
    memberships,
    plan_pool,
    pool_events,
    pool_status,
)
from pdscale.operator.reconciler import conditions as c
from pdscale.operator.reconciler.status import ChildrenView, compute
from pdscale.planner.history import History
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import shipped_profile

ROOT = pathlib.Path(__file__).resolve().parents[2]
NS = "models"
NOW = 1_800_000_000.0
ISL, OSL = 200.0, 50.0  # the demo-sim profile's small instances


def pdc(name: str, pool: dict | None = None, ns: str = NS, **planner: Any) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "demo-sim.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "generation": 1}
    doc["spec"]["planner"].update(planner)
    if pool is not None:
        doc["spec"]["planner"]["pool"] = pool
    return doc


def pool_body(members: list[dict], ns: str = NS, name: str = "shared", nodes: int = 24,
              status: dict | None = None, **spec: Any) -> dict:
    return {"apiVersion": "pdscale.io/v1alpha1", "kind": "PDPool",
            "metadata": {"name": name, "namespace": ns, "uid": "uid-pool", "generation": 3},
            "spec": {"nodes": nodes, "members": members, **spec},
            **({"status": status} if status else {})}


def keyed(*bodies: dict) -> dict[str, dict]:
    return {f"{b['metadata']['namespace']}/{b['metadata']['name']}": b for b in bodies}


# -- who joins ---------------------------------------------------------------------------------
def test_a_pdcluster_joins_only_a_pool_of_its_namespace_that_lists_it():
    pool = pool_body([{"name": "chat", "priority": 100}, {"name": "docs"}, {"name": "gone"}])
    bodies = keyed(
        pdc("chat", {"name": "shared"}),
        pdc("docs"),  # listed, but does not ask
        pdc("intruder", {"name": "shared"}),  # asks, not listed
        pdc("chat", {"name": "shared", "namespace": NS}, ns="tenant-b"),  # another namespace's
        pdc("thief", {"name": "shared", "namespace": NS}, ns="tenant-b"),
    )
    found, refused = memberships([pool], bodies)
    (ms,) = found
    assert [b["metadata"]["name"] for b, _ in ms.members] == ["chat"]
    assert ms.members[0][1].priority == 100
    assert "spec.planner.pool" in ms.absent["docs"]
    assert ms.absent["gone"] == "no such PDCluster"
    assert refused[f"{NS}/intruder"].startswith("spec.planner.pool.name: ")
    assert "does not list PDCluster 'intruder'" in refused[f"{NS}/intruder"]
    # a tenant cannot claim another namespace's pool, whatever that pool lists
    assert refused["tenant-b/thief"].startswith("spec.planner.pool.namespace: ")
    assert refused["tenant-b/chat"].startswith("spec.planner.pool.namespace: ")


@pytest.mark.parametrize("ref, pool, gpu, field", [
    (PoolRef(name="p", namespace="other"), None, "NVIDIA-H200", "spec.planner.pool.namespace"),
    (PoolRef(name="p"), None, "NVIDIA-H200", "spec.planner.pool.name"),
    (PoolRef(name="p"), pool_body([{"name": "x"}]), "NVIDIA-H200", "spec.planner.pool.name"),
    (PoolRef(name="p"), pool_body([{"name": "me"}]), "NVIDIA-B200", "spec.placement.gpuProduct"),
])
def test_a_refusal_names_the_field(ref, pool, gpu, field):
    assert pool_refusal(NS, "me", ref, gpu, pool).startswith(field + ": ")


def test_a_member_is_not_refused():
    assert pool_refusal(NS, "me", PoolRef(name="p"), "NVIDIA-H200", pool_body([{"name": "me"}])) is None
    assert pool_refusal(NS, "me", None, "NVIDIA-H200", None) is None


def test_the_pdcluster_says_whether_it_joined_in_a_condition():
    refused = ChildrenView(generation=4, pool=f"{NS}/p", pool_refusal="spec.planner.pool.name: no")
    cond = c.find(compute(refused, None, "2027-01-01T00:00:00Z")["conditions"], c.POOL_MEMBER)
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", c.POOL_REFUSED, 4)
    assert cond["message"].startswith("spec.planner.pool.name")
    joined = ChildrenView(generation=4, pool=f"{NS}/p")
    cond = c.find(compute(joined, None, "2027-01-01T00:00:00Z")["conditions"], c.POOL_MEMBER)
    assert cond["status"] == "True"
    alone = compute(ChildrenView(generation=4), None, "2027-01-01T00:00:00Z")["conditions"]
    assert c.find(alone, c.POOL_MEMBER) is None


# -- the joint plan ----------------------------------------------------------------------------
def _obs(rate: float, p: int, d: int) -> Observation:
    r = lambda v: Reading(v, NOW)  # noqa: E731
    return Observation(now_seconds=NOW, rate_rps=r(rate), mean_input_tokens=r(ISL),
                       mean_output_tokens=r(OSL), prefix_hit_rate=r(0.3),
                       prefill=RoleState(ready=p), decode=RoleState(ready=d))


def _inputs(rates: dict[str, float], held: dict[str, tuple[int, int]],
            priorities: dict[str, int]) -> list[MemberInput]:
    spec = PDClusterSpec.model_validate(pdc("x")["spec"])
    config = planner_config(spec, shipped_profile("demo-sim"))
    pool = PDPoolSpec.model_validate({"nodes": 24, "members": [
        {"name": n, "priority": priorities[n]} for n in rates]})
    return [MemberInput(m.name, m, _obs(rates[m.name], *held[m.name]), config, History(), None)
            for m in pool.members]


def _nodes(plans: dict) -> dict[str, int]:
    return {n: p.command.prefill + p.command.decode for n, p in plans.items()}


def test_under_a_full_pool_the_high_priority_gets_its_need_and_the_low_one_is_trimmed():
    held = {"high": (4, 4), "mid": (4, 4), "low": (4, 4)}
    alone = _inputs({"high": 10.0, "mid": 0.5, "low": 0.5}, held, {"high": 100, "mid": 10, "low": 1})
    _, plans_alone = plan_pool(alone[:1], pool_nodes=24, horizon_seconds=1800, now=NOW)
    need_high = _nodes(plans_alone)["high"]
    assert 16 < need_high <= 24  # the load asks for more than an even share
    busy = _inputs({"high": 10.0, "mid": 10.0, "low": 10.0}, held, {"high": 100, "mid": 10, "low": 1})
    decision, plans = plan_pool(busy, pool_nodes=24, horizon_seconds=1800, now=NOW)
    granted = {g.name: g.nodes for g in decision.grants}
    assert sum(granted.values()) <= 24
    # the others keep their minReplicas (1P1D: nodes their planners hold whatever the grant)
    assert granted["high"] == min(need_high, 24 - 2 - 2)
    assert granted["low"] == 2 and granted["mid"] <= 24 - granted["high"] - 2
    assert decision.grant("low").trimmed > 0 and "gives up" in decision.grant("low").reason
    # what the members hold once their commands apply never exceeds the pool: the high one's
    # gain waits for the low ones' drains (no pod Pending for want of a node)
    now_held = {n: max(plans[n].command.prefill, held[n][0]) + max(plans[n].command.decode, held[n][1])
                for n in plans}
    assert sum(now_held.values()) <= 24
    for name, plan in plans.items():
        assert plan.history.decisions[-1] == plan.command  # the decision in force between plans
        assert plan.command.explanation.endswith(decision.grant(name).reason)
        assert plan.budget_nodes <= 24


def test_the_pools_surplus_price_leaves_a_members_margin_beyond_its_share_idle():
    # one busy member on a pool of 24 with an idle one: unpriced it is granted its whole
    # need, beyond its even share of 12; priced at 100% (PDPool surplusPricePercent), none of
    # its margin beyond its share and its fluid demand, and the reason says so
    held = {"busy": (4, 4), "idle": (1, 1)}
    inputs = _inputs({"busy": 10.0, "idle": 0.2}, held, {"busy": 0, "idle": 0})
    free, _ = plan_pool(inputs, pool_nodes=24, horizon_seconds=1800, now=NOW)
    priced, plans = plan_pool(inputs, pool_nodes=24, horizon_seconds=1800, now=NOW,
                              surplus_price=1.0)
    unpriced, busy = free.grant("busy"), priced.grant("busy")
    assert unpriced.nodes == unpriced.need > 12 and unpriced.priced_out == 0
    assert busy.nodes < unpriced.nodes and busy.priced_out > 0
    assert unpriced.margin > 0 and busy.margin == 0
    assert "not worth their node-hours" in busy.reason
    assert plans["busy"].command.prefill + plans["busy"].command.decode <= plans["busy"].budget_nodes


def test_when_load_falls_every_member_gets_its_need_back():
    held = {"high": (8, 8), "mid": (2, 2), "low": (2, 2)}
    quiet = _inputs({"high": 1.0, "mid": 1.0, "low": 1.0}, held, {"high": 100, "mid": 10, "low": 1})
    decision, _plans = plan_pool(quiet, pool_nodes=24, horizon_seconds=1800, now=NOW)
    for g in decision.grants:
        assert g.nodes == g.need, g.reason
    assert "short" not in decision.explanation


# -- the pool's status and Events ---------------------------------------------------------------
def test_status_carries_the_split_with_reasons_and_conditions_with_observed_generation():
    pool = pool_body([{"name": "high", "priority": 100}, {"name": "mid", "priority": 10},
                      {"name": "low", "priority": 1}, {"name": "absent"}])
    found, _ = memberships([pool], keyed(*(pdc(n, {"name": "shared"}) for n in ("high", "mid", "low"))))
    inputs = _inputs({"high": 10.0, "mid": 10.0, "low": 10.0},
                     {"high": (4, 4), "mid": (4, 4), "low": (4, 4)},
                     {"high": 100, "mid": 10, "low": 1})
    decision, _ = plan_pool(inputs, pool_nodes=24, horizon_seconds=1800, now=NOW)
    status = pool_status(found[0], 3, pool_nodes=24, decision=decision, problem=None,
                         previous=None, now="2027-01-01T00:00:00Z")
    assert status["observedGeneration"] == 3 and status["nodes"] == 24
    assert [m["name"] for m in status["members"]] == ["high", "mid", "low"]
    assert status["grantedNodes"] == sum(m["grantedNodes"] for m in status["members"]) <= 24
    assert all(m["reason"] for m in status["members"])
    ready = c.find(status["conditions"], c.READY)
    degraded = c.find(status["conditions"], c.DEGRADED)
    assert ready["status"] == "True" and ready["observedGeneration"] == 3
    assert degraded["status"] == "True" and "absent: no such PDCluster" in degraded["message"]
    # an Event per member whose grant changed; none when the split stands
    events = pool_events(None, decision, None)
    assert len(events) == 3
    assert {r for _, r, _ in events} >= {"PoolTrim"}
    assert pool_events(status, decision, None) == []
    # a pool that cannot be planned says so once
    problem = "no member to plan"
    assert pool_events(status, None, problem) == [("Warning", "PoolNotPlanned", problem)]
    failed = pool_status(found[0], 3, pool_nodes=24, decision=None, problem=problem,
                         previous=status, now="2027-01-01T00:01:00Z")
    assert c.find(failed["conditions"], c.READY)["status"] == "False"
    assert failed["members"] == status["members"]  # the last split stays visible
    assert pool_events(failed, None, problem) == []


# -- one tick against an in-memory API ------------------------------------------------------------
class FakeKube:
    """The calls the pool loop and the planner memory make, on dicts."""

    def __init__(self, pools: list[dict]):
        self.pools = pools
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.statuses: list[tuple[str, str, dict]] = []
        self.events: list[dict] = []
        self.writes = 0

    def list_pdpools(self) -> list[dict]:
        return copy.deepcopy(self.pools)

    def list_nodes(self, labels: dict) -> list[dict]:
        raise AssertionError("the pool states its nodes")

    def get(self, kind: str, ns: str, name: str) -> dict | None:
        return copy.deepcopy(self.objects.get((kind, ns, name)))

    def apply(self, manifest: dict, *, force: bool = True) -> dict:
        meta = manifest["metadata"]
        self.objects[(manifest["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(manifest)
        return manifest

    create = apply

    def patch_status(self, ns: str, name: str, status: dict, *, kind: str = "PDCluster") -> dict:
        self.statuses.append((kind, name, status))
        return {}

    def create_event(self, event: dict) -> dict:
        self.events.append(event)
        return event


def test_one_tick_plans_the_members_together_and_saves_each_command(monkeypatch):
    from pdscale.operator.loop import planner_loop as pl
    from pdscale.operator.loop import pools
    from pdscale.planner.prometheus import MetricsSnapshot

    kube = FakeKube([pool_body([{"name": "high", "priority": 100}, {"name": "low", "priority": 1}],
                               nodes=10, horizonSeconds=900, surplusPricePercent=75)])
    planned_with: list[tuple[float, float]] = []
    plan = pools.plan_pool

    def spy(inputs, **kw):  # the pool's own horizon and surplus price reach the joint solve
        planned_with.append((kw["horizon_seconds"], kw["surplus_price"]))
        return plan(inputs, **kw)

    monkeypatch.setattr(pools, "plan_pool", spy)
    loop = pl.PlannerLoop(kube, worker_lists=object(), drains=object())  # type: ignore[arg-type]
    loads = {"high": 10.0, "low": 10.0}

    def metrics(self, spec, ns, name, now, percentile):
        return MetricsSnapshot({}, {})

    monkeypatch.setattr(pl.PlannerLoop, "_read_metrics", metrics)
    monkeypatch.setattr(pl, "observation_from", lambda snap, now, p, d: Observation(
        now_seconds=now, rate_rps=Reading(loads[current[0]], now),
        mean_input_tokens=Reading(ISL, now), mean_output_tokens=Reading(OSL, now),
        prefix_hit_rate=Reading(0.3, now), prefill=p, decode=d))
    current = [""]
    original = pl.PlannerLoop._prepare

    def prepare(self, body, spec, pods, now, *, force=False, ordered=None):
        current[0] = body["metadata"]["name"]
        return original(self, body, spec, pods, now, force=force, ordered=ordered)

    monkeypatch.setattr(pl.PlannerLoop, "_prepare", prepare)
    bodies = keyed(pdc("high", {"name": "shared"}), pdc("low", {"name": "shared"}),
                   pdc("alone"))

    def one_each(body):  # each member's fleet as its reconcile built it: a pod per role
        return ({r: [PodView(f"{r.value}-0", r.value, "10.0.0.1", True, 0.0)] for r in pl.Role},
                {r: None for r in pl.Role})

    members = loop.pools.tick(bodies, one_each, NOW)
    assert members == {f"{NS}/high", f"{NS}/low"}
    assert planned_with == [(900.0, 0.75)]
    (_kind, name, status), = [s for s in kube.statuses if s[0] == "PDPool"]
    assert (name, status["nodes"]) == ("shared", 10)
    granted = {m["name"]: m["grantedNodes"] for m in status["members"]}
    assert sum(granted.values()) <= 10 and granted["high"] > granted["low"]
    # each member's memory holds its command: its own tick moves there (within its grant)
    for n in ("high", "low"):
        decision, _ = loop._in_force(bodies[f"{NS}/{n}"], PDClusterSpec.model_validate(
            bodies[f"{NS}/{n}"]["spec"]), NOW)
        assert decision is not None and decision.prefill + decision.decode <= granted[n]
        assert "pool: " in decision.explanation
    assert any(e["involvedObject"]["kind"] == "PDPool" for e in kube.events)
    # the next tick, not due: no plan, no write
    kube.statuses.clear()
    kube.pools[0]["status"] = status
    loop.pools.tick(bodies, one_each, NOW + 1)
    assert kube.statuses == []
