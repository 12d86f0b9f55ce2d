"""The planner inside the operator, pure parts: a PDCluster spec becomes a planner
configuration; a decision becomes status, an Event and the replicas to apply; the planner's
memory (recent loads and decisions) becomes JSON that survives an operator restart.

The loop that calls these (read pods and metrics, plan, act) is in ``planner_loop.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, replace
from typing import Any

from pdscale.operator.api import multinode
from pdscale.operator.api.pdcluster import PDClusterSpec, PlannerMode, RoutingPolicy, Seasonality
from pdscale.operator.api.tenant_policy import TenantPolicy, prometheus_refusal
from pdscale.operator.render import engines, router
from pdscale.planner.config import PlannerConfig, build_config, decode_quantile
from pdscale.planner.decision import Decision
from pdscale.planner.model import Calibration, Load, PerformanceModel, Slo
from pdscale.planner.observe import Reading
from pdscale.planner.profile import (
    Profile,
    ProfileError,
    capped_profile,
    shape_problem,
    shipped_profile,
)
from pdscale.planner.prometheus import MetricsSnapshot
from pdscale.planner.schedule import ScheduledFloor
from pdscale.planner.seasonal import SeasonalMemory
from pdscale.planner.solve import History, lead_intervals

#: decisions and loads kept across restarts at least: the forecast and rise windows; more when
#: the scale-down window spans more intervals (see history_keep). About 200 bytes each.
HISTORY_KEEP = 64


def history_keep(config: PlannerConfig) -> int:
    """Intervals the planner's memory must keep to restart with its whole scale-down window
    (at 10 s intervals the default 900 s window is 90 of them) and what the risk over the
    lead is learned from (``rise_min_samples`` leads one lead apart, and the forecast window
    before them: 126 intervals at 60 s with a 600 s warm-up, about 25 kB): a restarted
    operator prices the next warm-up from the load it saw before, not from nothing."""
    lead = lead_intervals(config)
    risk = lead * (config.rise_min_samples + 1) + config.forecast_window
    return max(HISTORY_KEEP, math.ceil(config.stabilization_seconds / config.interval_seconds) + 1,
               min(risk, config.rise_history_intervals))


#: intervals over which lengths and the prefix hit rate are averaged (see planner_config).
#: 3 follows a load-shape change within a few intervals (the demo, 10 s intervals: 15 kept
#: prefill at 1-2 for 4 intervals of long documents). It costs the policy benchmark (60 s
#: intervals, bench/policy_bench.py), where per-minute lengths are noisy and each noisy high
#: is then held by the scale-down window: against 15, Mooncake x6 99.51% at 193.3 GPU-h
#: (15: 99.51% at 175.5), Azure code x20 98.83% at 383.4 (15: 99.02% at 352.1), ServeGen x0.3
#: 99.29% at 1297.8 (15: 99.28% at 1282.2); 5 and 8 land in between.
LENGTH_WINDOW_INTERVALS = 3


#: the spec fields the planner's configuration is made of, (section, field) as in
#: ``pdcluster.py``: ``pdscale replay`` lists each with its value and source, and a test checks
#: that each one moves the configuration and no other field does
PLANNER_SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    ("slo", "ttft_milliseconds"),
    ("slo", "tpot_milliseconds"),
    ("slo", "percentile"),
    ("planner", "interval_seconds"),
    ("planner", "node_budget"),
    ("planner", "stabilization_window_seconds"),
    ("planner", "load_percentile"),
    ("planner", "profile"),
    ("prefill", "min_replicas"),
    ("prefill", "max_replicas"),
    ("prefill", "warmup_seconds"),
    ("decode", "min_replicas"),
    ("decode", "max_replicas"),
    ("decode", "warmup_seconds"),
    ("decode", "pre_stop_drain_seconds"),
    ("prefill", "nodes_per_instance"),
    ("decode", "nodes_per_instance"),
    ("planner", "schedules"),
    ("planner", "seasonality"),
)


def planner_config(spec: PDClusterSpec, profile: Profile | None = None) -> PlannerConfig:
    """The planner's configuration for a PDCluster: the one mapping from a spec, used by the
    operator, ``pdscale replay`` and the benchmarks (``config.build_config`` does the
    arithmetic). ``profile`` replaces ``spec.planner.profile`` (the command line's
    ``--profile`` file); the fields read are :data:`PLANNER_SPEC_FIELDS`.

    - SLO: the targets, and ``percentile`` as a share (90 -> 0.9), which the solver sizes
      for, the metrics reader asks Prometheus for and calibration compares with the targets.
    - Warm-up: the spec's per-role ``warmupSeconds`` is what this deployment's instances take,
      so it replaces the profile's figure (the slower role's, to price every start safely). A
      role switch is a drain plus a fresh pod of the other role here, so it costs the same.
      The horizon is derived from it, so that the solver sees a new instance come online and
      prices its warm-up.
    - A decode batch cap in the engines' arguments (SGLang ``--max-running-requests``, vLLM
      ``--max-num-seqs``, in ``extraArgs``) lowers the profile's ``decode.max_batch``: an
      instance runs no more, and the rest wait in its queue (``engines.decode_batch_cap``).
    - The node budget defaults to the two roles' maxima together.
    - A removed decode instance drains for ``preStopDrainSeconds``.
    - Fleets count requests as they complete: a prefill backlog reads as load, cleared over
      one interval after a new node's warm-up (``build_config``), and a stall with no
      completions does not hold the plan. A replay's simulated fleet is read the same way.
    - Lengths are smoothed over 3 intervals: a change of load shape (chat -> long documents)
      must reach the split within a few intervals. Measured on the demo's phases: 15 kept
      prefill at 1-2 for 4 intervals of long documents.
    - Prefill is sized for ``loadPercentile`` of the load one lead ahead, decode for half the
      risk (90: prefill 0.9, decode 0.95; ``config.decode_quantile``).
    - The prefill TTFT queue is one pool behind a router that sends each request where it is
      served soonest, and a queue per instance behind one that picks at random
      (``router.prefill_choice``: sglang-router 0.3.2, the default, does so in PD mode).
    - Scheduled floors (``planner.schedules``) become the planner's ``schedules``, read on the
      wall clock: the operator plans on Unix time.
    - ``seasonality`` Auto forecasts with the daily profile of the earlier days
      (``planner.seasonal``), Off without it."""
    p = spec.planner
    if profile is None and p.profile_config_map is not None:
        # never the default in its place: a replay of this spec would plan other hardware
        raise ProfileError(f"spec.planner.profileConfigMap: the profile is in ConfigMap "
                           f"{p.profile_config_map.name!r}; pass it (the operator reads it; "
                           f"pdscale profile export writes it to a file for --profile)")
    base = profile or shipped_profile(p.profile)
    kp, kd = (multinode.nodes_per_instance(spec, "prefill"),
              multinode.nodes_per_instance(spec, "decode"))
    problem = shape_problem(base, (kp, kd))
    if problem is not None:
        raise ProfileError(problem)
    # the engines' batch cap is the deployment's: decode instances carry no more than it
    capped = capped_profile(base, engines.decode_batch_cap(spec))
    return build_config(
        model=PerformanceModel(capped),
        slo=Slo(
            ttft_seconds=spec.slo.ttft_seconds,
            tpot_seconds=spec.slo.tpot_seconds,
            percentile=spec.slo.percentile / 100.0,
        ),
        interval_seconds=float(p.interval_seconds),
        node_budget=p.node_budget or (spec.prefill.max_replicas * kp + spec.decode.max_replicas * kd),
        warmup_seconds=float(max(spec.prefill.warmup_seconds, spec.decode.warmup_seconds)),
        min_prefill=spec.prefill.min_replicas,
        max_prefill=spec.prefill.max_replicas,
        min_decode=spec.decode.min_replicas,
        max_decode=spec.decode.max_replicas,
        stabilization_window_seconds=p.stabilization_window_seconds,
        decode_drain_seconds=float(spec.decode.pre_stop_drain_seconds),
        horizon_intervals=None,
        count_prefill_backlog=True,
        length_window=LENGTH_WINDOW_INTERVALS,
        rise_quantile=p.load_percentile / 100.0,
        decode_rise_quantile=decode_quantile(p.load_percentile / 100.0),
        prefill_queue="split" if router.prefill_choice(spec) is RoutingPolicy.RANDOM else "pooled",
        nodes_per_instance=(kp, kd),
        schedules=scheduled_floors(spec),
        seasonality=p.seasonality is Seasonality.AUTO,
    )


def scheduled_floors(spec: PDClusterSpec) -> tuple[ScheduledFloor, ...]:
    """The spec's ``planner.schedules`` as the planner reads them (checked by the checklist
    first, so that a bad one is refused naming its field, never planned with)."""
    return tuple(ScheduledFloor(name=s.name, start=s.start, end=s.end, timezone=s.timezone,
                                min_prefill=s.min_prefill_replicas, min_decode=s.min_decode_replicas)
                 for s in spec.planner.schedules)


#: where the operator's own Prometheus is set, as status names it
OPERATOR_PROMETHEUS = "the operator's Prometheus (chart value operator.prometheusURL)"
SPEC_PROMETHEUS = "spec.planner.prometheusURL"


def metrics_source(spec: PDClusterSpec, operator_url: str | None, policy: TenantPolicy
                   ) -> tuple[str | None, str, str | None]:
    """(URL, where it was set, why there is none) of the Prometheus a PDCluster's planner
    reads: the spec's when it names one the tenant policy allows (checked here again, as the
    loop plans specs the reconcile may have refused), else the operator's; never a URL the
    policy refuses."""
    url = spec.planner.prometheus_url
    if url is not None:
        why = prometheus_refusal(spec, policy)
        if why is not None:
            return None, SPEC_PROMETHEUS, f"{SPEC_PROMETHEUS} is refused: {why}"
        return url, SPEC_PROMETHEUS, None
    if operator_url:
        return operator_url, OPERATOR_PROMETHEUS, None
    return None, SPEC_PROMETHEUS, (f"no Prometheus to read: {OPERATOR_PROMETHEUS} is not set, "
                                   f"nor is {SPEC_PROMETHEUS}")


#: a tick this close before its plan's due time plans it (the loop sleeps to the due time on
#: one clock and checks it on another; a plan skipped by a hair waits a whole fast tick)
EARLY_WAKE_SECONDS = 0.05


def plan_slot(last_slot_seconds: float | None, interval_seconds: float,
              now: float) -> float | None:
    """The slot of the plan schedule a plan at ``now`` fills, or None when none is due.

    Plans keep a fixed cadence: slot k + 1 is slot k + the interval, however late the tick
    that fills it ran. Stamping each plan with the time it ran instead let every plan drift by
    up to one fast tick: at a 10 s interval and 2 s ticks the demo's plans came 10.2-12.5 s
    apart, while the replay plans on the dot. A tick a whole interval late (the operator was
    down) starts a new schedule at ``now``."""
    if last_slot_seconds is None:
        return now
    due = last_slot_seconds + interval_seconds
    if now < due - EARLY_WAKE_SECONDS:
        return None
    return due if now - due < interval_seconds else now


def short(decision: Decision) -> str:
    """``4P17D``: the name users know for a split."""
    return f"{decision.prefill}P{decision.decode}D"


def _finite_ms(seconds: float) -> int | None:
    return None if math.isinf(seconds) or math.isnan(seconds) else round(seconds * 1000)


def decision_status(
    decision: Decision, mode: PlannerMode, snapshot: MetricsSnapshot | None, now_rfc3339: str
) -> dict[str, Any]:
    """``status.planner``: the last decision, why, and what it predicts. Latencies in integer
    milliseconds (no floats in the API); ``null`` when the role is overloaded."""
    return {
        "mode": mode.value,
        "lastDecision": short(decision),
        "lastDecisionTime": now_rfc3339,
        "recommended": {"prefill": decision.prefill, "decode": decision.decode},
        "predictedTTFTMilliseconds": _finite_ms(decision.predicted_ttft_seconds),
        "predictedTPOTMilliseconds": _finite_ms(decision.predicted_tpot_seconds),
        "held": decision.held,
        "shortfall": decision.shortfall,
        "explanation": decision.explanation,
        "metrics": snapshot.summary() if snapshot is not None else "not read",
    }


def decision_event(decision: Decision, previous: Decision | None) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for this decision, or None when nothing a user
    would want to hear changed (same counts, same held/shortfall state)."""
    if previous is not None and (previous.prefill, previous.decode, previous.held,
                                 previous.shortfall) == (decision.prefill, decision.decode,
                                                         decision.held, decision.shortfall):
        return None
    before = short(previous) if previous is not None else "none"
    if decision.held:
        return "Warning", "PlannerHolding", f"holding {short(decision)}: {decision.explanation}"
    reason = "PlannerShortfall" if decision.shortfall else "PlannerDecision"
    kind = "Warning" if decision.shortfall else "Normal"
    return kind, reason, f"{before} -> {short(decision)}: {decision.explanation}"


# -- the planner's memory, as JSON -------------------------------------------------------------
def history_to_json(history: History, last_plan_at_seconds: float | None,
                    keep: int = HISTORY_KEEP, *, profile: str | None = None,
                    rates_keep: int = 0) -> str:
    """The memory as stored: ``keep`` whole loads and decisions, and the request rates of up
    to ``rates_keep`` intervals in all (``History.bounded``: a day at 60 s intervals is
    1,440 numbers, about 10 kB), what the risk over the lead is learned from;
    ``profile`` is :func:`profile_identity` of the profile its calibration was learned
    against (None: not known)."""
    history = history.bounded(keep, rates_keep)
    # the burst peak too: the scale-down window holds what the highest recent burst needs; and
    # the prompts' spread, which prices prefill's mean compute
    loads = [None if x is None else [x.rate_rps, x.mean_input_tokens, x.mean_output_tokens,
                                     x.prefix_hit_rate, x.peak_rate_rps, x.input_tokens_square_ratio]
             for x in history.loads]
    decisions = [_decision_dict(d) for d in history.decisions]
    cal = None if history.calibration is None else asdict(history.calibration)
    # the last prefill queue too: the next tick's throughput reading (a saturated prefill's
    # speed, calibration.samples) is the queue's growth since it, and the operator plans from
    # this memory every tick, so without it that reading never happens live
    queue = history.prefill_queue
    return json.dumps({"version": 1, "lastPlanAtSeconds": last_plan_at_seconds,
                       "loads": loads, "decisions": decisions, "calibration": cal,
                       "prefillQueue": None if queue is None else [queue.value, queue.at_seconds],
                       "profile": profile, "season": season_to_json(history.season),
                       "earlierRates": [None if r is None else round(r, 3)
                                        for r in history.earlier_rates]},
                      separators=(",", ":"))


def season_to_json(season: SeasonalMemory) -> dict[str, Any]:
    """The seasonal memory as stored: at most ``seasonal.MAX_DAYS`` days of ten-minute rates
    (4,032 numbers, rounded to 4 digits: about 32 kB), whatever the interval; the loads
    and decisions keep their own bound (:func:`history_keep`)."""
    return {"bucketSeconds": season.bucket_seconds, "startSeconds": season.start_seconds,
            "rates": [None if r is None else round(r, 4) for r in season.rates],
            "count": season.count, "seeded": season.seeded}


def season_from_json(data: object) -> SeasonalMemory:
    """The stored seasonal memory; an empty one (seeded again) when there is none or it is
    not one (a memory written before it was kept, or edited by hand): a bad season never
    costs the loads and decisions."""
    fresh = SeasonalMemory()
    if not isinstance(data, dict):
        return fresh
    rates, start, bucket = data.get("rates"), data.get("startSeconds"), data.get("bucketSeconds")
    ok = (isinstance(rates, list) and len(rates) <= fresh.max_buckets
          and _rates_ok(rates)
          and (start is None or (_is_real(start) and math.isfinite(start)))
          and bucket == fresh.bucket_seconds and isinstance(data.get("seeded"), bool)
          and isinstance(data.get("count"), int) and data["count"] >= 0)
    if not ok or not isinstance(rates, list):
        return fresh
    if start is None or not rates:
        return replace(fresh, seeded=data["seeded"])
    return replace(fresh, start_seconds=float(start),
                   rates=tuple(None if r is None else float(r) for r in rates),
                   count=data["count"], seeded=data["seeded"])


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def profile_identity(profile: Profile) -> str:
    """What a calibration is learned against: the profile's name and a digest of every field
    the planner reads (its provenance left out), ``NAME@sha256:HEX16``.

    The numbers, not where they came from: a ConfigMap edited without touching the profile
    (a label, the provenance) keeps its identity although its resourceVersion moves, while a
    re-fitted file under the same name, another shipped profile, or a shipped profile whose
    numbers a new release changed, each get a new one."""
    numbers = json.dumps(profile.model_dump(mode="json", exclude={"provenance"}), sort_keys=True)
    return f"{profile.name}@sha256:{hashlib.sha256(numbers.encode()).hexdigest()[:16]}"


def remembered_profile(text: str | None) -> str | None:
    """The :func:`profile_identity` a stored memory's calibration was learned against; None
    when it records none (written before identities were kept) or cannot be read."""
    try:
        found = json.loads(text or "").get("profile")
    except (ValueError, AttributeError, RecursionError):
        return None
    return found if isinstance(found, str) and found else None


def calibration_for_profile(history: History, remembered: str | None, current: str
                            ) -> tuple[History, str | None]:
    """The memory to plan from with the profile ``current`` (pure): the learned compute factors
    and headrooms are dropped when they were learned against another profile, and the second
    value says why (for the log and an Event); None when they are kept.

    They are corrections of one profile's predictions (observed over predicted), so against
    another profile they correct the wrong thing: a fleet learned 25% slower than a slow
    profile would be planned 25% slower than a fitted one that already says so. The loads and
    decisions stay: they are the traffic and the fleet, whatever the profile.

    A memory that records no profile (written before identities were kept) is kept as it is:
    it was learned against the profile its PDCluster named then, which an operator upgrade
    alone does not change, and each headroom step was learned from SLO misses that a reset
    would pay again. Its next save records the identity, so a later change is caught."""
    if remembered is None or remembered == current or history.calibration is None:
        return history, None
    cal = history.calibration
    why = (f"the profile changed ({remembered} -> {current}): the calibration learned against "
           f"the old one is reset (was prefill time x{cal.prefill_factor:.3g}, decode time "
           f"x{cal.decode_factor:.3g}, headroom prefill x{cal.prefill_headroom:.3g} decode "
           f"x{cal.decode_headroom:.3g}, {cal.samples} samples)")
    return replace(history, calibration=None), why


def history_from_json(text: str | None) -> tuple[History, float | None]:
    """The stored memory, or an empty one when there is none or it cannot be read (a lost
    memory costs one stabilization window of caution, never a wrong action)."""
    if not text:
        return History(), None
    try:
        data = json.loads(text)
        loads = tuple(None if x is None else _load_from(x) for x in data["loads"])
        decisions = tuple(_decision_from(d) for d in data["decisions"])
        last = data.get("lastPlanAtSeconds")
        # memories written before calibration was kept have none: the profile's, as at start
        cal = data.get("calibration")
        calibration = None if cal is None else Calibration(**{
            k: v for k, v in cal.items() if k in Calibration.__dataclass_fields__})
        queue = data.get("prefillQueue")  # memories written before it was kept have none
        prefill_queue = None if queue is None else Reading(float(queue[0]), float(queue[1]))
        history = History(loads=loads, decisions=decisions, calibration=calibration,
                          prefill_queue=prefill_queue, season=season_from_json(data.get("season")),
                          earlier_rates=earlier_rates_from_json(data.get("earlierRates")))
        return history, None if last is None else float(last)
    except (ValueError, KeyError, TypeError, IndexError):
        return History(), None


#: the most earlier rates a stored memory is read with: a week of 60 s intervals (the planner
#: keeps ``rise_history_intervals``, a day by default); a longer list is not this operator's
MAX_EARLIER_RATES = 7 * 1440


def earlier_rates_from_json(data: object) -> tuple[float | None, ...]:
    """The stored earlier rates; none (learned again from the loads as they come) when there
    are none or they are not rates (a memory written before they were kept, or edited by
    hand): bad rates never cost the loads and decisions."""
    if not isinstance(data, list) or len(data) > MAX_EARLIER_RATES or not _rates_ok(data):
        return ()
    return tuple(None if r is None else float(r) for r in data)


def _rates_ok(rates: list[Any]) -> bool:
    """A stored list of rates: each unknown (None) or a finite, non-negative number."""
    return all(r is None or (_is_real(r) and math.isfinite(r) and r >= 0) for r in rates)


def _load_from(x: list[float | None]) -> Load:
    """One remembered interval's load; a missing or non-numeric field raises (the caller then
    starts from an empty memory, never from a half-read one)."""
    fields = x[:4]
    if len(fields) < 4 or any(v is None for v in fields):
        raise ValueError(f"a remembered load needs four numbers, got {fields}")
    rate, mean_in, mean_out, hit = (float(v) for v in fields if v is not None)
    # memories written before the peak was kept have four fields, before the spread five
    peak = x[4] if len(x) > 4 else None
    square = x[5] if len(x) > 5 and x[5] is not None else 1.0
    return Load(rate, mean_in, mean_out, hit, peak_rate_rps=None if peak is None else float(peak),
                input_tokens_square_ratio=float(square))


def _decision_dict(d: Decision) -> dict[str, Any]:
    out = asdict(d)
    for key in ("predicted_ttft_seconds", "predicted_tpot_seconds", "cost_gpu_hours"):
        if math.isinf(out[key]) or math.isnan(out[key]):
            out[key] = None  # JSON has no infinity
    return out


def _decision_from(d: dict[str, Any]) -> Decision:
    for key in ("predicted_ttft_seconds", "predicted_tpot_seconds", "cost_gpu_hours"):
        if d.get(key) is None:
            d[key] = math.inf
    d["plan"] = tuple(tuple(p) for p in d.get("plan", ()))
    d["desired"] = tuple(d.get("desired", (0, 0)))
    # JSON keeps tuples as lists; memories written before lead_need existed have none
    d["lead_need"] = tuple(d.get("lead_need", (0, 0)))
    known = set(Decision.__dataclass_fields__)
    return Decision(**{k: v for k, v in d.items() if k in known})



def clamp_decision(decision: Decision, spec: PDClusterSpec) -> Decision:
    """``decision`` held to the spec's bounds now (pure): each role within its min/max
    replicas, and prefill + decode within ``planner.nodeBudget``, the larger role giving way
    first and never below its minimum. A remembered decision is stored data, not a plan: the
    bounds may have changed since, and anyone able to write ConfigMaps may have written it."""
    prefill = min(max(decision.prefill, spec.prefill.min_replicas), spec.prefill.max_replicas)
    decode = min(max(decision.decode, spec.decode.min_replicas), spec.decode.max_replicas)
    budget = spec.planner.node_budget
    if budget is not None and prefill + decode > budget:
        over = prefill + decode - budget
        for _ in range(over):
            if decode >= prefill and decode > spec.decode.min_replicas:
                decode -= 1
            elif prefill > spec.prefill.min_replicas:
                prefill -= 1
            elif decode > spec.decode.min_replicas:
                decode -= 1
    if (prefill, decode) == (decision.prefill, decision.decode):
        return decision
    return replace(decision, prefill=prefill, decode=decode)


def clamp_history(history: History, spec: PDClusterSpec) -> History:
    """Every remembered decision clamped (``clamp_decision``): the stabilization window reads
    them, so an out-of-bounds one would hold the fleet there."""
    decisions = tuple(clamp_decision(d, spec) for d in history.decisions)
    return history if decisions == history.decisions else replace(history, decisions=decisions)
