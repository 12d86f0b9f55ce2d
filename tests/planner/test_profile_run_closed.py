"""``pdscale profile run`` end to end with a real aiperf: it sweeps simulated engines (the
planner's model of a known profile) behind the real sglang-router in PD mode, stops its grids
by the coverage rule, and the profile it fits plans like the truth (the checks of
test_profile_fit_closed.py); the ConfigMap it writes is one the operator accepts, with its
provenance in what status.planner.profile shows.

aiperf 0.13 from its own venv, as test_profile_fit_closed.py. The sweep is the session's
``aiperf_sweep`` (tests/planner/conftest.py, closed_loop_aiperf.run_profile_sweep), which the
fit test reads too: about 6 minutes on two cores, once."""

from __future__ import annotations

import pytest
import yaml
from closed_loop_aiperf import (
    SWEEP_DECODE_CONTEXTS,
    SWEEP_OUTPUT_TOKENS,
    ProfileSweep,
    assert_plans_like_truth,
    needs_aiperf,
)

from pdscale.operator.api.pdcluster import ProfileConfigMapRef
from pdscale.operator.loop.profile_source import configmap_source, profile_from_configmap
from pdscale.operator.reconciler.status import profile_status
from pdscale.planner.profile import load_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), needs_aiperf]


def test_profile_run_sweeps_the_router_stops_when_covered_and_plans_like_the_truth(
        aiperf_sweep: ProfileSweep):
    # the grid (closed_loop_aiperf.SWEEP_*): prefill lengths 100,1000,2000,3000,4000,6000, past
    # the TTFT target's length: the truth takes 1.72 s for 4000 tokens, 80% of a 2 s target is
    # 1.6 s, so the row stops there and 6000 is never sent
    run = aiperf_sweep
    print(run.stderr)  # the progress, for the record (pytest -s)
    assert run.code == 0, run.stderr[-3000:]

    fitted, truth = load_profile(run.output), load_profile(run.truth)
    sweep = fitted.provenance["sweep"]
    print(f"profile run: {run.seconds:.0f} s, {len(sweep['runs'])} runs; early stops "
          f"{sweep['early_stop']}; prefill {fitted.prefill}; decode {fitted.decode}")
    assert fitted.provenance["fitted_by"] == "pdscale profile run"
    assert all(r["status"] == "done" for r in sweep["runs"])
    assert "prefill-isl6000-c1" not in {r["name"] for r in sweep["runs"]}
    assert any(s.startswith("prefill:") for s in sweep["early_stop"]), sweep["early_stop"]
    for r in sweep["runs"]:  # every run's aiperf artifacts are kept
        assert list(run.runs_dir.glob(f"*-{r['name']}/profile_export.jsonl"))
    assert_plans_like_truth(truth, fitted, input_lengths=SWEEP_DECODE_CONTEXTS,
                            output_tokens=SWEEP_OUTPUT_TOKENS, longest=4000)

    manifest = yaml.safe_load((run.workdir / "fitted-configmap.yaml").read_text())
    ref = ProfileConfigMapRef(name="sim-profile")
    from_configmap = profile_from_configmap(manifest, ref, "team-a")
    assert from_configmap == fitted
    status = profile_status(from_configmap, configmap_source(ref, "1"), None)
    assert status["source"] == "ConfigMap sim-profile@1"
    assert status["provenance"]["fittedBy"] == "pdscale profile run"
    assert status["provenance"]["tools"] == ["aiperf"]
    assert status["provenance"]["points"]["prefill"] >= 6 * 5
