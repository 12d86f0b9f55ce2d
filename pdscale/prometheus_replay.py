"""``pdscale replay --prometheus``: the planner re-run on what it read over a past range,
next to the live decisions, and with override flags a what-if's. The command parses the
range, reads the live spec from the cluster where none is given, and prints; the re-plan, the
reading and the caveats are the planner's (``planner/recording/from_prometheus.py``, whose
docstring says when a replay is exact and when not)."""

from __future__ import annotations

import os
from typing import Any

from pdscale.planner.prometheus import QueryClient
from pdscale.planner.recording.from_prometheus import (
    Replayed,
    describe,
    memory_caveat,
    read_recording,
    replay_range,
)
from pdscale.planner.replay.recorded import instance_hours, matches, tick_times


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


def run(args: Any, configured: Any, whatif: Any | None) -> int:
    """``pdscale replay --prometheus URL --pdcluster NS/NAME --start T --end T``: the spec's
    decisions re-run over the range next to the live ones, and with override flags the
    what-if's decisions and instance-hours."""
    from rich.console import Console

    from pdscale.operator.api.names import base_name
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
                        pdcluster_label=base_name(name), config=configured.config, start=start, end=end, recorded=recorded,
                        ready=ready, live_interval_seconds=live_interval)
    caveats = list(base.caveats)
    memory = memory_caveat(planned_before, bool(recorded), configured.config.stabilization_seconds)
    if memory:
        caveats.append(memory)

    _print_replay(namespace, name, base, live_interval, configured.config.interval_seconds, end)
    if whatif is not None:
        alt = replay_range(client, engine=engine, namespace=namespace, name=name,
                           pdcluster_label=base_name(name), config=whatif.config, start=start, end=end, recorded=recorded,
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
