"""Reader of ``vllm bench serve --save-result --save-detailed`` (one JSON object per file).

From vLLM's ``vllm/benchmarks/serve.py``: the result carries the run's description (``date``,
``backend``, ``endpoint_type``, ``label``, ``model_id``, ``tokenizer_id``, ``num_prompts``,
``request_rate``, ``burstiness``, ``max_concurrency``) and, only with ``--save-detailed``, the
per-request arrays (see :mod:`.request_arrays`); recent versions add ``latencies`` and
``start_times``, which place each request among the others (batch per request), else the run
is one decode point at ``max_concurrency``.
"""

from __future__ import annotations

from pathlib import Path

from .json_input import Locator, read_json
from .points import Benchmark, BenchmarkError, benchmark_from_records
from .request_arrays import recorded_fields, records_from_arrays

TOOL = "vllm-bench-serve"
DESCRIPTION = ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id",
               "num_prompts", "request_rate", "burstiness", "max_concurrency")


def read(path: Path) -> Benchmark:
    source = str(path)
    run = read_json(path)
    at = Locator(source)
    if not isinstance(run, dict):
        raise at.error("(top level)", "expected the result object")
    records = records_from_arrays(run, at, hint="run vllm bench serve with --save-detailed")
    if not records:
        raise BenchmarkError(source, "no successful request", field="errors")
    concurrency = run.get("max_concurrency")
    if concurrency is not None:
        concurrency = at.number(concurrency, "max_concurrency", positive=True)
    return benchmark_from_records(source, TOOL, records, concurrency=concurrency,
                                  recorded=recorded_fields(run, DESCRIPTION))
