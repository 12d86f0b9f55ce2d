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
re-plan (:func:`replan`) here beside the readings it needs; :func:`read_recording` and
:func:`read_readings` are the only functions that query.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.prometheus import (
    MetricsSnapshot,
    QueryClient,
    observation_from,
    rate_window_seconds,
    read_metrics,
    render_queries,
)
from pdscale.planner.replay.recorded import (
    RecordedTick,
    Series,
    grid_ticks,
    instance_hours,
    matches,
    missed_decisions,
    recorded_ticks,
    tick_times,
)
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


# -- the command (``pdscale replay --prometheus``) ----------------------------------------------
def parse_time(text: str, flag: str) -> float:
    """Unix seconds, or an RFC 3339 time (``2026-12-02T01:00:00Z``)."""
    from datetime import datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is neither Unix seconds nor an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{flag}: {text!r} has no time zone (add Z for UTC)")
    return moment.timestamp()


def spec_from_cluster(namespace: str, name: str) -> Any:
    """The live PDCluster's spec, through the kubeconfig (the replay of the spec that ran)."""
    from kubernetes import client, config

    from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION
    from pdscale.operator.render.checklist import parse

    # KUBECONFIG as it is now (the client reads its default when first imported)
    config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    body = client.CustomObjectsApi().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return parse(body.get("spec") if isinstance(body, dict) else None)


@dataclass(frozen=True)
class Replayed:
    """A re-plan over a range: its ticks, decisions, and what stood in the way of exactness."""

    ticks: tuple[RecordedTick, ...]
    decisions: tuple[Decision, ...]
    caveats: tuple[str, ...]


def replay_range(client: QueryClient, *, engine: str, namespace: str, name: str,
                 config: PlannerConfig, start: float, end: float,
                 recorded: Sequence[RecordedTick], ready: Sequence[Series],
                 live_interval_seconds: float) -> Replayed:
    """Read and re-plan: at the live decisions' times when they are recorded and the interval
    is the live one, else on a grid at ``config``'s interval (and say why)."""
    from pdscale.operator.api.names import base_name

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
    snapshots = read_readings(client, engine, namespace, base_name(name), config,
                              [t.at_seconds for t in ticks])
    return Replayed(tuple(ticks), tuple(replan(ticks, snapshots, config)), tuple(caveats))


def run(args: Any, configured: Any, whatif: Any | None) -> int:
    """``pdscale replay --prometheus URL --pdcluster NS/NAME --start T --end T``: the spec's
    decisions re-run over the range next to the live ones, and with override flags the
    what-if's decisions and instance-hours."""
    from rich.console import Console

    from pdscale.planner.prometheus import prometheus_client

    console = Console(stderr=True)
    namespace, _, name = args.pdcluster.partition("/")
    try:
        if not namespace or not name:
            raise ValueError(f"--pdcluster: expected NAMESPACE/NAME, got {args.pdcluster!r}")
        start, end = parse_time(args.start, "--start"), parse_time(args.end, "--end")
        tick_times(start, end, 1.0)  # validates the order
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    # a recording is many samples a query: a larger answer than one plan's, still bounded
    client = prometheus_client(args.prometheus, timeout_seconds=60.0, max_answer_bytes=256 << 20)
    engine = configured.spec.engine.kind.value
    try:
        recorded, ready, planned_before = read_recording(client, namespace, name, start, end)
    except Exception as exc:  # the client raises requests' and its own errors alike
        console.print(f"[red]error:[/red] reading {args.prometheus}: {exc}")
        return 1
    live_interval = float(configured.spec.planner.interval_seconds)
    base = replay_range(client, engine=engine, namespace=namespace, name=name,
                        config=configured.config, start=start, end=end, recorded=recorded,
                        ready=ready, live_interval_seconds=live_interval)
    caveats = list(base.caveats)
    if planned_before or not recorded:
        caveats.append("the replay starts from an empty planner memory; the live planner "
                       + ("had decided before --start" if planned_before else "may have decided "
                          "before --start") + ", and its remembered loads, decisions and "
                       "calibration are not in Prometheus: decisions within the scale-down window "
                       f"({configured.config.stabilization_seconds:g} s) of --start may differ")

    _print_replay(namespace, name, base, live_interval, configured.config.interval_seconds, end)
    if whatif is not None:
        alt = replay_range(client, engine=engine, namespace=namespace, name=name,
                           config=whatif.config, start=start, end=end, recorded=recorded,
                           ready=ready, live_interval_seconds=live_interval)
        caveats.extend(alt.caveats)
        _print_whatif(base, alt, whatif, configured.config.interval_seconds, end)
        caveats.append("what-if: re-planned on the live fleet's readings and role states; the "
                       "latencies the what-if fleet would have had are not predicted here ("
                       + ("the simulated table predicts them on a rebuilt trace)"
                          if getattr(args, "simulate", False) else "--simulate predicts them "
                          "on a trace rebuilt from the recording)"))
    for line in dict.fromkeys(caveats):  # the same reason once
        console.print(f"note: {line}")
    if getattr(args, "simulate", False):
        return _simulate(args, configured, whatif, client, namespace, name, start, end, base)
    return 0


def _simulate(args: Any, configured: Any, whatif: Any | None, client: QueryClient,
              namespace: str, name: str, start: float, end: float, base: Replayed) -> int:
    """``--simulate``: the rebuilt trace on the simulator (``prometheus_simulate``), the live
    run's decided instances beside it; ``--json`` writes the re-plan's match and the lot."""
    import json
    from pathlib import Path

    from rich.console import Console

    from pdscale import prometheus_simulate
    from pdscale.planner.replay.ensemble import mean_decided_instances
    from pdscale.planner.replay.traces import TraceError

    known = [(t.at_seconds, t.live) for t in base.ticks if t.live is not None]
    live = {"mean_instances": mean_decided_instances(
        [t for t, _ in known], [c for _, c in known if c is not None],
        float(configured.spec.planner.interval_seconds))}
    try:
        result = prometheus_simulate.run(args, configured, whatif, client=client,
                                         namespace=namespace, name=name, start=start, end=end,
                                         live=live)
    except (TraceError, ValueError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] --simulate: {exc}")
        return 2
    if args.json_out:
        agreed, total = matches(base.decisions, base.ticks)
        report = {"pdcluster": f"{namespace}/{name}", "start": start, "end": end,
                  "replan": {"matched": agreed, "with_live_counts": total,
                             "decisions": [describe(d) for d in base.decisions]},
                  "simulate": result}
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))
        Console(stderr=True).print(f"wrote {args.json_out}")
    return 0


def _print_replay(namespace: str, name: str, base: Replayed, live_interval: float,
                  interval: float, end: float) -> None:
    """The ticks, live and replayed side by side, and how many agree."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{namespace}/{name}: live decisions and the replay ({len(base.ticks)} ticks)")
    for column in ("t (s)", "fleet P/D ready+warming", "live", "replayed", "", "explanation"):
        table.add_column(column)
    t0 = base.ticks[0].at_seconds if base.ticks else 0.0
    for tick, d in zip(base.ticks, base.decisions, strict=True):
        live = f"{tick.live[0]}P{tick.live[1]}D" if tick.live else "-"
        same = "" if tick.live is None else ("=" if (d.prefill, d.decode) == tick.live else "DIFFERS")
        table.add_row(f"{tick.at_seconds - t0:.0f}",
                      f"{tick.prefill.ready}+{len(tick.prefill.warming)} / "
                      f"{tick.decode.ready}+{len(tick.decode.warming)}",
                      live, f"{d.prefill}P{d.decode}D", same, d.explanation)
    Console().print(table)
    console = Console(stderr=True)
    agreed, known = matches(base.decisions, base.ticks)
    console.print(f"replayed = live in {agreed} of {known} decisions with live counts recorded")
    times = [t.at_seconds for t in base.ticks]
    live_counts = [t.live for t in base.ticks if t.live is not None]
    if base.ticks and len(live_counts) == len(base.ticks):
        console.print(f"instance-hours decided: live {instance_hours(times, live_counts, live_interval, end):.3f}")
    replayed_h = instance_hours(times, [(d.prefill, d.decode) for d in base.decisions], interval, end)
    console.print(f"instance-hours decided: replayed {replayed_h:.3f}")


def _print_whatif(base: Replayed, alt: Replayed, whatif: Any, base_interval: float,
                  end: float) -> None:
    """The what-if's decisions and its instance-hours against the replayed spec's."""
    from rich.console import Console
    from rich.table import Table

    changed = [f"{n}={v}" for n, v, src in whatif.sources if src.startswith("flag")]
    table = Table(title=f"what-if ({', '.join(changed)})")
    for column in ("t (s)", "what-if", "explanation"):
        table.add_column(column)
    t0 = base.ticks[0].at_seconds if base.ticks else (alt.ticks[0].at_seconds if alt.ticks else 0.0)
    for tick, d in zip(alt.ticks, alt.decisions, strict=True):
        table.add_row(f"{tick.at_seconds - t0:.0f}", f"{d.prefill}P{d.decode}D", d.explanation)
    Console().print(table)
    base_h = instance_hours([t.at_seconds for t in base.ticks],
                            [(d.prefill, d.decode) for d in base.decisions], base_interval, end)
    alt_h = instance_hours([t.at_seconds for t in alt.ticks],
                           [(d.prefill, d.decode) for d in alt.decisions],
                           whatif.config.interval_seconds, end)
    Console(stderr=True).print(f"instance-hours decided: what-if {alt_h:.3f} ({alt_h - base_h:+.3f} "
                               "against the replayed spec)")
