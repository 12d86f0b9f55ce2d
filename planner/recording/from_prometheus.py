"""Replay from Prometheus: the planner re-run on what it read over a past range.

A decision's whole input is the readings (PromQL evaluated at the plan time), the fleet's
role states at that time, the configuration and the history of earlier decisions. The operator
exports the role states and the plan time with every decision (``operator/loop/telemetry.py``:
``pdscale_planner_observed_instances``, ``pdscale_planner_warming_ready_in_seconds``,
``pdscale_planner_last_plan_timestamp_seconds``) and evaluates its queries at the plan time;
so the same queries evaluated at the same times, joined with the same role states and run
through the same pure ``step`` from the same (empty) history, give the same decisions.

Where that cannot hold, the report says so:

- no plan times recorded (the operator's metrics not scraped, or an operator older than these
  gauges): the ticks are a grid from ``--start`` at the interval, the role states the nearest
  earlier ``pdscale_ready_replicas`` (ready only, nothing warming or draining);
- a range that starts after the live planner had already planned: its memory (the length
  window, the scale-down window, the calibration) is not in Prometheus, so the first
  intervals up to the scale-down window may differ;
- a what-if (another interval, SLO, budget): the readings are the live fleet's and so are the
  role states; the what-if's decisions say what it would have asked for, not what the fleet
  it would have run would have measured, and its latencies are not predicted here;
- decisions made between two scrapes (the operator scraped less often than it plans): the
  replay never sees them and its memory parts from the live one's; found where the decisions
  counter (``pdscale_planner_decisions_total``) moved by more than one between two recorded
  decisions, so a plan that merely came late (a busy operator) is not reported;
- a scrape that began before a plan time but was stored after the live query ran: the live
  reading missed its sample and the replay's has it (scrapes are stored when they finish).
  Rare (a scrape takes milliseconds); the tick then shows DIFFERS or a different explanation.

The pure parts take plain values: joining the recorded samples into ticks, tick times and
instance-hours live in the planner's replay package (``planner/replay/recorded.py``), the
re-plan (:func:`replan`) and the interval aggregates a simulation rebuilds a trace from
(:func:`aggregates_from`) here beside the readings they need; the functions named ``read_*``
and :func:`replay_range` query, through the planner's metrics reader only. The command
(``pdscale replay --prometheus``, ``pdscale/prometheus_replay.py``) parses, prints and
reads the spec from the cluster; everything it decides or computes is here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.prometheus import (
    MetricsSnapshot,
    QueryClient,
    observation_from,
    rate_window_seconds,
    read_earlier_rates,
    read_metrics,
    render_queries,
)
from pdscale.planner.replay.ensemble import (
    NOT_COVERED,
    Ensemble,
    recorded_figures,
    simulate_specs,
)
from pdscale.planner.replay.reconstruct import IntervalAggregate
from pdscale.planner.replay.recorded import (
    RecordedTick,
    Series,
    grid_ticks,
    missed_decisions,
    recorded_ticks,
    tick_times,
)
from pdscale.planner.replay.traces import TraceError
from pdscale.planner.solve import History, step

PLAN_TIME_METRIC = "pdscale_planner_last_plan_timestamp_seconds"
INSTANCES_METRIC = "pdscale_planner_observed_instances"
WARMING_METRIC = "pdscale_planner_warming_ready_in_seconds"
RECOMMENDED_METRIC = "pdscale_planner_recommended_replicas"
DECISIONS_METRIC = "pdscale_planner_decisions_total"
READY_METRIC = "pdscale_ready_replicas"

def replan(ticks: Sequence[RecordedTick], snapshots: Sequence[MetricsSnapshot],
           config: PlannerConfig, history: History | None = None) -> list[Decision]:
    """The planner's decisions over recorded ticks (pure): each tick's readings joined with its
    role states, run through ``step`` with the history carried from the previous tick, as the
    live loop does (``operator/loop/planner_loop.py``)."""
    if len(ticks) != len(snapshots):
        raise ValueError(f"{len(ticks)} ticks but {len(snapshots)} sets of readings")
    history = history or History()
    decisions = []
    for tick, snapshot in zip(ticks, snapshots, strict=True):
        obs = observation_from(snapshot, tick.at_seconds, tick.prefill, tick.decode)
        decision, history = step(obs, config=config, history=history, now=tick.at_seconds)
        decisions.append(decision)
    return decisions


# -- the only functions that query -------------------------------------------------------------
def _range(client: QueryClient, metric: str, selector: str, start: float, end: float) -> list[Series]:
    """Every raw sample of ``metric`` in [start, end]: an instant query of a range vector,
    which returns the samples as scraped (a range query would resample them)."""
    window = max(1, math.ceil(end - start))
    answer = client.custom_query(f"{metric}{{{selector}}}[{window}s]",
                                 params={"time": repr(float(end))})
    if not answer and selector.startswith("namespace="):
        # scraped through a ServiceMonitor without honorLabels, the operator's own namespace
        # label becomes exported_namespace (the target's namespace is the operator's)
        answer = client.custom_query(f"{metric}{{exported_{selector}}}[{window}s]",
                                     params={"time": repr(float(end))})
    out: list[Series] = []
    for series in answer or []:
        if not isinstance(series, dict):
            continue
        samples = [(float(ts), float(v)) for ts, v in series.get("values", [])]
        out.append((series.get("metric", {}), samples))
    return out


def read_recording(client: QueryClient, namespace: str, pdcluster: str, start: float,
                   end: float) -> tuple[list[RecordedTick], list[Series], bool]:
    """The live decisions' times, role states and counts in [start, end], the ready counts
    (for the fallback when no plan time was recorded), and whether the live planner had
    decided before ``start`` (then its memory at ``start`` is not empty)."""
    sel = f'namespace="{namespace}",pdcluster="{pdcluster}"'
    ticks = recorded_ticks(*(_range(client, m, sel, start, end) for m in
                             (PLAN_TIME_METRIC, INSTANCES_METRIC, WARMING_METRIC, RECOMMENDED_METRIC,
                              DECISIONS_METRIC)))
    before = any(t.at_seconds < start for t in ticks)
    # plan times recorded in the range but decided before it are not this range's
    ticks = [t for t in ticks if start <= t.at_seconds <= end]
    return ticks, _range(client, READY_METRIC, sel, start, end), before


def read_readings(client: QueryClient, engine: str, namespace: str, pdcluster: str,
                  config: PlannerConfig, times: Sequence[float]) -> list[MetricsSnapshot]:
    """The planner's queries, as the live loop renders them for ``config`` (window = the
    interval, at least 10 s; the SLO's percentile), evaluated at each time."""
    queries = render_queries(engine, namespace=namespace, pdcluster=pdcluster,
                             window_seconds=rate_window_seconds(config.interval_seconds),
                             percentile=config.slo.percentile)
    return [read_metrics(client, queries, t, at_seconds=t) for t in times]


def describe(decision: Decision) -> dict[str, Any]:
    return {"at": decision.at_seconds, "prefill": decision.prefill, "decode": decision.decode,
            "held": decision.held, "shortfall": decision.shortfall,
            "explanation": decision.explanation}


@dataclass(frozen=True)
class Replayed:
    """A re-plan over a range: its ticks, decisions, and what stood in the way of exactness."""

    ticks: tuple[RecordedTick, ...]
    decisions: tuple[Decision, ...]
    caveats: tuple[str, ...]


def replay_range(client: QueryClient, *, engine: str, namespace: str, name: str,
                 pdcluster_label: str, config: PlannerConfig, start: float, end: float,
                 recorded: Sequence[RecordedTick], ready: Sequence[Series],
                 live_interval_seconds: float) -> Replayed:
    """Read and re-plan: at the live decisions' times when they are recorded and the interval
    is the live one, else on a grid at ``config``'s interval (and say why). ``name`` is the
    PDCluster's; ``pdcluster_label`` the engines' ``pdcluster`` label (its base name)."""
    caveats = []
    if recorded and config.interval_seconds == live_interval_seconds:
        ticks = list(recorded)
        gaps = missed_decisions(ticks, live_interval_seconds)
        if gaps:
            at, seconds = gaps[0]
            caveats.append(f"{len(gaps)} gap(s) between recorded decisions that hide decisions "
                           f"at the {live_interval_seconds:g} s interval (the first {seconds:.0f} s "
                           f"after {at:.0f}): the operator was scraped less often than it "
                           "plans, the decisions in between are not in Prometheus, and the "
                           "replay's memory parts from the live one's after each; scrape it "
                           "at least once per spec.planner.intervalSeconds")
    else:
        ticks = grid_ticks(tick_times(recorded[0].at_seconds if recorded else start, end,
                                      config.interval_seconds), recorded, ready)
        if not recorded:
            caveats.append(f"no plan times recorded ({PLAN_TIME_METRIC} has no samples for "
                           f"{namespace}/{name}: the operator's metrics are not scraped, or it "
                           "predates them): ticks on a grid from --start, role states from "
                           f"{READY_METRIC} (ready only; nothing warming or draining)")
        else:
            caveats.append(f"interval {config.interval_seconds:g} s is not the live "
                           f"{live_interval_seconds:g} s: ticks on a grid, each with the live "
                           "fleet's role states at its latest decision before it")
    snapshots = read_readings(client, engine, namespace, pdcluster_label, config,
                              [t.at_seconds for t in ticks])
    history = History()
    if ticks:
        history, problem = _with_earlier_rates(client, engine, pdcluster_label, namespace, config,
                                               ticks[0].at_seconds)
        if problem:
            caveats.append(problem)
    return Replayed(tuple(ticks), tuple(replan(ticks, snapshots, config, history)), tuple(caveats))


def _with_earlier_rates(client: QueryClient, engine: str, pdcluster_label: str, namespace: str,
                        config: PlannerConfig, first_seconds: float) -> tuple[History, str | None]:
    """A memory holding the rates of the ``rise_history_intervals`` intervals before the
    first tick, read as the operator reads them on a fresh memory's first plan
    (``planner_loop._seed_rates``), so that the risk over the lead is priced from the same
    day live and replayed; and what stood in the way, when they could not be read."""
    query = render_queries(engine, namespace=namespace, pdcluster=pdcluster_label,
                           window_seconds=rate_window_seconds(config.interval_seconds),
                           percentile=config.slo.percentile)["rate_rps"]
    try:
        earlier = read_earlier_rates(client, query, now_seconds=first_seconds,  # type: ignore[arg-type]
                                     interval_seconds=config.interval_seconds,
                                     intervals=config.rise_history_intervals)
    except Exception as exc:  # a server or client without range queries: the range alone
        return History(), (f"the request rates before --start were not read ({type(exc).__name__}): "
                           "the risk over the warm-up is learned from the range alone, where the "
                           "live planner may have priced it from the day before")
    return History(earlier_rates=earlier), None


def memory_caveat(planned_before: bool, recorded: bool, stabilization_seconds: float) -> str | None:
    """What an empty planner memory at ``--start`` may change, or None when nothing: the
    live planner had (or may have) decided before the range."""
    if not (planned_before or not recorded):
        return None
    return ("the replay starts from an empty planner memory; the live planner "
            + ("had decided before --start" if planned_before else "may have decided "
               "before --start") + ", and its remembered loads, decisions and "
            "calibration are not in Prometheus: decisions within the scale-down window "
            f"({stabilization_seconds:g} s) of --start may differ")


# -- a simulation's input: the recording as interval aggregates ------------------------------
def _fill(values: list[float | None], times: Sequence[float], name: str,
          caveats: list[str], *, default: float | None = None) -> list[float]:
    """Unknown values take the nearest earlier known one (else the next); none known anywhere:
    ``default`` with a caveat, or a TraceError naming the reading."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if not known:
        if default is None:
            raise TraceError(f"{name}: unknown in every interval from {times[0]:.0f} to "
                             f"{times[-1]:.0f} (not recorded for this PDCluster?)")
        caveats.append(f"{name} unknown over the whole range: taken as {default:g}")
        return [default] * len(values)
    missing = sum(1 for v in values if v is None)
    if missing:
        caveats.append(f"{name} unknown in {missing} of {len(values)} intervals: each took "
                       "the nearest earlier known interval's value")
    out, last = [], known[0][1]
    for v in values:
        last = last if v is None else v
        out.append(last)
    return out


def aggregates_from(snapshots: Sequence[MetricsSnapshot], times: Sequence[float],
                    window_seconds: float) -> tuple[list[IntervalAggregate], list[str]]:
    """The recording as interval aggregates (pure): the reading at ``times[k]`` covers
    ``[times[k] - window, times[k])``. Intervals before the first and after the last known
    rate are dropped (nothing scraped yet, or no more); the means and hit rate of an interval
    without traffic are not needed; other unknowns take a neighbour's value, each such filling
    named in the caveats returned."""
    if len(snapshots) != len(times):
        raise ValueError(f"{len(times)} times but {len(snapshots)} sets of readings")
    caveats: list[str] = []
    rates = [_value(s, "rate_rps") for s in snapshots]
    known = [i for i, r in enumerate(rates) if r is not None]
    if not known:
        raise TraceError("rate_rps: unknown at every time of the range (the engines or the "
                         "router not scraped then, or --start/--end outside the recording)")
    lo, hi = known[0], known[-1] + 1
    snaps, ts = snapshots[lo:hi], times[lo:hi]
    if lo or hi < len(times):
        caveats.append(f"{lo + len(times) - hi} interval(s) at the range's ends without a "
                       "request rate were left out")
    filled = {"rate_rps": _fill([_value(s, "rate_rps") for s in snaps], ts, "rate_rps", caveats)}
    # an interval without requests has no mean, and none is missing there: fill among the
    # intervals with requests only
    busy = [k for k, r in enumerate(filled["rate_rps"]) if r > 0]
    for name in ("mean_input_tokens", "mean_output_tokens", "prefix_hit_rate"):
        values = [0.0] * len(snaps)
        if busy:
            got = _fill([_value(snaps[k], name) for k in busy], [ts[k] for k in busy], name,
                        caveats, default=0.0 if name == "prefix_hit_rate" else None)
            for k, v in zip(busy, got, strict=True):
                values[k] = v
        filled[name] = values
    # the prompts' spread where the prompt histogram was recorded (else length_sigma's)
    spread = [_value(s, "input_tokens_square_ratio") for s in snaps]
    unknown = sum(1 for k in busy if spread[k] is None)
    if unknown:
        caveats.append("the prompts' spread (the engines' prompt histogram) unknown in "
                       f"{unknown} of {len(busy)} intervals with requests: their prompts "
                       "take the length sigma's")
    return [IntervalAggregate(start_seconds=t - window_seconds, seconds=window_seconds,
                              rate_rps=filled["rate_rps"][k],
                              mean_input_tokens=filled["mean_input_tokens"][k],
                              mean_output_tokens=filled["mean_output_tokens"][k],
                              prefix_hit_rate=min(1.0, max(0.0, filled["prefix_hit_rate"][k])),
                              # read as >= 1 already (prometheus.to_square_ratio)
                              input_tokens_square_ratio=spread[k])
            for k, t in enumerate(ts)], caveats


def _value(snapshot: MetricsSnapshot, name: str) -> float | None:
    reading = snapshot.readings.get(name)
    return None if reading is None else reading.value


def read_aggregates(client: QueryClient, *, engine: str, namespace: str, pdcluster: str,
                    window_seconds: int, percentile: float, start: float,
                    end: float) -> tuple[list[IntervalAggregate], list[str]]:
    """Query the planner's readings on a grid of ``window_seconds`` windows over [start, end]
    (the live planner's window: its interval, at least 10 s) and join them."""
    queries = render_queries(engine, namespace=namespace, pdcluster=pdcluster,
                             window_seconds=window_seconds, percentile=percentile)
    n = math.floor((end - start) / window_seconds + 1e-9)
    times = [start + (k + 1) * window_seconds for k in range(n)]
    if not times:
        raise TraceError(f"--start..--end spans {end - start:.0f} s, less than one "
                         f"{window_seconds} s window")
    snapshots = [read_metrics(client, queries, t, at_seconds=t) for t in times]
    return aggregates_from(snapshots, times, float(window_seconds))


def read_live_figures(client: QueryClient, *, engine: str, namespace: str, pdcluster: str,
                      percentile: float, start: float, end: float) -> dict[str, float | None]:
    """The live run's latencies over the whole range: the planner's queries with the range as
    the rate window, evaluated at its end (the histograms' quantiles over every request)."""
    queries = render_queries(engine, namespace=namespace, pdcluster=pdcluster,
                             window_seconds=max(1, math.ceil(end - start)), percentile=percentile)
    wanted = {k: queries[k] for k in ("ttft_at_percentile_seconds", "tpot_at_percentile_seconds",
                                      "prefix_hit_rate", "rate_rps")}
    snap = read_metrics(client, wanted, end, at_seconds=end)
    return {"ttft_at_percentile": _value(snap, "ttft_at_percentile_seconds"),
            "tpot_at_percentile": _value(snap, "tpot_at_percentile_seconds"),
            "prefix_hit_rate": _value(snap, "prefix_hit_rate"),
            "rate_rps": _value(snap, "rate_rps")}


def simulate_recording(client: QueryClient, *, engine: str, namespace: str, pdcluster_label: str,
                       window_seconds: int, percentile: float, start: float, end: float,
                       specs_at: Callable[[float], dict[str, Any]], ensemble: Ensemble,
                       max_input_tokens: int | None,
                       live: dict[str, Any],
                       progress: Callable[[str], None]) -> dict[str, Any]:
    """``--simulate``'s result: the recording read as interval aggregates, a trace rebuilt from
    them for each member of ``ensemble``, and each of ``specs_at(origin)`` (name -> trace ->
    the replay's setup, for a trace whose time 0 is ``origin`` in Unix seconds: the first
    interval's start, where schedules are read) simulated on every one; beside them the live run's figures (``live`` plus its
    latencies over the range), the recording's own, and the caveats of the reading."""
    aggregates, caveats = read_aggregates(
        client, engine=engine, namespace=namespace, pdcluster=pdcluster_label,
        window_seconds=window_seconds, percentile=percentile, start=start, end=end)
    live = {**live, **read_live_figures(client, engine=engine, namespace=namespace,
                                        pdcluster=pdcluster_label, percentile=percentile,
                                        start=start, end=end)}
    result = simulate_specs(aggregates, specs_at(aggregates[0].start_seconds), ensemble,
                            max_input_tokens=max_input_tokens,
                            progress=progress)
    result["live"] = live
    result["recorded"] = recorded_figures(aggregates)
    result["intervals"] = len(aggregates)
    result["window_seconds"] = window_seconds
    result["ensemble"] = {"seeds": list(ensemble.seeds), "length_sigmas": list(ensemble.length_sigmas)}
    result["not_covered"] = NOT_COVERED
    result["caveats"] = caveats
    return result
