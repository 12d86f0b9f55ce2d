"""Planner speed: decision latency and replay throughput.

1. Decision latency of ``plan()`` with a 2,000-node budget and a 30-minute horizon (30
   one-minute intervals), over varied loads, fleet states and histories (target: p99 <= 50 ms).
2. Replay of the Mooncake conversation trace at rate-scale 20 (~240k requests) under the
   pdscale policy (target: <= 60 s).
3. The pool's joint grant (``planner/pool.py: solve_pool``) for 10 members on 2,000 nodes,
   over random needs, fluid demands, holdings and guarantees (issue 45).

Prints a table and writes out/planner_bench.json.

    .venv/bin/python bench/planner_bench.py [--skip-replay]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.model import Load, PerformanceModel
from pdscale.planner.observe import Observation, Reading, RoleState, Warming
from pdscale.planner.pool import MemberNeed, solve_pool
from pdscale.planner.profile import load_profile
from pdscale.planner.replay.run import ReplaySetup, run_policy
from pdscale.planner.replay.traces import load_trace
from pdscale.planner.solve import History, plan
from pdscale.replay import configure, read_spec

OUT = Path(__file__).parents[1] / "out"
MOONCAKE = "/work/shared/traces/mooncake/conversation_trace.jsonl"
PDCLUSTER = Path(__file__).with_name("policy_bench_pdcluster.yaml")


def latency(samples: int = 300, seed: int = 7) -> dict[str, float]:
    rng = random.Random(seed)
    model = PerformanceModel(load_profile())
    cfg = PlannerConfig(model=model, nodes=2000, horizon_intervals=30, interval_seconds=60)
    times = []
    paths = {"held": 0, "shortfall": 0, "lp": 0, "milp": 0, "lp-rounded": 0}
    for _ in range(samples):
        now = 3600.0
        rate = rng.uniform(1, 3000)
        isl = rng.uniform(500, 30000)
        osl = rng.uniform(50, 2000)
        hit = rng.uniform(0, 0.9)
        p, d = rng.randint(1, 900), rng.randint(1, 900)
        warming = tuple(Warming(now + rng.uniform(0, 600)) for _ in range(rng.randint(0, 20)))
        hist = History()
        for k in range(30):
            r = rate * rng.uniform(0.7, 1.1)
            hist = hist.record(
                Load(r, isl, osl, hit),
                Decision(now - (30 - k) * 60, p, d, 1, 0.03, 1, "", desired=(p, d)),
            )
        obs = Observation(
            now_seconds=now, rate_rps=Reading(rate, now), mean_input_tokens=Reading(isl, now),
            mean_output_tokens=Reading(osl, now), prefix_hit_rate=Reading(hit, now),
            prefill=RoleState(ready=p, warming=warming), decode=RoleState(ready=d, draining=rng.randint(0, 5)),
        )
        t = time.perf_counter()
        dec = plan(obs, config=cfg, history=hist, now=now)
        times.append(time.perf_counter() - t)
        paths["held"] += dec.held
        paths["shortfall"] += dec.shortfall
        if dec.solver:
            paths[dec.solver] += 1
    ms = np.asarray(times) * 1000
    return {
        "samples": samples, "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()), **paths,
    }


def pool_latency(samples: int = 300, seed: int = 5, surplus_price: float = 0.5) -> dict[str, float]:
    """solve_pool for 10 members sharing 2,000 nodes (their needs exceed it about half the
    time), surplus priced (the price's test runs on every node beyond a fair share)."""
    rng = random.Random(seed)
    times = []
    for _ in range(samples):
        members = []
        for i in range(10):
            need = (rng.randint(10, 200), rng.randint(10, 200))
            members.append(MemberNeed(
                f"m{i}", priority=rng.randint(0, 3), guaranteed_nodes=rng.randint(0, 50),
                need_nodes=need, target_nodes=(need[0] + rng.randint(0, 10), need[1]),
                busy_nodes=(need[0] * rng.random(), need[1] * rng.random()),
                current_nodes=(rng.randint(0, 200), rng.randint(0, 200)),
                draining_nodes=rng.randint(0, 5), warmup_seconds=(600.0, 600.0)))
        t = time.perf_counter()
        solve_pool(members, pool_nodes=2000, surplus_price=surplus_price)
        times.append((time.perf_counter() - t) * 1000.0)
    arr = np.array(times)
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max())}


def replay_speed() -> dict[str, float]:
    t = time.perf_counter()
    trace = load_trace(MOONCAKE, rate_scale=20)
    load_s = time.perf_counter() - t
    # the policy benchmark's PDCluster, as the operator would configure its planner
    configured = configure(read_spec(str(PDCLUSTER)), spec_source="file",
                           overrides={"--slo-ttft": 15.0, "--nodes": 400})
    setup = ReplaySetup(trace=trace, planner=configured.config)
    t = time.perf_counter()
    rep = run_policy(setup, "pdscale")
    sim_s = time.perf_counter() - t
    return {
        "requests": rep["requests"], "load_seconds": load_s, "replay_seconds": sim_s,
        "requests_per_second": rep["requests"] / sim_s, "slo_attainment": rep["slo_attainment"],
        "gpu_hours": rep["gpu_hours"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    lat = latency()
    table = Table(title="planner speed")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("plan() p50 (2000 nodes, 30x60 s horizon)", f"{lat['p50_ms']:.1f} ms", "")
    table.add_row("plan() p99", f"{lat['p99_ms']:.1f} ms", "<= 50 ms")
    table.add_row("plan() max", f"{lat['max_ms']:.1f} ms", "")
    table.add_row("solved by LP / MILP / rounded LP",
                  f"{lat['lp']} / {lat['milp']} / {lat['lp-rounded']}", "")
    pool = pool_latency()
    table.add_row("solve_pool p50 (10 members, 2000 nodes)", f"{pool['p50_ms']:.1f} ms", "")
    table.add_row("solve_pool p99", f"{pool['p99_ms']:.1f} ms", "")
    result = {"latency": lat, "pool_latency": pool}
    if not args.skip_replay:
        rs = replay_speed()
        result["replay"] = rs
        table.add_row(f"replay mooncake x20 ({rs['requests']:,} req), pdscale",
                      f"{rs['replay_seconds']:.1f} s", "<= 60 s")
        table.add_row("  + trace load and scaling", f"{rs['load_seconds']:.1f} s", "")
        table.add_row("  attainment / GPU-h", f"{rs['slo_attainment']:.4f} / {rs['gpu_hours']:.0f}", "")
    Console().print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / "planner_bench.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
