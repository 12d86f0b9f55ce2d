"""What a benchmark file says, in the planner's units: per-request records, the points the fit
reads, and the error every reader raises.

Two kinds of point feed the fit (see :mod:`.fit`):

* a :class:`PrefillPoint` is the TTFT of one prompt that ran alone (no other prompt in prefill
  at the same time), so that TTFT = the model's prefill compute, with no queueing;
* a :class:`DecodePoint` is the mean inter-token latency of a decode batch of ``batch``
  sequences whose contexts sum to ``batch * mean_context_tokens``.

Readers turn a tool's records into :class:`RequestRecord` and call :func:`points_from_records`
(with timestamps) or :func:`points_from_run` (a fixed-concurrency run without them); Dynamo's
profiler arrays are points already. Everything here is pure: no file is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: a prompt counts as alone in prefill when the time-averaged number of prompts in prefill
#: during its TTFT window is at most this (1.0 = itself only; the slack absorbs clock jitter)
ALONE_IN_PREFILL = 1.05


class BenchmarkError(ValueError):
    """A benchmark file that cannot be read or fitted; names the file, the line and the field."""

    def __init__(self, file: str, message: str, *, line: int | None = None, field: str | None = None):
        self.file, self.line, self.field = file, line, field
        where = file if line is None else f"{file}:{line}"
        what = "" if field is None else f"field '{field}': "
        super().__init__(f"{where}: {what}{message}")


@dataclass(frozen=True)
class PrefillPoint:
    input_tokens: float
    ttft_seconds: float


@dataclass(frozen=True)
class DecodePoint:
    batch: float
    mean_context_tokens: float
    itl_seconds: float


@dataclass(frozen=True)
class RequestRecord:
    """One successful request as a benchmark client saw it (seconds since any common origin)."""

    input_tokens: int
    output_tokens: int
    ttft_seconds: float
    latency_seconds: float
    start_seconds: float | None = None

    @property
    def itl_seconds(self) -> float:
        """Mean inter-token latency: the decode time over the tokens after the first."""
        return (self.latency_seconds - self.ttft_seconds) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Benchmark:
    """One file's contribution: its points and what it recorded about where they came from."""

    source: str
    tool: str
    prefill: tuple[PrefillPoint, ...] = ()
    decode: tuple[DecodePoint, ...] = ()
    #: KV capacity of one decode instance when the file measured it (Dynamo's max_kv_tokens)
    kv_capacity_tokens: int | None = None
    #: tool version, date, model, engine and hardware flags, as the file recorded them
    recorded: dict[str, Any] = field(default_factory=dict)
    #: the TTFTs were measured through a PD pair, so they include the KV hand-off that the
    #: model adds on its own (kv_transfer); a benchmark client's are, Dynamo's profiler's
    #: (one engine, prefill only) are not
    ttft_includes_kv_transfer: bool = True


def _busy_integral(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray
                   ) -> Callable[[np.ndarray], np.ndarray]:
    """The function t -> integral up to t of the sum of ``weights`` of the intervals open at
    that time (piecewise linear), returned as a vectorised callable."""
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([weights, -weights])
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    level = np.cumsum(deltas)  # the weight open just after each event
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(times, t, side="right") - 1
        i = np.clip(i, 0, len(times) - 1)
        return np.asarray(area[i] + level[i] * (t - times[i]))

    return integral


def points_from_records(records: Sequence[RequestRecord]) -> tuple[list[PrefillPoint], list[DecodePoint]]:
    """Points from per-request records that carry their start time.

    A request's decode window is [start + TTFT, start + latency]. Its batch is the time-averaged
    number of decode windows open during its own; its mean context is the same average of
    ``input + output/2`` (the model's mean context of a sequence over its decode), weighted by
    overlap. It is a prefill point when it was alone in prefill (:data:`ALONE_IN_PREFILL`)."""
    if not records:
        return [], []
    start = np.array([r.start_seconds for r in records], dtype=float)
    ttft = np.array([r.ttft_seconds for r in records], dtype=float)
    latency = np.array([r.latency_seconds for r in records], dtype=float)
    isl = np.array([r.input_tokens for r in records], dtype=float)
    osl = np.array([r.output_tokens for r in records], dtype=float)
    first, end = start + ttft, start + latency

    in_prefill = _busy_integral(start, first, np.ones_like(start))
    prefill: list[PrefillPoint] = []
    alone = (in_prefill(first) - in_prefill(start)) <= ALONE_IN_PREFILL * np.maximum(ttft, 1e-12)
    for i in np.flatnonzero(alone & (ttft > 0)):
        prefill.append(PrefillPoint(float(isl[i]), float(ttft[i])))

    decoding = osl >= 2
    s, e = first[decoding], end[decoding]
    ctx = isl[decoding] + osl[decoding] / 2.0
    seqs = _busy_integral(s, e, np.ones_like(s))
    contexts = _busy_integral(s, e, ctx)
    span = e - s
    seq_area = seqs(e) - seqs(s)
    ctx_area = contexts(e) - contexts(s)
    itl = span / (osl[decoding] - 1)
    decode = [DecodePoint(float(seq_area[i] / span[i]), float(ctx_area[i] / seq_area[i]), float(itl[i]))
              for i in range(len(s)) if span[i] > 0 and seq_area[i] > 0]
    return prefill, decode


def points_from_run(records: Sequence[RequestRecord], concurrency: float | None
                    ) -> tuple[list[PrefillPoint], list[DecodePoint]]:
    """Points from one fixed-concurrency run whose records carry no start time.

    Every request of a run at concurrency 1 ran alone: each is a prefill point. The run gives
    one decode point: with ``k`` requests always in flight, a request spends the share
    mean(decode time) / mean(latency) of its life decoding, so the decode batch is k times
    that share (Little's law on the decode stage); the ITL is the mean over requests."""
    prefill = [PrefillPoint(float(r.input_tokens), r.ttft_seconds)
               for r in records if concurrency == 1 and r.ttft_seconds > 0]
    decoding = [r for r in records if r.output_tokens >= 2 and r.latency_seconds > r.ttft_seconds]
    if concurrency is None or not decoding:
        return prefill, []
    decode_time = float(np.mean([r.latency_seconds - r.ttft_seconds for r in decoding]))
    life = float(np.mean([r.latency_seconds for r in decoding]))
    batch = concurrency * decode_time / life
    context = float(np.mean([r.input_tokens + r.output_tokens / 2.0 for r in decoding]))
    itl = float(np.mean([r.itl_seconds for r in decoding]))
    return prefill, [DecodePoint(batch, context, itl)]


def benchmark_from_records(source: str, tool: str, records: Iterable[RequestRecord], *,
                           concurrency: float | None = None, recorded: dict[str, Any] | None = None
                           ) -> Benchmark:
    """A :class:`Benchmark` from records: per request when every record has its start time,
    else per run at the recorded concurrency."""
    records = list(records)
    if records and all(r.start_seconds is not None for r in records):
        prefill, decode = points_from_records(records)
    else:
        prefill, decode = points_from_run(records, concurrency)
    return Benchmark(source=source, tool=tool, prefill=tuple(prefill), decode=tuple(decode),
                     recorded=dict(recorded or {}))
