"""Fuzz the planner's ``step`` with garbage observations and moved bounds (opt-in).

A seeded generator builds cases of an Observation, a History, a PlannerConfig and a planning
time. Every reading field is valid, missing, or garbage (0, negative, 1e9, 1e300, NaN, +-inf,
a stale, future or undated timestamp); role states get odd counts (negative, huge, fractional)
and warm-ups with odd ready times; histories get odd loads, decisions and calibrations; the
config's bounds are random, with a max lowered under the current count or a budget lowered
under the fleet. Each case runs through ``planner.solve.step`` and is sorted:

* exception: ``step`` raised (the operator's tick would stop before the router sync);
* out of bounds: the target is outside [min, max] per role or above the node budget (or,
  when the minima alone exceed the budget, above the minima);
* hold: held, counted by the reason its explanation gives (a hold that gives none is counted
  as 'no reason');
* decision: planned.

    .venv/bin/python bench/planner_fuzz.py [--count 20000] [--seed 1] [--out out/planner_fuzz.json]

tests/planner/test_garbage_readings.py runs the same generator on 2,000 cases.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import random
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.model import Calibration, Load, PerformanceModel
from pdscale.planner.observe import Observation, Reading, RoleState, Warming
from pdscale.planner.profile import load_profile
from pdscale.planner.solve import History, step

NOW = 36_000.0
MODEL = PerformanceModel(load_profile())

#: reading field -> (low, high) of a real value for it
VALID = {
    "rate_rps": (0.0, 60.0),
    "peak_rate_rps": (0.0, 120.0),
    "mean_input_tokens": (50.0, 30_000.0),
    "mean_output_tokens": (5.0, 2_000.0),
    "streamed_output_tokens": (1.0, 2_000.0),
    "prefix_hit_rate": (0.0, 1.0),
    "ttft_p50_seconds": (0.05, 5.0),
    "ttft_at_percentile_seconds": (0.1, 30.0),
    "tpot_p50_seconds": (0.005, 0.1),
    "tpot_at_percentile_seconds": (0.01, 0.3),
}
ROLE_READINGS = {"queue_depth": (0.0, 200.0), "running_requests": (0.0, 500.0)}
GARBAGE_VALUES = (0.0, -1.0, -1e-9, -1e9, 1e9, 1e300, -1e300, math.nan, math.inf, -math.inf)
ODD_TIMES = (NOW - 1e4, NOW + 1e4, NOW + 1e9, -1e300, math.nan, math.inf, -math.inf)
ODD_COUNTS: tuple[Any, ...] = (-1, -7, 10**6, 10**9, 10**30, 2.5, math.nan, True)


@dataclass(frozen=True)
class Case:
    config: PlannerConfig
    observation: Observation
    history: History
    now: float


def _reading(rng: random.Random, lo: float, hi: float, mode: str) -> Reading | None:
    garbage = mode == "many" and rng.random() < 0.4
    if not garbage and rng.random() < 0.1:
        return None
    value = rng.choice(GARBAGE_VALUES) if garbage else rng.uniform(lo, hi)
    at = rng.choice(ODD_TIMES) if garbage and rng.random() < 0.3 else NOW - rng.uniform(0, 60)
    return Reading(value, at)


def _count(rng: random.Random, lo: int, hi: int, odd: bool) -> Any:
    return rng.choice(ODD_COUNTS) if odd else rng.randint(lo, hi)


def _role(rng: random.Random, mode: str, cfg: PlannerConfig, role: str) -> RoleState:
    odd = mode == "many" and rng.random() < 0.3
    hi = getattr(cfg, f"max_{role}")
    # often more than the (possibly lowered) max: the bounds moved under the fleet
    ready = _count(rng, 0, min(hi, 40) + rng.choice((0, 0, 3, 10)), odd)
    warm_at = [NOW + rng.uniform(-300, 900) for _ in range(rng.randint(0, 3))]
    if odd and rng.random() < 0.5:
        warm_at.append(rng.choice(ODD_TIMES))
    readings = {k: _reading(rng, lo, hi_, mode) for k, (lo, hi_) in ROLE_READINGS.items()}
    return RoleState(
        ready=ready,
        warming=tuple(Warming(t) for t in warm_at),
        draining=_count(rng, 0, 3, odd and rng.random() < 0.5),
        recently_ready=_count(rng, 0, 2, odd and rng.random() < 0.3),
        **readings,
    )


def _config(rng: random.Random) -> PlannerConfig:
    min_p, min_d = rng.randint(0, 3), rng.randint(0, 3)
    max_p, max_d = min_p + rng.randint(0, 25), min_d + rng.randint(0, 25)
    nodes = rng.randint(min_p + min_d, 80)
    return PlannerConfig(
        model=MODEL, nodes=nodes, min_prefill=min_p, max_prefill=max_p, min_decode=min_d,
        max_decode=max_d, horizon_intervals=rng.choice((3, 5, 10, 10, 30)),
        max_step_up=rng.choice((None, None, 1, 3)), max_step_down=rng.choice((None, None, 1, 2)),
        backlog_seconds=rng.choice((None, 60.0)),
    )


def _odd_load(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.2:
        return None
    if pick < 0.3:
        return rng.choice((0.0, "load", 3))  # not a Load at all
    bad = lambda: rng.choice(GARBAGE_VALUES)  # noqa: E731
    return Load(bad(), rng.choice((bad(), 4000.0)), rng.choice((bad(), 300.0)),
                rng.choice((bad(), 0.5)), rng.choice((None, bad())))


def _history(rng: random.Random, mode: str) -> History:
    n = rng.choice((0, 0, 1, 3, 10))
    loads: list[Any] = []
    decisions: list[Any] = []
    for k in range(n):
        t = NOW - 60.0 * (n - k)
        if mode == "many" and rng.random() < 0.3:
            loads.append(_odd_load(rng))
            p, d = rng.choice(ODD_COUNTS[:5]), rng.choice(ODD_COUNTS[:5])
            decisions.append(Decision(t, p, d, 1.0, 0.03, 1.0, "", desired=(p, d)))
        else:
            loads.append(Load(rng.uniform(0, 40), rng.uniform(100, 20000), rng.uniform(10, 1000),
                              rng.random()))
            p, d = rng.randint(0, 30), rng.randint(0, 30)
            decisions.append(Decision(t, p, d, 1.0, 0.03, 1.0, "", desired=(p, d)))
    cal = None
    if mode == "many" and rng.random() < 0.2:
        cal = Calibration(prefill_headroom=rng.choice((math.nan, 1e9, -1.0, 1.5)),
                          decode_headroom=rng.choice((math.inf, 0.0, 1.2)))
    return History(loads=tuple(loads), decisions=tuple(decisions), calibration=cal)


def generate(count: int, seed: int) -> Iterator[Case]:
    """``count`` cases: a third with every reading real, a third with one reading garbage, a
    third with garbage anywhere (readings, counts, times, history)."""
    rng = random.Random(seed)
    for _ in range(count):
        mode = rng.choice(("valid", "one", "many"))
        cfg = _config(rng)
        fields: dict[str, Any] = {k: _reading(rng, lo, hi, mode) for k, (lo, hi) in VALID.items()}
        if mode == "one":
            name = rng.choice(list(VALID))
            fields[name] = Reading(rng.choice(GARBAGE_VALUES), rng.choice((NOW, *ODD_TIMES)))
        now = rng.choice((math.nan, math.inf)) if mode == "many" and rng.random() < 0.1 else NOW
        obs = Observation(now_seconds=now, prefill=_role(rng, mode, cfg, "prefill"),
                          decode=_role(rng, mode, cfg, "decode"), **fields)
        yield Case(cfg, obs, _history(rng, mode), NOW)


@dataclass(frozen=True)
class Outcome:
    kind: str  # "exception", "hold" or "decision"
    reason: str = ""
    out_of_bounds: bool = False
    detail: str = ""
    #: the fleet observed above a role's max or above the budget (the bounds moved under it)
    bounds_moved: bool = False


def in_bounds(cfg: PlannerConfig, p: int, d: int) -> bool:
    budget = max(cfg.nodes, cfg.min_prefill + cfg.min_decode)
    return (cfg.min_prefill <= p <= cfg.max_prefill and cfg.min_decode <= d <= cfg.max_decode
            and p + d <= budget)


def hold_reason(explanation: str) -> str:
    """The reason a hold gives, without its figures and field names: 'unusable reading: X is
    not finite (nan)' -> 'unusable reading: not finite'."""
    why, sep, _ = explanation.partition(": holding")
    if not sep or not why.strip():
        return "no reason"
    why = re.sub(r"\s*\(.*", "", why)
    why = re.sub(r"unusable reading: [\w.]+ (is )?", "unusable reading: ", why)
    return re.sub(r"-?[0-9][0-9.e+-]*", "N", why).strip()


def bounds_moved(case: Case) -> bool:
    cfg, p, d = case.config, case.observation.prefill, case.observation.decode
    if not all(isinstance(n, int) and 0 <= n <= 10**5 for n in (p.ready, d.ready)):
        return False
    pc, dc = p.ready + len(p.warming), d.ready + len(d.warming)
    return pc > cfg.max_prefill or dc > cfg.max_decode or pc + dc > cfg.nodes


def run_case(case: Case) -> Outcome:
    moved = bounds_moved(case)
    try:
        decision, _ = step(case.observation, config=case.config, history=case.history, now=case.now)
    except Exception as exc:
        return Outcome("exception", detail=f"{type(exc).__name__}: {exc}"[:200], bounds_moved=moved)
    oob = not in_bounds(case.config, decision.prefill, decision.decode)
    detail = f"{decision.prefill}P{decision.decode}D: {decision.explanation[:200]}" if oob else ""
    if decision.held:
        return Outcome("hold", hold_reason(decision.explanation), oob, detail, moved)
    return Outcome("decision", out_of_bounds=oob, detail=detail, bounds_moved=moved)


def summarise(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    kinds = collections.Counter(o.kind for o in outcomes)
    return {
        "cases": len(outcomes),
        "bounds_moved_under_fleet": sum(o.bounds_moved for o in outcomes),
        "decisions": kinds["decision"],
        "holds": kinds["hold"],
        "holds_by_reason": dict(collections.Counter(o.reason for o in outcomes if o.kind == "hold").most_common()),
        "exceptions": kinds["exception"],
        "out_of_bounds": sum(o.out_of_bounds for o in outcomes),
        "examples": [o.detail for o in outcomes if o.detail][:20],
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/planner_fuzz.json"))
    args = ap.parse_args(argv)
    start = time.monotonic()
    outcomes = [run_case(c) for c in generate(args.count, args.seed)]
    summary = {"seed": args.seed, **summarise(outcomes, time.monotonic() - start)}
    rows = [("cases", summary["cases"]),
            ("  of which a max or budget below the fleet", summary["bounds_moved_under_fleet"]),
            ("decisions", summary["decisions"]),
            ("holds", summary["holds"]),
            *((f"  hold: {k}", v) for k, v in summary["holds_by_reason"].items()),
            ("exceptions", summary["exceptions"]), ("out of bounds", summary["out_of_bounds"])]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v:>7}")
    print(f"({summary['seconds']} s, seed {args.seed})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 1 if summary["exceptions"] or summary["out_of_bounds"] else 0


if __name__ == "__main__":
    sys.exit(main())
