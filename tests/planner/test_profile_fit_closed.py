"""The closed loop with a real benchmark client: aiperf drives simulated engines (whose timing
is the planner's model of a known profile) through the real sglang-router in PD mode, and
``pdscale profile fit`` on aiperf's own output plans like the truth.

aiperf runs from its own venv (bench/aiperf/setup_venv.sh, built by ``make test``; or
``PDSCALE_AIPERF``), see closed_loop_aiperf.py. Its runs are the session's ``aiperf_sweep``
(tests/planner/conftest.py): the ``pdscale profile run`` that test_profile_run_closed.py checks
keeps every run's ``profile_export.jsonl``, written by aiperf itself; this test reads them all
as a user's own aiperf files, apart from the sweep's fit. What it checks is what planning uses:
the decode batch at the TPOT target at each measured context and the prefill time of the
longest prompt, within 10%. Every term is not: through the router the TTFT carries tens of ms
that are not prefill compute, and the fit puts them in ``overhead_seconds`` (docs/profiles.md,
"Closed loop")."""

from __future__ import annotations

import pytest
from closed_loop_aiperf import (
    SWEEP_DECODE_CONTEXTS,
    SWEEP_OUTPUT_TOKENS,
    SWEEP_PREFILL_REQUESTS,
    ProfileSweep,
    assert_plans_like_truth,
    needs_aiperf,
)

from pdscale.planner.profile import load_profile
from pdscale.planner.profile_fit import fit_profile, read_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), needs_aiperf]

#: the prompt lengths the sweep sends alone before its prefill row stops (past L, as a fit of
#: the curvature needs)
PREFILL_LENGTHS = (100, 1000, 2000, 3000, 4000)


def test_a_profile_fitted_from_aiperf_through_the_router_plans_like_the_truth(
        aiperf_sweep: ProfileSweep):
    assert aiperf_sweep.code == 0, aiperf_sweep.stderr[-3000:]
    files = sorted(aiperf_sweep.runs_dir.glob("*/profile_export.jsonl"))
    lengths = {f"prefill-isl{n}-c1" for n in PREFILL_LENGTHS}
    assert lengths <= {f.parent.name.split("-", 1)[1] for f in files}, files
    assert any(f.parent.name.split("-", 1)[1].startswith("decode-") for f in files), files

    truth = load_profile(aiperf_sweep.truth)
    benchmarks = [read_benchmark(f) for f in files]
    # every request of aiperf's own files is read: the prompts sent alone are prefill points
    assert sum(len(b.prefill) for b in benchmarks) >= SWEEP_PREFILL_REQUESTS * len(PREFILL_LENGTHS)
    fitted = fit_profile(benchmarks, truth, name="fitted", fitted_at="-").profile
    assert_plans_like_truth(truth, fitted, input_lengths=SWEEP_DECODE_CONTEXTS,
                            output_tokens=SWEEP_OUTPUT_TOKENS, longest=max(PREFILL_LENGTHS))
