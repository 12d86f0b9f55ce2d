"""The planner: choose prefill and decode counts over a horizon with scipy's MILP.

``plan(observation, config=..., history=..., now=...) -> Decision`` forecasts the load, turns
each future interval's load into the instance counts it needs (performance model), and solves
a small integer programme over the horizon:

    minimise   gpu_h * sum_t provisioned_t                 (warming and draining included)
             + penalty * gpu_h * sum_{r,t} short_{r,t}     (instances missing vs need)
             + switch_penalty * idle_r * gpu_h * switches  (a switched node idles a while)
             + epsilon * (adds + removals)                 (prefer doing nothing on a tie)
    s.t.       serving_{r,t} + short_{r,t} >= need_{r,t},  serving_{r,t} >= 0
               min_r <= committed_{r,t} <= max_r,  provisioned_t <= nodes
               per-interval steps up/down <= max step, committed_{r,0} >= stabilised floor_r
               switches into r <= lasting deficit of r, and surplus of the other role

with gpu_h the GPU-hours of one instance for one interval; an instance of several nodes (a
group, ``PlannerConfig.nodes_per_instance``) counts its nodes in provisioned_t, the budget and
these costs, and switches only into a role of its own shape. Over budget, need is divided
between the roles before solving: each role's fluid demand first, then the margins above it
in proportion. A node started at t serves from t + warm-up(new node), a node switched into
role r serves from t + drain(other role) + warm-up(role switch), and a removed node holds its
node for its drain time. Only the first interval is applied (receding horizon); the next call
re-solves with fresh metrics.

One call of ``plan`` runs these steps, each a function of its own, in the module named:

    _observed_load     solve     the load now (None: hold)
    _forecast_loads    solve     the loads per interval that size prefill and decode
    _needs             needs     instances each interval needs (decode: at least what the
                                 sequences running now need, until new capacity serves), split
                                 over budget
    _timing            timing    warm-ups, drains and pre-existing warm-ups, in intervals
    _scale_down_floor  program   the stabilisation window's floor for the first interval
    _program           program   the MILP: costs, constraint rows, integrality
    _solve             program   the one solver call (LP first, branch and bound if needed)
    _outcome           program   the solution read back: counts, shortfall, provisioned nodes, cost
    _decision          explain   the Decision and its explanation

This module keeps the entry points (``step``, ``plan``, ``remember``, ``recalibrate``,
``current_load``) and the load shaping; ``History`` lives in :mod:`.history`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .calibration import learn_compute, rejected_too_many, samples
from .config import PlannerConfig
from .decision import Decision
from .explain import _clamp, _decision, _hold
from .forecast import LeadRisk, forecast, lead_ratios, rise_margin
from .history import History
from .model import (
    HEADROOM_BOUNDS,
    PREFILL_BUSY_FLOOR_MAX,
    PREFILL_BUSY_FLOOR_PRIOR,
    Calibration,
    Load,
    calibrate_slo,
    judge_prefill_raise,
)
from .needs import _decode_need_from_sequences, _needs, instances_needed
from .observe import (
    MAX_INSTANCES,
    MAX_MEAN_TOKENS,
    MAX_QUEUE,
    MAX_RATE_RPS,
    MAX_SQUARE_RATIO,
    Observation,
    Reading,
    fresh,
    unusable,
)
from .program import _outcome, _program, _scale_down_floor, _solve
from .seasonal import seasonal_factors, seasonal_times, weekday
from .timing import _intervals, _timing

__all__ = ["History", "PlannerConfig", "current_load", "forecast_rates", "plan", "recalibrate",
           "remember", "step"]


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
    read as zero or a plan held because nothing finished would starve the fleet).

    No response finished while decode streamed: the tokens streamed per request entering
    decode stand in for the output length (at least the ``last_known`` one). A load whose
    responses turned longer finishes none of them for a while, and the last known length is
    the old load's (the demo's long documents, 5 tokens, then agents, 80: two decodes ordered
    where ten were needed); the streamed tokens already say the responses are longer."""
    now = obs.now_seconds

    def get(r: Reading | None) -> float | None:
        return fresh(r, now, max_age_seconds)

    rate = get(obs.rate_rps)
    isl = get(obs.mean_input_tokens)
    osl = get(obs.mean_output_tokens)
    if rate is None:
        return None
    streamed = streamed_output_length(obs, max_age_seconds)
    if streamed is not None:
        osl = streamed if last_known is None else max(streamed, last_known.mean_output_tokens)
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
    # the prompts' spread moves as slowly as their mean: unknown (an engine without the prompt
    # histogram, an interval without completions) keeps the last one, else plans as if every
    # prompt were the mean one
    square = get(obs.input_tokens_square_ratio)
    if square is None:
        square = last_known.input_tokens_square_ratio if last_known is not None else 1.0
    return Load(
        rate, isl or 0.0, osl or 0.0, 0.0 if hit is None else min(max(hit, 0.0), 1.0),
        peak_rate_rps=None if peak is None else max(peak, rate),
        input_tokens_square_ratio=max(square, 1.0),
    )


def streamed_output_length(obs: Observation, max_age_seconds: float) -> float | None:
    """The tokens streamed per request entering decode where they stand in for the output
    length (``current_load``): no response finished, requests arrive, and something streamed
    (1 is the first token alone: no decode ready yet says nothing); else None."""
    now = obs.now_seconds
    streamed = fresh(obs.streamed_output_tokens, now, max_age_seconds)
    rate = fresh(obs.rate_rps, now, max_age_seconds)
    if (fresh(obs.mean_output_tokens, now, max_age_seconds) is None and streamed is not None
            and streamed > 1.0 and rate is not None and rate > 0):
        return streamed
    return None


def remember(history: History, obs: Observation, decision: Decision, config: PlannerConfig) -> History:
    """``history`` with this interval's load and decision: the load as observed.

    A prefill backlog is work to clear once, which ``plan`` adds to the interval it plans
    (``backlog_seconds``); remembered as a rate it would hold the forecast's recent maximum up
    for ``forecast_window`` intervals after the queue had gone, and buy nodes for it.

    The rate observed also goes into the seasonal memory, at its wall-clock time (the
    planner's time from ``clock_origin_unix_seconds``), whether seasonality is on or not: a
    planner switched to it later has the days it has run for."""
    load = current_load(obs, config.max_age_seconds)
    remembered = history.record(load, decision)
    unix = config.clock_origin_unix_seconds + obs.now_seconds
    return replace(remembered, season=remembered.season.record(
        unix, None if load is None else load.rate_rps))


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
    state carried from one interval to the next.

    Never raises for any observation or history content: a reading the planner cannot use
    (``observe.unusable``: negative, not finite, implausibly large, inconsistent) holds, and
    teaches the calibration nothing; any other failure holds too, naming the error. Every
    decision is within the current bounds (``_within_bounds``): a max or a budget lowered under
    the fleet lowers the target at once, and the operator gets there by draining (a target is
    where to go, the drains pace the way down)."""
    history = _sane_history(history)
    try:
        why = unusable(observation, config.max_age_seconds)
        if why is None and not (isinstance(now, (int, float)) and math.isfinite(now)):
            why = f"the planning time is not finite ({now!r})"
        if why is not None:
            decision = _hold(observation, history, now, f"unusable reading: {why}", config)
            return decision, history.record(None, decision)
        calibration = recalibrate(observation, config, history)
        model = replace(config.model, calibration=calibration)
        decision = plan(observation, config=replace(config, model=model), history=history, now=now,
                        future_loads=future_loads)
        decision = _within_bounds(decision, config)
        return decision, replace(remember(history, observation, decision, config), calibration=calibration,
                                 prefill_queue=observation.prefill.queue_depth)
    except Exception as exc:  # the last line of defence: a planning error must not stop the tick
        decision = _hold(observation, history, now, f"planner error ({type(exc).__name__}: {exc})",
                         config)
        return decision, history.record(None, decision)


def _sane_history(history: History) -> History:
    """``history`` without entries no planning could have produced (a remembered history
    restored from storage, or written by hand): an implausible load becomes unknown, an odd
    decision is dropped, a calibration outside its bounds is forgotten. The same object when
    all is well (checked every interval: a few ms for a full history)."""
    bad = {k for k, ld in enumerate(history.loads) if ld is not None and not _load_ok(ld)}
    decisions_ok = all(map(_decision_ok, history.decisions))
    calibration_ok = _calibration_ok(history.calibration)
    q = history.prefill_queue
    queue_ok = q is None or (isinstance(q, Reading) and _finite_in(q.value, 0.0, MAX_QUEUE)
                             and _finite_in(q.at_seconds, -math.inf, math.inf))
    if not bad and decisions_ok and calibration_ok and queue_ok:
        return history
    return replace(
        history, prefill_queue=q if queue_ok else None,
        loads=tuple(None if k in bad else ld for k, ld in enumerate(history.loads)),
        decisions=tuple(d for d in history.decisions if _decision_ok(d)),
        calibration=history.calibration if calibration_ok else None,
    )


def _finite_in(x: object, lo: float, hi: float) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and lo <= x <= hi)


def _load_ok(ld: object) -> bool:
    """A load as ``current_load`` makes them (NaN and infinities fail the comparisons)."""
    if not isinstance(ld, Load):
        return False
    peak = ld.peak_rate_rps
    try:
        return bool(0.0 <= ld.rate_rps <= MAX_RATE_RPS
                    and 0.0 <= ld.mean_input_tokens <= MAX_MEAN_TOKENS
                    and 0.0 <= ld.mean_output_tokens <= MAX_MEAN_TOKENS
                    and 0.0 <= ld.prefix_hit_rate <= 1.0
                    and (peak is None or 0.0 <= peak <= MAX_RATE_RPS)
                    and 1.0 <= ld.input_tokens_square_ratio <= MAX_SQUARE_RATIO)
    except TypeError:  # not numbers at all
        return False


def _decision_ok(d: object) -> bool:
    if not isinstance(d, Decision) or not isinstance(d.desired, tuple) or len(d.desired) != 2:
        return False
    if not isinstance(d.lead_need, tuple) or len(d.lead_need) != 2:
        return False
    p, q, (dp, dq), (lp, lq) = d.prefill, d.decode, d.desired, d.lead_need
    return all(type(x) is int and 0 <= x <= MAX_INSTANCES for x in (p, q, dp, dq, lp, lq))


def _calibration_ok(cal: object) -> bool:
    if cal is None:
        return True
    if not isinstance(cal, Calibration):
        return False
    lo, hi = HEADROOM_BOUNDS
    counts = (cal.samples, cal.prefill_samples, cal.decode_samples, cal.raise_ready,
              cal.raise_ratio_count, cal.since_ratio_count)
    test = (cal.raise_from_headroom == 0.0 or _finite_in(cal.raise_from_headroom, lo, hi),
            _finite_in(cal.raise_busy, 0.0, 1e6), _finite_in(cal.raise_ratio_sum, 0.0, 1e9),
            _finite_in(cal.since_ratio_sum, 0.0, 1e9), _finite_in(cal.since_busy, 0.0, 1e6),
            _finite_in(cal.raise_at_seconds, -1e12, 1e12))
    return (_finite_in(cal.prefill_headroom, lo, hi) and _finite_in(cal.decode_headroom, lo, hi)
            and _finite_in(cal.prefill_factor, 1e-6, 1e6) and _finite_in(cal.decode_factor, 1e-6, 1e6)
            and _finite_in(cal.prefill_busy_floor, PREFILL_BUSY_FLOOR_PRIOR, PREFILL_BUSY_FLOOR_MAX)
            and all(test) and all(type(n) is int and n >= 0 for n in counts))


def _within_bounds(decision: Decision, cfg: PlannerConfig) -> Decision:
    """``decision`` with its target inside the current bounds, and why if it moved. The MILP
    brings a fleet outside bounds just moved back by its step limits and never forces removals
    to fit a lowered budget; the target says where the bounds are, and the operator's drains
    bring the fleet down to it. (Switches are dropped: a fleet cut to new bounds has no role
    to switch into.)"""
    p, d, why = _clamp(decision.prefill, decision.decode, cfg)
    if not why:
        return decision
    return replace(
        decision, prefill=p, decode=d, switch_to_prefill=0, switch_to_decode=0,
        explanation=f"{decision.explanation}; target {decision.prefill}P{decision.decode}D clamped "
                    f"to {p}P{d}D by the {' and '.join(why)} (scaled down through drains)",
    )


def recalibrate(obs: Observation, config: PlannerConfig, history: History) -> Calibration:
    """The history's calibration moved by this interval's metrics: the compute factors by what
    the engines report against what the profile predicts for the load observed
    (``calibration.samples``: both ways, both roles, warm-up outliers skipped), then the
    headroom by the latency at the SLO percentile (``model.calibrate_slo``), for each role
    whose miss is the model's error (``_taught_roles``); a prefill raise is then judged by
    what its capacity did to the misses once it serves (``model.judge_prefill_raise``), and
    prefill's headroom rises no further until it is."""
    now = obs.now_seconds

    def get(r: Reading | None) -> float | None:
        return fresh(r, now, config.max_age_seconds)

    learned = samples(obs, current_load(obs, config.max_age_seconds), history.prefill_queue,
                      slo=config.slo, model=config.model, max_age_seconds=config.max_age_seconds)
    compute = learn_compute(history.calibration or config.model.calibration, learned)
    ttft = get(obs.ttft_at_percentile_seconds)
    if rejected_too_many(obs, config.slo, config.max_age_seconds):
        ttft = math.inf  # the percentile falls on a request that got no first token at all
    model = replace(config.model, calibration=compute)
    taught = _taught_roles(obs, replace(config, model=model), history)
    # a raise whose capacity has landed is judged before prefill learns again
    landed = compute.raise_from_headroom > 0.0 and obs.prefill.ready > compute.raise_ready
    model = calibrate_slo(
        model,
        ttft_at_percentile_seconds=ttft,
        tpot_at_percentile_seconds=get(obs.tpot_at_percentile_seconds),
        slo=config.slo,
        prefill_settled=taught.prefill and not landed,
        decode_settled=taught.decode,
        prefill_idle=taught.prefill_idle,
    )
    return judge_prefill_raise(
        compute, model.calibration,
        ttft_ratio=None if ttft is None else ttft / config.slo.ttft_seconds,
        busy=taught.prefill_busy, ready=obs.prefill.ready, landed_and_settled=taught.prefill_enough,
        now_seconds=now, expire_seconds=3 * lead_intervals(config) * config.interval_seconds)


class _Taught(NamedTuple):
    """Which roles a latency miss teaches this interval (``_taught_roles``)."""

    prefill: bool
    decode: bool
    #: prefill enough and warm, but too idle for queueing to explain a miss
    prefill_idle: bool
    #: prefill's ready instances all warm and, by the model, enough for the load
    prefill_enough: bool
    #: offered prefill compute at the interval's burst peak over the ready instances (None:
    #: no load read)
    prefill_busy: float | None


#: a prefill TTFT miss teaches headroom only while its ready instances were at least this
#: busy at the interval's burst peak (offered compute over ready instances, by the model as
#: calibrated), or the router refused requests: below it queueing adds little, and the miss
#: is the long prompts' own compute, which more instances do not buy. Measured on ServeGen's
#: day with Mooncake lengths, where the TTFT at the 99th percentile stayed 12-20 s against
#: 15 s on a fleet 15-35% busy: without the gate the headroom sat at its 2x cap and the day
#: cost 4,254 GPU-hours (96.98%), with it 3,617 (96.82%); on the mean rate instead of the
#: peak it also blocked Azure's bursts (92.8% -> 90.1%). Below it, a miss also gives back
#: headroom (``model.calibrate_slo``, ``prefill_idle``): bought while the fleet queued, it had made the fleet idle, and
#: the 2x cap was then held for the rest of the day while the long prompts kept missing. The
#: headroom now settles where the fleet is about this busy at its peak. Replayed, pdscale and
#: the oracle (which learns the same way): ServeGen 14% fewer GPU-hours for 0.5 pp (random
#: router), 6% for 0.1 pp (smg); Mooncake 1% for 0.06 pp; Azure and smg's other rows unmoved.
#: It is the prior of ``Calibration.prefill_busy_floor``, which a futile raise moves up
#: (``model.judge_prefill_raise``)
HEADROOM_MIN_PREFILL_BUSY = PREFILL_BUSY_FLOOR_PRIOR


def _taught_roles(obs: Observation, cfg: PlannerConfig, history: History) -> _Taught:
    """Whether a latency miss this interval says the model is wrong, per role, and whether
    prefill's ready instances were warm, enough and idle (too little queueing to explain a
    miss: below the calibration's ``prefill_busy_floor``, ``HEADROOM_MIN_PREFILL_BUSY`` until
    a futile raise moves it).

    It does when the role's ready instances were all warm and, by the model as calibrated so
    far, enough for the load observed (its prefill backlog and running sequences counted):
    the model said they would meet the SLO and they did not. Prefill also needs queueing to
    explain its miss (``HEADROOM_MIN_PREFILL_BUSY``). A fleet the model itself calls
    short (a rise it has ordered capacity for, a budget) explains its miss, and one with an
    instance just ready is still slow from its first passes. Prefill also waits until none
    of its instances warm (why: at ``prefill_enough``); decode learns whatever warms
    meanwhile: its misses answer to the decodes ready now, and waiting for none to warm
    cost ServeGen's jump 1.9 pp."""
    last = history.decisions[-1] if history.decisions else None
    load = _observed_load(obs, cfg, history)
    if last is None or last.held or load is None or load.rate_rps <= 0:
        return _Taught(False, False, False, False, None)
    need_p, need_d = instances_needed(cfg, load)
    need_d = max(need_d, _decode_need_from_sequences(cfg, obs, load))
    # at the interval's burst peak: a burst queues however idle the interval's mean looks
    busy_p = (max(load.rate_rps, load.peak_rate_rps or 0.0) * cfg.model.prefill_service_seconds(load)
              / max(obs.prefill.ready, 1))
    # requests the router refused say its admission (per ready instance) is short, however busy
    floor = cfg.model.calibration.prefill_busy_floor
    queueing = busy_p >= floor or rejected_too_many(obs, cfg.slo, cfg.max_age_seconds)
    # Prefill's headroom moves (up at a miss, back while idle) only once none of its
    # instances warm: a miss while the capacity ordered at the last one is still coming is
    # the same lesson again, and a prefill warm-up spans many intervals (600 s of 60 s on
    # the benchmarks). Learning through it wound the headroom up: on the steady hour 1.00 ->
    # 1.65 in 22 minutes of an unchanging load, 21 -> 32 prefills where the best fixed
    # fleet holds 26. Replayed on the deployed stack: the steady hour 97.81% / 224.1 ->
    # 97.71% / 197.5 GPU-hours, ServeGen 96.37% / 3048 -> 96.08% / 2941, Azure 93.67% / 351
    # -> 93.15% / 331, Mooncake 98.05% / 409 -> 98.05% / 396; a prefill 25% slower than its
    # profile 0.2-0.9 pp lower for 2-14% fewer GPU-hours. Giving back while it warmed
    # (waiting only to raise) cost ServeGen 0.7 pp more.
    prefill_enough = (obs.prefill.recently_ready == 0 and not obs.prefill.warming
                      and obs.prefill.ready >= need_p)
    return _Taught(prefill_enough and queueing,
                   obs.decode.recently_ready == 0 and obs.decode.ready >= need_d,
                   prefill_enough and not queueing, prefill_enough, busy_p)


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
    and say so, clamped to the current bounds; they are never read as zero load. (Readings
    that are present but unusable are ``step``'s to refuse: ``observe.unusable``.) Solves in milliseconds for horizons of tens
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
    load = _observed_load(observation, config, history)
    if load is None:
        return _hold(observation, history, now, "load metrics unknown or stale", config)
    H = max(1, config.horizon_intervals)
    if future_loads:
        known = list(future_loads)[:H]
        known += [known[-1]] * (H - len(known))
        return _plan_for(observation, config, history, now, load, known)
    loads = [*history.loads, load]
    earlier = history.earlier_rates
    season = _season(config, history, now, len(earlier) + len(loads), H)
    future_p, future_d, risk = _forecast_loads(config, loads, load, H, season, earlier)
    # equal loads cost nothing twice: _needs sizes each distinct load once
    return _plan_for(observation, config, history, now, load, future_p, future_d, risk)


def _observed_load(observation: Observation, cfg: PlannerConfig, history: History) -> Load | None:
    """This interval's load as ``plan`` sees it: with the prefill backlog and the last known
    lengths when the config counts a backlog (live fleets), as observed otherwise."""
    last_known = None
    if cfg.backlog_seconds is not None:
        last_known = next((x for x in reversed(history.loads) if x is not None and x.rate_rps > 0), None)
    return current_load(observation, cfg.max_age_seconds, backlog_seconds=cfg.backlog_seconds,
                        last_known=last_known)


class Season(NamedTuple):
    """The seasonal index of the past intervals and of the horizon's (daily profile times the
    day-of-week factor), the earlier days the daily profile is learned from (0: flat), and
    the weekly factor alone: at the last past interval, over the horizon, the weekday of each
    interval of the horizon (Monday 0) and the earlier days of each weekday it is learned from."""

    back: np.ndarray
    ahead: np.ndarray
    days: int
    week_now: float = 1.0
    week_ahead: np.ndarray | None = None
    weekday_ahead: tuple[int, ...] = ()
    weeks: tuple[int, ...] = (0,) * 7


def _season(cfg: PlannerConfig, history: History, now: float, past: int, H: int) -> Season | None:
    """The seasonal index over ``past`` intervals up to ``now`` and ``H`` from it
    (:mod:`.seasonal`); None when seasonality is off or no earlier whole day is known."""
    if not cfg.seasonality:
        return None
    unix = cfg.clock_origin_unix_seconds + now
    profile = history.season.profile(unix, weekly=cfg.weekly_seasonality)
    if profile is None:
        return None
    back, ahead = seasonal_factors(profile, unix, cfg.interval_seconds, past, H)
    t_back, t_ahead = seasonal_times(unix, cfg.interval_seconds, past, H)
    return Season(back, ahead, profile.days, week_now=float(profile.weekly_at(t_back[-1:])[0]),
                  week_ahead=profile.weekly_at(t_ahead),
                  weekday_ahead=tuple(weekday(float(t)) for t in t_ahead), weeks=profile.weeks)


def _forecast_loads(
    cfg: PlannerConfig, loads: list[Load | None], load: Load, H: int, season: Season | None = None,
    earlier: Sequence[float | None] = (),
) -> tuple[list[Load], list[Load], tuple[LeadRisk, LeadRisk]]:
    """The loads of the next ``H`` intervals that size prefill and decode, and how each role's
    were raised for the risk over the lead (:class:`forecast.LeadRisk`, for the explanation):
    the forecast rate (never below the rate seen now; on a ramp, the ramp carried a lead
    ahead, :func:`_lead_forecast`) times each role's rise margin, with the recent lengths,
    hit rate and burst peak. ``loads``: the history's loads then this interval's, ``load``;
    ``earlier``: the rates remembered before them (``History.earlier_rates``, as they were
    seen: not recounted in the planned shape); ``season``: the daily profile's index over
    both and the horizon (:func:`_season`), the rates forecast adjusted for it
    (:func:`_lead_forecast`).

    Each role forecasts from the rates of the past in the planned shape's requests
    (:func:`_in_planned_shape`): a rate of far cheaper requests is counted at the work it
    brought, not as that many requests of the new shape."""
    isl, osl, hit, square = _load_shape(cfg, loads, load)
    planned = _per_request_work(cfg, Load(1.0, isl, osl, hit, input_tokens_square_ratio=square))
    # each past interval's work per request, once for both roles
    works = [None if x is None or x.rate_rps <= 0 else _per_request_work(cfg, x) for x in loads]
    by_role, risks = [], []
    for role, quantile in enumerate(cfg.rise_quantiles):
        scale = [_in_planned_shape(cfg, w, role, planned[role]) for w in works]
        seen = [*earlier,
                *(None if x is None else x.rate_rps * f for x, f in zip(loads, scale, strict=True))]
        rates, risk = _lead_forecast(cfg, seen, H, quantile, season)
        rates[0] = max(rates[0], load.rate_rps)  # never plan the current interval below what we see
        peak = _burst_peak(cfg, loads, scale)
        by_role.append([Load(r, isl, osl, hit, peak_rate_rps=None if peak is None else max(peak, r),
                             input_tokens_square_ratio=square) for r in rates])
        risks.append(risk)
    return by_role[0], by_role[1], (risks[0], risks[1])


def lead_intervals(cfg: PlannerConfig) -> int:
    """The lead of capacity ordered now, in intervals: a new node's warm-up plus the interval
    it is ordered in (the next decision comes one interval later)."""
    return _intervals(cfg.model.profile.warmup.new_node_seconds, cfg.interval_seconds) + 1


def forecast_rates(cfg: PlannerConfig, rates: Sequence[float | None], history: History,
                   now: float) -> list[float]:
    """The request rates ``plan`` sizes prefill for over the horizon, from the past
    ``rates`` (one per interval, the last one ending at ``now``) and the history's seasonal
    memory: the forecast priced at ``cfg.rise_quantile`` (:func:`_lead_forecast`), for the
    benchmarks that score it without a simulator."""
    H = max(1, cfg.horizon_intervals)
    season = _season(cfg, history, now, len(rates), H)
    return _lead_forecast(cfg, list(rates), H, cfg.rise_quantile, season)[0]


def _lead_forecast(
    cfg: PlannerConfig, seen: list[float | None], H: int, quantile: float,
    season: Season | None = None,
) -> tuple[list[float], LeadRisk]:
    """:func:`_plain_lead_forecast` of the seasonally adjusted rates: each past rate divided
    by the daily profile's index at its time, the forecast multiplied by the index at the time
    forecast (:mod:`.seasonal`). The bound, the margin and the ramp are then learned from what
    the time of day does not explain. Without ``season``, the plain forecast."""
    if season is None:
        return _plain_lead_forecast(cfg, seen, H, quantile)
    back, ahead = season.back, season.ahead
    adjusted = [None if x is None else x / float(s) for x, s in zip(seen, back, strict=True)]
    rates, risk = _plain_lead_forecast(cfg, adjusted, H, quantile)
    rates = [r * float(s) for r, s in zip(rates, ahead, strict=True)]
    lead = min(risk.lead, H) - 1
    known = [x for x in seen[-cfg.forecast_window :] if x is not None]
    weekly = 1.0 if season.week_ahead is None else float(season.week_ahead[lead] / season.week_now)
    wd = season.weekday_ahead[lead] if season.weekday_ahead else 0
    return rates, replace(risk, at_lead_rps=rates[lead], base_rps=max(known) if known else 0.0,
                          seasonal=float(ahead[lead] / back[-1]), season_days=season.days,
                          weekly=weekly, weekday=wd, season_weeks=season.weeks[wd])


def lead_margin(cfg: PlannerConfig, seen: Sequence[float | None], quantile: float) -> float:
    """The margin the forecast at the lead is priced with, from the past rates ``seen``: the
    ``quantile`` of what the forecast missed at the lead, one warm-up apart
    (:func:`forecast.rise_margin`), or ``rise_prior`` while fewer than ``rise_min_samples``
    warm-ups are known (a fresh install)."""
    return rise_margin(
        seen[-cfg.rise_history_intervals :], lead=lead_intervals(cfg), window=cfg.forecast_window,
        quantile=quantile, max_margin=cfg.max_rise_margin, prior=cfg.rise_prior,
        min_samples=cfg.rise_min_samples,
        method="trend" if cfg.forecast_method == "trend" else "recent-max",
        stride=lead_intervals(cfg) if cfg.rise_independent_samples else 1,
    )


def _plain_lead_forecast(
    cfg: PlannerConfig, seen: list[float | None], H: int, quantile: float
) -> tuple[list[float], LeadRisk]:
    """The rates of the next ``H`` intervals, priced against the risk of the lead ``L``
    (:func:`lead_intervals`), and what priced them.

    - bound: the ``quantile`` of load(t + L) / recent max(t) over the history
      (:func:`forecast.lead_ratios`, origins one lead apart), once it holds
      ``rise_min_samples`` leads.
    - forecast: ``forecast_method``; with ``trend`` and a learned bound, a significant rising
      slope is carried to the lead and held, never above the bound
      (:func:`forecast.ramp_projection`): a ramp is ordered for where it will be when the
      capacity serves. Until the bound is learned, the damped trend (at most four slopes,
      :func:`forecast.bounded_trend`): carried to the lead at up to ``max_rise_margin``
      instead, issue 48's nine-minute rise (shorter than the lead) bought 30 prefills for a
      load that 20 served by the time they landed, 146.7 GPU-hours against 128.8 for the same
      96.43% (the rise's misses fall before anything ordered then can serve).
    - margin: the ``quantile`` of what the damped trend missed at the lead over the history
      (:func:`forecast.rise_margin`), ramped in over the lead:
      rate_k * (1 + (m - 1) * min(k, L) / L); the carried ramp is a floor under it, not
      multiplied by it. Releases are gated by the same forecast: the programme keeps what
      any interval of the horizon needs, the lead's included.

    ``quantile`` 0 is the plain forecast (no bound, no margin, the damped trend)."""
    lead = lead_intervals(cfg)
    history = seen[-cfg.rise_history_intervals :]
    stride = lead if cfg.rise_independent_samples else 1
    trend = cfg.forecast_method == "trend"
    if quantile <= 0:
        rates = forecast(seen, H, method=cfg.forecast_method, window=cfg.forecast_window)
        assert rates is not None
        return rates, LeadRisk(quantile=0.0, lead=lead)
    ratios = lead_ratios(history, lead=lead, window=cfg.forecast_window, stride=stride)
    learned = len(ratios) >= cfg.rise_min_samples
    bound = min(max(float(np.quantile(ratios, quantile)), 1.0), cfg.max_rise_margin) if learned else 1.0
    rates = forecast(seen, H, method=cfg.forecast_method, window=cfg.forecast_window)
    assert rates is not None
    margin = lead_margin(cfg, seen, quantile)
    rates = [r * (1.0 + (margin - 1.0) * min(k, lead) / lead) for k, r in enumerate(rates)]
    carried = False
    if trend and learned:
        # the ramp under way, carried to the lead: a floor, not a second margin (the margin
        # already prices a rise starting within the lead; multiplied, the two ordered 2.7x)
        ramp = forecast(seen, H, method="trend", window=cfg.forecast_window, lead=lead, cap=bound)
        assert ramp is not None
        carried = ramp[min(lead, H) - 1] > rates[min(lead, H) - 1] * 1.005
        rates = [max(r, x) for r, x in zip(rates, ramp, strict=True)]
    known = [x for x in seen[-cfg.forecast_window :] if x is not None]
    risk = LeadRisk(quantile=quantile, lead=lead, samples=len(ratios), learned=learned, bound=bound,
                    margin=margin, carried=carried, base_rps=max(known) if known else 0.0,
                    at_lead_rps=rates[min(lead, H) - 1])
    return rates, risk


def _per_request_work(cfg: PlannerConfig, load: Load) -> tuple[float, float]:
    """(prefill compute seconds, output tokens) one request of ``load``'s shape brings."""
    return cfg.model.prefill_service_seconds(load), load.mean_output_tokens


def _in_planned_shape(cfg: PlannerConfig, past: tuple[float, float] | None, role: int,
                      planned: float) -> float:
    """The factor that counts a past interval's requests (``past``: their work per request,
    None for an interval without requests) as requests of the planned shape for ``role``
    (0 prefill, 1 decode): their work over the planned request's where they brought at most
    1 / ``length_jump_ratio`` of it (a new, heavier shape: chat's 2.4 req/s of 100-token
    prompts forecast long documents' 600-token prompts at 2.4 req/s for the forecast window,
    2.4x the work either brought); 1 otherwise, so that per-interval noise in lengths never
    moves the rate forecast."""
    if past is None or cfg.length_jump_ratio is None or planned <= 0:
        return 1.0
    factor = past[role] / planned
    return factor if factor * cfg.length_jump_ratio <= 1.0 else 1.0


def _load_shape(
    cfg: PlannerConfig, loads: list[Load | None], load: Load
) -> tuple[float, float, float, float]:
    """(mean input tokens, mean output tokens, prefix hit rate, input tokens' square ratio)
    to plan with, from the last ``length_window`` intervals of ``loads``."""
    # lengths and hit rate move slowly and with noise: a rate-weighted mean of recent intervals
    recent = [x for x in loads[-cfg.length_window :] if x is not None and x.rate_rps > 0]
    wsum = sum(x.rate_rps for x in recent)
    if wsum > 0:
        isl = sum(x.rate_rps * x.mean_input_tokens for x in recent) / wsum
        osl = sum(x.rate_rps * x.mean_output_tokens for x in recent) / wsum
        hit = sum(x.rate_rps * x.prefix_hit_rate for x in recent) / wsum
        # the window's mean squared prompt over its squared mean prompt
        square_tokens = sum(x.rate_rps * x.input_tokens_square_ratio * x.mean_input_tokens**2
                            for x in recent) / wsum
        square = square_tokens / isl**2 if isl > 0 else load.input_tokens_square_ratio
    else:
        isl, osl, hit = load.mean_input_tokens, load.mean_output_tokens, load.prefix_hit_rate
        square = load.input_tokens_square_ratio
    if cfg.length_jump_ratio is not None and load.rate_rps > 0:
        # a new, longer shape is sized for now; noise around the window's mean is not
        jump = cfg.length_jump_ratio
        if load.mean_input_tokens >= jump * isl:
            isl, square = load.mean_input_tokens, load.input_tokens_square_ratio
        osl = load.mean_output_tokens if load.mean_output_tokens >= jump * osl else osl
    return isl, osl, hit, max(square, 1.0)


def _burst_peak(cfg: PlannerConfig, loads: list[Load | None], scale: list[float]) -> float | None:
    """The burst peak (req/s of the planned shape, ``scale`` per load) to size new capacity
    for: a high quantile of the sub-window peaks the scale-down window has seen (its floor
    holds what the highest needs). Not over the length window: of its 3 intervals the
    quantile is the highest, a lone burst."""
    burst_n = max(1, cfg.stabilization_intervals)
    peaks = [x.peak_rate_rps * f for x, f in zip(loads[-burst_n:], scale[-burst_n:], strict=True)
             if x is not None and x.peak_rate_rps is not None]
    return float(np.quantile(peaks, cfg.burst_quantile)) if peaks else None


def _plan_for(
    observation: Observation,
    cfg: PlannerConfig,
    history: History,
    now: float,
    load: Load,
    future: list[Load],
    future_decode: list[Load] | None = None,
    risk: tuple[LeadRisk, LeadRisk] | None = None,
) -> Decision:
    """Plan for known future loads: ``future`` sizes prefill (and decode, unless
    ``future_decode`` gives decode its own), one load per interval of the horizon; ``risk``
    says how the forecast priced the lead (None: the loads were known)."""
    needs = _needs(cfg, observation, future, future_decode, now=now)
    timing = _timing(cfg, observation, now, future[0], len(future))
    margins = (1.0, 1.0) if risk is None else (risk[0].margin, risk[1].margin)
    floor = _scale_down_floor(cfg, history, load, needs, timing, margins)
    program = _program(cfg, needs, timing, floor)
    x, how = _solve(program.c, program.A, program.lo, program.hi, program.ub,
                    program.integrality, cfg.solver_time_limit_seconds)
    if x is None:
        return _hold(observation, history, now, f"solver failed ({how})", cfg)
    outcome = _outcome(program, timing, x)
    decision = _decision(cfg, now, load, future, needs, timing, floor, outcome, how, risk)
    if streamed_output_length(observation, cfg.max_age_seconds) is not None:
        decision = replace(decision, explanation=decision.explanation + (
            "; no response finished: output length at least the tokens decode streamed per request "
            "entering it"))
    return decision
