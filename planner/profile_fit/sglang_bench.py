"""Reader of SGLang's ``bench_serving --output-file FILE --output-details`` (JSON Lines).

From SGLang's ``python/sglang/bench_serving.py``: every run appends one line, the run's
summary (``backend``, ``dataset_name``, ``request_rate``, ``max_concurrency``,
``random_input_len``, ... and the means) merged, with ``--output-details``, with its
per-request arrays (see :mod:`.request_arrays`). No request start times are saved, so each run
at a fixed ``max_concurrency`` is one decode point and a run at concurrency 1 gives its
prompts as prefill points; a sweep is several lines (or files).
"""

from __future__ import annotations

from pathlib import Path

from .json_input import Locator, iter_jsonl
from .points import Benchmark, BenchmarkError, DecodePoint, PrefillPoint, benchmark_from_records
from .request_arrays import recorded_fields, records_from_arrays

TOOL = "sglang-bench-serving"
DESCRIPTION = ("backend", "dataset_name", "request_rate", "max_concurrency", "random_input_len",
               "random_output_len", "random_range_ratio", "tag")


def read(path: Path) -> Benchmark:
    source = str(path)
    prefill: list[PrefillPoint] = []
    decode: list[DecodePoint] = []
    runs: list[dict[str, object]] = []
    for line, run in iter_jsonl(path):
        at = Locator(source, line)
        records = records_from_arrays(run, at, hint="run bench_serving with --output-details")
        concurrency = run.get("max_concurrency")
        if concurrency is not None:
            concurrency = at.number(concurrency, "max_concurrency", positive=True)
        one = benchmark_from_records(source, TOOL, records, concurrency=concurrency)
        prefill += one.prefill
        decode += one.decode
        runs.append({"line": line, **recorded_fields(run, DESCRIPTION)})
    if not prefill and not decode:
        raise BenchmarkError(source, "no run with a successful request at a known concurrency",
                             field="max_concurrency")
    return Benchmark(source=source, tool=TOOL, prefill=tuple(prefill), decode=tuple(decode),
                     recorded={"runs": runs})
