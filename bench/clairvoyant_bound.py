"""Clairvoyant bounds on an autoscaler's GPU-hours: per-interval smallest fleets.

For each trace of ``policy_bench.py`` (same scale factors, SLOs and router) this runs fixed
fleets over the whole trace and records every interval's attainment at each count: prefill
counts for TTFT (prefill alone, as in the article's routing simulation) and decode counts for
TPOT (prefill ample). From these curves it prices fleets that know every interval's load:

- ``per-interval``: the smallest counts meeting ``--share`` in every interval (an interval no
  probe brings to the share, because some prompts are too long for the TTFT on any fleet, needs
  only to do as well as the largest probe): what a planner sizing every interval for its SLO
  percentile aims at.
- ``aggregate``: from those, spends the whole trace's miss budget (1 - share) where it saves
  the most GPU time per miss (prefill and decode misses added, which over-counts requests
  missing both): the trade ``static:best`` also makes in hindsight.

Each is priced twice: resized for free every interval, and with the profile's new-node warm-up
(an instance serves only after it; one released and needed again within less than a warm-up
is cheaper kept, so such gaps are paid), the cost every policy in the benchmark pays. The
first is a lower bound; the second is what a clairvoyant policy with the same warm-up achieves
(the aggregate one by a greedy allocation, so a cleverer one could do a little better). Their
ratios to ``static:best`` (read from out/policy_bench.json) tell whether a target such as
"<= 0.6x static:best" is reachable.

    .venv/bin/python bench/clairvoyant_bound.py [--only servegen] [--share 0.99]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pdscale.planner.config import PlannerConfig
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import load_profile
from pdscale.planner.replay.run import ReplaySetup, simulate_fleet
from pdscale.planner.replay.traces import load_trace

sys.path.insert(0, str(Path(__file__).parent))  # PYTHONSAFEPATH keeps the script's folder off
from policy_bench import OUT, cases


def attainment_curves(setup: ReplaySetup, role: str, hi: int, other: int, share: float,
                      idx: np.ndarray, n: int, log: str) -> dict[int, np.ndarray]:
    """Per-interval attainment for counts hi, hi-1, ... until no interval meets its target."""
    cnt = np.maximum(np.bincount(idx, minlength=n), 1)
    busy = np.bincount(idx, minlength=n) > 0
    curves: dict[int, np.ndarray] = {}
    target = np.full(n, share)
    for k in range(hi, 0, -1):
        start = (k, other) if role == "P" else (other, k)
        r = simulate_fleet(setup, start, None, None, prefill_only=(role == "P"))
        if role == "P":
            ok = r.ttft_seconds <= setup.slo.ttft_seconds
        else:  # a request rejected at prefill is not decode's miss
            ok = (r.tpot_seconds <= setup.slo.tpot_seconds) | r.rejected
        att = np.bincount(idx, ok.astype(float), minlength=n) / cnt
        curves[k] = att
        if k == hi:
            target = np.minimum(target, att)
        met = att >= target - 1e-9
        print(f"{log} {role}={k}: {met[busy].mean():.0%} of busy intervals at target", flush=True)
        if not met[busy].any():
            break
    return curves


def bound(name: str, args: argparse.Namespace, model: PerformanceModel,
          bench: dict[str, Any]) -> str:
    """Both clairvoyant fleets for one trace, as a printable line."""
    c = cases()[name]
    trace = load_trace(c["path"], rate_scale=c["rate_scale"], time_scale=c["time_scale"],
                       lengths_from=c.get("lengths"))
    slo = Slo(ttft_seconds=c["ttft"], tpot_seconds=0.05)
    # fixed fleets only: no planner runs, its configuration carries the model, SLO and budget
    setup = ReplaySetup(trace=trace, planner=PlannerConfig(model=model, slo=slo, nodes=400),
                        early_rejection=True)
    t0 = trace.arrival_seconds[0]
    idx = ((np.asarray(trace.arrival_seconds) - t0) // setup.interval_seconds).astype(int)
    n = int(idx.max()) + 1
    cnt = np.bincount(idx, minlength=n).astype(float)
    busy = cnt > 0
    curves = {
        "P": attainment_curves(setup, "P", args.max_prefill, 3 * args.max_decode, args.share,
                               idx, n, name),
        "D": attainment_curves(setup, "D", args.max_decode, 3 * args.max_prefill, args.share,
                               idx, n, name),
    }
    # per-interval: the smallest probed count at the interval's target
    counts: dict[str, np.ndarray] = {}
    for role, cv in curves.items():
        hi = max(cv)
        target = np.minimum(args.share, cv[hi])
        need = np.full(n, float(hi))
        for k in sorted(cv, reverse=True):
            need = np.where(cv[k] >= target - 1e-9, k, need)
        counts[role] = np.where(busy, need, 1.0)  # idle intervals: the 1P1D minimum

    def misses(role: str, i: int, k: int) -> float:
        return float((1.0 - curves[role][k][i]) * cnt[i])

    warm = max(1, round(model.profile.warmup.new_node_seconds / setup.interval_seconds))
    to_gpu_h = setup.interval_seconds / 3600.0 * model.profile.gpus_per_instance
    budget = (1.0 - args.share) * cnt.sum()
    out: dict[int, tuple[float, float, dict[str, np.ndarray], float]] = {}
    for w in (0, warm):
        per = sum(fleet_cost(counts[r], w) for r in counts) * to_gpu_h
        agg, missed = spend_budget(counts, curves, misses, budget, busy, w)
        out[w] = (per, sum(fleet_cost(agg[r], w) for r in agg) * to_gpu_h, agg, missed)
    if args.dump:
        Path(args.dump).write_text(json.dumps({
            "per_interval": {r: v.tolist() for r, v in counts.items()},
            "aggregate_warm": {r: v.tolist() for r, v in out[warm][2].items()},
        }))
    sb = bench.get(name, {}).get("policies", {}).get("static:best")
    lines = [f"{name} x{c['rate_scale']:g}/t{c['time_scale']:g} (share {args.share:.0%}, "
             f"per-interval P mean {counts['P'][busy].mean():.2f} D mean {counts['D'][busy].mean():.2f}):"]
    for w, label in ((0, "resized for free"), (warm, f"with a {warm}-interval warm-up")):
        per, aggregate, _, missed = out[w]
        ratio = (f" = {per / sb['gpu_hours']:.2f}x / {aggregate / sb['gpu_hours']:.2f}x "
                 f"{sb['policy']} ({sb['gpu_hours']:.1f} GPU-h)") if sb else ""
        lines.append(f"  {label}: per-interval {per:.1f} GPU-h, aggregate {aggregate:.1f} GPU-h "
                     f"(est. attainment {1 - missed / cnt.sum():.4f}){ratio}")
    return "\n".join(lines)


def fleet_cost(need: np.ndarray, warm: int) -> int:
    """Instance-intervals of one role's per-interval counts, each instance starting ``warm``
    intervals before it serves (none for those ready at the start); a gap shorter than the
    warm-up is cheaper kept than released and re-warmed, so it is paid."""
    total = 0
    for j in range(1, int(need.max()) + 1):
        on = need >= j
        idx = np.nonzero(on)[0]
        total += idx.size + (0 if on[0] else warm)
        gaps = np.diff(idx) - 1
        total += int(np.minimum(gaps[gaps > 0], warm).sum()) if warm else 0
    return total


def spend_budget(counts: dict[str, np.ndarray], curves: dict[str, dict[int, np.ndarray]],
                 misses: Any, budget: float, busy: np.ndarray, warm: int) -> tuple[dict[str, np.ndarray], float]:
    """Greedily lower the top of each role's counts where it saves the most instance-intervals
    per miss (whole plateaus and their ends, so that with a warm-up a short spike can go),
    until the misses reach the budget."""
    need = {r: v.astype(int).copy() for r, v in counts.items()}
    n = len(busy)
    total = sum(misses(r, i, int(need[r][i])) for r in need for i in range(n) if busy[i])
    while True:
        best: tuple[float, str, int, np.ndarray, float] | None = None
        for r, nd in need.items():
            for j in range(int(nd.max()), 1, -1):
                top = np.nonzero((nd == j) & busy)[0]
                if top.size == 0 or j - 1 not in curves[r]:
                    continue
                on = nd >= j
                base = fleet_cost(on.astype(int), warm)
                segs = np.split(top, np.nonzero(np.diff(top) > 1)[0] + 1)
                cands = [x for sg in segs for x in ([sg, sg[:1], sg[-1:]] if sg.size > 1 else [sg])]
                for sg in cands:
                    dm = sum(misses(r, i, j - 1) - misses(r, i, j) for i in sg)
                    if total + dm > budget:
                        continue
                    on2 = on.copy()
                    on2[sg] = False
                    save = base - fleet_cost(on2.astype(int), warm)
                    if save <= 0:
                        continue
                    if best is None or dm / save < best[0]:
                        best = (dm / save, r, j, sg, dm)
        if best is None:
            return need, total
        _, r, j, sg, dm = best
        need[r][sg] = j - 1
        total += dm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="servegen")
    ap.add_argument("--share", type=float, default=0.99)
    ap.add_argument("--max-prefill", type=int, default=14)
    ap.add_argument("--max-decode", type=int, default=9)
    ap.add_argument("--dump", default=None, help="write the per-interval counts to this JSON file")
    args = ap.parse_args()
    model = PerformanceModel(load_profile())
    path = OUT / "policy_bench.json"
    bench = json.loads(path.read_text()) if path.exists() else {}
    for name in args.only.split(","):
        print(bound(name, args, model, bench))


if __name__ == "__main__":
    main()
