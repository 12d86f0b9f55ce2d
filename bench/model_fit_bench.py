"""Where the planner's performance model and the replay's fleet disagree, interval by interval.

For one case of ``bench/policy_bench.py`` (same trace, PDCluster and stack), every interval's
true load (what the oracle is told) is priced by the model, term by term, and set beside what
the replay's fleet needed for it:

- the model: prefill's fluid demand, its count at the utilisation cap, the M/G/c count at the
  SLO percentile (``prefill_instances_for_ttft``) and the burst count; decode's fluid demand,
  its count at the cap and at the SLO percentile (``decode_instances_at_percentile``); and
  the planner's need (``needs.instances_needed``: what the oracle orders for that load);
- the replay: the fewest fixed prefills (decode ample, prefill-only runs) whose requests
  arriving in that interval met the TTFT target for ``--target`` of them, and the fewest fixed
  decodes (prefill ample) whose requests met the TPOT target for as many.

A fixed fleet carries queues across intervals, so right after a rise the replay's count
reads high for an interval or two; on flat stretches the two should agree. Fixed runs are
whole replays: allow 10-150 s each on the shared machine.

    .venv/bin/python bench/model_fit_bench.py surge --prefill 9:17 --decode 1:3
    .venv/bin/python bench/model_fit_bench.py surge --old-default --prefill 12:22:2 --decode 1:3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from policy_bench import MOONCAKE, OUT, PDCLUSTER, cases

from pdscale.operator.api.pdcluster import SGLangGateway
from pdscale.planner.needs import instances_needed
from pdscale.planner.replay.run import (
    STACKS,
    ReplaySetup,
    interval_loads,
    simulate_fleet,
    start_from,
)
from pdscale.planner.replay.simulate import SimResult
from pdscale.planner.replay.traces import Trace, load_trace, read_mooncake, synthesize_from_rates
from pdscale.planner.replay.workloads import synthetic_trace
from pdscale.replay import configure, read_spec
from pdscale.replay_setup import router_admission, routing


def case_setup(name: str, old_default: bool) -> ReplaySetup:
    """The scored setup of ``policy_bench``'s case ``name`` on the deployed stack."""
    spec = read_spec(str(PDCLUSTER))
    if old_default:
        spec = spec.model_copy(update={"router": spec.router.model_copy(update={
            "gateway": SGLangGateway.SGLANG_ROUTER, "admission": None})})
    c = cases()[name]
    trace: Trace
    if "steady_rps" in c:
        trace = synthesize_from_rates([(0.0, c["steady_rps"]), (c["seconds"], 0.0)],
                                      read_mooncake(MOONCAKE), name="steady-12rps", seed=3)
    elif "shape" in c:
        trace = synthetic_trace(c["shape"], c["base_rps"], load_trace(c["lengths"]), seed=3)
    else:
        trace = load_trace(c["path"], rate_scale=c["rate_scale"], time_scale=c["time_scale"],
                           lengths_from=c.get("lengths"))
    configured = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides={"--slo-ttft": c["ttft"]})
    setup = ReplaySetup(trace=trace, planner=configured.config,
                        **{**STACKS["deployed"], **routing(configured.spec)},
                        prefill_admission=router_admission(configured.spec))
    return start_from(setup, "history")[0]


def met_per_interval(setup: ReplaySetup, r: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Per interval of arrival: the share of requests within the TTFT target, and within the
    TPOT target (a rejected or unserved request misses both)."""
    t0, dt = float(r.arrival_seconds[0]), setup.interval_seconds
    idx = ((r.arrival_seconds - t0) // dt).astype(int)
    count = np.maximum(np.bincount(idx), 1)
    ttft = np.nan_to_num(r.ttft_seconds, nan=np.inf) <= setup.slo.ttft_seconds
    tpot = np.nan_to_num(r.tpot_seconds, nan=np.inf) <= setup.slo.tpot_seconds
    return (np.bincount(idx, weights=ttft.astype(float)) / count,
            np.bincount(idx, weights=tpot.astype(float)) / count)


def model_terms(setup: ReplaySetup) -> list[dict[str, Any]]:
    """Each interval's load priced by the model, term by term (the module's docstring)."""
    cfg, slo = setup.planner, setup.slo
    m = cfg.model
    rows = []
    for ld in interval_loads(setup.trace, setup.interval_seconds):
        fp, fd = m.fluid_demand(ld, slo)
        cv = m.prefill_service_cv(ld, cfg.prefill_service_cv)
        need = instances_needed(cfg, ld)
        rows.append({
            "rate_rps": round(ld.rate_rps, 2), "peak_rps": round(ld.peak_rate_rps or 0.0, 2),
            "prefill_fluid": round(fp, 2), "prefill_at_cap": round(fp / cfg.prefill_utilization, 2),
            "prefill_at_percentile": m.prefill_instances_for_ttft(
                ld, slo, service_cv=cv, pooled=cfg.prefill_queue == "pooled") if ld.rate_rps > 0 else 0,
            "prefill_burst": round(m.prefill_instances_for_burst(ld, slo), 2),
            "decode_fluid": round(fd, 3), "decode_at_cap": round(fd / cfg.decode_utilization, 3),
            "decode_at_percentile": round(m.decode_instances_at_percentile(ld, slo), 3),
            "need": list(need),
        })
    return rows


def counts(spec: str) -> list[int]:
    """``A:B`` or ``A:B:STEP`` -> range(A, B, STEP)."""
    return list(range(*(int(x) for x in spec.split(":"))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case", help="a case of bench/policy_bench.py (surge, mooncake, azure, steady, ...)")
    ap.add_argument("--prefill", default="8:20", help="fixed prefill counts to run, A:B[:STEP]")
    ap.add_argument("--decode", default="1:4", help="fixed decode counts to run, A:B[:STEP]")
    ap.add_argument("--old-default", action="store_true",
                    help="sglang-router 0.3.2 (random PD prefill choice), no admission")
    ap.add_argument("--target", type=float, default=None,
                    help="share of an interval's requests that must meet the target (default: the SLO's percentile)")
    args = ap.parse_args()
    setup = case_setup(args.case, args.old_default)
    target = setup.slo.percentile if args.target is None else args.target
    rows = model_terms(setup)
    ps, ds = counts(args.prefill), counts(args.decode)
    p_ample, d_ample = max(ps) + 5, max(ds) + 3
    ttft_met: dict[int, list[float]] = {}
    tpot_met: dict[int, list[float]] = {}
    for p in ps:
        t = time.perf_counter()
        r = simulate_fleet(setup, (p, d_ample), None, None, prefill_only=True)
        ttft_met[p] = met_per_interval(setup, r)[0].tolist()
        print(f"{p}P (decode ample): TTFT met {r.attainment(setup.slo, ttft_only=True):.4f} "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
    for d in ds:
        t = time.perf_counter()
        r = simulate_fleet(setup, (p_ample, d), None, None)
        tpot_met[d] = met_per_interval(setup, r)[1].tolist()
        print(f"{p_ample}P{d}D: attainment {r.attainment(setup.slo):.4f} ({time.perf_counter() - t:.0f} s)",
              flush=True)
    print(f"\n{args.case}{' (old default router)' if args.old_default else ''}: per interval, the model's "
          f"terms and the fewest fixed instances meeting each target for {target:.0%} of its requests")
    print("  k   req/s   peak |  P fluid  cap  pct  burst  need |  D fluid   cap   pct  need | replay P  D")
    for k, row in enumerate(rows):
        def fewest(met: dict[int, list[float]], k: int = k) -> str:
            n = next((c for c in sorted(met) if k < len(met[c]) and met[c][k] >= target), None)
            return "-" if n is None else str(n)
        row["replay_prefill"], row["replay_decode"] = fewest(ttft_met), fewest(tpot_met)
        print(f"{k:3d} {row['rate_rps']:7.1f} {row['peak_rps']:6.1f} | {row['prefill_fluid']:7.1f} "
              f"{row['prefill_at_cap']:5.1f} {row['prefill_at_percentile']:4d} {row['prefill_burst']:6.1f} "
              f"{row['need'][0]:5d} | {row['decode_fluid']:7.2f} {row['decode_at_cap']:5.2f} "
              f"{row['decode_at_percentile']:5.2f} {row['need'][1]:5d} | {row['replay_prefill']:>8} "
              f"{row['replay_decode']:>2}")
    OUT.mkdir(exist_ok=True)
    path = Path(OUT) / f"model_fit_{args.case}{'_old_default' if args.old_default else ''}.json"
    path.write_text(json.dumps({"case": args.case, "target": target, "intervals": rows,
                                "ttft_met": ttft_met, "tpot_met": tpot_met}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
