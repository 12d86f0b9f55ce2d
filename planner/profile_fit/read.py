"""Which reader a benchmark file needs: by extension and by the shape of its content, or as the
user says (``--format``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from . import aiperf, dynamo_npz, guidellm, inference_perf, sglang_bench, vllm_bench
from .points import Benchmark, BenchmarkError

READERS: dict[str, Callable[[Path], Benchmark]] = {
    "dynamo-npz": dynamo_npz.read,
    "aiperf": aiperf.read,
    "sglang": sglang_bench.read,
    "vllm": vllm_bench.read,
    "guidellm": guidellm.read,
    "inference-perf": inference_perf.read,
}


def _first_object(path: Path) -> object:
    """The first JSON value of a file (its first line for JSON Lines); None if unreadable, so
    that the chosen reader, not the sniffing, reports where the file breaks."""
    try:
        with path.open(encoding="utf-8") as f:
            head = f.readline()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return json.loads(head)
    except json.JSONDecodeError:
        return None


def _starts_with(path: Path, char: str) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            return f.read(64).lstrip().startswith(char)
    except (OSError, UnicodeDecodeError):
        return False


def detect_format(path: Path) -> str:
    """The reader name for ``path``; refuses a file none of the readers recognises."""
    if path.suffix == ".npz":
        return "dynamo-npz"
    first = _first_object(path)
    if isinstance(first, list) or (path.suffix == ".json" and _starts_with(path, "[")):
        return "inference-perf"
    if isinstance(first, dict) and "benchmarks" in first:
        return "guidellm"
    if isinstance(first, dict):
        if "metadata" in first and "metrics" in first:
            return "aiperf"
        if "ttfts" in first or "mean_ttft_ms" in first:
            return "sglang" if path.suffix == ".jsonl" else "vllm"
    if path.suffix == ".jsonl":
        raise BenchmarkError(str(path), "not a format we read (first line is neither an aiperf "
                             "record nor a bench_serving run); name it with --format", line=1)
    raise BenchmarkError(str(path), f"not a format we read; name it with --format ({', '.join(READERS)})")


def read_benchmark(path: Path, fmt: str | None = None) -> Benchmark:
    """The points of one benchmark file, read by ``fmt`` (detected when None)."""
    name = fmt or detect_format(path)
    if name not in READERS:
        raise BenchmarkError(str(path), f"unknown format {name!r}; known: {', '.join(READERS)}")
    return READERS[name](path)
