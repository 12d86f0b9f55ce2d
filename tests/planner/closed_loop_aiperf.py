"""What the closed loops with a real aiperf share (imported as ``closed_loop_aiperf``:
tests/planner is not a package): the truth profile the simulated engines run, the fleet of
two prefill and one decode engine behind the real sglang-router, the tokenizer directory aiperf
reads, and the check that a fitted profile plans like the truth.

aiperf is not a dependency of pdscale (it brings ~1 GB): it lives in a venv of its own that
``bench/aiperf/setup_venv.sh`` builds (``make test`` builds it first), found there or where
``PDSCALE_AIPERF`` points. ``make test`` sets PDSCALE_REQUIRE_AIPERF=1: then a missing aiperf
fails these tests; a bare ``pytest`` without one skips them, saying so."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import Profile
from pdscale.testbed.localcluster import CACHE_ROOT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loop"))  # the loop tests' harness

from fake_aiperf import TRUTH_YAML

#: where bench/aiperf/setup_venv.sh puts aiperf by default
VENV_AIPERF = CACHE_ROOT / "aiperf-venv" / "bin" / "aiperf"
AIPERF = os.environ.get("PDSCALE_AIPERF") or (str(VENV_AIPERF) if VENV_AIPERF.is_file() else None)
#: make test: a missing aiperf is a failure, not a skip
AIPERF_REQUIRED = os.environ.get("PDSCALE_REQUIRE_AIPERF") == "1"
needs_aiperf = pytest.mark.skipif(
    not AIPERF and not AIPERF_REQUIRED,
    reason="no aiperf: run bench/aiperf/setup_venv.sh or set PDSCALE_AIPERF")


def require_aiperf() -> str:
    """The aiperf executable; under PDSCALE_REQUIRE_AIPERF=1 its absence fails the test."""
    if not AIPERF or not Path(AIPERF).is_file():
        pytest.fail(f"PDSCALE_REQUIRE_AIPERF=1 but no aiperf executable ({AIPERF!r}): run "
                    "bench/aiperf/setup_venv.sh or set PDSCALE_AIPERF")
    return AIPERF

TPOT_TARGET_SECONDS = 0.1
#: aiperf's environment: without HF_HUB_OFFLINE (aiperf 0.13 then treats a local path as a hub
#: name); the closed HF_ENDPOINT keeps any hub request on this machine
AIPERF_ENV = {**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"},
              "HF_ENDPOINT": "http://127.0.0.1:9"}


@dataclass(frozen=True)
class PDFleet:
    url: str
    #: the engines' word-level tokenizer.json, with the config aiperf needs to load it
    tokenizer: Path
    truth: Path


@contextmanager
def pd_fleet(tmp_path: Path) -> Iterator[PDFleet]:
    """Two simulated prefill engines and one decode engine running the truth profile's own
    timing, behind the real sglang-router in PD mode; torn down on exit."""
    from loop_harness import Fleet

    require_aiperf()

    truth_path = tmp_path / "truth.yaml"
    truth_path.write_text(TRUTH_YAML)
    fleet = Fleet(tmp_path, f"127.{random.randint(100, 250)}.{random.randint(1, 250)}")
    # the model's own timing; blocks too large to fill keep the prefix cache out of reach (the
    # word tokenizer makes every prompt the same words)
    engine = ("--profile", str(truth_path), "--block-tokens", "1000000",
              "--max-total-tokens", "100000000")
    try:
        prefill = [fleet.start_engine("prefill", *engine) for _ in range(2)]
        decode = fleet.start_engine("decode", *engine)
        url = fleet.start_router(prefill, [decode], "--shutdown-grace-period-secs", "1")
        tokenizer = tmp_path / "sim-model"  # the engines' word-level tokenizer.json
        (tokenizer / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}))
        yield PDFleet(url, tokenizer, truth_path)
    finally:
        fleet.close()


def assert_plans_like_truth(truth: Profile, fitted: Profile, *, input_lengths: Sequence[int],
                            output_tokens: int, longest: int) -> None:
    """What planning uses, within 10%: the decode batch at the TPOT target at each measured
    context and the prefill time of the longest prompt."""
    t, f = PerformanceModel(truth), PerformanceModel(fitted)
    fitted_terms = {k: getattr(fitted.decode if k in type(fitted.decode).model_fields else fitted.prefill, k)
                    for k in ("tokens_per_second", "attention_doubling_tokens", "overhead_seconds",
                              "step_seconds", "per_sequence_seconds", "per_context_token_seconds")}
    for isl in input_lengths:
        context = isl + output_tokens / 2
        want = t.decode_batch_at_slo(TPOT_TARGET_SECONDS, context)
        got = f.decode_batch_at_slo(TPOT_TARGET_SECONDS, context)
        assert abs(got - want) <= 0.1 * want, (context, got, want, fitted_terms)
    assert f.prefill_seconds(longest) == pytest.approx(t.prefill_seconds(longest), rel=0.10), fitted_terms


#: the sweep's grid (test_profile_run_closed.py says why each value): the prefill row stops
#: past 4000 tokens (the truth takes 1.72 s there, 80% of the 2 s TTFT target is 1.6 s)
SWEEP_PREFILL_LENGTHS = (100, 1000, 2000, 3000, 4000, 6000)
SWEEP_PREFILL_REQUESTS = 6
SWEEP_DECODE_CONTEXTS = (100, 1500)
SWEEP_OUTPUT_TOKENS = 64


@dataclass(frozen=True)
class ProfileSweep:
    """What one ``pdscale profile run`` left: its exit code, its stderr (the progress), how
    long it took, and its files under ``workdir`` (fitted.yaml, fitted-runs/ with every run's
    aiperf artifacts, fitted-configmap.yaml); ``truth`` is the profile the engines ran."""

    code: int
    stderr: str
    seconds: float
    workdir: Path
    truth: Path

    @property
    def output(self) -> Path:
        return self.workdir / "fitted.yaml"

    @property
    def runs_dir(self) -> Path:
        return self.workdir / "fitted-runs"


def run_profile_sweep(workdir: Path) -> ProfileSweep:
    """``pdscale profile run`` against :func:`pd_fleet` (the aiperf_sweep fixture, once per
    session): prefill lengths at concurrency 1, then concurrencies 2, 8, 24, 48 per context,
    each row stopped by the coverage rule; a ConfigMap for namespace team-a."""
    import contextlib
    import io
    import time

    from pdscale.main import main

    err = io.StringIO()
    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp, pd_fleet(workdir) as fleet:
        mp.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub request leaves the machine
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([
                "profile", "run", "--url", fleet.url, "--model", "sim-model",
                "--tokenizer", str(fleet.tokenizer), "--aiperf", str(AIPERF),
                "--base", str(fleet.truth), "--slo-ttft", "2", "--slo-tpot", "0.1",
                "--prefill-lengths", ",".join(map(str, SWEEP_PREFILL_LENGTHS)),
                "--prefill-requests", str(SWEEP_PREFILL_REQUESTS),
                "--decode-contexts", ",".join(map(str, SWEEP_DECODE_CONTEXTS)),
                "--decode-concurrencies", "2,8,24,48",
                "--decode-output-tokens", str(SWEEP_OUTPUT_TOKENS),
                "--decode-requests-per-client", "3", "-o", str(workdir / "fitted.yaml"),
                "--configmap", "sim-profile", "--namespace", "team-a"])
    return ProfileSweep(code, err.getvalue(), time.monotonic() - began, workdir, fleet.truth)
