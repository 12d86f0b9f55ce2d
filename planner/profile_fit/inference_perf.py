"""Reader of inference-perf's per-request report (``per_request_lifecycle_metrics.json``,
written with ``report.request_lifecycle.per_request: true``).

From inference-perf's ``inference_perf/reportgen/base.py`` and ``apis/base.py``: a JSON list,
one object per request, ``{"start_time", "end_time", "request", "response", "info": {
"request_metrics": {"text": {"input_tokens"}}, "input_tokens" (deprecated mirror),
"response_metrics": {"output_tokens", "output_token_times": [...], ...}}, "error"}``, times in
seconds of one clock. As inference-perf's own summary does, TTFT is
``output_token_times[0] - start_time`` and the decode window runs from the first to the last
output token; requests that did not stream (fewer than two token times) or failed are skipped.
The file records no version, model or stage configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .json_input import Locator, read_json
from .points import Benchmark, BenchmarkError, RequestRecord, benchmark_from_records

TOOL = "inference-perf"


def _record(obj: Any, at: Locator, where: str) -> RequestRecord | None:
    if at.get(obj, "error", f"{where}.error") is not None:
        return None
    info = at.get(obj, "info", f"{where}.info")
    response = at.get(info, "response_metrics", f"{where}.info.response_metrics")
    if response is None or "output_token_times" not in response:
        return None
    times = at.sequence(response["output_token_times"], f"{where}.info.response_metrics.output_token_times")
    if len(times) < 2:
        return None
    first = at.number(times[0], f"{where}.info.response_metrics.output_token_times[0]")
    last = at.number(times[-1], f"{where}.info.response_metrics.output_token_times[{len(times) - 1}]")
    start = at.number(at.get(obj, "start_time", f"{where}.start_time"), f"{where}.start_time")
    if first < start or last < first:
        raise at.error(f"{where}.info.response_metrics.output_token_times", "token times out of order")
    request_metrics = info.get("request_metrics") if isinstance(info, dict) else None
    text = request_metrics.get("text") if isinstance(request_metrics, dict) else None
    if isinstance(text, dict) and "input_tokens" in text:
        isl = at.number(text["input_tokens"], f"{where}.info.request_metrics.text.input_tokens")
    else:
        isl = at.number(at.get(info, "input_tokens", f"{where}.info.input_tokens"), f"{where}.info.input_tokens")
    osl = at.number(at.get(response, "output_tokens", f"{where}.info.response_metrics.output_tokens"),
                    f"{where}.info.response_metrics.output_tokens")
    return RequestRecord(int(isl), int(osl), first - start, last - start, start)


def read(path: Path) -> Benchmark:
    source = str(path)
    requests = read_json(path)
    at = Locator(source)
    records = [_record(r, at, f"[{i}]") for i, r in enumerate(at.sequence(requests, "(top level)"))]
    kept = [r for r in records if r is not None and r.output_tokens >= 1]
    if not kept:
        raise BenchmarkError(source, "no successful streamed request", field="[].info.response_metrics")
    return benchmark_from_records(source, TOOL, kept, recorded={"records": len(kept)})
