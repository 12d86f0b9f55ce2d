"""The planner: choose prefill and decode counts over a horizon with scipy's MILP.

``plan(observation, config=..., history=..., now=...) -> Decision`` forecasts the load, turns
each future interval's load into the instance counts it needs (performance model), and solves
a small integer programme over the horizon:

    minimise   sum_t gpu_hours(provisioned_t)              (warming and draining included)
             + penalty * sum_{r,t} short_{r,t}             (instances missing vs need)
             + split   * sum_t share_t                     (largest fractional shortfall)
             + epsilon * (actions)                         (prefer doing nothing on a tie)
    s.t.       serving_{r,t} + short_{r,t} >= need_{r,t}
               short_{r,t} <= share_t * need_{r,t}         (shortfall divided in proportion)
               min_r <= committed_{r,t} <= max_r,  provisioned_t <= nodes
               per-interval steps up/down <= max step, committed_{r,0} >= stabilised floor

where a node started at t serves from t + warm-up(new node), a node switched into role r
serves from t + drain(other role) + warm-up(role switch), and a removed node holds its node
for its drain time. Only the first interval is applied (receding horizon); the next call
re-solves with fresh metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .config import PlannerConfig
from .decision import Decision
from .forecast import forecast, rise_margin
from .model import Calibration, Load, calibrate_slo
from .observe import Observation, Reading

__all__ = ["History", "PlannerConfig", "current_load", "plan", "recalibrate", "remember", "step"]


@dataclass(frozen=True)
class History:
    """What the planner remembers between calls: recent loads and decisions (oldest first)."""

    loads: tuple[Load | None, ...] = ()
    decisions: tuple[Decision, ...] = ()
    #: the model's online correction learned from past intervals' metrics (None: not yet,
    #: the configured model's own)
    calibration: Calibration | None = None
    #: keep at most this many entries
    max_len: int = 4096

    def record(self, load: Load | None, decision: Decision) -> History:
        """A new history with this interval appended (pure: the old one is unchanged)."""
        return replace(
            self,
            loads=(*self.loads, load)[-self.max_len :],
            decisions=(*self.decisions, decision)[-self.max_len :],
        )


def current_load(
    obs: Observation,
    max_age_seconds: float,
    *,
    backlog_seconds: float | None = None,
    last_known: Load | None = None,
) -> Load | None:
    """The observed load, or ``None`` if the rate is unknown or stale.

    Engines count a request when it completes, so an overloaded fleet shows the rate it
    serves, not the rate that arrives, and no lengths at all once nothing completes. Two
    corrections keep overload visible: with ``backlog_seconds``, the requests queued at
    prefill count as extra arrivals to serve within that time; and when the rate is known but
    a length is not, the ``last_known`` load's lengths stand in (lengths move slowly; a rate
    read as zero or a plan held because nothing finished would starve the fleet)."""
    now = obs.now_seconds

    def get(r: Reading | None) -> float | None:
        return None if r is None else r.fresh(now, max_age_seconds)

    rate = get(obs.rate_rps)
    isl = get(obs.mean_input_tokens)
    osl = get(obs.mean_output_tokens)
    if rate is None:
        return None
    backlog = get(obs.prefill.queue_depth)
    if backlog_seconds and backlog and backlog > 0:
        rate += backlog / backlog_seconds
    if rate > 0 and (isl is None or osl is None):
        if last_known is None:
            return None
        isl = last_known.mean_input_tokens if isl is None else isl
        osl = last_known.mean_output_tokens if osl is None else osl
    hit = get(obs.prefix_hit_rate)
    peak = get(obs.peak_rate_rps)
    return Load(
        rate, isl or 0.0, osl or 0.0, 0.0 if hit is None else min(max(hit, 0.0), 1.0),
        peak_rate_rps=None if peak is None else max(peak, rate),
    )


def remember(history: History, obs: Observation, decision: Decision, config: PlannerConfig) -> History:
    """``history`` with this interval's load and decision: the load as observed.

    A prefill backlog is work to clear once, which ``plan`` adds to the interval it plans
    (``backlog_seconds``); remembered as a rate it would hold the forecast's recent maximum up
    for ``forecast_window`` intervals after the queue had gone, and buy nodes for it."""
    return history.record(current_load(obs, config.max_age_seconds), decision)


def step(
    observation: Observation,
    *,
    config: PlannerConfig,
    history: History,
    now: float,
    future_loads: Sequence[Load] | None = None,
) -> tuple[Decision, History]:
    """One planning interval as the operator and the replay both run it: learn the model's
    correction from the observation, plan with it, remember. Pure; the history is the only
    state carried from one interval to the next."""
    calibration = recalibrate(observation, config, history)
    model = replace(config.model, calibration=calibration)
    decision = plan(observation, config=replace(config, model=model), history=history, now=now,
                    future_loads=future_loads)
    return decision, replace(remember(history, observation, decision, config), calibration=calibration)


def recalibrate(obs: Observation, config: PlannerConfig, history: History) -> Calibration:
    """The history's calibration moved by this interval's metrics (``model.calibrate_slo``).
    A latency miss teaches something only when the fleet is settled: nothing warming or just
    ready, and the last plan neither short nor held. (The compute factors of
    ``model.calibrate`` need each role's mean context, which no engine metric gives, so they
    stay at the profile's.)"""
    now = obs.now_seconds

    def get(r: Reading | None) -> float | None:
        return None if r is None else r.fresh(now, config.max_age_seconds)

    last = history.decisions[-1] if history.decisions else None
    settled = (
        not obs.prefill.warming and not obs.decode.warming
        and obs.prefill.recently_ready == 0 and obs.decode.recently_ready == 0
        and last is not None and not last.shortfall and not last.held
    )
    model = calibrate_slo(
        replace(config.model, calibration=history.calibration or config.model.calibration),
        ttft_p99_seconds=get(obs.ttft_p99_seconds),
        tpot_p99_seconds=get(obs.tpot_p99_seconds),
        slo=config.slo,
        settled=settled,
    )
    return model.calibration


def _intervals(seconds: float, interval: float) -> int:
    return max(0, math.ceil(seconds / interval - 1e-9))


def plan(
    observation: Observation,
    *,
    config: PlannerConfig,
    history: History = History(),
    now: float,
    future_loads: Sequence[Load] | None = None,
) -> Decision:
    """Decide target prefill/decode counts for the interval starting at ``now`` (seconds).

    ``future_loads`` replaces the forecast with known loads per interval (the oracle).

    Returns a :class:`Decision` whose ``prefill``/``decode`` are replica counts (ready +
    warming). Unknown or stale load metrics hold the previous decision (or the current counts)
    and say so; they are never read as zero load. Solves in milliseconds for horizons of tens
    of intervals and budgets of thousands of nodes.

    Examples
    --------
    >>> from pdscale.planner.model import PerformanceModel
    >>> from pdscale.planner.profile import load_profile
    >>> from pdscale.planner.observe import Reading, RoleState
    >>> cfg = PlannerConfig(model=PerformanceModel(load_profile()), nodes=32)
    >>> obs = Observation(now_seconds=0.0, rate_rps=Reading(20.0, 0.0),
    ...     mean_input_tokens=Reading(4000.0, 0.0), mean_output_tokens=Reading(400.0, 0.0),
    ...     prefix_hit_rate=Reading(0.5, 0.0), prefill=RoleState(ready=2),
    ...     decode=RoleState(ready=2))
    >>> d = plan(obs, config=cfg, now=0.0)
    >>> d.prefill >= 2 and d.decode >= 2
    True
    """
    cfg = config
    last_known = None
    if cfg.backlog_seconds is not None:
        last_known = next((x for x in reversed(history.loads) if x is not None and x.rate_rps > 0), None)
    load = current_load(observation, cfg.max_age_seconds, backlog_seconds=cfg.backlog_seconds,
                        last_known=last_known)
    if load is None:
        return _hold(observation, history, now, "load metrics unknown or stale")

    H = max(1, cfg.horizon_intervals)
    loads = [*history.loads, load]
    if future_loads:
        known = list(future_loads)[:H]
        known += [known[-1]] * (H - len(known))
        return _plan_for(observation, cfg, history, now, load, known)
    rates = forecast(
        [x.rate_rps if x else None for x in loads], H,
        method=cfg.forecast_method, window=cfg.forecast_window,
    )
    assert rates is not None
    rates[0] = max(rates[0], load.rate_rps)  # never plan the current interval below what we see
    # Capacity ordered now serves after the warm-up: size it for the rises the history has
    # shown at that lead (empirical quantile), ramping the margin in over the warm-up.
    w_lead = _intervals(cfg.model.profile.warmup.new_node_seconds, cfg.interval_seconds)
    rate_history = [x.rate_rps if x else None for x in loads[-cfg.rise_history_intervals :]]

    def margined(quantile: float) -> list[float]:
        margin = rise_margin(
            rate_history, lead=max(w_lead, 1), window=cfg.forecast_window, quantile=quantile,
            max_margin=cfg.max_rise_margin, prior=cfg.rise_prior, min_samples=cfg.rise_min_samples,
        ) if quantile > 0 else 1.0
        assert rates is not None
        return [r * (1.0 + (margin - 1.0) * min(k, max(w_lead, 1)) / max(w_lead, 1))
                for k, r in enumerate(rates)]

    rates_p = margined(cfg.rise_quantile)
    rates_d = margined(cfg.rise_quantile if cfg.decode_rise_quantile is None
                       else cfg.decode_rise_quantile)
    # lengths and hit rate move slowly and with noise: a rate-weighted mean of recent intervals
    recent = [x for x in loads[-cfg.length_window :] if x is not None and x.rate_rps > 0]
    wsum = sum(x.rate_rps for x in recent)
    if wsum > 0:
        isl = sum(x.rate_rps * x.mean_input_tokens for x in recent) / wsum
        osl = sum(x.rate_rps * x.mean_output_tokens for x in recent) / wsum
        hit = sum(x.rate_rps * x.prefix_hit_rate for x in recent) / wsum
    else:
        isl, osl, hit = load.mean_input_tokens, load.mean_output_tokens, load.prefix_hit_rate
    # bursts come back: size new capacity for a high quantile of recent sub-window peaks
    # (the scale-down floor below holds what the highest needs)
    peaks = [
        x.peak_rate_rps for x in loads[-cfg.length_window :]
        if x is not None and x.peak_rate_rps is not None
    ]
    peak = float(np.quantile(peaks, cfg.burst_quantile)) if peaks else None

    def loads_for(rs: list[float]) -> list[Load]:
        return [Load(r, isl, osl, hit, peak_rate_rps=None if peak is None else max(peak, r))
                for r in rs]

    # equal loads cost nothing twice: _plan_for sizes each distinct load once
    return _plan_for(observation, cfg, history, now, load, loads_for(rates_p), loads_for(rates_d))


def _plan_for(
    observation: Observation,
    cfg: PlannerConfig,
    history: History,
    now: float,
    load: Load,
    future: list[Load],
    future_decode: list[Load] | None = None,
) -> Decision:
    """``future``: the loads per interval that size prefill (and decode, unless
    ``future_decode`` gives decode its own)."""
    model = cfg.model
    P, D = observation.prefill, observation.decode
    H = len(future)
    dt = cfg.interval_seconds
    isl = future[0].mean_input_tokens
    osl = future[0].mean_output_tokens
    hit = future[0].prefix_hit_rate
    cache: dict[Load, tuple[int, int]] = {}

    def needed(ld: Load) -> tuple[int, int]:
        if ld not in cache:
            cache[ld] = model.instances_needed(
                ld, cfg.slo,
                prefill_utilization=cfg.prefill_utilization,
                decode_utilization=cfg.decode_utilization,
                ttft_queueing=True, service_cv=cfg.prefill_service_cv,
            )
        return cache[ld]

    need = np.array(
        [[needed(ld)[0] for ld in future],
         [needed(ld)[1] for ld in (future_decode or future)]],
        dtype=float,
    )  # shape (2, H)
    need[0] = np.maximum(need[0], cfg.min_prefill)
    need[1] = np.maximum(need[1], cfg.min_decode)
    # Over budget, divide the shortfall before solving: each role gets the budget in
    # proportion to its need, so TTFT and TPOT degrade together instead of one role starving
    # (Dynamo cuts prefill first; neither side's users are worth more by default).
    uncapped = need.copy()
    avail = float(cfg.nodes - (P.draining + D.draining))
    total = need.sum(axis=0)
    over = total > avail
    if over.any():
        p_share = np.floor(avail * need[0] / np.maximum(total, 1e-9))
        p_share = np.clip(p_share, cfg.min_prefill, max(avail - cfg.min_decode, cfg.min_prefill))
        need[0] = np.where(over, p_share, need[0])
        need[1] = np.where(over, np.maximum(avail - p_share, cfg.min_decode), need[1])
    # what this interval needs (after the budget split): remembered for the scale-down window
    desired = (int(need[0, 0]), int(need[1, 0]))

    # -- timing in intervals ------------------------------------------------------------------
    prof = model.profile
    drain_d_s = (
        cfg.decode_drain_seconds
        if cfg.decode_drain_seconds is not None
        else 2.0 * osl * cfg.slo.tpot_seconds
    )
    drain_p_s = model.prefill_seconds(isl, isl * hit)  # a prefill queue empties in seconds
    w_new = _intervals(prof.warmup.new_node_seconds, dt)
    drain_iv = (_intervals(drain_p_s, dt), _intervals(drain_d_s, dt))
    # switch into role r: drain of the other role, then the role-switch warm-up
    w_sw = (
        _intervals(drain_d_s + prof.warmup.role_switch_seconds, dt),
        _intervals(drain_p_s + prof.warmup.role_switch_seconds, dt),
    )

    roles = (P, D)
    ready = np.array([P.ready, D.ready], dtype=float)
    committed0 = np.array([P.committed, D.committed], dtype=float)
    # pre-existing warm-ups landing by interval t
    landing = np.zeros((2, H))
    for r, st in enumerate(roles):
        for w in st.warming:
            k = _intervals(w.ready_at_seconds - now, dt)
            if k < H:
                landing[r, k:] += 1
    existing_draining = P.draining + D.draining

    # -- stabilisation: scale-down floor ---------------------------------------------------------
    # HPA-style: scale down only to the highest recommendation of the window. A recommendation
    # for scale-down is the need at a cap lowered by the tolerance: the survivors must absorb
    # the load with margin, or per-minute noise removes a node only to re-add it minutes later.
    window_n = int(cfg.stabilization_seconds // dt)
    tol = 1.0 - cfg.scale_down_tolerance
    recent_loads = [ld for ld in history.loads[-window_n:] if ld is not None] if window_n else []
    floor = np.array(desired, dtype=float)
    for ld in [*recent_loads, load]:
        hold = model.instances_needed(
            ld, cfg.slo,
            prefill_utilization=cfg.prefill_utilization * tol,
            decode_utilization=cfg.decode_utilization * tol,
            ttft_queueing=True, service_cv=cfg.prefill_service_cv, queueing_margin=1.0 / tol,
        )
        floor = np.maximum(floor, np.array(hold, dtype=float))
    if window_n > 0:
        for dec in history.decisions[-window_n:]:
            floor = np.maximum(floor, np.array(dec.desired, dtype=float))
    floor = np.where(over[0], np.minimum(floor, need[:, 0]), floor)  # budget split wins
    floor = np.minimum(floor, committed0)  # a floor never forces a scale-up
    # ... nor keeps a fleet above a maxReplicas the user has lowered under it
    floor = np.minimum(floor, [cfg.max_prefill, cfg.max_decode])

    # -- MILP ----------------------------------------------------------------------------------
    # variables: for role r in (0, 1) and kind in (add, switch-in, remove, short): index
    # (r * 4 + kind) * H + t.
    nv = 8 * H
    ADD, SW, REM, SHORT = 0, 1, 2, 3

    def vi(r: int, kind: int) -> slice:
        s = (r * 4 + kind) * H
        return slice(s, s + H)

    tri = np.tril(np.ones((H, H)))  # tri[t, tau] = 1 if tau <= t

    def shifted(w: int) -> np.ndarray:
        # [t, tau] = 1 if tau <= t - w
        out: np.ndarray = np.tril(np.ones((H, H)), -w) if w < H else np.zeros((H, H))
        return out

    def band(w: int) -> np.ndarray:
        # [t, tau] = 1 if t - w < tau <= t : a removal still holds its node while draining
        if w <= 0:
            return np.zeros((H, H))
        diff: np.ndarray = tri - shifted(w)
        return diff

    rows: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []

    def add_rows(a: np.ndarray, lb: np.ndarray | float, ub: np.ndarray | float) -> None:
        rows.append(a)
        lo.append(np.broadcast_to(np.asarray(lb, dtype=float), (a.shape[0],)))
        hi.append(np.broadcast_to(np.asarray(ub, dtype=float), (a.shape[0],)))

    def serving(r: int) -> np.ndarray:
        a = np.zeros((H, nv))
        a[:, vi(r, ADD)] = shifted(w_new)
        a[:, vi(r, SW)] = shifted(w_sw[r])
        a[:, vi(r, REM)] = -tri
        a[:, vi(1 - r, SW)] = -tri  # switched away from r
        return a

    def committed(r: int) -> np.ndarray:
        a = np.zeros((H, nv))
        a[:, vi(r, ADD)] = tri
        a[:, vi(r, SW)] = tri
        a[:, vi(r, REM)] = -tri
        a[:, vi(1 - r, SW)] = -tri
        return a

    inf = np.inf
    prov = np.zeros((H, nv))
    for r in (0, 1):
        base_serving = ready[r] + landing[r]
        # serving + short >= need
        a = serving(r)
        a[:, vi(r, SHORT)] = np.eye(H)
        add_rows(a, need[r] - base_serving, inf)
        # serving >= 0 (cannot remove more than are there)
        add_rows(serving(r), -base_serving, inf)
        # min/max on committed
        lim = (cfg.min_prefill, cfg.max_prefill) if r == 0 else (cfg.min_decode, cfg.max_decode)
        # (a fleet outside bounds the user has just moved comes back in as fast as the step
        # limits allow)
        floor_r, ceiling = lim[0] - committed0[r], lim[1] - committed0[r]
        if cfg.max_step_up is not None:
            floor_r = np.minimum(floor_r, cfg.max_step_up * np.arange(1, H + 1))
        if cfg.max_step_down is not None:
            ceiling = np.maximum(ceiling, -cfg.max_step_down * np.arange(1, H + 1))
        add_rows(committed(r), floor_r, ceiling)
        prov += committed(r)
        prov[:, vi(r, REM)] += band(drain_iv[r])
        # max steps per interval
        if cfg.max_step_up is not None:
            a = np.zeros((H, nv))
            a[:, vi(r, ADD)] = np.eye(H)
            a[:, vi(r, SW)] = np.eye(H)
            add_rows(a, -inf, cfg.max_step_up)
        if cfg.max_step_down is not None:
            a = np.zeros((H, nv))
            a[:, vi(r, REM)] = np.eye(H)
            a[:, vi(1 - r, SW)] = np.eye(H)
            add_rows(a, -inf, cfg.max_step_down)
        # stabilisation floor for the first interval
        a = committed(r)[:1]
        add_rows(a, floor[r] - committed0[r], inf)
    # Switch only to fix a lasting imbalance: once new nodes could land, role r still lacks
    # nodes that the other role has spare. A transient shortfall already covered by warming
    # capacity is no reason to take a node out of service for drain + warm-up.
    late = min(w_new, H - 1)
    for r in (0, 1):
        deficit = float(need[r, late:].max() - committed0[r])
        surplus = float(committed0[1 - r] - need[1 - r, late:].max())
        a = np.zeros((1, nv))
        a[0, vi(r, SW)] = 1.0
        add_rows(a, -inf, max(0.0, min(deficit, surplus)))
    # node budget; existing draining nodes hold theirs for the longest drain
    old_drain = np.where(np.arange(H) < max(drain_iv), existing_draining, 0)
    base_prov = committed0.sum() + old_drain
    # never force removals to fit a budget that is already exceeded: cap at what exists
    budget = np.maximum(cfg.nodes - base_prov, np.minimum(0.0, 0.0 * base_prov))
    add_rows(prov, -inf, budget)

    gpu_h = prof.gpus_per_instance * dt / 3600.0
    c = np.zeros(nv)
    # provisioned-node cost of each variable = column sum of the provisioned rows
    c += gpu_h * prov.sum(axis=0)
    penalty = cfg.shortfall_penalty * gpu_h  # an instance short for one interval vs idle ones
    for r in (0, 1):
        c[vi(r, SHORT)] = penalty
        # epsilon on actions: on a tie, do nothing
        c[vi(r, ADD)] += 0.01 * gpu_h
        # A switched node serves neither role for drain + warm-up: price that idle time again
        # so that a switch is chosen for a lasting shift of the ratio (it saves a new node and
        # keeps the budget), not to chase per-minute noise
        c[vi(r, SW)] += cfg.role_switch_penalty * w_sw[r] * gpu_h
        c[vi(r, REM)] += 0.01 * gpu_h
        # a removed node still costs its drain: price the fraction of an interval
        frac = (drain_p_s if r == 0 else drain_d_s) / dt
        c[vi(r, REM)] += gpu_h * max(0.0, frac - drain_iv[r])
    ub = np.full(nv, inf)
    integrality = np.ones(nv)
    for r in (0, 1):
        integrality[vi(r, SHORT)] = 0
    A = np.vstack(rows)
    x, how = _solve(c, A, np.concatenate(lo), np.concatenate(hi), ub, integrality,
                    cfg.solver_time_limit_seconds)
    if x is None:
        return _hold(observation, history, now, f"solver failed ({how}); holding")
    x = np.round(x, 6)
    for r in (0, 1):
        for kind in (ADD, SW, REM):
            x[vi(r, kind)] = np.ceil(x[vi(r, kind)] - 1e-6) if kind != REM else np.floor(
                x[vi(r, kind)] + 1e-6
            )
    serve = np.array([ready[r] + landing[r] + serving(r) @ x for r in (0, 1)])
    comm = np.array([committed0[r] + committed(r) @ x for r in (0, 1)])
    short = np.array([x[vi(r, SHORT)] for r in (0, 1)])
    provisioned = base_prov + prov @ x
    cost = float(gpu_h * provisioned.sum())
    target = (int(np.rint(comm[0, 0])), int(np.rint(comm[1, 0])))
    sw_to_p, sw_to_d = int(x[vi(0, SW)][0]), int(x[vi(1, SW)][0])
    budget_short = bool(over.any())
    shortfall = bool(short.sum() > 1e-6) or budget_short

    ttft = model.predicted_ttft_seconds(future[0], int(serve[0, 0]), cfg.slo.percentile)
    tpot = model.predicted_tpot_seconds(future[0], int(serve[1, 0]))
    explanation = _explain(
        load=load, future=future, need=need, serve=serve, comm=comm, short=short,
        committed0=committed0, target=target, sw=(sw_to_p, sw_to_d), floor=floor,
        uncapped=uncapped, over=over,
        provisioned=provisioned, cfg=cfg, w_new=w_new, interval=dt, desired=desired,
    )
    return Decision(
        at_seconds=now,
        prefill=target[0],
        decode=target[1],
        predicted_ttft_seconds=ttft,
        predicted_tpot_seconds=tpot,
        cost_gpu_hours=cost,
        explanation=explanation,
        switch_to_prefill=sw_to_p,
        switch_to_decode=sw_to_d,
        shortfall=shortfall,
        plan=tuple((int(a), int(b)) for a, b in zip(serve[0], serve[1], strict=True)),
        desired=desired,
        solver=how,
    )


def _solve(
    c: np.ndarray,
    A: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    ub: np.ndarray,
    integrality: np.ndarray,
    time_limit: float,
) -> tuple[np.ndarray | None, str]:
    """LP relaxation first: the constraint rows are cumulative sums over time (interval
    matrices), so the LP optimum is integral in practice and costs a few ms. Only when it is
    not, fall back to branch and bound under a time limit."""
    cons = LinearConstraint(A, lo, hi)
    bounds = Bounds(np.zeros(len(c)), ub)
    lp = milp(c, constraints=cons, bounds=bounds)
    if lp.x is None:
        return None, str(lp.message)
    xi = lp.x[integrality > 0]
    if np.all(np.abs(xi - np.round(xi)) < 1e-6):
        return lp.x, "lp"
    res = milp(c, constraints=cons, bounds=bounds, integrality=integrality,
               options={"time_limit": time_limit})
    if res.x is not None:
        return res.x, "milp"
    return lp.x, "lp-rounded"


def _hold(obs: Observation, history: History, now: float, why: str) -> Decision:
    if history.decisions:
        last = history.decisions[-1]
        p, d = last.prefill, last.decode
        src = "the previous decision"
    else:
        p, d = obs.prefill.committed, obs.decode.committed
        src = "the current counts"
    return Decision(
        at_seconds=now,
        prefill=p,
        decode=d,
        predicted_ttft_seconds=math.nan,
        predicted_tpot_seconds=math.nan,
        cost_gpu_hours=math.nan,
        explanation=f"{why}: holding {src} {p}P{d}D (unknown is not zero)",
        held=True,
        desired=history.decisions[-1].desired if history.decisions else (p, d),
    )


def _explain(
    *,
    load: Load,
    future: list[Load],
    need: np.ndarray,
    serve: np.ndarray,
    comm: np.ndarray,
    short: np.ndarray,
    committed0: np.ndarray,
    target: tuple[int, int],
    sw: tuple[int, int],
    floor: np.ndarray,
    uncapped: np.ndarray,
    over: np.ndarray,
    provisioned: np.ndarray,
    cfg: PlannerConfig,
    w_new: int,
    interval: float,
    desired: tuple[int, int],
) -> str:
    """A few clauses a user can check: load, what bound the counts, what was traded."""
    names = ("prefill", "decode")
    parts = [
        f"{load.rate_rps:.1f} req/s, in {load.mean_input_tokens:.0f} / out "
        f"{load.mean_output_tokens:.0f} tok, hit {load.prefix_hit_rate:.0%}"
    ]
    peak = max(f.rate_rps for f in future)
    if peak > load.rate_rps * 1.05:
        parts.append(f"forecast peak {peak:.1f} req/s within {len(future) * interval / 60:.0f} min")
    parts.append(f"needs {desired[0]}P{desired[1]}D now, up to {int(need[0].max())}P{int(need[1].max())}D")
    cal = cfg.model.calibration
    learned = [f"{n} x{h:.2f}" for n, h in zip(names, (cal.prefill_headroom, cal.decode_headroom),
                                               strict=True) if h > 1.0 + 1e-9]
    if learned:
        parts.append(f"headroom {', '.join(learned)} (learned from p99 misses on a settled fleet)")
    # which role binds: the one whose capacity is closest to its need (share of headroom)
    ratio = [float(serve[r, 0] / max(need[r, 0], 1e-9)) for r in (0, 1)]
    bound = names[int(np.argmin(ratio))]
    parts.append(f"bound by {bound} ({'TTFT' if bound == 'prefill' else 'TPOT'} at the utilisation cap)")
    act = []
    for r in (0, 1):
        delta = target[r] - int(committed0[r])
        if delta > 0:
            act.append(f"+{delta} {names[r]}")
        elif delta < 0:
            act.append(f"{delta} {names[r]}")
    if sw[0]:
        act.append(f"switch {sw[0]} decode->prefill (cheaper than a new node)")
    if sw[1]:
        act.append(f"switch {sw[1]} prefill->decode (cheaper than a new node)")
    if act:
        parts.append("; ".join(act))
        if any(target[r] > committed0[r] for r in (0, 1)):
            parts.append(f"new nodes serve after {w_new} interval(s) of warm-up")
    else:
        parts.append("no change")
    for r in (0, 1):
        if target[r] > desired[r] and target[r] <= committed0[r]:
            why = (
                f"stabilisation window {cfg.stabilization_seconds:.0f}s"
                if floor[r] >= target[r]
                else "dropping and re-warming costs more than keeping"
            )
            parts.append(f"kept {target[r] - desired[r]} {names[r]} above need ({why})")
    if over.any():
        t_first = int(np.argmax(over))
        k = int(np.argmax(uncapped.sum(axis=0)))
        parts.append(
            f"OVER BUDGET: {cfg.nodes} nodes < need {int(uncapped[0, k])}P{int(uncapped[1, k])}D "
            f"from interval +{t_first}; budget split in proportion to need "
            f"({int(need[0, k])}P{int(need[1, k])}D) so TTFT and TPOT degrade together"
        )
    if short.sum() > 1e-6:
        t_last = int(np.nonzero(short.sum(axis=0) > 1e-6)[0].max())
        parts.append(
            f"short by up to {int(np.ceil(short[0].max()))}P{int(np.ceil(short[1].max()))}D "
            f"until interval +{t_last}: capacity is still warming up"
        )
    if provisioned.max() >= cfg.nodes - 1e-6:
        parts.append(f"node budget {cfg.nodes} reached")
    return "; ".join(parts)
