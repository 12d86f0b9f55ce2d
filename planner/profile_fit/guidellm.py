"""Reader of GuideLLM's report (``benchmarks.json``, ``guidellm benchmark --outputs json``).

From GuideLLM's ``GenerativeBenchmarksReport`` (``src/guidellm/benchmark/schemas/report.py``):
``{"metadata": {"version": 2, "guidellm_version", "python_version", "platform"}, "config":
{...the run's scenario...}, "benchmarks": [...]}``; each benchmark has its ``config.strategy``
(``{"type_": "concurrent", "streams": N}`` and the like) and ``requests.successful``, a list of
``GenerativeRequestStats`` (``src/guidellm/schemas/request_stats.py``) whose computed fields
are ``request_start_time`` (epoch seconds), ``prompt_tokens``, ``output_tokens``,
``time_to_first_token_ms`` and ``inter_token_latency_ms`` (first to last token over
``output_tokens - 1``). The decode window is taken as TTFT + ITL x (output - 1), the span
GuideLLM itself measured. GuideLLM may keep a sample of the requests; the fit uses what is
kept (the batch a request decoded in is then underestimated: sample all requests for a fit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .json_input import Locator, read_json
from .points import (
    Benchmark,
    BenchmarkError,
    DecodePoint,
    PrefillPoint,
    RequestRecord,
    benchmark_from_records,
)
from .request_arrays import recorded_fields

TOOL = "guidellm"


def _record(stats: Any, at: Locator, where: str) -> RequestRecord | None:
    def value(key: str) -> Any:
        return at.get(stats, key, f"{where}.{key}")

    osl = at.number(value("output_tokens"), f"{where}.output_tokens")
    ttft = at.number(value("time_to_first_token_ms"), f"{where}.time_to_first_token_ms") / 1000
    if osl >= 2:
        itl = at.number(value("inter_token_latency_ms"), f"{where}.inter_token_latency_ms") / 1000
    else:
        itl = 0.0
    return RequestRecord(int(at.number(value("prompt_tokens"), f"{where}.prompt_tokens")), int(osl),
                         ttft, ttft + itl * max(osl - 1, 0),
                         at.number(value("request_start_time"), f"{where}.request_start_time"))


def read(path: Path) -> Benchmark:
    source = str(path)
    report = read_json(path)
    at = Locator(source)
    benchmarks = at.sequence(at.get(report, "benchmarks", "benchmarks"), "benchmarks")
    prefill: list[PrefillPoint] = []
    decode: list[DecodePoint] = []
    strategies = []
    for b, bench in enumerate(benchmarks):
        requests = at.get(at.get(bench, "requests", f"benchmarks[{b}].requests"), "successful",
                          f"benchmarks[{b}].requests.successful")
        records = [_record(r, at, f"benchmarks[{b}].requests.successful[{i}]")
                   for i, r in enumerate(at.sequence(requests, f"benchmarks[{b}].requests.successful"))]
        one = benchmark_from_records(source, TOOL, [r for r in records if r is not None])
        prefill += one.prefill
        decode += one.decode
        strategy = bench.get("config", {}).get("strategy") if isinstance(bench.get("config"), dict) else None
        if isinstance(strategy, dict):
            strategies.append(recorded_fields(strategy, ("type_", "streams", "rate")))
    if not prefill and not decode:
        raise BenchmarkError(source, "no successful request", field="benchmarks[].requests.successful")
    metadata = report.get("metadata") if isinstance(report.get("metadata"), dict) else {}
    config = report.get("config") if isinstance(report.get("config"), dict) else {}
    recorded: dict[str, Any] = {**recorded_fields(metadata, ("guidellm_version", "version", "platform")),
                                **recorded_fields(config, ("target", "model", "backend", "profile")),
                                "strategies": strategies}
    return Benchmark(source=source, tool=TOOL, prefill=tuple(prefill), decode=tuple(decode),
                     recorded=recorded)
