"""The planner's decision and its explanation: the Decision from a solved programme, the
hold when nothing can be planned, and the clauses a user can check."""

from __future__ import annotations

import math

import numpy as np

from .config import PlannerConfig
from .decision import Decision
from .forecast import LeadRisk
from .history import History
from .model import PREFILL_BUSY_FLOOR_PRIOR, Load
from .needs import _Needs
from .observe import Observation, Role
from .program import _Outcome
from .schedule import ScheduledFloor, floor_at
from .seasonal import WEEKDAYS
from .timing import _Timing


def _clamp(p: int, d: int, cfg: PlannerConfig) -> tuple[int, int, list[str]]:
    """Counts moved into the current bounds: each role within its min and max, then both
    within the node budget, cutting each role in proportion to what it has above its min.
    The minima win over the budget (a config may ask for more than the budget holds)."""
    why = []
    if p > cfg.max_prefill or p < cfg.min_prefill:
        why.append(f"prefill bounds [{cfg.min_prefill}, {cfg.max_prefill}]")
        p = min(max(p, cfg.min_prefill), cfg.max_prefill)
    if d > cfg.max_decode or d < cfg.min_decode:
        why.append(f"decode bounds [{cfg.min_decode}, {cfg.max_decode}]")
        d = min(max(d, cfg.min_decode), cfg.max_decode)
    kp, kd = cfg.nodes_per_instance  # the budget counts nodes, the cuts whole instances
    over = p * kp + d * kd - cfg.nodes
    if over > 0:
        room_p, room_d = p - cfg.min_prefill, d - cfg.min_decode
        cut_p = min(room_p, -(-(over * room_p * kp // max(room_p * kp + room_d * kd, 1)) // kp))
        cut_d = min(room_d, -(-max(over - cut_p * kp, 0) // kd))
        cut_p = min(room_p, -(-max(over - cut_d * kd, 0) // kp))
        p, d = p - cut_p, d - cut_d
        why.append(f"node budget {cfg.nodes}"
                   + (" (the minima exceed it)" if p * kp + d * kd > cfg.nodes else ""))
    return p, d, why


def _decision(
    cfg: PlannerConfig, now: float, load: Load, future: list[Load], needs: _Needs,
    timing: _Timing, floor: np.ndarray, outcome: _Outcome, how: str,
    risk: tuple[LeadRisk, LeadRisk] | None = None,
) -> Decision:
    """The decision for the interval at ``now``: the first interval's counts, the predicted
    latencies of what serves then, the horizon's cost and plan, and why."""
    model, serve = cfg.model, outcome.serve
    shortfall = bool(outcome.short.sum() > 1e-6) or bool(needs.over.any())
    return Decision(
        at_seconds=now,
        prefill=outcome.target[0],
        decode=outcome.target[1],
        predicted_ttft_seconds=model.predicted_ttft_seconds(future[0], int(serve[0, 0]), cfg.slo.percentile),
        predicted_tpot_seconds=model.predicted_tpot_seconds(future[0], int(serve[1, 0])),
        cost_gpu_hours=outcome.cost_gpu_hours,
        explanation=_explain(cfg, load, future, needs, timing, floor, outcome, risk),
        switch_to_prefill=outcome.switched[0],
        switch_to_decode=outcome.switched[1],
        shortfall=shortfall,
        plan=tuple((int(a), int(b)) for a, b in zip(serve[0], serve[1], strict=True)),
        desired=needs.desired,
        # the horizon's need up to the first interval a node ordered now serves
        lead_need=_lead_need(needs, timing),
        solver=how,
    )


def _lead_need(needs: _Needs, timing: _Timing) -> tuple[int, int]:
    """The most each role needs (for its load: a scheduled floor is no load) up to the first
    interval a node ordered now serves."""
    need = needs.need if needs.from_load is None else needs.from_load
    peak = need[:, : timing.new_node + 1].max(axis=1)
    return int(peak[0]), int(peak[1])


def _hold(obs: Observation, history: History, now: float, why: str, cfg: PlannerConfig) -> Decision:
    """Hold the previous decision (or, with none, the current counts), inside the current
    bounds: a hold after a lowered max or budget lowers the target to it."""
    if history.decisions:
        last = history.decisions[-1]
        p, d = last.prefill, last.decode
        src = "the previous decision"
    else:
        p, d = _committed_or(obs, Role.PREFILL, cfg.min_prefill), _committed_or(obs, Role.DECODE, cfg.min_decode)
        src = "the current counts"
    text = f"{why}: holding {src} {p}P{d}D (unknown is not zero)"
    # what the scale-down window remembers: the fleet held, never a scheduled floor
    unfloored = _clamp(p, d, cfg)[:2]
    # a window open now holds its floor whatever the metrics say (KEDA's cron scaler reads none)
    fp, fd, open_now = _floor_now(cfg, now)
    if fp > p or fd > d:
        raised = [f.describe() for f in open_now if f.min_prefill > p or f.min_decode > d]
        p, d = max(p, fp), max(d, fd)
        text += f"; raised to {p}P{d}D by {'; '.join(raised)}"
    hp, hd, clamped = _clamp(p, d, cfg)
    if clamped:
        text += f"; clamped to {hp}P{hd}D by the {' and '.join(clamped)} (scaled down through drains)"
    return Decision(
        at_seconds=now,
        prefill=hp,
        decode=hd,
        predicted_ttft_seconds=math.nan,
        predicted_tpot_seconds=math.nan,
        cost_gpu_hours=math.nan,
        explanation=text,
        held=True,
        desired=history.decisions[-1].desired if history.decisions else unfloored,
    )


def _floor_now(cfg: PlannerConfig, now: float) -> tuple[int, int, tuple[ScheduledFloor, ...]]:
    """``schedule.floor_at`` for the planner's ``now``; none for a time no clock can read (a
    hold must not fail on the time that made it hold)."""
    try:
        return floor_at(cfg.schedules, cfg.clock_origin_unix_seconds + now)
    except (TypeError, ValueError, OverflowError, OSError):
        return 0, 0, ()


def _committed_or(obs: Observation, role: Role, default: int) -> int:
    """The role's ready + warming instances, or ``default`` when the observation does not
    hold a count (a hold on a broken observation must not break too)."""
    st = getattr(obs, role.value, None)
    ready, warming = getattr(st, "ready", None), getattr(st, "warming", None)
    if isinstance(ready, int) and not isinstance(ready, bool) and isinstance(warming, tuple):
        return max(0, ready) + len(warming)
    return default


def _explain(
    cfg: PlannerConfig, load: Load, future: list[Load], needs: _Needs, timing: _Timing,
    floor: np.ndarray, outcome: _Outcome, risk: tuple[LeadRisk, LeadRisk] | None = None,
) -> str:
    """A few clauses a user can check: load, what bound the counts, what was traded."""
    return "; ".join([
        *_load_clauses(cfg, load, future, needs, outcome, timing.interval),
        *_risk_clauses(risk),
        *_action_clauses(needs, timing, outcome),
        *_schedule_clauses(cfg, needs, timing),
        *_limit_clauses(cfg, needs, timing, floor, outcome),
    ])


def _schedule_clauses(cfg: PlannerConfig, needs: _Needs, timing: _Timing) -> list[str]:
    """The scheduled floors that raise a need over the horizon: in force now (``scheduled
    floor 'business-hours': prefill >= 6``), or opening later, ordered a warm-up ahead."""
    sched, from_load = needs.scheduled, needs.from_load
    if sched is None or from_load is None:
        return []
    by_name = {f.name: f for f in cfg.schedules}
    parts: list[str] = []
    seen: set[str] = set()
    for k, names in enumerate(sched.names):
        for name in names:
            f = by_name[name]
            binds = f.min_prefill > from_load[0, k] or f.min_decode > from_load[1, k]
            if name in seen or not binds:
                continue
            seen.add(name)
            if k == 0:
                parts.append(f.describe())
            else:
                ahead = " (its capacity ordered a warm-up ahead)" if k <= timing.new_node else ""
                parts.append(f"{f.describe()} from interval +{k}{ahead}")
    return parts


_ROLES = ("prefill", "decode")


def _load_clauses(
    cfg: PlannerConfig, load: Load, future: list[Load], needs: _Needs, outcome: _Outcome,
    interval: float,
) -> list[str]:
    """The load now and ahead, what it needs, learned headroom, and which role binds."""
    parts = [
        f"{load.rate_rps:.1f} req/s, in {load.mean_input_tokens:.0f} / out "
        f"{load.mean_output_tokens:.0f} tok, hit {load.prefix_hit_rate:.0%}"
    ]
    peak = max(f.rate_rps for f in future)
    if peak > load.rate_rps * 1.05:
        parts.append(f"forecast peak {peak:.1f} req/s within {len(future) * interval / 60:.0f} min")
    need, desired = needs.need, needs.desired
    parts.append(f"needs {desired[0]}P{desired[1]}D now, up to {int(need[0].max())}P{int(need[1].max())}D")
    if needs.decode_from_sequences:
        parts.append(f"decode {needs.decode_from_sequences} for the sequences running now "
                     "(rates and lengths lag: they are counted as requests finish)")
    cal = cfg.model.calibration
    model, context = cfg.model, cfg.model.decode_mean_context(load)
    at_cap = model.fluid_demand(load, cfg.slo)[1] / cfg.decode_utilization
    if model.decode_instances_at_percentile(load, cfg.slo) > at_cap:
        parts.append(
            f"decode at {model.decode_sequences_at_percentile(cfg.slo, context):.2f} sequences "
            f"per instance on average, so that a request at p{100 * cfg.slo.percentile:g} finds "
            f"a batch within the TPOT target's "
            f"{model.decode_batch_limit(cfg.slo.tpot_seconds, context):.2f} "
            "(batches this small vary more than the utilisation cap allows for)")
    learned = [f"{n} x{h:.2f}" for n, h in zip(_ROLES, (cal.prefill_headroom, cal.decode_headroom),
                                               strict=True) if h > 1.0 + 1e-9]
    if learned:
        parts.append(f"headroom {', '.join(learned)} (learned from misses at the SLO percentile "
                     "on a settled fleet; prefill's given back while its idle instances still miss)")
    if cal.prefill_busy_floor > PREFILL_BUSY_FLOOR_PRIOR + 0.005:
        parts.append(f"prefill TTFT misses below {cal.prefill_busy_floor:.0%} busy at the burst peak "
                     "teach no headroom (a raise that did not cut them was given back)")
    speeds = [f"{n} x{1.0 / f:.2f}" for n, f in zip(_ROLES, (cal.prefill_factor, cal.decode_factor),
                                                   strict=True) if abs(f - 1.0) > 1e-3]
    if speeds:
        parts.append(f"fleet speed vs profile {', '.join(speeds)} (learned from the engines' "
                     "TPOT, TTFT and prefill throughput; sized with it)")
    # which role binds: the one whose capacity is closest to its need (share of headroom)
    ratio = [float(outcome.serve[r, 0] / max(need[r, 0], 1e-9)) for r in (0, 1)]
    bound = _ROLES[int(np.argmin(ratio))]
    parts.append(f"bound by {bound} ({'TTFT' if bound == 'prefill' else 'TPOT'} at the utilisation cap)")
    return parts


def _risk_clauses(risk: tuple[LeadRisk, LeadRisk] | None) -> list[str]:
    """How each role's forecast was raised for the risk over the lead, where it was: the rate
    sized for when capacity ordered now serves, against the recent max, and why (a ramp carried
    to the lead, the margin for what the forecast has missed)."""
    parts = []
    for name, r in zip(_ROLES, risk or (), strict=False):
        if r.quantile <= 0 or r.at_lead_rps <= r.base_rps * 1.005:
            continue
        why = []
        daily = r.seasonal / r.weekly
        if r.season_days and abs(daily - 1.0) > 0.005:
            why.append(f"x{daily:.2f} by the time of day over {r.season_days} earlier day(s)")
        if r.season_weeks and abs(r.weekly - 1.0) > 0.005:
            why.append(f"x{r.weekly:.2f} for a {WEEKDAYS[r.weekday]} over {r.season_weeks} "
                       f"earlier week(s)")
        if r.carried:
            why.append(f"rising: the ramp carried to the lead, at most x{r.bound:.2f}")
        elif r.margin > 1.0 + 1e-9 and not r.learned:
            why.append(f"x{r.margin:.2f} held for a rise not yet learned (the prior)")
        elif r.margin > 1.0 + 1e-9:
            why.append(f"x{r.margin:.2f} for what the forecast missed")
        else:
            why.append("rising: the ramp extrapolated, damped")
        learned = (f"p{100 * r.quantile:g} of {r.samples} past leads" if r.learned
                   else f"{r.samples} past lead(s), too few to learn the risk from")
        parts.append(f"{name} sized for {r.at_lead_rps:.1f} req/s a lead ({r.lead} intervals: warm-up + "
                     f"one) ahead, recent max {r.base_rps:.1f} ({', '.join(why)}; {learned})")
    return parts


def _action_clauses(needs: _Needs, timing: _Timing, outcome: _Outcome) -> list[str]:
    """What changes now: instances added or removed per role, switches, warm-up lead."""
    target, committed0, sw = outcome.target, timing.committed0, outcome.switched
    act = []
    for r in (0, 1):
        delta = target[r] - int(committed0[r])
        if delta > 0:
            act.append(f"+{delta} {_ROLES[r]}")
        elif delta < 0:
            act.append(f"{delta} {_ROLES[r]}")
    if sw[0]:
        act.append(f"switch {sw[0]} decode->prefill (cheaper than a new node)")
    if sw[1]:
        act.append(f"switch {sw[1]} prefill->decode (cheaper than a new node)")
    if not act:
        return ["no change"]
    parts = ["; ".join(act)]
    if any(target[r] > committed0[r] for r in (0, 1)):
        parts.append(f"new nodes serve after {timing.new_node} interval(s) of warm-up")
    return parts


def _limit_clauses(
    cfg: PlannerConfig, needs: _Needs, timing: _Timing, floor: np.ndarray, outcome: _Outcome
) -> list[str]:
    """What held the counts away from the need: the scale-down window or the cost of
    re-warming, the node budget, capacity still warming up."""
    target, desired, committed0 = outcome.target, needs.desired, timing.committed0
    parts = []
    for r in (0, 1):
        if target[r] > desired[r] and target[r] <= committed0[r]:
            why = (
                f"stabilisation window {cfg.stabilization_seconds:.0f}s"
                if floor[r] >= target[r]
                else "dropping and re-warming costs more than keeping"
            )
            parts.append(f"kept {target[r] - desired[r]} {_ROLES[r]} above need ({why})")
    over, uncapped, need = needs.over, needs.uncapped, needs.need
    if over.any():
        t_first = int(np.argmax(over))
        k = int(np.argmax(uncapped.sum(axis=0)))
        parts.append(
            f"OVER BUDGET: {cfg.nodes} nodes < need {int(uncapped[0, k])}P{int(uncapped[1, k])}D "
            f"from interval +{t_first}; budget split to cover each role's fluid demand first, the "
            f"rest in proportion to their margins ({int(need[0, k])}P{int(need[1, k])}D)"
        )
    short = outcome.short
    if short.sum() > 1e-6:
        t_last = int(np.nonzero(short.sum(axis=0) > 1e-6)[0].max())
        parts.append(
            f"short by up to {int(np.ceil(short[0].max()))}P{int(np.ceil(short[1].max()))}D "
            f"until interval +{t_last}: capacity is still warming up"
        )
    if outcome.provisioned.max() >= cfg.nodes - 1e-6:
        parts.append(f"node budget {cfg.nodes} reached")
    return parts
