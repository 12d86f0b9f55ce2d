"""Reader of Dynamo's profiler arrays (``raw_data.npz``).

As written by Dynamo's SLA profiler (``benchmarks/profiler/utils/profile_prefill.py`` and
``profile_decode.py``), in one file per role or both in one:

* prefill: ``prefill_isl`` (tokens), ``prefill_ttft`` (**milliseconds**, TTFT of one prompt at
  a time), ``prefill_thpt_per_gpu`` (tokens/s/GPU, derived: not read);
* decode: ``max_kv_tokens`` (one value: the engine's KV capacity, tokens), ``x_kv_usage``
  (fraction of it in use: ``(isl + osl/2) * concurrency / max_kv_tokens``),
  ``y_context_length`` (``isl + osl/2``, tokens), ``z_itl`` (**milliseconds**, mean ITL),
  ``z_thpt_per_gpu`` (derived: not read).

So the decode batch is ``x_kv_usage * max_kv_tokens / y_context_length`` and the mean context
is ``y_context_length`` (the model's own ``input + output/2``). The arrays record no tool
version, hardware or engine flags.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .points import Benchmark, BenchmarkError, DecodePoint, PrefillPoint

TOOL = "dynamo-profiler"
PREFILL_ARRAYS = ("prefill_isl", "prefill_ttft")
DECODE_ARRAYS = ("max_kv_tokens", "x_kv_usage", "y_context_length", "z_itl")


def _array(data: np.lib.npyio.NpzFile, name: str, source: str) -> np.ndarray:
    try:
        values = np.asarray(data[name])
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise BenchmarkError(source, f"unreadable array ({exc})", field=name) from None
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
        raise BenchmarkError(source, f"expected a 1-D numeric array, got {values.dtype} of shape "
                             f"{values.shape}", field=name)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        i = int(bad[0])
        raise BenchmarkError(source, f"not a finite non-negative number: {values[i]!r}",
                             field=f"{name}[{i}]")
    return values.astype(float)


def _same_length(arrays: dict[str, np.ndarray], source: str) -> None:
    first, *rest = arrays
    for name in rest:
        if len(arrays[name]) != len(arrays[first]):
            raise BenchmarkError(source, f"{len(arrays[name])} values where '{first}' has "
                                 f"{len(arrays[first])}", field=name)


def read(path: Path) -> Benchmark:
    """The points of one Dynamo profiler ``.npz``; refuses a truncated or corrupted file."""
    source = str(path)
    try:
        data = np.load(path, allow_pickle=False)  # never unpickle a file handed to us
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise BenchmarkError(source, f"not a readable .npz ({exc})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise BenchmarkError(source, "a single array, not Dynamo's .npz of named arrays")
    with data:
        names = set(data.files)
        has_prefill, has_decode = (any(n in names for n in group) for group in (PREFILL_ARRAYS, DECODE_ARRAYS))
        if not has_prefill and not has_decode:
            raise BenchmarkError(source, "none of Dynamo's profiler arrays", field="prefill_isl")
        prefill: list[PrefillPoint] = []
        decode: list[DecodePoint] = []
        kv: int | None = None
        for group, present in ((PREFILL_ARRAYS, has_prefill), (DECODE_ARRAYS, has_decode)):
            for name in group:
                if present and name not in names:
                    raise BenchmarkError(source, "missing", field=name)
        if has_prefill:
            arrays = {n: _array(data, n, source) for n in PREFILL_ARRAYS}
            _same_length(arrays, source)
            prefill = [PrefillPoint(n, t / 1000.0)
                       for n, t in zip(arrays["prefill_isl"], arrays["prefill_ttft"], strict=True)]
        if has_decode:
            capacity = _array(data, "max_kv_tokens", source)
            if capacity.size != 1 or capacity[0] <= 0:
                raise BenchmarkError(source, f"expected one positive value, got {capacity.tolist()}",
                                     field="max_kv_tokens")
            kv = int(capacity[0])
            arrays = {n: _array(data, n, source) for n in DECODE_ARRAYS[1:]}
            _same_length(arrays, source)
            for i, (usage, context, itl) in enumerate(zip(*arrays.values(), strict=True)):
                if context <= 0:
                    raise BenchmarkError(source, "a context of 0 tokens", field=f"y_context_length[{i}]")
                decode.append(DecodePoint(usage * kv / context, context, itl / 1000.0))
    return Benchmark(source=source, tool=TOOL, prefill=tuple(prefill), decode=tuple(decode),
                     kv_capacity_tokens=kv, recorded={"units": "ms (prefill_ttft, z_itl)"},
                     ttft_includes_kv_transfer=False)
