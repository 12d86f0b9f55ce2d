"""Several PDClusters, one trace each, on one pool of nodes: the pooled plan against each
member planning alone on a static even split, and against an oracle over the pool.

``pooled`` runs every member's own planner (``solve.step``, as the operator does) in lockstep
with the others: at each tick each member states what it would command with no budget (its
need), the pool's joint grant (:func:`pdscale.planner.pool.solve_pool`) divides the pool,
and each member plans within its grant as within a ``nodeBudget``. ``split`` runs each member
alone on ``pool / members`` nodes (the admin's static split). ``oracle`` is ``pooled`` with
every member's planner told its true future load and the fleet's true speed (the single
member's ``oracle`` policy), under the same joint grant: the pool's hindsight bound.

The members' simulations run in threads, one per member, that meet at every tick (the
simulator is one loop per fleet); the threads only take turns, so the run is deterministic
and as slow as the members' simulations one after the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..config import PlannerConfig
from ..decision import Decision
from ..history import History
from ..model import Load
from ..observe import Observation
from ..pool import (
    MemberNeed,
    PoolDecision,
    even_split,
    member_command,
    member_need,
    solve_pool,
)
from .policies import PdscaleController
from .run import (
    ReplaySetup,
    initial_fleet,
    planner_config,
    planner_controller,
    run_policy,
    simulate_fleet,
    summarize,
)
from .simulate import SimResult

#: the policies :func:`run_pool` compares
POOL_POLICIES = ("pooled", "split", "oracle")


@dataclass(frozen=True)
class PoolMemberSetup:
    """One member: its replay (trace, planner configuration: its ``nodeBudget`` is its cap),
    its priority and guarantee in the pool, and the loads before its scored window."""

    name: str
    setup: ReplaySetup
    priority: int = 0
    guaranteed_nodes: int = 0
    history: Sequence[Load] | None = None


class _Meeting:
    """Where the members' threads meet at each tick: the pool's grant at tick ``t`` is
    solved once every member still running has stated its need for ``t`` (or later)."""

    def __init__(self, names: Sequence[str], pool_nodes: int, horizon_seconds: float,
                 surplus_price: float = 0.0) -> None:
        self.names = list(names)
        self.pool_nodes, self.horizon = pool_nodes, horizon_seconds
        self.surplus_price = surplus_price
        self.cond = threading.Condition()
        self.posted: dict[str, tuple[float, MemberNeed]] = {}
        self.done: set[str] = set()
        self.decisions: dict[float, PoolDecision] = {}
        self.failed: BaseException | None = None

    def grant(self, name: str, t: float, need: MemberNeed) -> PoolDecision:
        with self.cond:
            self.posted[name] = (t, need)
            self.cond.notify_all()
            while t not in self.decisions:
                if self.failed is not None:
                    raise RuntimeError("another member's replay failed") from self.failed
                live = [n for n in self.names if n not in self.done]
                if all(n in self.posted and self.posted[n][0] >= t - 1e-6 for n in live):
                    needs = [self.posted[n][1] for n in live]
                    self.decisions[t] = solve_pool(needs, pool_nodes=self.pool_nodes,
                                                   horizon_seconds=self.horizon,
                                                   surplus_price=self.surplus_price)
                    self.cond.notify_all()
                    break
                self.cond.wait()
            return self.decisions[t]

    def finish(self, name: str, error: BaseException | None = None) -> None:
        with self.cond:
            self.done.add(name)
            if error is not None:
                self.failed = error
            self.cond.notify_all()


@dataclass
class PooledController:
    """A member's planner inside the pool: its need with no budget (a probe of its own
    ``step`` on a copy of its memory), the pool's grant, then its plan within the grant."""

    name: str
    inner: PdscaleController
    meeting: _Meeting
    priority: int
    guaranteed_nodes: int
    cap_nodes: int
    grants: list[dict[str, Any]] = field(default_factory=list)
    #: diagnostics: also probe what the member's planner would command alone on this many
    #: nodes (its even split's share) each tick, recorded in ``grants`` (None: not probed)
    split_cap: int | None = None

    def __call__(self, obs: Observation) -> tuple[int, int, int, int]:
        inner = self.inner
        cfg = inner.config

        def stepper(config: PlannerConfig, history: History) -> tuple[Decision, History]:
            return inner.plan(obs, config, history)

        probe_history = inner.history
        probe = member_need(self.name, obs, config=cfg, history=inner.history, stepper=stepper,
                            priority=self.priority, guaranteed_nodes=self.guaranteed_nodes,
                            cap_nodes=self.cap_nodes)
        decision = self.meeting.grant(self.name, obs.now_seconds, probe.need)
        command, inner.history, budget = member_command(probe, decision, config=cfg,
                                                        history=inner.history, stepper=stepper)
        inner.decisions.append(inner.history.decisions[-1].explanation)
        grant = decision.grant(self.name)
        kp, kd = cfg.nodes_per_instance
        alone = probe.alone
        row = {"t": round(obs.now_seconds, 1), "granted": grant.nodes,
               "budget": budget, "need": grant.need, "held": grant.current,
               "commanded": command.prefill * kp + command.decode * kd,
               "desired": alone.desired[0] * kp + alone.desired[1] * kd,
               "lead_need": alone.lead_need[0] * kp + alone.lead_need[1] * kd,
               "busy": probe.need.busy, "reason": grant.reason,
               "measured": [r.fresh(obs.now_seconds, cfg.max_age_seconds)
                            if r is not None else None
                            for r in (obs.ttft_at_percentile_seconds, obs.tpot_at_percentile_seconds)]}
        if self.split_cap is not None:
            at_split, _ = stepper(replace(cfg, nodes=self.split_cap), probe_history)
            row["alone_at_split"] = at_split.prefill * kp + at_split.decode * kd
            row["split_pred"] = (round(at_split.predicted_ttft_seconds, 3),
                                 round(at_split.predicted_tpot_seconds, 4), at_split.shortfall)
            row["alone_pred"] = (round(alone.predicted_ttft_seconds, 3),
                                 round(alone.predicted_tpot_seconds, 4), alone.shortfall)
        self.grants.append(row)
        return (command.prefill, command.decode, command.switch_to_prefill,
                command.switch_to_decode)


def _member_setup(m: PoolMemberSetup, pool_nodes: int, *, nodes: int) -> ReplaySetup:
    """The member's replay with a budget of ``nodes`` (at most its own nodeBudget) and the
    pool's tick schedule (every member ticks at the same multiples of the interval)."""
    cap = min(m.setup.nodes, pool_nodes)
    return replace(m.setup, planner=replace(m.setup.planner, nodes=min(nodes, cap)),
                   tick_phase_seconds=0.0)


def _check(members: Sequence[PoolMemberSetup], pool_nodes: int) -> None:
    if not members:
        raise ValueError("members: at least one")
    intervals = {m.setup.interval_seconds for m in members}
    if len(intervals) != 1:
        raise ValueError(f"members must share one planning interval, got {sorted(intervals)}")
    if len({m.name for m in members}) != len(members):
        raise ValueError("members: names must be unique")
    if sum(m.guaranteed_nodes for m in members) > pool_nodes:
        raise ValueError("members' guaranteed nodes sum to more than the pool")


def _run_joint(members: Sequence[PoolMemberSetup], pool_nodes: int, horizon_seconds: float,
               oracle: bool, probe_split: bool = False,
               surplus_price: float = 0.0) -> tuple[list[SimResult], list[PooledController], list[ReplaySetup]]:
    meeting = _Meeting([m.name for m in members], pool_nodes, horizon_seconds, surplus_price)
    shares = even_split([m.name for m in members], pool_nodes)
    setups, controllers, starts = [], [], []
    for m in members:
        cap = min(m.setup.nodes, pool_nodes)
        s = _member_setup(m, pool_nodes, nodes=cap)
        # every policy starts from the fleet its even share sizes (the split's start)
        start_setup = _member_setup(m, pool_nodes, nodes=shares[m.name])
        start = initial_fleet(start_setup.knowing_the_fleet() if oracle else start_setup, m.history)
        inner = planner_controller(s, "oracle" if oracle else "pdscale", m.history)
        setups.append(replace(s, planner=replace(s.planner, nodes=pool_nodes)))
        controllers.append(PooledController(
            m.name, inner, meeting, m.priority, m.guaranteed_nodes, cap,
            split_cap=min(shares[m.name], cap) if probe_split else None))
        starts.append(start)
    results: list[SimResult | None] = [None] * len(members)

    def work(i: int) -> None:
        error: BaseException | None = None
        try:
            results[i] = simulate_fleet(setups[i], starts[i], controllers[i], None)
        except BaseException as exc:  # handed to the other threads and the caller
            error = exc
            raise
        finally:
            meeting.finish(members[i].name, error)

    threads = [threading.Thread(target=work, args=(i,), name=f"pool-{m.name}")
               for i, m in enumerate(members)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if meeting.failed is not None or any(r is None for r in results):
        raise RuntimeError("a member's replay failed") from meeting.failed
    return [r for r in results if r is not None], controllers, setups


def _pool_usage(results: Sequence[SimResult], setups: Sequence[ReplaySetup]) -> dict[str, Any]:
    """The members' provisioned nodes summed per tick (the pool's use over time)."""
    by_t: dict[float, int] = {}
    for r, s in zip(results, setups, strict=True):
        kp, kd = s.planner.nodes_per_instance
        for t, _, _, pp, pd in r.ticks:
            key = round(t, 3)
            by_t[key] = by_t.get(key, 0) + pp * kp + pd * kd
    series = sorted(by_t.items())
    return {"peak_provisioned_nodes": max((n for _, n in series), default=0),
            "mean_provisioned_nodes": round(float(np.mean([n for _, n in series])), 2) if series else 0.0}


def _totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    requests = sum(r["requests"] for r in rows)
    met = sum(r["slo_attainment"] * r["requests"] for r in rows)
    return {"requests": requests,
            "slo_attainment": round(met / requests, 5) if requests else 1.0,
            "gpu_hours": round(sum(r["gpu_hours"] for r in rows), 3),
            "role_changes": sum(r["role_changes"] for r in rows)}


def _member_row(m: PoolMemberSetup, report: dict[str, Any]) -> dict[str, Any]:
    keep = ("policy", "trace", "requests", "slo_attainment", "slo_met", "gpu_hours",
            "role_changes", "ttft_p99", "tpot_p99", "rejected")
    row = {k: report[k] for k in keep}
    row.update(member=m.name, priority=m.priority, guaranteed_nodes=m.guaranteed_nodes)
    return row


def run_pool(
    members: Sequence[PoolMemberSetup],
    *,
    pool_nodes: int,
    policy: str,
    horizon_seconds: float = 1800.0,
    probe_split: bool = False,
    surplus_price: float = 0.0,
) -> dict[str, Any]:
    """Replay every member's trace under ``policy`` (:data:`POOL_POLICIES`) on one pool of
    ``pool_nodes`` nodes; the report per member and in total (JSON-ready).

    ``surplus_price``: the joint grant's price of a node beyond a member's fair share
    (:func:`pdscale.planner.pool.solve_pool`). ``probe_split`` (pooled and oracle; diagnostics, one more plan per member and tick): each
    grant row also says what the member's planner would command alone on its even share
    (``alone_at_split``), from the same memory."""
    _check(members, pool_nodes)
    if policy not in POOL_POLICIES:
        raise ValueError(f"policy must be one of {POOL_POLICIES}, got {policy!r}")
    started = time.perf_counter()
    if policy == "split":
        shares = even_split([m.name for m in members], pool_nodes)
        rows: list[dict[str, Any]] = []
        for m in members:
            s = _member_setup(m, pool_nodes, nodes=shares[m.name])
            report = run_policy(s, "pdscale", history=m.history)
            rows.append({**_member_row(m, report), "nodes": s.nodes,
                         "decisions": report["decisions"]})
        total = _totals(rows)
        # the split's members never exceed their shares: the pool's use is their sum
        peak = _split_peak(rows, members, pool_nodes)
        out: dict[str, Any] = {"policy": policy, "pool_nodes": pool_nodes, "members": rows,
                               "total": total, **peak}
    else:
        results_, controllers, setups_ = _run_joint(members, pool_nodes, horizon_seconds,
                                                    oracle=policy == "oracle",
                                                    probe_split=probe_split,
                                                    surplus_price=surplus_price)
        rows = []
        for m, r, c, s in zip(members, results_, controllers, setups_, strict=True):
            report = summarize(s, policy, r)
            rows.append({**_member_row(m, report), "nodes": min(m.setup.nodes, pool_nodes),
                         "grants": c.grants, "decisions": report["decisions"],
                         "explanations": [
                             {"t": g["t"], "why": why}
                             for g, why in zip(c.grants, c.inner.decisions, strict=False)]})
        out = {"policy": policy, "pool_nodes": pool_nodes, "members": rows,
               "total": _totals(rows), **_pool_usage(results_, setups_)}
    out["surplus_price"] = surplus_price
    out["horizon_seconds"] = horizon_seconds
    out["wall_seconds"] = round(time.perf_counter() - started, 2)
    return out


def _split_peak(rows: Sequence[dict[str, Any]], members: Sequence[PoolMemberSetup],
                pool_nodes: int) -> dict[str, Any]:
    by_t: dict[float, int] = {}
    for row, m in zip(rows, members, strict=True):
        kp, kd = planner_config(m.setup).nodes_per_instance
        for d in row["decisions"]:
            key = round(d["t"], 3)
            by_t[key] = by_t.get(key, 0) + d["provisioned_prefill"] * kp + d["provisioned_decode"] * kd
    series = sorted(by_t.items())
    return {"peak_provisioned_nodes": max((n for _, n in series), default=0),
            "mean_provisioned_nodes": round(float(np.mean([n for _, n in series])), 2) if series else 0.0}


def compare(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per member and a total row: attainment and GPU-hours under each policy."""
    names = [r["member"] for r in next(iter(reports.values()))["members"]]
    rows = []
    for i, name in enumerate([*names, "total"]):
        row: dict[str, Any] = {"member": name}
        for policy, rep in reports.items():
            src = rep["total"] if name == "total" else rep["members"][i]
            row[f"{policy}_attainment"] = src["slo_attainment"]
            row[f"{policy}_gpu_hours"] = src["gpu_hours"]
        rows.append(row)
    return rows
