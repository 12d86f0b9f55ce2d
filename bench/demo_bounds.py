"""What the demo's recorded load allows: the planner as run, the oracles, and a user's hedges.

A live demo run is one draw of the random router at one phase of the planner's ticks. This
replays its recording (``pdscale demo --out DIR`` wrote DIR/trace.jsonl, pdcluster.yaml and
demo.json) at ``--tick-phases`` phases of the interval times ``--draws`` router draws, at the
live run's join delay, for:

- ``as run``: the PDCluster applied, under pdscale, ``oracle`` (knows the load ahead) and
  ``oracle:now`` (knows each interval's load once it ends, nothing ahead: the bound of a
  planner that only measures);
- ``--floor P3``, ``D6``, ``P5D6``: the same PDCluster with ``minReplicas`` raised (and the
  starting replicas to the floor), the hedge a user states for a shape they expect and the
  planner has not seen;
- ``--start P2D6``: the same PDCluster starting from other replicas (a cold start sized for
  the opening load);
- ``--static 5P6D``: a fixed fleet.

Prints one row per variant (attainment mean, min and max over the replays, per phase, and
GPU-hours as a ratio to pdscale as run) and writes the rows as JSON.

    .venv/bin/python bench/demo_bounds.py DIR [--floor P3 --floor D6 ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from pdscale.testbed import demo_replay
from pdscale.testbed.demo import phase_clock, recorded_result, recorded_timing

DEFAULT_FLOORS = ("P3", "D6", "P5D6")
DEFAULT_STARTS = ("P2D6",)
DEFAULT_STATICS = ("5P6D",)


def parse_counts(text: str) -> dict[str, int]:
    """``P3``, ``D6`` or ``P5D6`` as {role: count}; either role may be left out."""
    m = re.fullmatch(r"(?:P(\d+))?(?:D(\d+))?", text.strip().upper())
    if not m or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"expected counts such as P3, D6 or P5D6, got {text!r}")
    return {role: int(n) for role, n in zip(("prefill", "decode"), m.groups(), strict=True) if n is not None}


def with_floor(body: dict[str, Any], floors: dict[str, int]) -> dict[str, Any]:
    """The PDCluster ``body`` with each role's ``minReplicas`` raised to ``floors`` (never
    lowered) and its starting ``replicas`` to at least that; the maxima stand."""
    out = copy.deepcopy(body)
    for role, n in floors.items():
        spec = out["spec"].setdefault(role, {})
        spec["minReplicas"] = max(int(spec.get("minReplicas", 1)), n)
        spec["replicas"] = max(int(spec.get("replicas", 1)), spec["minReplicas"])
    return out


def with_start(body: dict[str, Any], start: dict[str, int]) -> dict[str, Any]:
    """The PDCluster ``body`` starting from ``start`` replicas (its floors stand)."""
    out = copy.deepcopy(body)
    for role, n in start.items():
        out["spec"].setdefault(role, {})["replicas"] = n
    return out


def summarise(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's row from its replays (each {"met", "gpu_hours", "by_phase"})."""
    met = [r["met"] for r in runs]
    phases = runs[0]["by_phase"].keys()
    return {"variant": name, "replays": len(runs), "met_mean": statistics.mean(met),
            "met_min": min(met), "met_max": max(met),
            "met_by_phase": {p: statistics.mean(r["by_phase"][p] or 0.0 for r in runs)
                             for p in phases},
            "gpu_hours": statistics.mean(r["gpu_hours"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path, help="a finished demo's --out directory")
    ap.add_argument("--floor", action="append", type=parse_counts)
    ap.add_argument("--start", action="append", type=parse_counts)
    ap.add_argument("--static", action="append")
    ap.add_argument("--tick-phases", type=int, default=4)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("out/demo_bounds.json"))
    args = ap.parse_args()

    rec: Path = args.recording
    body = yaml.safe_load((rec / demo_replay.PDCLUSTER_FILE).read_text())
    live = recorded_result(rec)
    interval, timing = recorded_timing(live, rec)
    phase_at = phase_clock(live.phases)
    tmp = Path(tempfile.mkdtemp(prefix="demo-bounds-"))

    def replays(name: str, variant: dict[str, Any], policy: str) -> dict[str, Any]:
        path = tmp / f"{name.replace(' ', '_').replace(',', '')}.yaml"
        path.write_text(yaml.safe_dump(variant))
        runs = []
        for k in range(args.tick_phases):
            at = replace(timing, tick_phase_seconds=k * interval / args.tick_phases)
            by_draw = demo_replay.router_draw_replays(
                path, rec / demo_replay.TRACE_FILE, at, seeds=range(1, args.draws + 1),
                policy=policy)
            runs += [{"met": r["slo_attainment"], "gpu_hours": r["gpu_hours"],
                      "by_phase": demo_replay.interval_attainment_by_phase(
                          r["per_interval"], interval, phase_at)} for r in by_draw.values()]
        row = summarise(name, runs)
        print(f"  {name}: {row['met_mean']:.1%}", flush=True)
        return row

    print(f"replaying {rec} at {args.tick_phases} tick phases x {args.draws} router draws "
          f"(join delay {timing.join_delay_seconds:.1f} s, as live)", flush=True)
    rows = [replays(f"{p} as run", body, p) for p in ("pdscale", "oracle", "oracle:now")]
    for floors in args.floor or [parse_counts(f) for f in DEFAULT_FLOORS]:
        label = "".join(f"{r[0].upper()}{n}" for r, n in floors.items())
        rows.append(replays(f"pdscale, floor {label}", with_floor(body, floors), "pdscale"))
    for start in args.start or [parse_counts(s) for s in DEFAULT_STARTS]:
        label = "".join(f"{r[0].upper()}{n}" for r, n in start.items())
        rows.append(replays(f"pdscale, start {label}", with_start(body, start), "pdscale"))
    for fleet in args.static or list(DEFAULT_STATICS):
        rows.append(replays(f"fixed {fleet}", body, f"static:{fleet}"))

    base = rows[0]["gpu_hours"]
    phases = list(rows[0]["met_by_phase"])
    head = f"{'variant':28} {'met':>6} {'min':>6} {'max':>6} " + " ".join(
        f"{p[:10]:>10}" for p in phases) + f" {'GPU-h':>6} {'x as run':>8}"
    print(head)
    for row in rows:
        print(f"{row['variant']:28} {row['met_mean']:6.1%} {row['met_min']:6.1%} "
              f"{row['met_max']:6.1%} " + " ".join(
                  f"{row['met_by_phase'][p]:10.1%}" for p in phases)
              + f" {row['gpu_hours']:6.2f} {row['gpu_hours'] / base:8.2f}")
    for row in rows:
        row["gpu_hours_vs_as_run"] = row["gpu_hours"] / base
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"recording": str(rec), "tick_phases": args.tick_phases,
                                    "draws": args.draws,
                                    "join_delay_seconds": timing.join_delay_seconds,
                                    "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
