"""Where the pooled plan's GPU-hours go (issue 45): per member and interval, the grant
against the member's need at its SLO and against what its planner would command alone on
its even share of the pool.

    nice -n 10 .venv/bin/python bench/pool_diag.py [--case equal] [--pool-nodes 30]

Prints per member the node-intervals (x interval = node-hours) the pooled plan commanded
beyond the need (``lead_need``: the most its planner forecast within one warm-up), and beyond
what it would have commanded alone on its share; writes out/pool_diag.json (every tick).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # PYTHONSAFEPATH keeps the script's folder off

from pool_bench import CASES, MEMBERS, ROOT, SPEC  # type: ignore[import-not-found]

from pdscale.planner.replay.pool import run_pool
from pdscale.replay_pool import MemberArg, member_setups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="equal")
    ap.add_argument("--pool-nodes", type=int, default=30)
    ap.add_argument("--policy", default="pooled")
    ap.add_argument("--surplus-price", type=float, default=0.0)
    ap.add_argument("--out", default=str(ROOT / "out" / "pool_diag.json"))
    args = ap.parse_args()
    prio = CASES[args.case]
    members = member_setups([MemberArg(spec=SPEC, name=name, priority=prio[name][0],
                                       guaranteed=prio[name][1], **kw)  # type: ignore[arg-type]
                             for name, kw in MEMBERS.items()])
    t = time.perf_counter()
    rep = run_pool(members, pool_nodes=args.pool_nodes, policy=args.policy, probe_split=True,
                   surplus_price=args.surplus_price)
    print(f"{args.policy} on {args.pool_nodes}: {time.perf_counter() - t:.0f} s; total "
          f"{rep['total']}")
    hours = 60.0 / 3600.0  # the bench's interval
    print("member  att.    GPU-h  | node-h: commanded  >lead_need  >alone@split  "
          "(>split while own >lead)")
    for m in rep["members"]:
        g = m["grants"]
        cmd = sum(r["commanded"] for r in g) * hours
        over_need = sum(max(0, r["commanded"] - r["lead_need"]) for r in g) * hours
        over_split = sum(max(0, r["commanded"] - r["alone_at_split"]) for r in g) * hours
        both = sum(max(0, r["commanded"] - max(r["alone_at_split"], r["lead_need"]))
                   for r in g) * hours
        print(f"{m['member']:6s} {m['slo_attainment']:.4f} {m['gpu_hours']:6.1f} | "
              f"{cmd:6.1f} {over_need:6.1f} {over_split:6.1f} {both:6.1f}")
    for m in rep["members"]:
        m.pop("decisions", None)
        m.pop("explanations", None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
