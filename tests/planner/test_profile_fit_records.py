"""Per-request records of each benchmark client, generated from a known profile by a small
simulation of one prefill and one decode instance, are fitted back to that profile; every
reader refuses a truncated or corrupted file, naming the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import shipped_profile
from pdscale.planner.profile_fit import (
    BenchmarkError,
    RequestRecord,
    detect_format,
    fit_profile,
    read_benchmark,
)
from pdscale.testbed.profile_sweep import closed_loop_records

TRUTH = shipped_profile()
#: a base far from the truth, so that a term kept from it would fail the 10% checks, but with
#: the truth's KV hand-off (the fit takes the base's off the measured TTFTs)
BASE = shipped_profile("demo-sim").model_copy(update={"kv_transfer": TRUTH.kv_transfer})
OUTPUT_TOKENS = 160
#: prefill instances in front of the one decode instance (a PD ratio that lets the batch build)
PREFILL_INSTANCES = 8
PREFILL_LENGTHS = (200, 1000, 2500, 5000, 8000, 12000)
DECODE_RUNS = [(k, isl) for isl in (500, 4000, 12000) for k in (2, 8, 32, 96)]


def simulate_run(model: PerformanceModel, concurrency: int, isl: int, requests_per_client: int,
                 t0: float) -> list[RequestRecord]:
    """A closed loop of ``concurrency`` clients against :data:`PREFILL_INSTANCES` prefill
    instances and one continuous-batching decode instance, without noise
    (``testbed.profile_sweep.closed_loop_records``)."""
    return closed_loop_records(model, concurrency=concurrency, input_tokens=isl,
                               output_tokens=OUTPUT_TOKENS, requests_per_client=requests_per_client,
                               t0=t0, prefill_instances=PREFILL_INSTANCES)


@pytest.fixture(scope="module")
def runs() -> list[tuple[int, list[RequestRecord]]]:
    """The sweep a user would run: input lengths one at a time, then concurrency x context."""
    model = PerformanceModel(TRUTH)
    out, t = [], 1_000.0
    for isl in PREFILL_LENGTHS:
        out.append((1, simulate_run(model, 1, isl, 3, t)))
        t = max(r.start_seconds + r.latency_seconds for r in out[-1][1]) + 5
    for k, isl in DECODE_RUNS:
        out.append((k, simulate_run(model, k, isl, 2, t)))
        t = max(r.start_seconds + r.latency_seconds for r in out[-1][1]) + 5
    return out


# -- writers: each tool's own format, from the records ----------------------------------------

def write_aiperf(path: Path, records: list[RequestRecord]) -> None:
    """As aiperf 0.13 writes them (checked against a real run): no "error" key on a success."""
    lines = []
    for i, r in enumerate(records):
        itl_ms = (r.latency_seconds - r.ttft_seconds) / (r.output_tokens - 1) * 1000
        lines.append(json.dumps({
            "metadata": {"session_num": i, "x_request_id": f"r{i}", "turn_index": 0,
                         "request_start_ns": int(r.start_seconds * 1e9), "request_ack_ns": None,
                         "request_end_ns": int((r.start_seconds + r.latency_seconds) * 1e9),
                         "worker_id": "worker_0", "record_processor_id": "rp_0",
                         "benchmark_phase": "profiling", "was_cancelled": False,
                         "cancellation_time_ns": None},
            "metrics": {"input_sequence_length": {"value": r.input_tokens, "unit": "tokens"},
                        "time_to_first_token": {"value": r.ttft_seconds * 1000, "unit": "ms"},
                        "request_latency": {"value": r.latency_seconds * 1000, "unit": "ms"},
                        "output_sequence_length": {"value": r.output_tokens, "unit": "tokens"},
                        "inter_token_latency": {"value": itl_ms, "unit": "ms"}}}))
    path.write_text("\n".join(lines) + "\n")


def _arrays(records: list[RequestRecord], concurrency: int) -> dict:
    gaps = [[(r.latency_seconds - r.ttft_seconds) / (r.output_tokens - 1)] * (r.output_tokens - 1)
            for r in records]
    return {"backend": "sglang", "max_concurrency": concurrency, "request_rate": float("inf"),
            "completed": len(records), "mean_ttft_ms": 1.0,
            "input_lens": [r.input_tokens for r in records],
            "output_lens": [r.output_tokens for r in records],
            "ttfts": [r.ttft_seconds for r in records], "itls": gaps,
            "generated_texts": ["" for _ in records], "errors": ["" for _ in records]}


def write_sglang(path: Path, records: list[RequestRecord], concurrency: int) -> None:
    with path.open("a") as f:  # bench_serving appends one line per run
        f.write(json.dumps(_arrays(records, concurrency)) + "\n")


def write_vllm(path: Path, records: list[RequestRecord], concurrency: int, *, with_starts: bool) -> None:
    run = _arrays(records, concurrency)
    run.update(backend="vllm", date="20261202-004000", model_id="m", endpoint_type="openai")
    if with_starts:
        run["latencies"] = [r.latency_seconds for r in records]
        run["start_times"] = [r.start_seconds for r in records]
    path.write_text(json.dumps(run))


def _guidellm_request(r: RequestRecord, i: int) -> dict:
    itl_ms = (r.latency_seconds - r.ttft_seconds) / (r.output_tokens - 1) * 1000
    return {"type_": "generative_request_stats", "request_id": f"r{i}",
            "request_start_time": r.start_seconds, "request_end_time": r.start_seconds + r.latency_seconds,
            "request_latency": r.latency_seconds, "prompt_tokens": r.input_tokens,
            "output_tokens": r.output_tokens, "time_to_first_token_ms": r.ttft_seconds * 1000,
            "inter_token_latency_ms": itl_ms}


def write_guidellm(path: Path, runs) -> None:
    report = {"metadata": {"version": 2, "guidellm_version": "0.8.0", "platform": "Linux"},
              "config": {"target": "http://router", "model": "m"},
              "benchmarks": [{"config": {"strategy": {"type_": "concurrent", "streams": k}},
                              "requests": {"successful": [_guidellm_request(r, i) for i, r in enumerate(records)],
                                           "errored": [], "incomplete": []}}
                             for k, records in runs]}
    path.write_text(json.dumps(report))


def write_inference_perf(path: Path, records: list[RequestRecord]) -> None:
    rows = []
    for r in records:
        first, last = r.start_seconds + r.ttft_seconds, r.start_seconds + r.latency_seconds
        times = np.linspace(first, last, r.output_tokens).tolist()
        rows.append({"start_time": r.start_seconds, "end_time": last + 0.001, "request": "{}",
                     "response": "", "error": None,
                     "info": {"request_metrics": {"text": {"input_tokens": r.input_tokens}},
                              "input_tokens": r.input_tokens,
                              "response_metrics": {"output_tokens": r.output_tokens,
                                                   "output_token_times": times}}})
    path.write_text(json.dumps(rows, indent=2))


def files_for(tool: str, runs, tmp_path: Path) -> list[Path]:
    if tool == "guidellm":
        write_guidellm(tmp_path / "benchmarks.json", runs)
        return [tmp_path / "benchmarks.json"]
    paths = []
    for i, (k, records) in enumerate(runs):
        if tool == "aiperf":
            p = tmp_path / f"run{i}" / "profile_export.jsonl"
            p.parent.mkdir()
            write_aiperf(p, records)
        elif tool == "inference-perf":
            p = tmp_path / f"run{i}" / "per_request_lifecycle_metrics.json"
            p.parent.mkdir()
            write_inference_perf(p, records)
        elif tool == "sglang":
            p = tmp_path / "bench_serving.jsonl"
            write_sglang(p, records, k)
        else:
            p = tmp_path / f"vllm-{i}.json"
            write_vllm(p, records, k, with_starts=tool == "vllm")
        if p not in paths:
            paths.append(p)
    return paths


def within(fitted: float | None, truth: float | None, tolerance: float = 0.10) -> bool:
    assert fitted is not None and truth is not None
    return abs(fitted - truth) <= tolerance * truth


@pytest.mark.parametrize("tool", ["aiperf", "guidellm", "inference-perf", "sglang", "vllm",
                                  "vllm-without-start-times"])
def test_records_of_each_tool_are_fitted_back_to_the_profile_that_made_them(tool, runs, tmp_path):
    paths = files_for(tool, runs, tmp_path)
    benchmarks = [read_benchmark(p) for p in paths]
    result = fit_profile(benchmarks, BASE, name="fitted", fitted_at="2026-12-02T00:00:00Z")
    p, d = result.profile.prefill, result.profile.decode
    assert within(p.tokens_per_second, TRUTH.prefill.tokens_per_second)
    assert within(p.attention_doubling_tokens, TRUTH.prefill.attention_doubling_tokens)
    assert within(p.overhead_seconds, TRUTH.prefill.overhead_seconds)
    assert within(d.step_seconds, TRUTH.decode.step_seconds)
    assert within(d.per_sequence_seconds, TRUTH.decode.per_sequence_seconds)
    assert within(d.per_context_token_seconds, TRUTH.decode.per_context_token_seconds)
    terms = result.document["provenance"]["terms"]
    assert all(t["identified"] for t in terms.values())
    # records carry no KV capacity: it stays the base's, and the provenance says so
    assert d.kv_capacity_tokens == BASE.decode.kv_capacity_tokens
    assert "decode.kv_capacity_tokens" in result.document["provenance"]["kept_from_base"]


def test_the_kv_hand_off_in_a_measured_ttft_is_not_fitted_into_the_prefill(runs, tmp_path):
    benchmarks = [read_benchmark(p) for p in files_for("aiperf", runs, tmp_path)]
    kept = fit_profile(benchmarks, BASE, name="f", fitted_at="-", kv_transfer_in_ttft=False)
    # fitted as if the TTFT were all prefill, the hand-off's 5 ms setup lands in the overhead
    setup = TRUTH.kv_transfer.setup_seconds
    assert kept.profile.prefill.overhead_seconds == pytest.approx(
        TRUTH.prefill.overhead_seconds + setup, rel=0.05)
    assert kept.document["provenance"]["sources"][0]["ttft_less_kv_transfer"] is False


def test_the_batch_a_request_decoded_in_is_reconstructed_from_the_records(runs):
    from pdscale.planner.profile_fit.points import points_from_records

    k, records = next((k, r) for k, r in runs if k == 96)
    _, decode = points_from_records(records)
    batches = [p.batch for p in decode]
    # prefill serialises the arrivals, so the batch builds up; it never exceeds the clients
    assert max(batches) <= k + 1e-9
    assert max(batches) > 0.3 * k


def test_detect_format_tells_the_tools_apart(runs, tmp_path):
    for tool in ("aiperf", "guidellm", "inference-perf", "sglang", "vllm"):
        expected = tool
        sub = tmp_path / tool
        sub.mkdir()
        assert detect_format(files_for(tool, runs[:1], sub)[0]) == expected


def test_aiperf_records_with_an_explicit_null_error_are_read_and_failed_ones_skipped(runs, tmp_path):
    path = files_for("aiperf", runs[:1], tmp_path)[0]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["error"] = None  # the tutorial's shape
    lines[1]["error"] = {"code": 500, "type": "ServerError", "message": "boom"}
    lines[1]["metrics"] = {"error_isl": {"value": 200, "unit": "tokens"}}
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert len(read_benchmark(path).prefill) == len(lines) - 1


# -- refusals ----------------------------------------------------------------------------------

def _one_run_file(tool: str, runs, tmp_path: Path) -> Path:
    return files_for(tool, runs[:2], tmp_path)[-1 if tool not in ("sglang", "guidellm") else 0]


def _truncate(path: Path) -> None:
    text = path.read_text().rstrip("\n")
    path.write_text(text[: len(text) - 25])  # a write cut short in its last record


def _corrupt_aiperf(path: Path) -> tuple[int, str]:
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["metrics"]["time_to_first_token"]["value"] = "fast"
    lines[1] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    return 2, "metrics.time_to_first_token.value"


def _corrupt_arrays(path: Path) -> tuple[int | None, str]:
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        run = json.loads(lines[0])
        run["ttfts"][1] = None
        lines[0] = json.dumps(run)
        path.write_text("\n".join(lines) + "\n")
        return 1, "ttfts[1]"
    run = json.loads(path.read_text())
    del run["itls"]
    path.write_text(json.dumps(run))
    return None, "itls"


def _corrupt_guidellm(path: Path) -> tuple[int | None, str]:
    report = json.loads(path.read_text())
    report["benchmarks"][0]["requests"]["successful"][1]["time_to_first_token_ms"] = "fast"
    path.write_text(json.dumps(report))
    return None, "benchmarks[0].requests.successful[1].time_to_first_token_ms"


def _corrupt_inference_perf(path: Path) -> tuple[int | None, str]:
    rows = json.loads(path.read_text())
    del rows[2]["info"]["response_metrics"]["output_tokens"]
    path.write_text(json.dumps(rows, indent=2))
    return None, "[2].info.response_metrics.output_tokens"


CORRUPT: dict[str, Callable[[Path], tuple[int | None, str]]] = {
    "aiperf": _corrupt_aiperf, "guidellm": _corrupt_guidellm,
    "inference-perf": _corrupt_inference_perf, "sglang": _corrupt_arrays, "vllm": _corrupt_arrays}


@pytest.mark.parametrize("tool", sorted(CORRUPT))
def test_a_truncated_file_is_refused_with_its_name_and_line(tool, runs, tmp_path):
    path = _one_run_file(tool, runs, tmp_path)
    _truncate(path)
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(path, tool)
    assert err.value.file == str(path)
    assert err.value.line is not None and str(path) in str(err.value)
    assert f":{err.value.line}:" in str(err.value)


@pytest.mark.parametrize("tool", sorted(CORRUPT))
def test_a_corrupted_field_is_refused_by_name(tool, runs, tmp_path):
    path = _one_run_file(tool, runs, tmp_path)
    line, field_name = CORRUPT[tool](path)
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(path)
    assert err.value.file == str(path)
    assert err.value.field == field_name
    assert err.value.line == line
    assert f"field '{field_name}'" in str(err.value)
