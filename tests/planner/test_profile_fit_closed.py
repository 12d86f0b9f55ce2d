"""The closed loop with a real benchmark client: aiperf drives simulated engines (whose timing
is the planner's model of a known profile) through the real sglang-router in PD mode, and
``pdscale profile fit`` on aiperf's own output plans like the truth.

Opt-in: aiperf is not a dependency of pdscale (it brings ~1 GB); set ``PDSCALE_AIPERF`` to an
``aiperf`` executable (for example from ``python -m venv V && V/bin/pip install aiperf==0.13.0``).
Takes about 7 minutes on two cores. What it checks is what planning uses: the decode batch at
the TPOT target at each measured context and the prefill time of the longest prompt, within
10%. Every term is not: through the router the TTFT carries tens of ms that are not prefill
compute, and the fit puts them in ``overhead_seconds`` (docs/profiles.md, "Closed loop")."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile
from pdscale.planner.profile_fit import fit_profile, read_benchmark

AIPERF = os.environ.get("PDSCALE_AIPERF")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500),
              pytest.mark.skipif(not AIPERF, reason="set PDSCALE_AIPERF to an aiperf executable")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loop"))  # the loop tests' harness

TRUTH_YAML = """\
name: closed-truth
gpus_per_instance: 8
prefill: {tokens_per_second: 4000, attention_doubling_tokens: 3000, overhead_seconds: 0.05,
          prefix_cache_tokens: 1000, block_tokens: 16}
decode: {step_seconds: 0.02, per_sequence_seconds: 0.002, per_context_token_seconds: 0.000002,
         kv_capacity_tokens: 1000000, max_batch: 256}
kv_transfer: {bytes_per_token: 1, gigabytes_per_second: 100, setup_seconds: 0.0}
warmup: {new_node_seconds: 1, role_switch_seconds: 1}
"""
PREFILL_LENGTHS = (100, 1000, 2000, 3000, 4000)  # past L, as a fit of the curvature needs
DECODE_RUNS = [(c, isl) for isl in (100, 1500) for c in (2, 8, 24)]
TPOT_TARGET_SECONDS = 0.1


def aiperf(url: str, tokenizer: Path, out: Path, *, concurrency: int, isl: int, osl: int,
           requests: int) -> Path:
    cmd = [str(AIPERF), "profile", "--url", url, "--endpoint-type", "completions", "--streaming",
           "--model", "sim-model", "--tokenizer", str(tokenizer), "--isl", str(isl),
           "--isl-stddev", "0", "--osl", str(osl), "--concurrency", str(concurrency),
           "--request-count", str(requests), "--random-seed", "1", "--ui-type", "none",
           "--extra-inputs", "ignore_eos:true", "--artifact-dir", str(out)]
    # without HF_HUB_OFFLINE: aiperf 0.13 then treats a local path as a hub name; the closed
    # HF_ENDPOINT keeps any hub request on this machine
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                            env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out / "profile_export.jsonl"


def test_a_profile_fitted_from_aiperf_through_the_router_plans_like_the_truth(tmp_path):
    from loop_harness import Fleet

    truth_path = tmp_path / "truth.yaml"
    truth_path.write_text(TRUTH_YAML)
    fleet = Fleet(tmp_path, f"127.{random.randint(100, 250)}.{random.randint(1, 250)}")
    # the model's own timing; blocks too large to fill keep the prefix cache out of reach (the
    # word tokenizer makes every prompt the same words)
    engine = ("--profile", str(truth_path), "--block-tokens", "1000000",
              "--max-total-tokens", "100000000")
    files = []
    try:
        prefill = [fleet.start_engine("prefill", *engine) for _ in range(2)]
        decode = fleet.start_engine("decode", *engine)
        url = fleet.start_router(prefill, [decode], "--shutdown-grace-period-secs", "1")
        tokenizer = tmp_path / "sim-model"  # the engines' word-level tokenizer.json
        (tokenizer / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}))
        for isl in PREFILL_LENGTHS:
            files.append(aiperf(url, tokenizer, tmp_path / f"c1-isl{isl}", concurrency=1,
                                isl=isl, osl=8, requests=6))
        for c, isl in DECODE_RUNS:
            files.append(aiperf(url, tokenizer, tmp_path / f"c{c}-isl{isl}", concurrency=c,
                                isl=isl, osl=64, requests=3 * c))
    finally:
        fleet.close()

    truth = load_profile(truth_path)
    benchmarks = [read_benchmark(f) for f in files]
    # every request of aiperf's own files is read: the prompts sent alone are prefill points
    assert sum(len(b.prefill) for b in benchmarks) >= 6 * len(PREFILL_LENGTHS)
    fitted = fit_profile(benchmarks, truth, name="fitted", fitted_at="-").profile
    t, f = PerformanceModel(truth), PerformanceModel(fitted)
    fitted_terms = {k: getattr(fitted.decode if k in type(fitted.decode).model_fields else fitted.prefill, k)
              for k in ("tokens_per_second", "attention_doubling_tokens", "overhead_seconds",
                        "step_seconds", "per_sequence_seconds", "per_context_token_seconds")}
    for isl in (100, 1500):
        context = isl + 64 / 2
        want = t.decode_batch_at_slo(TPOT_TARGET_SECONDS, context)
        got = f.decode_batch_at_slo(TPOT_TARGET_SECONDS, context)
        assert abs(got - want) <= 0.1 * want, (context, got, want, fitted_terms)
    longest = max(PREFILL_LENGTHS)
    assert f.prefill_seconds(longest) == pytest.approx(t.prefill_seconds(longest), rel=0.10), fitted_terms
