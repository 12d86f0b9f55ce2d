"""Replay from Prometheus, simulated (``pdscale replay --prometheus ... --simulate``): a trace
rebuilt from what the planner read over the range, replayed on the simulator under the spec
and under the what-if, with the spread that rebuilding requests from aggregates leaves.

The re-plan (``prometheus_replay``) answers "what would this spec have decided on the live
fleet's readings"; it cannot say what latencies the what-if's fleet would have had, because
the readings are the live fleet's. This rebuilds the load itself (rate, mean lengths and
prefix hit rate per interval, ``planner/replay/reconstruct.py``) and runs the pdscale policy
on the deployed stack, routed as the spec renders, for each spec. Each figure is given over
several seeds and length spreads (min-max): the rebuilt trace is one of many that agree with
the aggregates, and the spread is how much the figure depends on which.

The aggregates are read at the planner's own queries on a grid of contiguous windows (each
reading covers the window before its time); the live run's own figures over the whole range
(its TTFT and TPOT at the SLO percentile, the instances it decided) come beside the base
simulation's, so that a reader sees how far to trust it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pdscale.planner.prometheus import (
    MetricsSnapshot,
    QueryClient,
    rate_window_seconds,
    read_metrics,
    render_queries,
)
from pdscale.planner.replay.ensemble import (
    FIGURES,
    NOT_COVERED,
    Ensemble,
    recorded_figures,
    simulate_specs,
)
from pdscale.planner.replay.reconstruct import IntervalAggregate
from pdscale.planner.replay.simulate import SCRAPE_SECONDS
from pdscale.planner.replay.traces import TraceError


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


# -- the command's part ---------------------------------------------------------------------------
def run(args: Any, configured: Any, whatif: Any | None, *, client: QueryClient, namespace: str,
        name: str, start: float, end: float, live: dict[str, Any]) -> dict[str, Any]:
    """``--simulate``: read the aggregates, simulate the spec (and the what-if), print the
    table and the caveats on stderr; returns the JSON part."""
    from rich.console import Console

    from pdscale.operator.api.names import base_name
    from pdscale.replay_setup import fleet_setup

    console = Console(stderr=True)
    config = configured.config
    engine = configured.spec.engine.kind.value
    window = rate_window_seconds(configured.spec.planner.interval_seconds)
    aggregates, caveats = read_aggregates(
        client, engine=engine, namespace=namespace, pdcluster=base_name(name),
        window_seconds=window, percentile=config.slo.percentile, start=start, end=end)
    live = {**live, **read_live_figures(client, engine=engine, namespace=namespace,
                                        pdcluster=base_name(name), percentile=config.slo.percentile,
                                        start=start, end=end)}
    # the rebuilt trace's clock starts at the first interval: its schedules are read there
    configured = on_clock(configured, aggregates[0].start_seconds)
    if whatif is not None:
        whatif = on_clock(whatif, aggregates[0].start_seconds)
    # each spec routes and admits as its router renders; the fleet runs the planner's profile
    flags = replay_flags(args)
    specs = {"spec": lambda trace: fleet_setup(flags, trace, configured, None)}
    if whatif is not None:
        specs["what-if"] = lambda trace: fleet_setup(flags, trace, whatif, None)
    ensemble = Ensemble(tuple(range(args.simulate_seeds)), tuple(args.length_sigmas))
    max_input = getattr(configured.spec.model, "max_context_length_tokens", None)
    result = simulate_specs(aggregates, specs, ensemble, max_input_tokens=max_input,
                            progress=lambda msg: console.print(msg, style="dim"))
    result["live"] = live
    result["recorded"] = recorded_figures(aggregates)
    result["intervals"] = len(aggregates)
    result["window_seconds"] = window
    result["ensemble"] = {"seeds": list(ensemble.seeds), "length_sigmas": list(ensemble.length_sigmas)}
    result["not_covered"] = NOT_COVERED
    result["caveats"] = caveats
    _print(result, config, whatif)
    console.print(fidelity(result))
    for line in caveats:
        console.print(f"note: simulate: {line}")
    console.print(f"note: simulate: {NOT_COVERED}")
    return result


def on_clock(configured: Any, origin_unix_seconds: float) -> Any:
    """``configured`` whose planner reads the wall clock (its schedules) with time 0 at
    ``origin_unix_seconds``."""
    import dataclasses

    return dataclasses.replace(configured, config=dataclasses.replace(
        configured.config, clock_origin_unix_seconds=origin_unix_seconds))


def replay_flags(args: Any) -> Any:
    """The replay flags ``fleet_setup`` reads (stack, routers, admission), defaulted where a
    caller's namespace lacks them."""
    import argparse

    defaults = {"stack": "deployed", "router": None, "decode_router": None,
                "early_rejection": None, "decode_admission": "off", "tick_phase_seconds": None,
                "join_delay_seconds": 0.0, "scrape_seconds": SCRAPE_SECONDS,
                "scrape_lag_seconds": 0.0}
    return argparse.Namespace(**{k: getattr(args, k, v) for k, v in defaults.items()})


def _cell(s: dict[str, float | None], *, signed: bool = False) -> str:
    if s["mean"] is None or s["min"] is None or s["max"] is None:
        return "-"
    f = "+.4g" if signed else ".4g"
    text = f"{s['mean']:{f}} ({s['min']:{f}} to {s['max']:{f}})"
    return text + (f" ({s['unknown_in']:.0f} unknown)" if s["unknown_in"] else "")


def _print(result: dict[str, Any], config: Any, whatif: Any | None) -> None:
    """Base and what-if side by side, each mean (min to max) over the ensemble, and the live
    run's figures where Prometheus holds them."""
    from rich.console import Console
    from rich.table import Table

    pct = f"p{100 * config.slo.percentile:g}"
    n = len(result["ensemble"]["seeds"]) * len(result["ensemble"]["length_sigmas"])
    table = Table(title=f"simulated on {result['intervals']} rebuilt intervals of "
                        f"{result['window_seconds']} s: mean (min to max) over {n} traces")
    table.add_column("figure")
    table.add_column("live (recorded)", justify="right")
    table.add_column("spec, simulated", justify="right")
    if whatif is not None:
        table.add_column("what-if, simulated", justify="right")
        table.add_column("what-if - spec, same traces", justify="right")
    live = result["live"]
    labels = {"slo_attainment": "SLO attainment", "ttft_at_percentile": f"TTFT {pct} (s)",
              "tpot_at_percentile": f"TPOT {pct} (s)", "gpu_hours": "GPU-hours (provisioned)",
              "mean_instances": "mean instances decided", "prefix_hit_rate": "prefix hit rate"}
    for figure in FIGURES:
        value = live.get(figure)
        row = [labels[figure], "not recorded" if value is None else f"{value:.4g}",
               _cell(result["spec"]["spread"][figure])]
        if whatif is not None:
            row.append(_cell(result["what-if"]["spread"][figure]))
            row.append(_cell(result["what-if"]["minus_base"][figure], signed=True))
        table.add_row(*row)
    Console().print(table)


def fidelity(result: dict[str, Any]) -> str:
    """One line: the rebuilt traces' figures (min to max) against the recording's."""
    members = [m["rebuilt"] for m in result["spec"]["members"]]
    recorded = result["recorded"]
    parts = []
    for key, label, fmt in (("rate_rps", "req/s", ".3g"), ("mean_input_tokens", "prompt tokens", ".0f"),
                            ("mean_output_tokens", "output tokens", ".0f"),
                            ("prefix_hit_rate", "hit rate (unbounded cache)", ".3f")):
        got = [m[key] for m in members]
        parts.append(f"{label} {min(got):{fmt}} to {max(got):{fmt}} (recorded {recorded[key]:{fmt}})")
    return "rebuilt traces against the recording: " + "; ".join(parts)
