"""What a user's benchmark would record against engines that run a known profile: the points
``pdscale profile fit`` is fed, made from a :class:`~pdscale.planner.model.PerformanceModel`
(the "true" one) with seeded measurement noise, so that a fit can be held against its truth.

Two shapes, each as its tool writes it (read back by ``planner/profile_fit``'s readers):

* :func:`dynamo_profiler_arrays`: Dynamo's SLA profiler's ``raw_data.npz`` on the profiler's
  own grids (``benchmarks/profiler/utils/profile_prefill.py`` and ``profile_decode.py``,
  ai-dynamo/dynamo): prefill input lengths ``range(100, max_context - 512, (max_context - 612)
  // 16)`` one prompt at a time (TTFT in ms, one engine, no KV hand-off); decode ``osl = 500``,
  inputs ``range(100, max_context - 500, (max_context - 500) // 6)`` and concurrencies
  ``range(1, max_concurrency, max_concurrency // 6)`` with ``max_concurrency = max_kv_tokens //
  (isl + osl)``, recording ``x_kv_usage = (isl + osl/2) * concurrency / max_kv_tokens``,
  ``y_context_length = isl + osl/2`` and the mean ITL in ms. One departure: the concurrency is
  capped at the engine's batch cap (``decode.max_batch``, SGLang's ``--max-running-requests``):
  past it the engine queues, the batch stops growing and the recorded KV usage no longer says
  the batch (a sweep a user would have to cap the same way).
* :func:`closed_loop_records`: per-request records of a benchmark client (aiperf's
  ``profile_export.jsonl``, :func:`write_aiperf_jsonl`) driving prefill instances and one
  decode instance through a PD router, closed loop: FIFO prefill, one prompt at a time per
  instance; the first token follows the KV hand-off (so the client's TTFT includes it, as
  through a real PD router); continuous-batching decode, each step the model's TPOT of the
  running batch and its mean context.

Noise is multiplicative and lognormal (``exp(sigma * N(0, 1))``): per point for the profiler's
arrays (each is a mean over a run), per prompt and per decode step for the records.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile_fit import RequestRecord

#: Dynamo's profiler defaults (profiler_argparse.py): interpolation granularity per role
DYNAMO_PREFILL_GRANULARITY = 16
DYNAMO_DECODE_GRANULARITY = 6
#: the profiler's decode output length, and the room it leaves for a chat template
DYNAMO_DECODE_OSL = 500
DYNAMO_TEMPLATE_TOKENS = 512


def _noise(rng: np.random.Generator, sigma: float, size: int | None = None) -> np.ndarray:
    return np.exp(sigma * rng.standard_normal(size))


def dynamo_profiler_arrays(model: PerformanceModel, *, max_context_length: int, noise: float = 0.0,
                           seed: int = 0, max_concurrency: int | None = None,
                           prefill_granularity: int = DYNAMO_PREFILL_GRANULARITY,
                           decode_granularity: int = DYNAMO_DECODE_GRANULARITY
                           ) -> dict[str, np.ndarray]:
    """The prefill and decode arrays of one Dynamo profiler run against engines that run
    ``model`` (TTFT and ITL in ms, lognormal noise ``noise``). ``max_concurrency`` caps the
    decode sweep below the engine's batch cap (a sweep that stopped early)."""
    rng = np.random.default_rng(seed)
    top = max_context_length - DYNAMO_TEMPLATE_TOKENS
    isl = np.arange(100, top, max(1, (top - 100) // prefill_granularity), dtype=float)
    ttft_ms = np.array([model.prefill_seconds(n) for n in isl]) * 1000 * _noise(rng, noise, len(isl))
    kv = model.profile.decode.kv_capacity_tokens
    cap = model.profile.decode.max_batch if max_concurrency is None else max_concurrency
    osl = DYNAMO_DECODE_OSL
    usage, context, itl_ms = [], [], []
    for d_isl in range(100, max_context_length - osl, (max_context_length - osl) // decode_granularity):
        top_k = min(kv // (d_isl + osl), cap)
        for k in range(1, max(top_k, 2), max(1, top_k // decode_granularity)):
            ctx = d_isl + osl / 2
            usage.append(ctx * k / kv)
            context.append(ctx)
            itl_ms.append(model.tpot_seconds(k, ctx) * 1000 * float(_noise(rng, noise)))
    return {"prefill_isl": isl, "prefill_ttft": ttft_ms,
            "prefill_thpt_per_gpu": isl / ttft_ms * 1000 / model.profile.gpus_per_instance,
            "max_kv_tokens": np.array([kv]), "x_kv_usage": np.array(usage),
            "y_context_length": np.array(context), "z_itl": np.array(itl_ms),
            "z_thpt_per_gpu": np.array(usage)}


@dataclass
class _Request:
    client: int
    start: float
    first: float
    generated: int = 0
    end: float = math.nan


def closed_loop_records(model: PerformanceModel, *, concurrency: int, input_tokens: int,
                        output_tokens: int, requests_per_client: int, t0: float,
                        prefill_instances: int, noise: float = 0.0,
                        rng: np.random.Generator | None = None) -> list[RequestRecord]:
    """One fixed-concurrency run of a benchmark client through a PD router (see the module
    docstring); start times are absolute seconds from ``t0``."""
    rng = rng or np.random.default_rng(0)
    prefill_free = [t0] * prefill_instances
    pending: list[tuple[float, int, _Request]] = []
    seq = 0
    left = dict.fromkeys(range(concurrency), requests_per_client)

    def submit(client: int, at: float) -> None:
        nonlocal seq
        free = min(range(prefill_instances), key=prefill_free.__getitem__)
        done = max(at, prefill_free[free]) + model.prefill_seconds(input_tokens) * float(_noise(rng, noise))
        prefill_free[free] = done
        first = done + model.kv_transfer_seconds(input_tokens)  # the first token follows the hand-off
        seq += 1
        heapq.heappush(pending, (first, seq, _Request(client, at, first)))
        left[client] -= 1

    for c in range(concurrency):
        submit(c, t0)
    done: list[_Request] = []
    running: list[_Request] = []
    now = t0
    step: Callable[[int, float], float] = model.tpot_seconds
    while pending or running:
        if not running and pending[0][0] > now:
            now = pending[0][0]
        while pending and pending[0][0] <= now:
            running.append(heapq.heappop(pending)[2])
        context = float(np.mean([input_tokens + 1 + r.generated for r in running]))
        now += step(len(running), context) * float(_noise(rng, noise))
        still = []
        for r in running:
            r.generated += 1
            if r.generated == output_tokens - 1:
                r.end = now
                done.append(r)
                if left[r.client] > 0:
                    submit(r.client, now)
            else:
                still.append(r)
        running = still
    return [RequestRecord(input_tokens, output_tokens, r.first - r.start, r.end - r.start, r.start)
            for r in done]


def write_aiperf_jsonl(path: Path, records: list[RequestRecord]) -> Path:
    """``records`` as aiperf 0.13 writes ``profile_export.jsonl`` (no "error" key on a success)."""
    lines = []
    for i, r in enumerate(records):
        assert r.start_seconds is not None
        lines.append(json.dumps({
            "metadata": {"session_num": i, "x_request_id": f"r{i}", "turn_index": 0,
                         "request_start_ns": int(r.start_seconds * 1e9),
                         "request_end_ns": int((r.start_seconds + r.latency_seconds) * 1e9),
                         "benchmark_phase": "profiling", "was_cancelled": False},
            "metrics": {"input_sequence_length": {"value": r.input_tokens, "unit": "tokens"},
                        "time_to_first_token": {"value": r.ttft_seconds * 1000, "unit": "ms"},
                        "request_latency": {"value": r.latency_seconds * 1000, "unit": "ms"},
                        "output_sequence_length": {"value": r.output_tokens, "unit": "tokens"}}}))
    path.write_text("\n".join(lines) + "\n")
    return path
