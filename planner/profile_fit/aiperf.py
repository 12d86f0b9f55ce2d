"""Reader of aiperf's per-request records (``profile_export.jsonl``).

One JSON object per line, as aiperf's ``MetricRecordInfo`` (``aiperf/common/models/
record_models.py``) and its "Working with profile export files" tutorial describe it::

    {"metadata": {"request_start_ns": ..., "benchmark_phase": "profiling", "was_cancelled": false, ...},
     "metrics": {"input_sequence_length": {"value": 550, "unit": "tokens"},
                 "time_to_first_token": {"value": 255.9, "unit": "ms"},
                 "request_latency": {"value": 297.5, "unit": "ms"},
                 "output_sequence_length": {"value": 9, "unit": "tokens"}, ...},
     "error": null}

(aiperf 0.13 omits ``error`` when there is none.) Failed, cancelled and warm-up records are skipped; every other record must carry the four
metrics and its start time (epoch nanoseconds), which place it among the others: the batch it
decoded in is reconstructed from the overlap of the records (see ``points_from_records``).
The file records no aiperf version, model or engine flags (those are in
``profile_export_aiperf.json``, not read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .json_input import Locator, iter_jsonl
from .points import Benchmark, BenchmarkError, RequestRecord, benchmark_from_records

TOOL = "aiperf"


def _record(obj: Any, at: Locator) -> RequestRecord | None:
    metadata = at.get(obj, "metadata", "metadata")
    # aiperf 0.13 leaves "error" out of a successful record (the tutorial's example shows null)
    if obj.get("error") is not None or metadata.get("was_cancelled"):
        return None
    if metadata.get("benchmark_phase", "profiling") != "profiling":
        return None
    metrics = at.get(obj, "metrics", "metrics")

    def metric(name: str) -> dict[str, Any]:
        value: dict[str, Any] = at.get(metrics, name, f"metrics.{name}")
        at.get(value, "value", f"metrics.{name}.value")
        return value

    isl = at.number(metric("input_sequence_length")["value"], "metrics.input_sequence_length.value")
    osl_name = "output_sequence_length" if "output_sequence_length" in metrics else "output_token_count"
    osl = at.number(metric(osl_name)["value"], f"metrics.{osl_name}.value")
    ttft_m, latency_m = metric("time_to_first_token"), metric("request_latency")
    ttft = at.seconds(ttft_m["value"], ttft_m.get("unit"), "metrics.time_to_first_token")
    latency = at.seconds(latency_m["value"], latency_m.get("unit"), "metrics.request_latency")
    if latency < ttft:
        raise at.error("metrics.request_latency.value", "shorter than the time to first token")
    start_ns = at.number(at.get(metadata, "request_start_ns", "metadata.request_start_ns"),
                         "metadata.request_start_ns")
    return RequestRecord(int(isl), int(osl), ttft, latency, start_ns * 1e-9)


def read(path: Path) -> Benchmark:
    """The points of one aiperf ``profile_export.jsonl``."""
    source = str(path)
    records = []
    for line, obj in iter_jsonl(path):
        record = _record(obj, Locator(source, line))
        if record is not None:
            records.append(record)
    if not records:
        raise BenchmarkError(source, "no successful profiling record", field="metrics")
    return benchmark_from_records(source, TOOL, records,
                                  recorded={"records": len(records)})
