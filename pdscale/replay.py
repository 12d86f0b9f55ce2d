"""Replay a recorded trace through a scaling policy on a simulated PD fleet.

Prints a summary table and optionally writes the full report as JSON and a plot of load,
prefill and decode counts and SLO attainment per interval. Examples:

    pdscale replay --trace conversation_trace.jsonl --rate-scale 5 --policy pdscale --slo-ttft 15
    pdscale replay --trace m-mid_rate.csv --lengths conversation_trace.jsonl --policy oracle
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--trace", required=True, help="Mooncake .jsonl, Azure CSV or rate-series CSV")
    parser.add_argument("--lengths", help="trace to draw lengths from (needed for a rate series)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="replicate arrivals K times")
    parser.add_argument("--time-scale", type=float, default=1.0, help="compress time K times")
    parser.add_argument(
        "--policy", required=True,
        help="pdscale | static:xPyD (e.g. static:4P17D) | static:best | reactive | sla-interp | oracle",
    )
    parser.add_argument("--profile", help="profile YAML (default: shipped DeepSeek FP8 8xH200)")
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT target, seconds")
    parser.add_argument("--slo-tpot", type=float, default=0.05, help="TPOT target, seconds")
    parser.add_argument("--nodes", type=int, default=64, help="node budget (8xH200 nodes)")
    parser.add_argument("--interval", type=float, default=60.0, help="planning interval, seconds")
    parser.add_argument("--router", default="predicted-ttft",
                        choices=["random", "least-queue", "cache-aware", "predicted-ttft"])
    parser.add_argument("--early-rejection", action="store_true",
                        help="the router rejects a request whose predicted TTFT breaks the target")
    parser.add_argument("--decode-admission", choices=["off", "queue", "shed"], default="off",
                        help="off: decode takes every request; queue: decode caps its batch at the "
                             "TPOT target (--max-running-requests sized to the SLO) and the rest "
                             "wait; shed: and drops what would wait past the TTFT target "
                             "(default: off)")
    parser.add_argument("--json", dest="json_out", help="write the report here")
    parser.add_argument("--plot", help="write a PNG of load, x, y and attainment per interval")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from pdscale.planner.model import PerformanceModel, Slo
    from pdscale.planner.profile import ProfileError, load_profile
    from pdscale.planner.replay.run import ReplaySetup, run_policy
    from pdscale.planner.replay.traces import TraceError, load_trace

    console = Console(stderr=True)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        console.print("[red]error:[/red] --plot needs matplotlib: pip install 'pdscale[plot]'")
        return 2
    try:
        profile = load_profile(args.profile)
        trace = load_trace(
            args.trace, rate_scale=args.rate_scale, time_scale=args.time_scale,
            lengths_from=args.lengths,
        )
    except (ProfileError, TraceError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    setup = ReplaySetup(
        trace=trace, model=PerformanceModel(profile),
        slo=Slo(ttft_seconds=args.slo_ttft, tpot_seconds=args.slo_tpot),
        nodes=args.nodes, interval_seconds=args.interval, router=args.router,
        early_rejection=args.early_rejection, decode_admission=args.decode_admission,
    )
    console.print(
        f"{trace.name}: {len(trace):,} requests over {trace.duration_seconds / 60:.0f} min "
        f"(rate x{args.rate_scale:g}, time /{args.time_scale:g}), profile {profile.name}"
    )
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"replay {args.policy}", total=1.0)
        try:
            report = run_policy(
                setup, args.policy,
                progress=lambda share: bar.update(task, completed=share),
                log=lambda msg: bar.console.print(msg),
            )
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
    report["rate_scale"] = args.rate_scale
    report["time_scale"] = args.time_scale
    table = Table(title=f"replay {report['policy']} on {report['trace']}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in ("requests", "slo_attainment", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50",
                "tpot_p90", "tpot_p99", "rejected", "gpu_hours", "role_changes"):
        table.add_row(key, _fmt(report[key]))
    m = report["misses"]
    table.add_row("missed: late first token / slow decode / both",
                  f"{m['ttft_only']} / {m['tpot_only']} / {m['both']}")
    Console().print(table)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))
        console.print(f"wrote {args.json_out}")
    if args.plot:
        plot_report(report, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def plot_report(report: dict[str, Any], path: str) -> None:
    """Load, commanded x and y, and SLO attainment per interval, on a shared time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = report["per_interval"]
    dec = report["decisions"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    t = [p["t"] / 60 for p in per]
    axes[0].plot(t, [p["rate_rps"] for p in per], color="black")
    axes[0].set_ylabel("load (req/s)")
    td = [d["t"] / 60 for d in dec]
    axes[1].step(td, [d["prefill"] for d in dec], where="post", label="prefill (x)")
    axes[1].step(td, [d["decode"] for d in dec], where="post", label="decode (y)")
    axes[1].set_ylabel("instances")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [p["attainment"] if p["attainment"] is not None else float("nan") for p in per])
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(0, 1.02)
    axes[2].set_xlabel("minutes")
    fig.suptitle(
        f"{report['policy']} on {report['trace']}: attainment {report['slo_attainment']:.3f}, "
        f"{report['gpu_hours']:.1f} GPU-h"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
