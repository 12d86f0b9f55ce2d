"""The planner's knobs: :class:`PlannerConfig`, validated when it is made, and
:func:`build_config`, the one place a deployment's figures become a configuration.

``build_config`` takes plain keyword arguments in seconds and derives what follows from them
(the horizon from the warm-up, the backlog's clearing time, the profile's warm-up). Its one
caller in the product is the mapping from a PDCluster spec (``operator/loop/planning.py:
planner_config``), which the operator, ``pdscale replay`` and the benchmarks all use, so that
the planner measured in a replay is the planner that runs. (The planner cannot import the
operator's spec model, so the mapping lives there; the replay receives its result whole.)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

from .forecast import METHODS
from .model import PerformanceModel, Slo
from .schedule import ScheduledFloor
from .seasonal import WEEKLY_MODES

#: HPA's default scale-down stabilization window, for engines that start in seconds
HPA_SCALE_DOWN_WINDOW_SECONDS = 300.0

#: the horizon covers the new-node warm-up plus this many intervals, so that the solver sees
#: a node started now serve for a while (and prices its warm-up against what it saves) ...
HORIZON_AFTER_WARMUP_INTERVALS = 5
#: ... and never fewer intervals than this, for engines that start within an interval
MIN_DERIVED_HORIZON_INTERVALS = 10


@dataclass(frozen=True)
class PlannerConfig:
    """Planner knobs. Names follow HPA ``behavior`` where one exists; times in seconds.

    Every value is checked on construction (also by ``dataclasses.replace``): a bad one raises
    ``ValueError`` naming the field and its allowed range."""

    model: PerformanceModel
    slo: Slo = field(default_factory=Slo)
    interval_seconds: float = 60.0
    #: intervals planned ahead; must cover the new-node warm-up to price it
    horizon_intervals: int = 30
    #: node budget shared by both roles, counting warming and draining nodes
    nodes: int = 64
    min_prefill: int = 1
    max_prefill: int = 10**6
    min_decode: int = 1
    max_decode: int = 10**6
    #: highest busy share per role; prefill is also sized by the queueing model for its TTFT
    prefill_utilization: float = 0.85
    decode_utilization: float = 0.8
    #: coefficient of variation of prefill compute time (heavy-tailed prompts wait longer)
    prefill_service_cv: float = 1.5
    #: how the router spreads prefill requests, which sets the TTFT queueing model: "pooled"
    #: (it sends each where it is served soonest: one M/G/c queue) or "split" (it picks an
    #: instance at random, as sglang-router 0.3.2 does in PD mode: c independent M/G/1 queues)
    prefill_queue: str = "pooled"
    #: scale-down uses the highest need seen in this window (HPA scaleDown stabilization).
    #: None = HPA's 300 s plus the new-node warm-up: a node released now is back no sooner
    #: than one warm-up after the need returns, so a need that recurs within it finds the
    #: fleet short. Measured (bench/policy_bench.py): on Azure code x20, whose per-minute rate
    #: jumps between 0 and 200 req/s, 300 s met 97.1% of requests and 900 s 99.0% at 1.18x
    #: the GPU-hours; on Mooncake x6 and ServeGen x0.3 it cost 5% and 3% more GPU-hours.
    stabilization_window_seconds: float | None = None
    #: scale down only if the survivors stay below (1 - tolerance) x the utilisation cap.
    #: The need is read from windowed means that move by a few percent from one interval to
    #: the next (a 3-interval mean output length: 333 then 342 tokens on a steady plateau),
    #: so a need sitting at an instance boundary removes a node and re-adds it minutes later,
    #: a warm-up paid for a node the fleet had (bench/ramp_bench.py: the ramp's plateau, decode
    #: 8 -> 7 -> 8). Measured on the deployed stack (bench/policy_bench.py, ramp_bench.py),
    #: 0.03 against 0: no re-add on the ramp (was 1); ServeGen 97.22% at 3299 GPU-h (96.77% at
    #: 3360); Mooncake 98.10% at 1.02x the GPU-hours; Azure, steady, step and spike within
    #: 0.1 pp and 1%. 0.05 kept more for nothing; 0.1 cost 10% GPU-hours on Mooncake x5 at
    #: equal attainment (ideal router)
    scale_down_tolerance: float = 0.03
    #: scale down only below what every decision of the last warm-up forecast it would need
    #: within a warm-up (solve._scale_down_floor): no node removed and re-added within one
    scale_down_hysteresis: bool = True
    #: the window and its hysteresis remember a past need only as far as the fleet was serving
    #: it then (the decision's planned serving count for that interval): instances that
    #: landed after a need never served it, and are held only by needs seen since. Off by
    #: default: measured on the surge (issue 48) it leaves the default stack dominated
    #: (docs/benchmarks-risk.md, "the surge row, bounded")
    scale_down_served_only: bool = False
    #: most instances one role may gain / lose per interval (HPA policies); None = unlimited
    max_step_up: int | None = None
    max_step_down: int | None = None
    #: new capacity is sized for this quantile of the burst peaks the scale-down window has
    #: seen (its intervals, ``stabilization_seconds``); the window's floor still holds the
    #: capacity for the highest. Buying for the highest chases a burst that has passed with
    #: nodes that serve a warm-up later; keeping what serves it costs no warm-up. Measured on
    #: Azure code x20 (900 s window): 0.9 met 99.0% of requests; the highest 99.1% at 1.42x
    #: the GPU-hours; 0.75 98.8%. Over the 3-interval length window instead, 0.9 of three
    #: peaks is their highest: on Azure conv (deployed stack) one 215 req/s minute ordered 17
    #: prefill that landed after it (93.2% at 375 GPU-h; over the window 93.6% at 349).
    burst_quantile: float = 0.9
    #: forecast method for the request rate (see forecast.METHODS) and its window. "trend"
    #: (recent max plus a significant, damped, bounded slope) leads a ramp without carrying it
    #: past its end: on a +50% ramp over 10 minutes it met 88.4% against recent-max's 86.0%
    #: (oracle 90.2%) at the same peak; steps and spikes are not extrapolated (docs/replay.md)
    forecast_method: str = "trend"
    forecast_window: int = 5
    #: intervals averaged (rate-weighted) for lengths and prefix hit rate, which move slowly
    #: and are noisy per minute
    length_window: int = 15
    #: a mean length this many times the window's is a new load shape (chat -> long
    #: documents), sized for at once: lengths are counted as requests finish, so the window's
    #: mean trails a new shape by its whole length. Below it, per-interval noise: sizing for
    #: every high (the ratio 1) cost a steady hour 17% more GPU-hours for no attainment
    #: (bench/policy_bench.py). A shape that turns shorter follows the window, and the
    #: scale-down window holds what the longer needed. None: the window alone
    length_jump_ratio: float | None = 1.5
    #: size capacity for this quantile of the rate rises seen over the lead, warm-up plus one
    #: interval (0 = off): ``spec.planner.loadPercentile`` / 100 (``solve._lead_forecast``)
    rise_quantile: float = 0.9
    #: the same for decode (None = ``rise_quantile``), higher: a decode fleet short by a
    #: fraction slows every running sequence past the TPOT target until new nodes land, while
    #: a prefill fleet short by a fraction (with early rejection) loses only that fraction, so
    #: an uncovered rise costs decode several times more. Measured on ServeGen's day series at
    #: its own rate (10-minute windows stepping by up to 1.8x): 0.9 met 97.6% of requests,
    #: 0.95 99.4% at 2.7% more GPU-hours, 1.0 99.4% at 16% more. On the series compressed 2x it
    #: cost 2.3% more GPU-hours for no gain; Mooncake and Azure were unchanged.
    decode_rise_quantile: float | None = 0.95
    max_rise_margin: float = 2.0
    #: the margin held until ``rise_min_samples`` warm-ups of history show how far the load
    #: moves over a lead (a fresh install: about two hours): a rise the planner cannot yet
    #: price lands a warm-up after it is seen. On issue 48's surge (+70% within one warm-up,
    #: an hour of history) 1.0 met 96.43% where a fixed fleet met 99.09%; 1.1 met 99.09%,
    #: for 1.7-6.0% more GPU-hours on the default stack's other traces (docs/
    #: benchmarks-risk.md, 2026-12-07). Once learned, the history's own quantile replaces it
    rise_prior: float = 1.1
    rise_min_samples: int = 10
    #: the rises are sampled one warm-up apart (forecast.rise_margin ``stride``), so that
    #: ``rise_min_samples`` counts independent warm-ups and one step or ramp is one sample,
    #: not a warm-up's worth: with overlapping samples a single 2x step in the first hour set
    #: the margin to 2.0 for the rest of the trace (bench/ramp_bench.py, docs/replay.md)
    rise_independent_samples: bool = True
    rise_history_intervals: int = 1440
    #: forecast with the daily profile of the earlier days (``seasonal``): the recent rate
    #: divided by the profile at its time of day, forecast, and multiplied by the profile at
    #: the time forecast. No earlier whole day known: exactly the plain forecast.
    #: ``spec.planner.seasonality`` (Auto: True, Off: False)
    seasonality: bool = True
    #: the day-of-week factor on top of the daily profile (``seasonal.WEEKLY_MODES``): auto
    #: uses it only where it forecast the memory's own held-out midnights better; on, off
    #: (the benches' arms). Needs ``seasonal.WEEKLY_MIN_DAYS`` earlier days.
    weekly_seasonality: str = "auto"
    #: cost of one instance missing for one interval, in instance-intervals of GPU time
    shortfall_penalty: float = 1000.0
    #: extra cost of a role switch, in multiples of its idle (drain + warm-up) node time
    role_switch_penalty: float = 1.0
    #: readings older than this are unknown
    max_age_seconds: float = 180.0
    #: live fleets: requests queued at prefill count as arrivals to serve within this many
    #: seconds, and unknown lengths fall back to the last known ones (see current_load);
    #: None for replays, whose observations are exact. Only the interval planned sees the
    #: backlog: the history remembers loads as observed (``current_load`` without it)
    backlog_seconds: float | None = None
    #: expected drain of a decode instance being removed; None = from the load (2x mean output
    #: at the TPOT target)
    decode_drain_seconds: float | None = None
    #: MILP time limit; the LP relaxation rounded up is used if it is hit
    solver_time_limit_seconds: float = 0.2
    #: whole nodes one (prefill, decode) instance spans (a LeaderWorkerSet group). The group
    #: is the unit: counts, bounds and steps stay in instances, while the node budget, the
    #: GPU-hours and the shortfall, switch and drain costs count an instance's nodes (the
    #: profile's ``gpus_per_instance`` is then read as GPUs per node, and its capacities as
    #: one instance's of that shape). A role switch needs both roles to have the same nodes
    #: per instance; otherwise none is planned. (1, 1): every instance one node.
    nodes_per_instance: tuple[int, int] = (1, 1)
    #: user-stated windows of minimum instances (KEDA's cron scaler): while one is open, each
    #: role keeps at least its minimum, and the instances it adds are ordered a warm-up before
    #: it opens (the floor is a need of the intervals it covers, ``needs._needs``). A floor is
    #: not remembered as load: when the window closes, the fleet follows the load again
    schedules: tuple[ScheduledFloor, ...] = ()
    #: Unix time of the planner's time 0, where the schedules are read on the wall clock: 0 for
    #: the operator, which plans on Unix time; a replay's trace start (``--start-time``)
    clock_origin_unix_seconds: float = 0.0

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def stabilization_seconds(self) -> float:
        """The scale-down window in force (explicit, or derived from the warm-up)."""
        if self.stabilization_window_seconds is not None:
            return self.stabilization_window_seconds
        return HPA_SCALE_DOWN_WINDOW_SECONDS + self.model.profile.warmup.new_node_seconds

    @property
    def rise_quantiles(self) -> tuple[float, float]:
        """The rise quantile each role is sized at (prefill, decode): decode's own, or
        prefill's when it has none."""
        decode = self.rise_quantile if self.decode_rise_quantile is None else self.decode_rise_quantile
        return self.rise_quantile, decode

    @property
    def stabilization_intervals(self) -> int:
        """Whole planning intervals in the scale-down window (0 for a window shorter than one)."""
        return int(self.stabilization_seconds // self.interval_seconds)


# -- validation ------------------------------------------------------------------------------
# One rule per numeric field: (field, lowest, lowest allowed itself, highest, highest allowed
# itself, None allowed). A table rather than thirty ifs: the ranges read in one place, and the
# message for each is written once.
_INF = math.inf
#: PlannerConfig.prefill_queue's values
PREFILL_QUEUES = ("pooled", "split")
_REAL_RULES: tuple[tuple[str, float, bool, float, bool, bool], ...] = (
    ("interval_seconds", 0.0, False, _INF, False, False),
    ("prefill_utilization", 0.0, False, 1.0, True, False),
    ("decode_utilization", 0.0, False, 1.0, True, False),
    ("prefill_service_cv", 0.0, True, _INF, False, False),
    ("stabilization_window_seconds", 0.0, True, _INF, False, True),
    ("scale_down_tolerance", 0.0, True, 1.0, False, False),
    ("burst_quantile", 0.0, True, 1.0, True, False),
    ("rise_quantile", 0.0, True, 1.0, True, False),
    ("decode_rise_quantile", 0.0, True, 1.0, True, True),
    # a margin multiplies the forecast: below 1 it would plan for less than the forecast
    ("max_rise_margin", 1.0, True, _INF, False, False),
    ("rise_prior", 1.0, True, _INF, False, False),
    ("shortfall_penalty", 0.0, False, _INF, False, False),
    ("role_switch_penalty", 0.0, True, _INF, False, False),
    ("max_age_seconds", 0.0, False, _INF, False, False),
    ("length_jump_ratio", 1.0, True, _INF, False, True),
    ("backlog_seconds", 0.0, False, _INF, False, True),
    ("decode_drain_seconds", 0.0, True, _INF, False, True),
    ("solver_time_limit_seconds", 0.0, False, _INF, False, False),
    ("clock_origin_unix_seconds", -_INF, False, _INF, False, False),
)
# (field, lowest allowed, None allowed); the maxima per role are checked against their minima
_INT_RULES: tuple[tuple[str, int, bool], ...] = (
    ("horizon_intervals", 1, False),
    ("nodes", 0, False),
    ("min_prefill", 0, False),
    ("min_decode", 0, False),
    ("max_step_up", 1, True),
    ("max_step_down", 1, True),
    ("forecast_window", 1, False),
    ("length_window", 1, False),
    ("rise_min_samples", 1, False),
    ("rise_history_intervals", 1, False),
)


def _range(lo: float, lo_in: bool, hi: float, hi_in: bool) -> str:
    if hi == _INF:
        return f"{'>=' if lo_in else '>'} {lo:g}"
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def _check_real(owner: str, name: str, value: object, lo: float, lo_in: bool, hi: float,
                hi_in: bool, optional: bool = False) -> None:
    if value is None and optional:
        return
    x = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    ok = math.isfinite(x) and (lo <= x if lo_in else lo < x) and (x <= hi if hi_in else x < hi)
    if not ok:
        allowed = f"a finite number {_range(lo, lo_in, hi, hi_in)}" + (" or None" if optional else "")
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _is_int(value: object, lowest: int) -> bool:
    # numpy integers are Integral but not int; a bool is an int but never a count
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and int(value) >= lowest)


def _check_int(owner: str, name: str, value: object, lo: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_int(value, lo):
        allowed = f"an integer >= {lo}" + (" or None" if optional else "")
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")


#: switches: exactly True or False (a truthy string or number is a mistake, not a yes)
_BOOL_RULES: tuple[str, ...] = ("scale_down_hysteresis", "scale_down_served_only",
                                "rise_independent_samples", "seasonality")


def _validate(cfg: PlannerConfig) -> None:
    """Raise ValueError naming the first field outside its allowed range."""
    # (model and slo are typed, not isinstance-checked: a module imported twice under two
    # names, as a doctest run on the file does, has two classes of each)
    owner = "PlannerConfig"
    _check_real(owner, "slo.ttft_seconds", cfg.slo.ttft_seconds, 0.0, False, _INF, False)
    _check_real(owner, "slo.tpot_seconds", cfg.slo.tpot_seconds, 0.0, False, _INF, False)
    # a share of requests: 0 asks nothing, 1 asks that no request ever misses
    _check_real(owner, "slo.percentile", cfg.slo.percentile, 0.0, False, 1.0, False)
    for name, lo, lo_in, hi, hi_in, optional in _REAL_RULES:
        _check_real(owner, name, getattr(cfg, name), lo, lo_in, hi, hi_in, optional)
    for name, lowest, optional in _INT_RULES:
        _check_int(owner, name, getattr(cfg, name), lowest, optional)
    for name in _BOOL_RULES:
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{owner}.{name} must be True or False, got {getattr(cfg, name)!r}")
    for role in ("prefill", "decode"):
        low = getattr(cfg, f"min_{role}")
        high = getattr(cfg, f"max_{role}")
        if not _is_int(high, low):
            raise ValueError(
                f"{owner}.max_{role} must be an integer >= min_{role} ({low}), got {high!r}")
    k = cfg.nodes_per_instance
    if not (isinstance(k, tuple) and len(k) == 2 and all(_is_int(x, 1) for x in k)):
        raise ValueError(f"{owner}.nodes_per_instance must be a pair of integers >= 1 "
                         f"(prefill, decode), got {k!r}")
    _check_schedules(cfg)
    if cfg.forecast_method not in METHODS:
        raise ValueError(
            f"{owner}.forecast_method must be one of {METHODS}, got {cfg.forecast_method!r}")
    if cfg.weekly_seasonality not in WEEKLY_MODES:
        raise ValueError(f"{owner}.weekly_seasonality must be one of {WEEKLY_MODES}, "
                         f"got {cfg.weekly_seasonality!r}")
    if cfg.prefill_queue not in PREFILL_QUEUES:
        raise ValueError(
            f"{owner}.prefill_queue must be one of {PREFILL_QUEUES}, got {cfg.prefill_queue!r}")


def _check_schedules(cfg: PlannerConfig) -> None:
    """Schedules are ScheduledFloor (checked when made), and no floor passes its role's max."""
    owner = "PlannerConfig.schedules"
    if not isinstance(cfg.schedules, tuple):
        raise ValueError(f"{owner} must be a tuple of ScheduledFloor, got {cfg.schedules!r}")
    for s in cfg.schedules:
        if type(s).__name__ != "ScheduledFloor":  # (by name: see the note on model and slo)
            raise ValueError(f"{owner} must hold ScheduledFloor, got {s!r}")
        for role in ("prefill", "decode"):
            low, high = getattr(s, f"min_{role}"), getattr(cfg, f"max_{role}")
            if low > high:
                raise ValueError(f"{owner}[{s.name!r}].min_{role} ({low}) exceeds max_{role} ({high})")


def decode_quantile(quantile: float) -> float:
    """Decode's rise quantile for prefill's ``quantile``: half the risk (0.9 -> 0.95; 0 stays
    off). A decode fleet short by a fraction slows every running sequence past the TPOT
    target until new nodes land; a prefill fleet short by a fraction loses that fraction
    (``PlannerConfig.decode_rise_quantile``)."""
    return 1.0 - (1.0 - quantile) / 2.0 if quantile > 0 else 0.0


# -- the one builder -------------------------------------------------------------------------
def _with_warmup(model: PerformanceModel, warmup_seconds: float | None) -> PerformanceModel:
    """``model`` whose profile's new-node and role-switch warm-ups are ``warmup_seconds``
    (None: as the profile says). model_copy does not validate: build_config checks it."""
    if warmup_seconds is None:
        return model
    profile = model.profile.model_copy(update={
        "warmup": model.profile.warmup.model_copy(update={
            "new_node_seconds": warmup_seconds, "role_switch_seconds": warmup_seconds,
        })
    })
    return replace(model, profile=profile)


def build_config(
    *,
    model: PerformanceModel,
    slo: Slo,
    interval_seconds: float,
    node_budget: int,
    warmup_seconds: float | None = None,
    min_prefill: int = 1,
    max_prefill: int = 10**6,
    min_decode: int = 1,
    max_decode: int = 10**6,
    stabilization_window_seconds: float | None = None,
    decode_drain_seconds: float | None = None,
    horizon_intervals: int | None = None,
    count_prefill_backlog: bool = False,
    length_window: int = PlannerConfig.length_window,
    rise_quantile: float = PlannerConfig.rise_quantile,
    decode_rise_quantile: float | None = PlannerConfig.decode_rise_quantile,
    prefill_queue: str = PlannerConfig.prefill_queue,
    nodes_per_instance: tuple[int, int] = (1, 1),
    schedules: tuple[ScheduledFloor, ...] = (),
    seasonality: bool = True,
) -> PlannerConfig:
    """A validated :class:`PlannerConfig` from a deployment's figures (times in seconds).

    Derived here, and nowhere else:

    - warm-up: ``warmup_seconds`` (what this deployment's instances take from start to
      serving) replaces the profile's new-node *and* role-switch warm-up (a role switch is a
      drain plus a fresh instance of the other role); None keeps the profile's figures.
    - horizon: ``horizon_intervals``, or when None
      ``max(10, ceil(warm-up / interval) + 5)`` intervals, so that the solver sees a new
      instance come online and serve, and prices its warm-up.
    - backlog: with ``count_prefill_backlog`` (live fleets, whose engines count requests as
      they complete), the requests queued at prefill are work to clear within
      ``interval + warm-up`` seconds, the soonest that capacity ordered now can work on it
      (over one interval alone, the demo's long documents bought 16 prefill nodes for a queue
      that had mostly cleared before they were ready). Off: observations are exact (replays).

    ``node_budget`` counts nodes shared by both roles (warming and draining included);
    ``min_*``/``max_*`` bound each role's instances; ``stabilization_window_seconds`` None is
    HPA's 300 s plus the warm-up; ``decode_drain_seconds`` None is estimated from the load;
    ``length_window`` (intervals) smooths lengths and hit rate; ``rise_quantile`` the risk
    over the lead prefill is sized for (:func:`decode_quantile` gives decode's);
    ``decode_rise_quantile`` None sizes decode for rises as prefill is; ``prefill_queue`` how the router spreads prefill
    (``PlannerConfig.prefill_queue``); ``nodes_per_instance`` the (prefill, decode) nodes one
    instance spans, each counted against ``node_budget``; ``schedules`` the windows of
    minimum instances (``PlannerConfig.schedules``); ``seasonality`` whether the forecast
    uses the daily profile of earlier days (``PlannerConfig.seasonality``). Raises
    ValueError naming a bad argument."""
    model = _with_warmup(model, warmup_seconds)
    warmup = model.profile.warmup.new_node_seconds
    _check_real("build_config", "warmup_seconds", warmup, 0.0, True, _INF, False)
    _check_real("build_config", "interval_seconds", interval_seconds, 0.0, False, _INF, False)
    if horizon_intervals is None:
        horizon_intervals = max(MIN_DERIVED_HORIZON_INTERVALS,
                                math.ceil(warmup / interval_seconds) + HORIZON_AFTER_WARMUP_INTERVALS)
    return PlannerConfig(
        model=model,
        slo=slo,
        interval_seconds=interval_seconds,
        horizon_intervals=horizon_intervals,
        nodes=node_budget,
        min_prefill=min_prefill,
        max_prefill=max_prefill,
        min_decode=min_decode,
        max_decode=max_decode,
        stabilization_window_seconds=stabilization_window_seconds,
        decode_drain_seconds=decode_drain_seconds,
        backlog_seconds=float(interval_seconds) + warmup if count_prefill_backlog else None,
        length_window=length_window,
        rise_quantile=rise_quantile,
        decode_rise_quantile=decode_rise_quantile,
        prefill_queue=prefill_queue,
        nodes_per_instance=nodes_per_instance,
        schedules=tuple(schedules),
        seasonality=seasonality,
    )
