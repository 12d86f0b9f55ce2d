"""The closed loop with a real benchmark client: aiperf drives simulated engines (whose timing
is the planner's model of a known profile) through the real sglang-router in PD mode, and
``pdscale profile fit`` on aiperf's own output plans like the truth.

aiperf runs from its own venv (bench/aiperf/setup_venv.sh, built by ``make test``; or
``PDSCALE_AIPERF``), see closed_loop_aiperf.py.
Takes about 7 minutes on two cores. What it checks is what planning uses: the decode batch at
the TPOT target at each measured context and the prefill time of the longest prompt, within
10%. Every term is not: through the router the TTFT carries tens of ms that are not prefill
compute, and the fit puts them in ``overhead_seconds`` (docs/profiles.md, "Closed loop")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from closed_loop_aiperf import AIPERF, AIPERF_ENV, assert_plans_like_truth, needs_aiperf, pd_fleet

from pdscale.planner.profile import load_profile
from pdscale.planner.profile_fit import fit_profile, read_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), needs_aiperf]

PREFILL_LENGTHS = (100, 1000, 2000, 3000, 4000)  # past L, as a fit of the curvature needs
DECODE_RUNS = [(c, isl) for isl in (100, 1500) for c in (2, 8, 24)]


def aiperf(url: str, tokenizer: Path, out: Path, *, concurrency: int, isl: int, osl: int,
           requests: int) -> Path:
    cmd = [str(AIPERF), "profile", "--url", url, "--endpoint-type", "completions", "--streaming",
           "--model", "sim-model", "--tokenizer", str(tokenizer), "--isl", str(isl),
           "--isl-stddev", "0", "--osl", str(osl), "--concurrency", str(concurrency),
           "--request-count", str(requests), "--random-seed", "1", "--ui-type", "none",
           "--extra-inputs", "ignore_eos:true", "--artifact-dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=AIPERF_ENV)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out / "profile_export.jsonl"


def test_a_profile_fitted_from_aiperf_through_the_router_plans_like_the_truth(tmp_path):
    files = []
    with pd_fleet(tmp_path) as fleet:
        for isl in PREFILL_LENGTHS:
            files.append(aiperf(fleet.url, fleet.tokenizer, tmp_path / f"c1-isl{isl}",
                                concurrency=1, isl=isl, osl=8, requests=6))
        for c, isl in DECODE_RUNS:
            files.append(aiperf(fleet.url, fleet.tokenizer, tmp_path / f"c{c}-isl{isl}",
                                concurrency=c, isl=isl, osl=64, requests=3 * c))

    truth = load_profile(fleet.truth)
    benchmarks = [read_benchmark(f) for f in files]
    # every request of aiperf's own files is read: the prompts sent alone are prefill points
    assert sum(len(b.prefill) for b in benchmarks) >= 6 * len(PREFILL_LENGTHS)
    fitted = fit_profile(benchmarks, truth, name="fitted", fitted_at="-").profile
    assert_plans_like_truth(truth, fitted, input_lengths=(100, 1500), output_tokens=64,
                            longest=max(PREFILL_LENGTHS))
