"""A PDPool's planner inside the operator, pure parts: who plans in the pool this tick, the
joint plan over them, and the pool's status and Events.

The loop that calls these (read every member, plan, save, act, report) is in
``planner_loop.py``; the joint grant and each member's command within it are the planner's
(``pdscale.planner.pool``), the same code the replay (``pdscale replay-pool``) runs.

A member is a PDCluster that names the pool in ``spec.planner.pool`` *and* that the pool
lists in ``members`` (``pdpool.pool_refusal``): asking alone is not joining. The pool plans
when any member's plan falls due, and then plans them all together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.api.pdpool import PDPoolSpec, PoolMember, pool_refusal
from pdscale.operator.reconciler import conditions as c
from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.history import History
from pdscale.planner.observe import Observation
from pdscale.planner.pool import PoolDecision, member_command, member_need, solve_pool
from pdscale.planner.solve import step

# Pool condition reasons and Event reasons (a pool's own; the PDCluster's are conditions.py's).
POOL_PLANNED = "Planned"
POOL_NOT_PLANNED = "NotPlanned"
MEMBERS_JOINED = "MembersJoined"
MEMBER_NOT_PLANNED = "MemberNotPlanned"
EVENT_POOL_GRANT = "PoolGrant"
EVENT_POOL_TRIM = "PoolTrim"
EVENT_POOL_NOT_PLANNED = "PoolNotPlanned"


@dataclass(frozen=True)
class Membership:
    """One pool's members this tick: (PDCluster body, its entry in the pool) of those that
    joined, and why each PDCluster the pool lists did not (by name)."""

    pool_key: str
    body: dict[str, Any]
    spec: PDPoolSpec
    members: tuple[tuple[dict[str, Any], PoolMember], ...]
    absent: Mapping[str, str]


def key_of(body: Mapping[str, Any]) -> str:
    meta = body["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def memberships(pools: Sequence[dict[str, Any]], pdclusters: Mapping[str, dict[str, Any]]
                ) -> tuple[list[Membership], dict[str, str]]:
    """Every valid pool's members, and why each PDCluster naming a pool is refused (by its
    ``namespace/name``): the same rule as its PoolMember condition. A PDCluster whose spec is
    invalid is left to the reconcile (SpecValid=False) and joins nothing."""
    by_key = {key_of(p): p for p in pools}
    specs: dict[str, PDClusterSpec] = {}
    refused: dict[str, str] = {}
    joined: dict[str, list[str]] = {}
    for key, body in pdclusters.items():
        try:
            spec = PDClusterSpec.model_validate(body.get("spec") or {})
        except ValueError:
            continue
        ref = spec.planner.pool
        if ref is None:
            continue
        specs[key] = spec
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        pool = by_key.get(f"{ns}/{ref.name}") if ref.namespace in (None, ns) else None
        why = pool_refusal(ns, name, ref, spec.placement.gpu_product, pool)
        if why is None:
            joined.setdefault(f"{ns}/{ref.name}", []).append(key)
        else:
            refused[key] = why
    out = []
    for pool_key, pool in sorted(by_key.items()):
        try:
            pool_spec = PDPoolSpec.model_validate(pool.get("spec") or {})
        except ValueError:
            continue
        ns = pool["metadata"]["namespace"]
        mine = set(joined.get(pool_key, []))
        members, absent = [], {}
        for m in pool_spec.members:
            key = f"{ns}/{m.name}"
            if key in mine:
                members.append((pdclusters[key], m))
            elif key not in pdclusters:
                absent[m.name] = "no such PDCluster"
            elif key in specs:
                absent[m.name] = refused.get(key, "names another pool")
            else:
                absent[m.name] = "does not name this pool in spec.planner.pool (or its spec is invalid)"
        out.append(Membership(pool_key, pool, pool_spec, tuple(members), absent))
    return out, refused


@dataclass(frozen=True)
class MemberInput:
    """One member as its planner sees it this interval."""

    name: str
    entry: PoolMember
    obs: Observation
    config: PlannerConfig
    history: History
    #: its own nodeBudget (None: the pool)
    cap_nodes: int | None


@dataclass(frozen=True)
class MemberPlan:
    command: Decision
    #: the memory to save: its planner's, the last decision replaced by the command (the
    #: operator moves to the remembered decision between plans: the uncut one would start
    #: pods the pool has no node for)
    history: History
    budget_nodes: int


def floor_nodes(m: MemberInput) -> int:
    """Nodes a member holds whatever its grant: its guarantee, or its minReplicas where more
    (its planner never goes below them: granted less, it would hold nodes the pool gave to
    another member, whose pod would then wait, Pending)."""
    kp, kd = m.config.nodes_per_instance
    return max(m.entry.guaranteed_nodes, m.config.min_prefill * kp + m.config.min_decode * kd)


def plan_pool(inputs: Sequence[MemberInput], *, pool_nodes: int, horizon_seconds: float,
              now: float, surplus_price: float = 0.0) -> tuple[PoolDecision, dict[str, MemberPlan]]:
    """One joint plan over the members (pure): each states its need (its own planner with
    no budget but its cap), ``solve_pool`` divides the pool, each plans within its grant
    (``pdscale.planner.pool``), each guaranteed its ``floor_nodes``. ``pool_nodes``: the
    pool less the nodes held by listed members that could not be planned this interval
    (they are not free); the floors must fit in it (``solve_pool`` refuses them else).
    ``surplus_price``: the pool's ``surplusPricePercent`` / 100 (``solve_pool``'s rule 5)."""
    probes, steppers = [], []
    for m in inputs:
        def stepper(config: PlannerConfig, history: History,
                    obs: Observation = m.obs) -> tuple[Decision, History]:
            return step(obs, config=config, history=history, now=now)

        cap = pool_nodes if m.cap_nodes is None else min(m.cap_nodes, pool_nodes)
        steppers.append(stepper)
        probes.append(member_need(m.name, m.obs, config=m.config, history=m.history,
                                  stepper=stepper, priority=m.entry.priority,
                                  guaranteed_nodes=min(floor_nodes(m), pool_nodes),
                                  cap_nodes=cap))
    decision = solve_pool([p.need for p in probes], pool_nodes=pool_nodes,
                          horizon_seconds=horizon_seconds, surplus_price=surplus_price)
    plans = {}
    for m, probe, stepper in zip(inputs, probes, steppers, strict=True):
        # the operator scales each role's workload: a node one role drains is not reused by
        # the other, whose new pod would wait for it (Pending): no role switch is counted
        command, memory, budget = member_command(probe, decision, config=m.config,
                                                 history=m.history, stepper=stepper,
                                                 role_switch=False)
        remembered = replace(memory, decisions=(*memory.decisions[:-1], command))
        plans[m.name] = MemberPlan(command=command, history=remembered, budget_nodes=budget)
    return decision, plans


def pool_status(membership: Membership, generation: int, *, pool_nodes: int | None,
                decision: PoolDecision | None, problem: str | None,
                previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """The PDPool's status (pure): the split per member and why, conditions with
    observedGeneration. ``problem``: why the pool was not planned this time (None: it was,
    or it was not due and ``decision`` is None: the split stays as it was)."""
    prev = dict(previous or {})
    conds = []
    if problem is not None:
        conds.append(c.condition(c.READY, False, POOL_NOT_PLANNED, problem, generation))
    else:
        conds.append(c.condition(c.READY, True, POOL_PLANNED,
                                 f"{len(membership.members)} members planned together",
                                 generation))
    absent = "; ".join(f"{n}: {why}" for n, why in sorted(membership.absent.items()))
    conds.append(c.condition(c.DEGRADED, bool(absent), MEMBER_NOT_PLANNED if absent
                             else MEMBERS_JOINED, absent or "every listed member joined",
                             generation))
    status: dict[str, Any] = {"observedGeneration": generation,
                              "conditions": c.merge(prev.get("conditions"), conds, now)}
    if pool_nodes is not None:
        status["nodes"] = pool_nodes
    if decision is not None:
        status["grantedNodes"] = sum(g.nodes for g in decision.grants)
        status["members"] = [{"name": g.name, "grantedNodes": g.nodes, "neededNodes": g.need,
                              "heldNodes": g.current, "reason": g.reason}
                             for g in decision.grants]
    else:
        for field in ("grantedNodes", "members"):
            if field in prev:
                status[field] = prev[field]
    return status


def pool_events(previous: Mapping[str, Any] | None, decision: PoolDecision | None,
                problem: str | None) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events this plan makes on the PDPool: one per member
    whose grant changed (a Warning where it gives up nodes), and one when the pool cannot be
    planned (once: not again while the message stays)."""
    prev = dict(previous or {})
    out = []
    if problem is not None:
        ready = c.find(prev.get("conditions"), c.READY)
        if ready is None or ready.get("message") != problem:
            out.append(("Warning", EVENT_POOL_NOT_PLANNED, problem))
        return out
    if decision is None:
        return out
    before = {m.get("name"): m.get("grantedNodes") for m in prev.get("members") or []}
    for g in decision.grants:
        if before.get(g.name) == g.nodes:
            continue
        was = before.get(g.name)
        trimmed = g.trimmed > 0
        out.append(("Warning" if trimmed else "Normal",
                    EVENT_POOL_TRIM if trimmed else EVENT_POOL_GRANT,
                    f"{g.name}: {'none' if was is None else was} -> {g.nodes} nodes: {g.reason}"))
    return out
