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

One call of ``plan`` runs these steps, each a function of its own:

    _observed_load     the load now (None: hold)
    _forecast_loads    the loads per interval that size prefill and decode
    _needs             instances each interval needs (decode: at least what the sequences
                       running now need, until new capacity serves), split over budget
    _timing            warm-ups, drains and pre-existing warm-ups, in intervals
    _scale_down_floor  the stabilisation window's floor for the first interval
    _program           the MILP: costs, constraint rows, integrality
    _solve             the one solver call (LP first, branch and bound if needed)
    _outcome           the solution read back: counts, shortfall, provisioned nodes, cost
    _decision          the Decision and its explanation
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .calibration import learn_compute, rejected_too_many, samples
from .config import PlannerConfig
from .decision import Decision
from .forecast import forecast, rise_margin
from .model import HEADROOM_BOUNDS, Calibration, Load, calibrate_slo
from .observe import (
    MAX_INSTANCES,
    MAX_MEAN_TOKENS,
    MAX_QUEUE,
    MAX_RATE_RPS,
    MAX_SQUARE_RATIO,
    Observation,
    Reading,
    Role,
    fresh,
    unusable,
)

__all__ = ["History", "PlannerConfig", "current_load", "plan", "recalibrate", "remember", "step"]


@dataclass(frozen=True)
class History:
    """What the planner remembers between calls: recent loads and decisions (oldest first)."""

    loads: tuple[Load | None, ...] = ()
    decisions: tuple[Decision, ...] = ()
    #: the model's online correction learned from past intervals' metrics (None: not yet,
    #: the configured model's own)
    calibration: Calibration | None = None
    #: the last observation's prefill queue (requests), for the next interval's throughput
    #: (calibration.samples); None: not known (a restored memory learns again from the next)
    prefill_queue: Reading | None = None
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
    counts = (cal.samples, cal.prefill_samples, cal.decode_samples)
    return (_finite_in(cal.prefill_headroom, lo, hi) and _finite_in(cal.decode_headroom, lo, hi)
            and _finite_in(cal.prefill_factor, 1e-6, 1e6) and _finite_in(cal.decode_factor, 1e-6, 1e6)
            and all(type(n) is int and n >= 0 for n in counts))


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
    whose miss is the model's error (``_taught_roles``)."""
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
    prefill_taught, decode_taught, prefill_idle = _taught_roles(obs, replace(config, model=model),
                                                                history)
    model = calibrate_slo(
        model,
        ttft_at_percentile_seconds=ttft,
        tpot_at_percentile_seconds=get(obs.tpot_at_percentile_seconds),
        slo=config.slo,
        prefill_settled=prefill_taught,
        decode_settled=decode_taught,
        prefill_idle=prefill_idle,
    )
    return model.calibration


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
#: router), 6% for 0.1 pp (smg); Mooncake 1% for 0.06 pp; Azure and smg's other rows unmoved
HEADROOM_MIN_PREFILL_BUSY = 0.5


def _taught_roles(obs: Observation, cfg: PlannerConfig, history: History
                  ) -> tuple[bool, bool, bool]:
    """(prefill, decode, prefill idle): whether a latency miss this interval says the model is
    wrong, and whether prefill's ready instances were warm, enough and idle (too little
    queueing to explain a miss: ``HEADROOM_MIN_PREFILL_BUSY``).

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
        return False, False, False
    need_p, need_d = _instances_needed(cfg, load)
    need_d = max(need_d, _decode_need_from_sequences(cfg, obs, load))
    # at the interval's burst peak: a burst queues however idle the interval's mean looks
    busy_p = (max(load.rate_rps, load.peak_rate_rps or 0.0) * cfg.model.prefill_service_seconds(load)
              / max(obs.prefill.ready, 1))
    # requests the router refused say its admission (per ready instance) is short, however busy
    queueing = busy_p >= HEADROOM_MIN_PREFILL_BUSY or rejected_too_many(obs, cfg.slo, cfg.max_age_seconds)
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
    return (prefill_enough and queueing,
            obs.decode.recently_ready == 0 and obs.decode.ready >= need_d,
            prefill_enough and not queueing)


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
    future_p, future_d = _forecast_loads(config, [*history.loads, load], load, H)
    # equal loads cost nothing twice: _needs sizes each distinct load once
    return _plan_for(observation, config, history, now, load, future_p, future_d)


def _observed_load(observation: Observation, cfg: PlannerConfig, history: History) -> Load | None:
    """This interval's load as ``plan`` sees it: with the prefill backlog and the last known
    lengths when the config counts a backlog (live fleets), as observed otherwise."""
    last_known = None
    if cfg.backlog_seconds is not None:
        last_known = next((x for x in reversed(history.loads) if x is not None and x.rate_rps > 0), None)
    return current_load(observation, cfg.max_age_seconds, backlog_seconds=cfg.backlog_seconds,
                        last_known=last_known)


def _forecast_loads(
    cfg: PlannerConfig, loads: list[Load | None], load: Load, H: int
) -> tuple[list[Load], list[Load]]:
    """The loads of the next ``H`` intervals that size prefill and decode: the forecast rate
    (never below the rate seen now) times each role's rise margin, with the recent lengths,
    hit rate and burst peak. ``loads``: the history's loads then this interval's, ``load``.

    Each role forecasts from the rates of the past in the planned shape's requests
    (:func:`_in_planned_shape`): a rate of far cheaper requests is counted at the work it
    brought, not as that many requests of the new shape."""
    isl, osl, hit, square = _load_shape(cfg, loads, load)
    planned = _per_request_work(cfg, Load(1.0, isl, osl, hit, input_tokens_square_ratio=square))
    # each past interval's work per request, once for both roles
    works = [None if x is None or x.rate_rps <= 0 else _per_request_work(cfg, x) for x in loads]
    decode_quantile = cfg.rise_quantile if cfg.decode_rise_quantile is None else cfg.decode_rise_quantile
    by_role = []
    for role, quantile in ((0, cfg.rise_quantile), (1, decode_quantile)):
        scale = [_in_planned_shape(cfg, w, role, planned[role]) for w in works]
        seen = [None if x is None else x.rate_rps * f for x, f in zip(loads, scale, strict=True)]
        rates = forecast(seen, H, method=cfg.forecast_method, window=cfg.forecast_window)
        assert rates is not None
        rates[0] = max(rates[0], load.rate_rps)  # never plan the current interval below what we see
        rates = _with_rise_margin(cfg, rates, seen, quantile)
        peak = _burst_peak(cfg, loads, scale)
        by_role.append([Load(r, isl, osl, hit, peak_rate_rps=None if peak is None else max(peak, r),
                             input_tokens_square_ratio=square) for r in rates])
    return by_role[0], by_role[1]


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


def _with_rise_margin(
    cfg: PlannerConfig, rates: list[float], seen: list[float | None], quantile: float
) -> list[float]:
    """``rates`` raised for the rises the history has shown at the warm-up lead.

    Capacity ordered now serves after the warm-up: size it for the ``quantile`` of the rises
    seen ``w`` intervals ahead (empirical, ``forecast.rise_margin``), ramping the margin ``m``
    in over the warm-up: rate_k * (1 + (m - 1) * min(k, w) / w), ``w`` >= 1."""
    w_lead = max(_intervals(cfg.model.profile.warmup.new_node_seconds, cfg.interval_seconds), 1)
    rate_history = seen[-cfg.rise_history_intervals :]
    margin = rise_margin(
        rate_history, lead=w_lead, window=cfg.forecast_window, quantile=quantile,
        max_margin=cfg.max_rise_margin, prior=cfg.rise_prior, min_samples=cfg.rise_min_samples,
        method="trend" if cfg.forecast_method == "trend" else "recent-max",
        stride=w_lead if cfg.rise_independent_samples else 1,
    ) if quantile > 0 else 1.0
    return [r * (1.0 + (margin - 1.0) * min(k, w_lead) / w_lead) for k, r in enumerate(rates)]


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
) -> Decision:
    """Plan for known future loads: ``future`` sizes prefill (and decode, unless
    ``future_decode`` gives decode its own), one load per interval of the horizon."""
    needs = _needs(cfg, observation, future, future_decode)
    timing = _timing(cfg, observation, now, future[0], len(future))
    floor = _scale_down_floor(cfg, history, load, needs, timing)
    program = _program(cfg, needs, timing, floor)
    x, how = _solve(program.c, program.A, program.lo, program.hi, program.ub,
                    program.integrality, cfg.solver_time_limit_seconds)
    if x is None:
        return _hold(observation, history, now, f"solver failed ({how})", cfg)
    outcome = _outcome(program, timing, x)
    decision = _decision(cfg, now, load, future, needs, timing, floor, outcome, how)
    if streamed_output_length(observation, cfg.max_age_seconds) is not None:
        decision = replace(decision, explanation=decision.explanation + (
            "; no response finished: output length at least the tokens decode streamed per request "
            "entering it"))
    return decision


# -- needs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Needs:
    """Instances each role needs per interval, arrays of shape (2, H): row 0 prefill, 1 decode."""

    #: what the solver is asked to serve: within min/max, split over budget (prefill_share)
    need: np.ndarray
    #: the same before the budget split (for the explanation)
    uncapped: np.ndarray
    #: shape (H,): intervals whose need exceeds the budget left by draining nodes
    over: np.ndarray
    #: what this interval needs (after the split): remembered for the scale-down window
    desired: tuple[int, int]
    #: decode instances the sequences running now need where that exceeds the load model's
    #: (0: the load model's binds), for the explanation (``_decode_need_from_sequences``)
    decode_from_sequences: int = 0


def _needs(
    cfg: PlannerConfig, observation: Observation, future: list[Load], future_decode: list[Load] | None
) -> _Needs:
    """Instances needed per role and interval at the utilisation caps (prefill with its
    queueing model for the TTFT target), at least the role's minimum. Over budget (need_p +
    need_d > nodes - draining), prefill gets the floor of :func:`prefill_share`, clipped to
    its minimum and the room the decode minimum leaves, and decode the rest."""
    model = cfg.model
    cache: dict[Load, tuple[int, int]] = {}

    def needed(ld: Load) -> tuple[int, int]:
        if ld not in cache:
            cache[ld] = _instances_needed(cfg, ld)
        return cache[ld]

    need = np.array(
        [[needed(ld)[0] for ld in future],
         [needed(ld)[1] for ld in (future_decode or future)]],
        dtype=float,
    )  # shape (2, H)
    # decode: at least what the sequences running now need, until capacity ordered now
    # serves (from then on the load model's need, and the scale-down window, hold it)
    lead = _intervals(model.profile.warmup.new_node_seconds, cfg.interval_seconds) + 1
    from_sequences = _decode_need_from_sequences(cfg, observation, (future_decode or future)[0])
    binding = from_sequences if from_sequences > need[1, 0] else 0
    need[1, :lead] = np.maximum(need[1, :lead], from_sequences)
    need[0] = np.maximum(need[0], cfg.min_prefill)
    need[1] = np.maximum(need[1], cfg.min_decode)
    # Over budget, divide the shortfall before solving (prefill_share), so that neither role
    # starves (Dynamo cuts prefill first; neither side's users are worth more by default).
    # The budget is in nodes and an instance spans kp or kd of them (a group): the split
    # below is made in nodes and read back in whole instances.
    uncapped = need.copy()
    kp, kd = cfg.nodes_per_instance
    k = np.array([[kp], [kd]], dtype=float)
    avail = float(cfg.nodes - (observation.prefill.draining * kp + observation.decode.draining * kd))
    total = (need * k).sum(axis=0)
    over = total > avail
    if over.any():
        busy = np.array([[model.fluid_demand(ld, cfg.slo)[0] for ld in future],
                         [model.fluid_demand(ld, cfg.slo)[1] for ld in (future_decode or future)]])
        p_share = np.floor(prefill_share(avail, need * k, busy * k) + 1e-9)
        p_share = np.clip(p_share, cfg.min_prefill * kp,
                          max(avail - cfg.min_decode * kd, cfg.min_prefill * kp))
        p_share = np.floor(p_share / kp)  # whole prefill instances
        need[0] = np.where(over, p_share, need[0])
        need[1] = np.where(over, np.maximum(np.floor((avail - p_share * kp) / kd), cfg.min_decode),
                           need[1])
    return _Needs(need=need, uncapped=uncapped, over=over, desired=(int(need[0, 0]), int(need[1, 0])),
                  decode_from_sequences=binding)


def prefill_share(avail: float, need: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """Prefill's share of ``avail`` nodes where the roles need more (fractional, per interval).

    Below its fluid demand (``busy``: instances kept 100% busy, at the TPOT target for decode)
    a role falls off a cliff: prefill's queue grows without bound, every decode step runs past
    the TPOT target, and nearly every request misses. Above it, an instance buys margin for
    queueing and bursts. So the budget covers both fluid demands first (in proportion to them
    when even those do not fit), and what is left goes in proportion to each role's margin
    (need - busy). Split in proportion to need alone, the margin prefill's TTFT queueing asks
    for took decode's fluid demand: on Mooncake x6 under a 27-node budget the planner ran
    23P4D to 19P8D and met 25.7%; split this way it runs 20P7D +-1 and meets 64.1% (the best
    fixed split, 19P8D, 66.3%)."""
    busy = np.minimum(busy, need)
    busy_total, margin = busy.sum(axis=0), need - busy
    by_busy = avail * busy[0] / np.maximum(busy_total, 1e-9)
    by_margin = busy[0] + (avail - busy_total) * margin[0] / np.maximum(margin.sum(axis=0), 1e-9)
    share: np.ndarray = np.where(avail <= busy_total, by_busy, by_margin)
    return share


def _instances_needed(cfg: PlannerConfig, load: Load) -> tuple[int, int]:
    """(prefill, decode) ``cfg.model`` needs for ``load`` at the configured caps and queueing."""
    return cfg.model.instances_needed(
        load, cfg.slo,
        prefill_utilization=cfg.prefill_utilization,
        decode_utilization=cfg.decode_utilization,
        ttft_queueing=True, service_cv=cfg.prefill_service_cv,
        pooled_prefill=cfg.prefill_queue == "pooled",
    )


def _decode_need_from_sequences(cfg: PlannerConfig, observation: Observation, load: Load) -> int:
    """Decode instances the sequences running now need (0 when unknown or stale).

    Decode, by Little's law: the ``N`` sequences running on the decode instances run at the
    TPOT target on ceil(N x headroom / (b x decode_utilization)) instances, ``b`` the batch
    one instance runs at the target for the load's mean context
    (``model.decode_batch_at_slo``). Rates and lengths are counted when requests finish, so
    after a change of load shape they show the need one residence time and a length window
    late; the sequences already running show it at once. In steady load N = rate x output x
    TPOT with TPOT within the target, which the load model's rate x output / tokens-per-second
    at the target already covers, so this adds nothing there.

    Not the decode queues: in PD mode a decode receives each request with its prefill, so its
    transfer queue holds requests whose prefill has not run yet (docs/conformance.md). Counted,
    the demo's long documents (4 tokens out) asked for 10 decodes for a prefill backlog. That
    backlog is prefill's, and enters as load (``current_load``'s backlog).

    A short decode runs its sequences above the TPOT target, and by the same law holds
    TPOT/target times as many as it would at the target: that excess is a backlog that
    drains within a residence time (N / arrival rate), not load. It counts only as far as it
    could still be running when capacity ordered now serves (decayed over a new node's
    warm-up): behind a 600 s warm-up, a doubled load on a short decode (sequences residing
    about 15 s) asked for 23 decode instances where 9 served it; behind the demo's 20 s
    warm-up most of it still counts.

    The running gauge is at most the requests that decoded over the last scrape
    (``decoding_requests``, where read). SGLang sets the gauge only when it logs a batch, and
    an idle decode shows its last busy batch for up to 30 s: summed over decodes each busy a
    fraction of the time, it read 12 sequences where 3 were decoding, and the demo's chat
    held 9 decodes for them where 4 served (the replay, which counts them exactly, held 4-5).
    A request that is not streamed sends its first chunk at 50 tokens and adds
    nothing before it: there the bound reads low, and the load model's need stands."""
    now, decode = observation.now_seconds, observation.decode
    sequences = fresh(decode.running_requests, now, cfg.max_age_seconds)
    decoded = fresh(decode.decoding_requests, now, cfg.max_age_seconds)
    if sequences is not None and decoded is not None:
        sequences = min(sequences, decoded)
    if sequences is None or sequences <= 0:
        return 0
    model = cfg.model
    context = model.decode_mean_context(load)
    batch = model.decode_batch_at_slo(cfg.slo.tpot_seconds, context)
    if batch <= 0:
        return 0  # the target cannot be met at any batch: the load model says so already
    ready = observation.decode.ready
    tpot_now = model.tpot_seconds(sequences / ready, context) if ready > 0 else 0.0
    if tpot_now > cfg.slo.tpot_seconds and load.rate_rps > 0:
        at_target = sequences * cfg.slo.tpot_seconds / tpot_now
        residence_seconds = sequences / load.rate_rps
        lead_seconds = model.profile.warmup.new_node_seconds
        sequences = at_target + (sequences - at_target) * math.exp(-lead_seconds / residence_seconds)
    per_instance = batch * cfg.decode_utilization / model.calibration.decode_headroom
    return math.ceil(round(sequences / per_instance, 9))


# -- timing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Timing:
    """The fleet now and what takes time, in intervals of ``interval`` seconds. Per-role pairs
    and rows are (prefill, decode)."""

    interval: float
    #: seconds a removed instance keeps its node: a prefill queue empties in seconds; decode
    #: as configured, or 2x the mean output at the TPOT target
    drain_seconds: tuple[float, float]
    drain_intervals: tuple[int, int]
    #: intervals from ordering a new node to its serving
    new_node: int
    #: intervals from switching a node into a role to its serving: drain of the other role,
    #: then the role-switch warm-up
    switch_in: tuple[int, int]
    ready: np.ndarray
    #: ready + warming per role
    committed0: np.ndarray
    #: shape (2, H): warm-ups already under way that serve by interval t
    landing: np.ndarray
    #: nodes held by instances of either role draining now
    draining: int


def _timing(cfg: PlannerConfig, observation: Observation, now: float, first: Load, H: int) -> _Timing:
    """Warm-ups and drains in whole intervals (rounded up), from the profile, the config and
    ``first``, the load of the first interval; and the fleet as observed at ``now``."""
    model, dt = cfg.model, cfg.interval_seconds
    prof = model.profile
    osl = first.mean_output_tokens
    drain_d_s = (
        cfg.decode_drain_seconds
        if cfg.decode_drain_seconds is not None
        else 2.0 * osl * cfg.slo.tpot_seconds
    )
    drain_p_s = model.prefill_service_seconds(first)  # a prefill queue empties in seconds
    P, D = observation.prefill, observation.decode
    # pre-existing warm-ups landing by interval t
    landing = np.zeros((2, H))
    for r, st in enumerate((P, D)):
        for w in st.warming:
            k = _intervals(w.ready_at_seconds - now, dt)
            if k < H:
                landing[r, k:] += 1
    return _Timing(
        interval=dt,
        drain_seconds=(drain_p_s, drain_d_s),
        drain_intervals=(_intervals(drain_p_s, dt), _intervals(drain_d_s, dt)),
        new_node=_intervals(prof.warmup.new_node_seconds, dt),
        # switch into role r: drain of the other role, then the role-switch warm-up
        switch_in=(
            _intervals(drain_d_s + prof.warmup.role_switch_seconds, dt),
            _intervals(drain_p_s + prof.warmup.role_switch_seconds, dt),
        ),
        ready=np.array([P.ready, D.ready], dtype=float),
        committed0=np.array([P.committed, D.committed], dtype=float),
        landing=landing,
        draining=P.draining * cfg.nodes_per_instance[0] + D.draining * cfg.nodes_per_instance[1],
    )


# -- the stabilisation floor -----------------------------------------------------------------
def _scale_down_floor(
    cfg: PlannerConfig, history: History, load: Load, needs: _Needs, timing: _Timing
) -> np.ndarray:
    """Per role, the fewest instances the first interval may keep (shape (2,)).

    HPA-style: scale down only to the highest recommendation of the window
    (``stabilization_seconds``). A recommendation for scale-down is the need at a cap lowered
    by the tolerance: the survivors must absorb the load with margin, or per-minute noise
    removes a node only to re-add it minutes later. The floor never exceeds the budget split,
    the nodes the budget leaves beyond the other role's need, the instances there are (it
    never forces a scale-up), or the role's maximum."""
    model = cfg.model
    window_n = cfg.stabilization_intervals
    tol = 1.0 - cfg.scale_down_tolerance
    recent_loads = [ld for ld in history.loads[-window_n:] if ld is not None] if window_n else []
    floor = np.array(needs.desired, dtype=float)
    for ld in [*recent_loads, load]:
        hold = model.instances_needed(
            ld, cfg.slo,
            prefill_utilization=cfg.prefill_utilization * tol,
            decode_utilization=cfg.decode_utilization * tol,
            ttft_queueing=True, service_cv=cfg.prefill_service_cv, queueing_margin=1.0 / tol,
            pooled_prefill=cfg.prefill_queue == "pooled",
        )
        floor = np.maximum(floor, np.array(hold, dtype=float))
    if window_n > 0:
        for dec in history.decisions[-window_n:]:
            floor = np.maximum(floor, np.array(dec.desired, dtype=float))
    # Hysteresis tied to the warm-up: keep what any decision of the last warm-up forecast it
    # would need within a warm-up. A node removed below that is one the forecast's own noise
    # (a recent-max moving by one interval) re-adds minutes later, paying a warm-up for a
    # node the fleet had; the new need must stay below it for a whole warm-up first.
    lead_n = _intervals(model.profile.warmup.new_node_seconds, cfg.interval_seconds)
    if lead_n > 0 and cfg.scale_down_hysteresis:
        for dec in history.decisions[-lead_n:]:
            floor = np.maximum(floor, np.array(dec.lead_need, dtype=float))
    floor = np.where(needs.over[0], np.minimum(floor, needs.need[:, 0]), floor)  # budget split wins
    # The window guards against flapping; it is no claim on nodes the other role needs. When
    # a load's shape flips under the budget (the demo's long documents -> agents: 16 prefill
    # held by the window, decode needing 20 of 24 nodes), a held role keeps only what the
    # budget leaves beyond the other's need up to when a node ordered now would serve (and
    # never less than its own need): else the other role's additions wait out the window.
    lead = min(timing.new_node, needs.need.shape[1] - 1)
    other_need = needs.need[::-1, : lead + 1].max(axis=1)
    k = np.array(cfg.nodes_per_instance, dtype=float)  # nodes per instance of each role
    room = np.floor((cfg.nodes - timing.draining - other_need * k[::-1]) / k)
    floor = np.minimum(floor, np.maximum(needs.need[:, 0], room))
    floor = np.minimum(floor, timing.committed0)  # a floor never forces a scale-up
    # ... nor keeps a fleet above a maxReplicas the user has lowered under it
    capped: np.ndarray = np.minimum(floor, [cfg.max_prefill, cfg.max_decode])
    return capped


# -- the programme ---------------------------------------------------------------------------
# Variables: for role r in (0, 1) and kind in (add, switch-in, remove, short), one per
# interval t, at index (r * 4 + kind) * H + t. Adds, switches and removals are integers;
# shortfalls are continuous.
_ADD, _SW, _REM, _SHORT = 0, 1, 2, 3
_KINDS = 4


def _cols(r: int, kind: int, H: int) -> slice:
    s = (r * _KINDS + kind) * H
    return slice(s, s + H)


def _before(w: int, H: int) -> np.ndarray:
    """[t, tau] = 1 if tau <= t - w: an action at tau has taken effect by t after w intervals."""
    out: np.ndarray = np.tril(np.ones((H, H)), -w) if w < H else np.zeros((H, H))
    return out


def _draining(w: int, H: int) -> np.ndarray:
    """[t, tau] = 1 if t - w < tau <= t: a removal at tau still holds its node while draining."""
    if w <= 0:
        return np.zeros((H, H))
    diff: np.ndarray = _before(0, H) - _before(w, H)
    return diff


def _serving_rows(r: int, H: int, timing: _Timing) -> np.ndarray:
    """(H, nv): change in role r's serving instances at each t (adds after the new-node
    warm-up, switches in after their drain and warm-up, minus removals and switches out)."""
    tri = _before(0, H)
    a = np.zeros((H, 2 * _KINDS * H))
    a[:, _cols(r, _ADD, H)] = _before(timing.new_node, H)
    a[:, _cols(r, _SW, H)] = _before(timing.switch_in[r], H)
    a[:, _cols(r, _REM, H)] = -tri
    a[:, _cols(1 - r, _SW, H)] = -tri  # switched away from r
    return a


def _committed_rows(r: int, H: int) -> np.ndarray:
    """(H, nv): change in role r's committed (ready + warming) instances at each t."""
    tri = _before(0, H)
    a = np.zeros((H, 2 * _KINDS * H))
    a[:, _cols(r, _ADD, H)] = tri
    a[:, _cols(r, _SW, H)] = tri
    a[:, _cols(r, _REM, H)] = -tri
    a[:, _cols(1 - r, _SW, H)] = -tri
    return a


@dataclass(frozen=True)
class _Program:
    """min c @ x  s.t.  lo <= A @ x <= hi,  0 <= x <= ub,  x integral where integrality is 1;
    plus the row blocks that read a solution back (each (H, nv), per role)."""

    c: np.ndarray
    A: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    ub: np.ndarray
    integrality: np.ndarray
    serving: tuple[np.ndarray, np.ndarray]
    committed: tuple[np.ndarray, np.ndarray]
    #: (H, nv): change in provisioned nodes (committed, plus removals while they drain)
    provisioned: np.ndarray
    #: shape (H,): nodes provisioned with no action (the fleet now, its draining nodes)
    base_provisioned: np.ndarray
    #: GPU-hours of one node (a one-node instance) for one interval
    gpu_hours: float


class _Rows:
    """Constraint rows lo <= a @ x <= hi, collected in order."""

    def __init__(self) -> None:
        self.a: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []

    def add(self, a: np.ndarray, lb: np.ndarray | float, ub: np.ndarray | float) -> None:
        self.a.append(a)
        self.lo.append(np.broadcast_to(np.asarray(lb, dtype=float), (a.shape[0],)))
        self.hi.append(np.broadcast_to(np.asarray(ub, dtype=float), (a.shape[0],)))


def _program(cfg: PlannerConfig, needs: _Needs, timing: _Timing, floor: np.ndarray) -> _Program:
    """The MILP over the horizon (see the module docstring): the rows of each role, the
    switch limits, the node budget, then the costs."""
    H = needs.need.shape[1]
    rows = _Rows()
    serving = (_serving_rows(0, H, timing), _serving_rows(1, H, timing))
    committed = (_committed_rows(0, H), _committed_rows(1, H))
    prov = np.zeros((H, 2 * _KINDS * H))  # in nodes: an instance of role r holds k[r]
    k = cfg.nodes_per_instance
    for r in (0, 1):
        _role_rows(rows, cfg, r, needs, timing, floor, serving[r], committed[r])
        prov += committed[r] * float(k[r])
        prov[:, _cols(r, _REM, H)] += _draining(timing.drain_intervals[r], H) * float(k[r])
    _switch_rows(rows, needs, timing, H, same_shape=k[0] == k[1])
    # node budget; existing draining nodes hold theirs for the longest drain
    old_drain = np.where(np.arange(H) < max(timing.drain_intervals), timing.draining, 0)
    base_prov = (timing.committed0 * np.array(k, dtype=float)).sum() + old_drain
    # never force removals to fit a budget that is already exceeded: cap at what exists
    budget = np.maximum(cfg.nodes - base_prov, np.minimum(0.0, 0.0 * base_prov))
    rows.add(prov, -np.inf, budget)
    # GPU-hours of one node for one interval (with groups, the profile's gpus_per_instance
    # is a node's GPUs: PlannerConfig.nodes_per_instance)
    gpu_h = cfg.model.profile.gpus_per_instance * timing.interval / 3600.0
    integrality = np.ones(2 * _KINDS * H)
    for r in (0, 1):
        integrality[_cols(r, _SHORT, H)] = 0
    return _Program(
        c=_costs(cfg, timing, prov, gpu_h, H),
        A=np.vstack(rows.a), lo=np.concatenate(rows.lo), hi=np.concatenate(rows.hi),
        ub=np.full(2 * _KINDS * H, np.inf), integrality=integrality,
        serving=serving, committed=committed, provisioned=prov, base_provisioned=base_prov,
        gpu_hours=gpu_h,
    )


def _role_rows(
    rows: _Rows, cfg: PlannerConfig, r: int, needs: _Needs, timing: _Timing, floor: np.ndarray,
    serving: np.ndarray, committed: np.ndarray,
) -> None:
    """Role r's rows: need met or short, no removal of what is not there, min/max on the
    committed instances, per-interval steps, and the stabilisation floor at t = 0."""
    H = serving.shape[0]
    inf = np.inf
    base_serving = timing.ready[r] + timing.landing[r]
    # serving + short >= need
    a = serving.copy()
    a[:, _cols(r, _SHORT, H)] = np.eye(H)
    rows.add(a, needs.need[r] - base_serving, inf)
    # serving >= 0 (cannot remove more than are there)
    rows.add(serving, -base_serving, inf)
    # min/max on committed
    lim = (cfg.min_prefill, cfg.max_prefill) if r == 0 else (cfg.min_decode, cfg.max_decode)
    # (a fleet outside bounds the user has just moved comes back in as fast as the step
    # limits allow)
    c0 = timing.committed0[r]
    low, ceiling = lim[0] - c0, lim[1] - c0
    if cfg.max_step_up is not None:
        low = np.minimum(low, cfg.max_step_up * np.arange(1, H + 1))
    if cfg.max_step_down is not None:
        ceiling = np.maximum(ceiling, -cfg.max_step_down * np.arange(1, H + 1))
    rows.add(committed, low, ceiling)
    # max steps per interval
    if cfg.max_step_up is not None:
        a = np.zeros_like(serving)
        a[:, _cols(r, _ADD, H)] = np.eye(H)
        a[:, _cols(r, _SW, H)] = np.eye(H)
        rows.add(a, -inf, cfg.max_step_up)
    if cfg.max_step_down is not None:
        a = np.zeros_like(serving)
        a[:, _cols(r, _REM, H)] = np.eye(H)
        a[:, _cols(1 - r, _SW, H)] = np.eye(H)
        rows.add(a, -inf, cfg.max_step_down)
    # stabilisation floor for the first interval
    rows.add(committed[:1], floor[r] - c0, inf)


def _switch_rows(rows: _Rows, needs: _Needs, timing: _Timing, H: int, same_shape: bool = True) -> None:
    """Switch only to fix a lasting imbalance: once new nodes could land, role r still lacks
    nodes that the other role has spare. A transient shortfall already covered by warming
    capacity is no reason to take a node out of service for drain + warm-up. Between roles
    whose instances span different node counts there is no switch (a group of one shape is
    no instance of the other): ``same_shape`` False forbids it."""
    late = min(timing.new_node, H - 1)
    need, committed0 = needs.need, timing.committed0
    for r in (0, 1):
        deficit = float(need[r, late:].max() - committed0[r])
        surplus = float(committed0[1 - r] - need[1 - r, late:].max())
        a = np.zeros((1, 2 * _KINDS * H))
        a[0, _cols(r, _SW, H)] = 1.0
        rows.add(a, -np.inf, max(0.0, min(deficit, surplus)) if same_shape else 0.0)


def _costs(cfg: PlannerConfig, timing: _Timing, prov: np.ndarray, gpu_h: float, H: int) -> np.ndarray:
    """c per variable, in GPU-hours: the provisioned nodes it adds over the horizon, the
    shortfall penalty, the idle time of a switch, and an epsilon on every action."""
    c = np.zeros(2 * _KINDS * H)
    # provisioned-node cost of each variable = column sum of the provisioned rows
    c += gpu_h * prov.sum(axis=0)
    penalty = cfg.shortfall_penalty * gpu_h  # an instance short for one interval vs idle ones
    k = cfg.nodes_per_instance  # a group's shortfall, switch and drain cost all its nodes
    for r in (0, 1):
        c[_cols(r, _SHORT, H)] = penalty * k[r]
        # epsilon on actions: on a tie, do nothing
        c[_cols(r, _ADD, H)] += 0.01 * gpu_h
        # A switched node serves neither role for drain + warm-up: price that idle time again
        # so that a switch is chosen for a lasting shift of the ratio (it saves a new node and
        # keeps the budget), not to chase per-minute noise
        c[_cols(r, _SW, H)] += cfg.role_switch_penalty * timing.switch_in[r] * gpu_h * k[r]
        c[_cols(r, _REM, H)] += 0.01 * gpu_h
        # a removed node still costs its drain: price the fraction of an interval
        frac = timing.drain_seconds[r] / timing.interval
        c[_cols(r, _REM, H)] += gpu_h * max(0.0, frac - timing.drain_intervals[r]) * k[r]
    return c


# -- the result ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Outcome:
    """A solution read back. Arrays of shape (2, H) per role, (H,) for nodes."""

    serve: np.ndarray
    comm: np.ndarray
    short: np.ndarray
    provisioned: np.ndarray
    cost_gpu_hours: float
    #: committed instances for the first interval: the decision
    target: tuple[int, int]
    #: nodes switched now into (prefill, decode)
    switched: tuple[int, int]


def _outcome(program: _Program, timing: _Timing, x: np.ndarray) -> _Outcome:
    """Round the solver's actions to whole instances (adds and switches up, removals down:
    never fewer than the solution asked for) and count what serves, what is committed, what
    is short and what is provisioned per interval."""
    H = timing.landing.shape[1]
    x = np.round(x, 6)
    for r in (0, 1):
        for kind in (_ADD, _SW, _REM):
            x[_cols(r, kind, H)] = np.ceil(x[_cols(r, kind, H)] - 1e-6) if kind != _REM else np.floor(
                x[_cols(r, kind, H)] + 1e-6
            )
    serve = np.array([timing.ready[r] + timing.landing[r] + program.serving[r] @ x for r in (0, 1)])
    comm = np.array([timing.committed0[r] + program.committed[r] @ x for r in (0, 1)])
    provisioned = program.base_provisioned + program.provisioned @ x
    return _Outcome(
        serve=serve,
        comm=comm,
        short=np.array([x[_cols(r, _SHORT, H)] for r in (0, 1)]),
        provisioned=provisioned,
        cost_gpu_hours=float(program.gpu_hours * provisioned.sum()),
        target=(int(np.rint(comm[0, 0])), int(np.rint(comm[1, 0]))),
        switched=(int(x[_cols(0, _SW, H)][0]), int(x[_cols(1, _SW, H)][0])),
    )


def _decision(
    cfg: PlannerConfig, now: float, load: Load, future: list[Load], needs: _Needs,
    timing: _Timing, floor: np.ndarray, outcome: _Outcome, how: str,
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
        explanation=_explain(cfg, load, future, needs, timing, floor, outcome),
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
    """The most each role needs up to the first interval a node ordered now serves."""
    peak = needs.need[:, : timing.new_node + 1].max(axis=1)
    return int(peak[0]), int(peak[1])


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
    hp, hd, clamped = _clamp(p, d, cfg)
    text = f"{why}: holding {src} {p}P{d}D (unknown is not zero)"
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
        desired=history.decisions[-1].desired if history.decisions else (hp, hd),
    )


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
    floor: np.ndarray, outcome: _Outcome,
) -> str:
    """A few clauses a user can check: load, what bound the counts, what was traded."""
    return "; ".join([
        *_load_clauses(cfg, load, future, needs, outcome, timing.interval),
        *_action_clauses(needs, timing, outcome),
        *_limit_clauses(cfg, needs, timing, floor, outcome),
    ])


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
