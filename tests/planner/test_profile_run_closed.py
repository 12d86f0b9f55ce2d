"""``pdscale profile run`` end to end with a real aiperf: it sweeps simulated engines (the
planner's model of a known profile) behind the real sglang-router in PD mode, stops its grids
by the coverage rule, and the profile it fits plans like the truth (the checks of
test_profile_fit_closed.py); the ConfigMap it writes is one the operator accepts, with its
provenance in what status.planner.profile shows.

aiperf 0.13 from its own venv, as test_profile_fit_closed.py.
About 8 minutes on two cores."""

from __future__ import annotations

import time

import pytest
import yaml
from closed_loop_aiperf import AIPERF, assert_plans_like_truth, needs_aiperf, pd_fleet

from pdscale.main import main
from pdscale.operator.api.pdcluster import ProfileConfigMapRef
from pdscale.operator.loop.profile_source import configmap_source, profile_from_configmap
from pdscale.operator.reconciler.status import profile_status
from pdscale.planner.profile import load_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), needs_aiperf]

#: past the TTFT target's length: the truth takes 1.72 s for 4000 tokens, 80% of a 2 s target
#: is 1.6 s, so the row stops there and 6000 is never sent
PREFILL_LENGTHS = "100,1000,2000,3000,4000,6000"
DECODE_CONTEXTS = (100, 1500)
OUTPUT_TOKENS = 64


def test_profile_run_sweeps_the_router_stops_when_covered_and_plans_like_the_truth(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub request leaves the machine
    out = tmp_path / "fitted.yaml"
    began = time.monotonic()
    with pd_fleet(tmp_path) as fleet:
        code = main(["profile", "run", "--url", fleet.url, "--model", "sim-model",
                     "--tokenizer", str(fleet.tokenizer), "--aiperf", str(AIPERF),
                     "--base", str(fleet.truth), "--slo-ttft", "2", "--slo-tpot", "0.1",
                     "--prefill-lengths", PREFILL_LENGTHS, "--prefill-requests", "6",
                     "--decode-contexts", ",".join(map(str, DECODE_CONTEXTS)),
                     "--decode-concurrencies", "2,8,24,48",
                     "--decode-output-tokens", str(OUTPUT_TOKENS),
                     "--decode-requests-per-client", "3", "-o", str(out),
                     "--configmap", "sim-profile", "--namespace", "team-a"])
    seconds = time.monotonic() - began
    captured = capsys.readouterr()
    print(captured.err)  # the progress, for the record (pytest -s)
    assert code == 0, captured.err[-3000:]

    fitted, truth = load_profile(out), load_profile(fleet.truth)
    sweep = fitted.provenance["sweep"]
    print(f"profile run: {seconds:.0f} s, {len(sweep['runs'])} runs; early stops "
          f"{sweep['early_stop']}; prefill {fitted.prefill}; decode {fitted.decode}")
    assert fitted.provenance["fitted_by"] == "pdscale profile run"
    assert all(r["status"] == "done" for r in sweep["runs"])
    assert "prefill-isl6000-c1" not in {r["name"] for r in sweep["runs"]}
    assert any(s.startswith("prefill:") for s in sweep["early_stop"]), sweep["early_stop"]
    for r in sweep["runs"]:  # every run's aiperf artifacts are kept
        assert list((tmp_path / "fitted-runs").glob(f"*-{r['name']}/profile_export.jsonl"))
    assert_plans_like_truth(truth, fitted, input_lengths=DECODE_CONTEXTS,
                            output_tokens=OUTPUT_TOKENS, longest=4000)

    manifest = yaml.safe_load((tmp_path / "fitted-configmap.yaml").read_text())
    ref = ProfileConfigMapRef(name="sim-profile")
    from_configmap = profile_from_configmap(manifest, ref, "team-a")
    assert from_configmap == fitted
    status = profile_status(from_configmap, configmap_source(ref, "1"), None)
    assert status["source"] == "ConfigMap sim-profile@1"
    assert status["provenance"]["fittedBy"] == "pdscale profile run"
    assert status["provenance"]["tools"] == ["aiperf"]
    assert status["provenance"]["points"]["prefill"] >= 6 * 5
