"""Replay from Prometheus, simulated (``pdscale replay --prometheus ... --simulate``): a trace
rebuilt from what the planner read over the range, replayed on the simulator under the spec
and under the what-if, with the spread that rebuilding requests from aggregates leaves.

The re-plan (``planner/recording/from_prometheus.py``) answers "what would this spec have decided on the live
fleet's readings"; it cannot say what latencies the what-if's fleet would have had, because
the readings are the live fleet's. This rebuilds the load itself (rate, mean lengths and
prefix hit rate per interval, ``planner/replay/reconstruct.py``) and runs the pdscale policy
on the deployed stack, routed as the spec renders, for each spec. Each figure is given over
several seeds and length spreads (min-max): the rebuilt trace is one of many that agree with
the aggregates, and the spread is how much the figure depends on which.

The command builds each spec's simulated fleet (``replay_setup.fleet_setup``) and prints;
reading the recording and simulating it are the planner's
(``planner/recording/from_prometheus.py``, ``simulate_recording``). The aggregates are read
at the planner's own queries on a grid of contiguous windows (each reading covers the window
before its time); the live run's own figures over the whole range
(its TTFT and TPOT at the SLO percentile, the instances it decided) come beside the base
simulation's, so that a reader sees how far to trust it.
"""

from __future__ import annotations

from typing import Any

from pdscale.planner.prometheus import QueryClient, rate_window_seconds
from pdscale.planner.recording.from_prometheus import simulate_recording
from pdscale.planner.replay.ensemble import FIGURES, NOT_COVERED, Ensemble
from pdscale.planner.replay.simulate import SCRAPE_SECONDS


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
    # each spec routes and admits as its router renders; the fleet runs the planner's profile
    flags = replay_flags(args)

    def specs_at(origin_unix_seconds: float) -> dict[str, Any]:
        # the rebuilt trace's clock starts at the first interval: its schedules are read there
        base = on_clock(configured, origin_unix_seconds)
        specs = {"spec": lambda trace: fleet_setup(flags, trace, base, None)}
        if whatif is not None:
            alt = on_clock(whatif, origin_unix_seconds)
            specs["what-if"] = lambda trace: fleet_setup(flags, trace, alt, None)
        return specs

    result = simulate_recording(
        client, engine=configured.spec.engine.kind.value, namespace=namespace,
        pdcluster_label=base_name(name),
        window_seconds=rate_window_seconds(configured.spec.planner.interval_seconds),
        percentile=config.slo.percentile, start=start, end=end, specs_at=specs_at,
        ensemble=Ensemble(tuple(range(args.simulate_seeds)), tuple(args.length_sigmas)),
        max_input_tokens=getattr(configured.spec.model, "max_context_length_tokens", None),
        live=live, progress=lambda msg: console.print(msg, style="dim"))
    caveats = result["caveats"]
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
