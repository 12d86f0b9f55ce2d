"""Ramps, steps and spikes: pdscale, the oracle and static:best side by side on synthetic
load shapes (planner/replay/workloads.py ``SHAPES``), on the deployed stack.

Each shape opens with 30 minutes at the base rate (steady: an hour at it), then +50% over
10 minutes (ramp), 2x at once (step) or 2.5x decaying back (spike); Poisson arrivals, lengths
and prefix blocks drawn from the Mooncake conversation trace (as the rate series are). The
planner runs the policy benchmark's PDCluster (bench/policy_bench_pdcluster.yaml: warm-up 600 s,
interval 60 s, TPOT 50 ms, p99), TTFT target 15 s. By default the shape's first warm-up is
history, not scored: every dynamic policy starts from the fleet it sizes, and the planner
remembers it (``run.with_history``); ``--start-from hindsight`` sizes the start from the
scored trace's first warm-up instead, as the replay did before.

Per policy: attainment, GPU-hours and their ratio to the oracle's, peak provisioned instances
and their ratio to the oracle's peak (target <= 1.15x), re-adds (an instance of a role removed
and the role raised again within one warm-up: target 0 on steady and monotone load) and role
changes (target 0 on the steady hour). Writes out/ramp_bench.json and prints the table.

    .venv/bin/python bench/ramp_bench.py [--shapes steady,ramp,step,spike] [--base-rps 12]
        [--start-from history|hindsight] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pdscale.planner.replay.run import STACKS, START_FROM, ReplaySetup, run_policy, start_from
from pdscale.planner.replay.traces import read_mooncake
from pdscale.planner.replay.workloads import SHAPES, synthetic_trace
from pdscale.replay import configure, read_spec

SHARED = Path("/work/shared/traces")
MOONCAKE = SHARED / "mooncake/conversation_trace.jsonl"
PDCLUSTER = Path(__file__).with_name("policy_bench_pdcluster.yaml")
OUT = Path(__file__).parents[1] / "out"
POLICIES = ["pdscale", "oracle", "static:best"]
#: the targets of issue 17 for a ramp
PEAK_RATIO_TARGET = 1.15


def readds(decisions: list[dict[str, Any]], warmup_seconds: float) -> int:
    """Times an instance was removed and its role raised again within ``warmup_seconds``.

    Per role, on the provisioned counts of each tick: a drop at tick t counts once when the
    role's count climbs above the count right after the drop at any tick before t + warm-up.
    Such a pair paid a warm-up for a node the fleet already had."""
    n = 0
    for key in ("provisioned_prefill", "provisioned_decode"):
        ts = [d["t"] for d in decisions]
        xs = [d[key] for d in decisions]
        for i in range(1, len(xs)):
            if xs[i] < xs[i - 1]:
                after = xs[i]
                if any(xs[j] > after for j in range(i + 1, len(xs)) if ts[j] - ts[i] < warmup_seconds):
                    n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--base-rps", type=float, default=12.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", default=str(OUT / "ramp_bench.json"))
    ap.add_argument("--start-from", choices=list(START_FROM), default="history",
                    help="history (default): the shape's first warm-up is history, not scored, "
                         "and sizes every dynamic policy's start; hindsight: the start is sized "
                         "from the scored trace's first warm-up (the earlier replay's rule); "
                         "running: every policy runs the first warm-up on the fleet, unscored")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a PlannerConfig field (an A/B of one knob), e.g. "
                         "forecast_method=recent-max; repeatable")
    args = ap.parse_args()
    console = Console(width=170)
    spec = read_spec(str(PDCLUSTER))
    configured = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides={"--slo-ttft": 15.0})
    for kv in args.set:
        field, value = kv.split("=", 1)
        old = getattr(configured.config, field)
        parsed: object = (value.lower() in ("1", "true", "yes") if isinstance(old, bool)
                          else type(old)(value) if old is not None else float(value))
        changes: dict[str, Any] = {field: parsed}
        configured = dataclasses.replace(
            configured, config=dataclasses.replace(configured.config, **changes))
    donor = read_mooncake(MOONCAKE)
    warmup = configured.config.model.profile.warmup.new_node_seconds
    results: dict[str, Any] = {}
    for shape in args.shapes.split(","):
        trace = synthetic_trace(shape, args.base_rps, donor, seed=3)
        setup = ReplaySetup(trace=trace, planner=configured.config, **STACKS["deployed"])
        setup, history = start_from(setup, args.start_from)
        console.print(f"[bold]{shape}[/bold]: {trace.name}, {len(setup.trace):,} requests scored "
                      f"over {setup.trace.duration_seconds / 3600:.2f} h (start: {args.start_from})")
        reps: dict[str, Any] = {}
        for pol in args.policies.split(","):
            t = time.perf_counter()
            rep = run_policy(setup, pol, history=history)
            decisions = rep["decisions"]
            row: dict[str, Any] = {k: rep[k] for k in ("policy", "slo_attainment", "gpu_hours", "role_changes",
                                       "misses", "ttft_at_percentile", "initial_fleet")
                   if k in rep}
            row["peak_instances"] = max(
                (d["provisioned_prefill"] + d["provisioned_decode"] for d in decisions), default=0)
            row["readds_within_warmup"] = readds(decisions, warmup)
            row["wall_seconds"] = round(time.perf_counter() - t, 1)
            reps[pol] = row
            console.print(f"  {row['policy']:>22}: attainment {row['slo_attainment']:.4f}, "
                          f"{row['gpu_hours']:.1f} GPU-h, peak {row['peak_instances']}, re-adds "
                          f"{row['readds_within_warmup']}, role changes {row['role_changes']} "
                          f"({row['wall_seconds']:.0f} s)")
        oracle = reps.get("oracle")
        for row in reps.values():
            if oracle:
                row["gpu_hours_vs_oracle"] = round(row["gpu_hours"] / oracle["gpu_hours"], 3)
                row["peak_vs_oracle"] = round(row["peak_instances"] / oracle["peak_instances"], 3)
        results[shape] = {"trace": trace.name, "requests_scored": len(setup.trace),
                          "start_from": args.start_from, "base_rps": args.base_rps,
                          "policies": reps}
    table = Table(title="ramps and spikes, deployed stack (TTFT 15 s, TPOT 50 ms, p99, warm-up "
                        f"{warmup:.0f} s)")
    for col in ("shape", "policy", "attain.", "GPU-h", "vs oracle", "peak", "peak vs oracle",
                "re-adds", "role chg"):
        table.add_column(col, justify="right")
    for shape, r in results.items():
        for row in r["policies"].values():
            table.add_row(shape, row["policy"], f"{row['slo_attainment']:.4f}",
                          f"{row['gpu_hours']:.1f}", f"{row.get('gpu_hours_vs_oracle', '-')}",
                          str(row["peak_instances"]), f"{row.get('peak_vs_oracle', '-')}",
                          str(row["readds_within_warmup"]), str(row["role_changes"]))
    console.print(table)
    checks = []
    for shape, r in results.items():
        ours = r["policies"].get("pdscale")
        if not ours:
            continue
        if "peak_vs_oracle" in ours:
            checks.append((shape, f"peak <= {PEAK_RATIO_TARGET}x oracle's", ours["peak_vs_oracle"],
                           ours["peak_vs_oracle"] <= PEAK_RATIO_TARGET))
        if shape in ("steady", "ramp", "step"):  # steady or monotone load
            checks.append((shape, "no re-add within a warm-up", ours["readds_within_warmup"],
                           ours["readds_within_warmup"] == 0))
        if shape == "steady":
            checks.append((shape, "0 role changes", ours["role_changes"], ours["role_changes"] == 0))
    for shape, what, value, met in checks:
        console.print(f"  {shape:>7} {what:<32} {value!s:<8} {'met' if met else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"settings": args.set, "results": results, "targets": [
        {"shape": s, "target": w, "value": v, "met": m} for s, w, v, m in checks]}, indent=1))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
