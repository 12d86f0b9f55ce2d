"""The planner with a fitted profile against the same planner with the true one.

A user does not have the true profile: they run a benchmark against their engines and fit
one with ``pdscale profile fit``. This bench asks what that costs. The fleet runs the true
profile (the one ``bench/policy_bench.py`` plans with, ``deepseek-fp8-8xh200-sglang``); the
benchmark points are made from it as a user would get them (``pdscale/testbed/
profile_sweep.py``: each tool's own file, seeded lognormal noise, ``--noise``), fitted by the
command's own code (``read_benchmark`` then ``fit_profile``), and each trace is replayed with
the planner on the true profile and on each fit, side by side in one run:

- ``dynamo-npz``: Dynamo's SLA profiler arrays on the profiler's own grids (prefill to the
  PDCluster's ``maxContextLengthTokens``, decode concurrency to the engine's batch cap);
- ``aiperf``: aiperf ``profile_export.jsonl`` records through a PD router (the KV hand-off in
  every TTFT, taken off by the fit): prompts one at a time at 500-100k tokens, then closed
  loops at concurrency 8-192 at three contexts, 8 prefill instances before one decode;
- ``sparse``: a Dynamo sweep that stops short of the SLO region (prompts to 4k tokens,
  decode concurrency to 16): what the coverage warning is for; not held to the targets;
- ``true, compute +-1%``: the true profile with every compute term 1% off, for scale (the
  planner's instance counts are integers: a small error can move a count);
- ``knee: ...`` (unless ``--no-knee``): a fleet whose prefill takes ``KNEE_FACTOR`` x the
  model's time for prompts past ``KNEE_TOKENS``, a form the parametric model cannot follow:
  the planner given that very form (a model no profile YAML can hold), a fit of its full
  Dynamo sweep (the residual warning fires) and of its sparse one (it cannot: the points
  never reach the knee; only the coverage warning does). The knee rows' deltas are against
  the planner given the form, which is no bound: the planner prices the load's mean prompt,
  and on Mooncake the mean lies below the knee.

The fit's base (the fields the points do not determine) is the true profile with every fitted
term replaced by ``demo-sim``'s, far from the truth: a term kept from the base shows as an
error instead of hiding as the truth. Targets (the issue's, printed under the table, stored
under ``targets``): GPU-hours within 5% and attainment within 0.5 pp of the planner on the
true profile, for the dynamo-npz and aiperf fits.

The replay is ``policy_bench``'s default: its PDCluster's configuration, the deployed stack,
each trace's TTFT target. Writes out/profile_error_bench.json (or ``--out``) and the
benchmark files it fitted under out/profile_error_bench/ (re-fit them by hand with
``pdscale profile fit FILE --base BASE.yaml``). Progress on stderr.

    .venv/bin/python bench/profile_error_bench.py [--only mooncake,azure,servegen] [--no-knee]
        [--noise 0.03] [--seed 1] [--minutes 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import Profile, scaled_profile, shipped_profile
from pdscale.planner.profile_fit import Benchmark, fit_profile, read_benchmark
from pdscale.planner.replay.run import STACKS, ReplaySetup, run_policy
from pdscale.planner.replay.traces import load_trace
from pdscale.replay import configure, read_spec
from pdscale.replay_setup import router_admission
from pdscale.testbed.profile_sweep import (
    closed_loop_records,
    dynamo_profiler_arrays,
    write_aiperf_jsonl,
)

sys.path.insert(0, str(Path(__file__).parent))  # PYTHONSAFEPATH keeps the script's folder off
from model_error_bench import first_minutes
from policy_bench import OUT, PDCLUSTER, cases, trimmed

#: the issue's targets for a fit of a full sweep
GPU_HOURS_TOLERANCE = 0.05
ATTAINMENT_TOLERANCE_PP = 0.5
#: the fitted terms (the rest of a fitted profile is the base's)
FITTED = {"prefill": ("tokens_per_second", "attention_doubling_tokens", "overhead_seconds"),
          "decode": ("step_seconds", "per_sequence_seconds", "per_context_token_seconds")}
#: the aiperf sweep: prompts alone (3 each), then (concurrency, input tokens) closed loops
AIPERF_PROMPTS = (500, 2_000, 8_000, 16_000, 32_000, 64_000, 100_000)
AIPERF_RUNS = [(k, isl) for isl in (1_000, 4_000, 12_000) for k in (8, 32, 64, 128, 192)]
AIPERF_OUTPUT_TOKENS = 256
AIPERF_PREFILL_INSTANCES = 8
#: the sparse sweep: Dynamo's profiler run with a short context and an early stop
SPARSE_CONTEXT, SPARSE_CONCURRENCY = 4_096, 16
#: the knee: past this many prompt tokens, prefill takes this factor times the model's time
KNEE_TOKENS, KNEE_FACTOR = 16_384, 2.0


@dataclass(frozen=True)
class KneePrefillModel(PerformanceModel):
    """A fleet whose prefill steps up: ``KNEE_FACTOR`` x the profile's time for a prompt (or a
    chunk ending) past ``KNEE_TOKENS`` tokens: a kernel or memory regime the parametric form
    ``overhead + (n + n^2/2L)/R`` has no term for."""

    knee_tokens: float = KNEE_TOKENS
    knee_factor: float = KNEE_FACTOR

    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        base = super().prefill_seconds(input_tokens, cached_tokens)
        return base * (self.knee_factor if input_tokens > self.knee_tokens else 1.0)


def far_base(truth: Profile) -> Profile:
    """``truth`` with every fitted term replaced by demo-sim's (100x slower prefill, flat;
    decode 20 ms per sequence): a term the points leave to the base shows as wrong."""
    demo = shipped_profile("demo-sim")
    update: dict[str, Any] = {
        role: getattr(truth, role).model_copy(update={t: getattr(getattr(demo, role), t) for t in terms})
        for role, terms in FITTED.items()}
    return truth.model_copy(update={**update, "name": "truth-with-demo-sim-terms"})


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_sweeps(truth: PerformanceModel, knee: PerformanceModel | None, folder: Path, *,
                 max_context: int, noise: float, seed: int) -> dict[str, list[Path]]:
    """Each sweep's benchmark files, as their tools write them."""
    folder.mkdir(parents=True, exist_ok=True)

    def npz(name: str, arrays: dict[str, np.ndarray]) -> list[Path]:
        path = folder / f"{name}.npz"
        np.savez(path, **arrays)  # type: ignore[arg-type]
        return [path]

    files = {"dynamo-npz": npz("dynamo-npz", dynamo_profiler_arrays(
                 truth, max_context_length=max_context, noise=noise, seed=seed)),
             "sparse": npz("sparse", dynamo_profiler_arrays(
                 truth, max_context_length=SPARSE_CONTEXT, max_concurrency=SPARSE_CONCURRENCY,
                 noise=noise, seed=seed))}
    rng = np.random.default_rng(seed)
    records, t0 = [], 1_000.0
    runs = [(1, isl, 3) for isl in AIPERF_PROMPTS] + [(k, isl, 2) for k, isl in AIPERF_RUNS]
    for k, isl, per_client in runs:
        run = closed_loop_records(truth, concurrency=k, input_tokens=isl,
                                  output_tokens=AIPERF_OUTPUT_TOKENS, requests_per_client=per_client,
                                  t0=t0, prefill_instances=AIPERF_PREFILL_INSTANCES, noise=noise,
                                  rng=rng)
        records += run
        t0 = max(r.start_seconds + r.latency_seconds for r in run if r.start_seconds is not None) + 5.0
    files["aiperf"] = [write_aiperf_jsonl(folder / "aiperf_profile_export.jsonl", records)]
    if knee is not None:
        files["knee: dynamo-npz"] = npz("knee-dynamo-npz", dynamo_profiler_arrays(
            knee, max_context_length=max_context, noise=noise, seed=seed))
        files["knee: sparse"] = npz("knee-sparse", dynamo_profiler_arrays(
            knee, max_context_length=SPARSE_CONTEXT, max_concurrency=SPARSE_CONCURRENCY,
            noise=noise, seed=seed))
    return files


def fit(files: list[Path], base: Profile, slo: Slo, name: str) -> dict[str, Any]:
    """What ``pdscale profile fit FILES --base BASE`` does: read each file, fit, warn."""
    benchmarks: list[Benchmark] = [read_benchmark(p, None) for p in files]
    result = fit_profile(benchmarks, base, name=name, fitted_at="bench", slo=slo,
                         base_name=base.name)
    prov = result.document["provenance"]
    return {"profile": result.profile, "warnings": list(result.warnings),
            "residuals": prov["residuals"], "terms": prov["terms"]}


def term_errors(fitted: Profile, truth: Profile) -> dict[str, float | None]:
    """Relative error of each fitted term against the truth (None: one of them is flat)."""
    out: dict[str, float | None] = {}
    for role, terms in FITTED.items():
        for t in terms:
            got, want = getattr(getattr(fitted, role), t), getattr(getattr(truth, role), t)
            out[f"{role}.{t}"] = None if got is None or want is None else round(got / want - 1.0, 4)
    return out


def replay(setup: ReplaySetup, label: str) -> dict[str, Any]:
    t = time.perf_counter()
    rep = trimmed(run_policy(setup, "pdscale"))
    rep.pop("decisions", None)
    log(f"    {label:>22}: attainment {rep['slo_attainment']:.4f}, {rep['gpu_hours']:.1f} GPU-h, "
        f"misses {rep['misses']} ({time.perf_counter() - t:.0f} s)")
    return rep


def run_case(name: str, args: argparse.Namespace, files: dict[str, list[Path]],
             truth: Profile, knee: PerformanceModel | None) -> dict[str, Any]:
    spec = read_spec(str(PDCLUSTER))
    c = cases()[name]
    trace = first_minutes(load_trace(c["path"], rate_scale=c["rate_scale"], time_scale=c["time_scale"],
                                     lengths_from=c.get("lengths")), args.minutes)
    overrides = {"--slo-ttft": c["ttft"]}
    known = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides=overrides, profile=truth)
    slo = known.config.slo
    setup = ReplaySetup(trace=trace, planner=known.config, **STACKS["deployed"],
                        prefill_admission=router_admission(known.spec))
    log(f"{name}: {trace.name}, {len(trace):,} requests over {trace.duration_seconds / 3600:.2f} h, "
        f"TTFT SLO {c['ttft']} s")
    base = far_base(truth)
    true_fleet = PerformanceModel(truth)
    rows: dict[str, Any] = {"true": {"fleet": "true", "report": replay(setup, "true profile")}}
    # what a 1% error of every compute term does, for scale: the planner's counts are integers
    for label, speed in (("true, compute +1%", 1 / 1.01), ("true, compute -1%", 1 / 0.99)):
        off = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides=overrides,
                        profile=scaled_profile(truth, prefill_speed=speed, decode_speed=speed)).config
        rows[label] = {"fleet": "true", "report": replay(replace(setup, planner=off, fleet_model=true_fleet),
                                                         label)}
    if knee is not None:
        # the fleet steps up; the closest belief is that very form (no profile YAML holds it)
        knows = replace(setup, planner=replace(setup.planner, model=knee))
        rows["knee: knows the form"] = {"fleet": "knee", "report": replay(knows, "knee: knows the form")}
    for sweep, paths in files.items():
        fitted = fit(paths, base, slo, f"fitted-{sweep.replace(': ', '-')}")
        planned = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides=overrides,
                            profile=fitted["profile"]).config
        on_knee = sweep.startswith("knee")
        label = f"knee: fitted ({sweep.removeprefix('knee: ')})" if on_knee else f"fitted ({sweep})"
        rows[label] = {
            "fleet": "knee" if on_knee else "true", "files": [str(p) for p in paths],
            "warnings": fitted["warnings"], "residuals": fitted["residuals"],
            "term_errors": None if on_knee else term_errors(fitted["profile"], truth),
            "report": replay(replace(setup, planner=planned, fleet_model=knee if on_knee else true_fleet),
                             label)}
    return {"trace": trace.name, "requests": len(trace), "minutes": args.minutes,
            "ttft_slo_seconds": c["ttft"], "rows": rows}


def reference(rows: dict[str, Any], label: str) -> dict[str, Any]:
    """The row a fitted row is compared with: the planner that knows the fleet's form."""
    report: dict[str, Any] = rows["knee: knows the form" if label.startswith("knee") else "true"]["report"]
    return report


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for case, r in results.items():
        for label in ("fitted (dynamo-npz)", "fitted (aiperf)"):
            if label not in r["rows"]:
                continue
            rep, ref = r["rows"][label]["report"], r["rows"]["true"]["report"]
            ratio = rep["gpu_hours"] / ref["gpu_hours"]
            delta = 100.0 * (rep["slo_attainment"] - ref["slo_attainment"])
            out.append({"case": case, "row": label,
                        "target": f"GPU-hours within {GPU_HOURS_TOLERANCE:.0%} of the true profile's",
                        "value": f"{ratio:.3f}x", "met": abs(ratio - 1.0) < GPU_HOURS_TOLERANCE})
            out.append({"case": case, "row": label,
                        "target": f"attainment within {ATTAINMENT_TOLERANCE_PP} pp of the true profile's",
                        "value": f"{delta:+.2f} pp", "met": abs(delta) < ATTAINMENT_TOLERANCE_PP})
    return out


def print_table(results: dict[str, Any], console: Console, title: str) -> None:
    table = Table(title=title)
    for col in ("case", "planner profile", "fleet", "attain.", "Δ pp", "GPU-h", "ratio",
                "resid. rms/max P", "resid. rms/max D", "warn."):
        table.add_column(col, justify="right")
    for case, r in results.items():
        for label, row in r["rows"].items():
            rep = row["report"]
            ref = reference(r["rows"], label)
            res = row.get("residuals") or {}

            def pct(role: str, res: dict[str, Any] = res) -> str:
                x = res.get(role)
                return "-" if not x else f"{100 * x['rms_relative']:.1f}/{100 * x['max_relative']:.0f}%"

            table.add_row(case, label, row["fleet"], f"{rep['slo_attainment']:.4f}",
                          f"{100 * (rep['slo_attainment'] - ref['slo_attainment']):+.2f}",
                          f"{rep['gpu_hours']:.1f}", f"{rep['gpu_hours'] / ref['gpu_hours']:.3f}x",
                          pct("prefill_compute"), pct("decode_itl"),
                          str(len(row.get("warnings", []))))
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="mooncake,azure,servegen", help="policy_bench cases")
    ap.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of each measurement")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-knee", dest="knee", action="store_false",
                    help="leave out the fleet whose prefill steps up past KNEE_TOKENS")
    ap.add_argument("--minutes", type=float, default=None, help="replay only the first N minutes")
    ap.add_argument("--out", default=str(OUT / "profile_error_bench.json"))
    args = ap.parse_args()
    started = time.perf_counter()
    console = Console(width=170)
    truth = shipped_profile(read_spec(str(PDCLUSTER)).planner.profile)
    knee = KneePrefillModel(truth) if args.knee else None
    max_context = read_spec(str(PDCLUSTER)).model.max_context_length_tokens
    folder = Path(args.out).with_suffix("")
    files = write_sweeps(PerformanceModel(truth), knee, folder, max_context=max_context,
                         noise=args.noise, seed=args.seed)
    (folder / "base.yaml").write_text(yaml.safe_dump(far_base(truth).model_dump(mode="json"),
                                                     sort_keys=False))
    log(f"benchmark files under {folder}: " + ", ".join(f"{k}: {len(v)}" for k, v in files.items()))
    results = {name: run_case(name, args, files, truth, knee) for name in args.only.split(",")}
    wall = time.perf_counter() - started
    print_table(results, console, f"fitted vs true profile, stack deployed, noise {args.noise:g} "
                f"(seed {args.seed})" + (f", first {args.minutes:g} min" if args.minutes else ""))
    for case, r in results.items():
        for label, row in r["rows"].items():
            for w in row.get("warnings", []):
                console.print(f"  {case} {label}: warning: {w}")
            if row.get("term_errors"):
                errs = ", ".join(f"{k.split('.')[1]} {v:+.1%}" if v is not None else f"{k.split('.')[1]} flat"
                                 for k, v in row["term_errors"].items())
                console.print(f"  {case} {label}: terms vs truth: {errs}")
    checks = targets(results)
    for c in checks:
        mark = "met" if c["met"] else "NOT met"
        console.print(f"  {c['case']:>9} {c['row']:<20} {c['target']:<48} {c['value']:<10} {mark}")
    console.print(f"wall {wall:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def plain(x: Any) -> Any:
        return x.model_dump(mode="json") if isinstance(x, Profile) else str(x)

    out.write_text(json.dumps({"noise": args.noise, "seed": args.seed, "wall_seconds": round(wall),
                               "results": results, "targets": checks}, indent=1, default=plain))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
