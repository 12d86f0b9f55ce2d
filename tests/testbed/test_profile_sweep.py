"""The benchmark points the profile-error bench fits are the tools' own files, on their grids:
read back by ``pdscale profile fit``'s readers, a noiseless sweep gives the truth's terms back."""

from __future__ import annotations

import numpy as np

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import shipped_profile
from pdscale.planner.profile_fit import fit_profile, read_benchmark
from pdscale.testbed.profile_sweep import (
    closed_loop_records,
    dynamo_profiler_arrays,
    write_aiperf_jsonl,
)

TRUTH = shipped_profile()
TERMS = {"prefill": ("tokens_per_second", "attention_doubling_tokens", "overhead_seconds"),
         "decode": ("step_seconds", "per_sequence_seconds", "per_context_token_seconds")}


def _errors(fitted, truth=TRUTH):  # type: ignore[no-untyped-def]
    return {f"{r}.{t}": abs(getattr(getattr(fitted, r), t) / getattr(getattr(truth, r), t) - 1)
            for r, ts in TERMS.items() for t in ts}


def test_dynamo_arrays_follow_the_profilers_grids_and_fit_back_exactly(tmp_path):
    arrays = dynamo_profiler_arrays(PerformanceModel(TRUTH), max_context_length=131_072)
    # profile_prefill.py: range(100, max_context - 512, (max_context - 612) // 16)
    assert arrays["prefill_isl"].tolist() == list(range(100, 131_072 - 512, (131_072 - 612) // 16))
    # profile_decode.py: osl 500, six input lengths, the batch within the engine's cap
    assert sorted(set(arrays["y_context_length"])) == [i + 250 for i in range(100, 130_572, 130_572 // 6)]
    batch = arrays["x_kv_usage"] * arrays["max_kv_tokens"][0] / arrays["y_context_length"]
    assert batch.max() <= TRUTH.decode.max_batch
    np.savez(tmp_path / "raw_data.npz", **arrays)  # type: ignore[arg-type]
    fitted = fit_profile([read_benchmark(tmp_path / "raw_data.npz")], TRUTH, name="f", fitted_at="-")
    assert max(_errors(fitted.profile).values()) < 1e-3


def test_aiperf_records_through_a_pd_router_fit_back_within_a_few_percent(tmp_path):
    model, records, t0 = PerformanceModel(TRUTH), [], 0.0
    for k, isl in [(1, n) for n in (500, 4_000, 16_000, 64_000)] + [(k, 4_000) for k in (8, 64)] + [(32, 12_000)]:
        run = closed_loop_records(model, concurrency=k, input_tokens=isl, output_tokens=128,
                                  requests_per_client=2, t0=t0, prefill_instances=8)
        records += run
        t0 = max(r.start_seconds + r.latency_seconds for r in run) + 5  # type: ignore[operator]
    bench = read_benchmark(write_aiperf_jsonl(tmp_path / "profile_export.jsonl", records))
    assert bench.tool == "aiperf" and bench.ttft_includes_kv_transfer
    fitted = fit_profile([bench], TRUTH, name="f", fitted_at="-")
    assert max(_errors(fitted.profile).values()) < 0.08, _errors(fitted.profile)
