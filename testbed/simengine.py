"""A simulated SGLang instance (prefill or decode) that the real SGLang router routes to.

No GPU here, so each "pod" of the e2e tests and the demo is one of these processes, bound to
its own 127.0.0.x address. It speaks the part of SGLang's HTTP API that sglang-router 0.3.2
uses in PD mode (observed, not guessed - see the report in tests/loop/README.md):

- registration: ``GET /health``, ``GET /server_info``, ``GET /model_info`` (the sim also
  answers SGLang's ``/get_server_info`` and ``/get_model_info``); the router first opens an
  HTTP/2 prior-knowledge probe for gRPC, which this HTTP/1.1 server refuses, and then falls
  back to HTTP;
- traffic: ``POST /generate``, ``/v1/chat/completions``, ``/v1/completions``, streaming or not,
  sent to the prefill and the decode instance *at the same time* with ``bootstrap_host``,
  ``bootstrap_port`` and a router-minted ``bootstrap_room`` injected into the body;
- load and metrics: ``GET /get_load`` (router ``/get_loads``) and ``GET /metrics``;
- a tokenizer: the router loads one for the ``model_path`` a worker reports, from the Hugging
  Face hub unless it is a local directory with a tokenizer.json; ``--model-path DIR`` writes
  one there, so nothing leaves the machine.

Pairing works as in SGLang: a prefill instance runs a bootstrap server on its own host at
``--bootstrap-port``; the decode instance asks it (``GET /sim/kv/{room}``, a long poll) for the
KV of its room, which is answered when the prefill of that room has been computed. The decode
side then waits the KV-transfer time and starts emitting tokens. A prefill request stays
in flight until its room's KV has been collected, because removing a prefill instance whose KV
is still awaited is exactly the failure the release order must avoid. A prefill that refuses
a request (draining) fails its room at once, so the decode half does not wait for nothing.

``--dialect vllm`` speaks vLLM's part instead, as vllm-router 0.1.17 uses it in PD mode with
``--kv-connector nixl`` (observed; tests/loop/README.md): the router sends the prefill first
(``max_tokens`` 1, non-streaming, ``kv_transfer_params.do_remote_decode``), and then the
original request to the decode with the ``kv_transfer_params`` the prefill answered. The sim's
prefill names itself there (``remote_host``, ``remote_port`` = its bootstrap server, standing
in for NIXL's side channel, ``remote_request_id`` = the room), and the decode collects that
room as above, waits the KV-transfer time and decodes; without them it prefills locally. No
``/generate``, ``/server_info`` or ``/get_load``; ``/metrics`` has vLLM's names (``vllm:...``,
label ``model_name``), whose ``num_requests_running`` + ``num_requests_waiting`` are what the
operator reads as in-flight work.

Time follows a pluggable :class:`TimingModel` (model seconds), divided by
``--time-compression``: a compressed engine behaves like one that is that many times faster in
every respect, so latencies observed by clients and in ``/metrics`` are wall-clock seconds.

Drain: ``SIGTERM`` or ``POST /sim/drain`` makes ``/health`` answer 503 and new requests get 503,
in-flight requests finish; after SIGTERM (or ``/sim/drain?exit=1``) the process exits once
nothing is in flight (exit status 0) or ``--drain-timeout-seconds`` passed (status 3).
``GET /sim/state`` and
``GET /get_load`` expose the in-flight count.

aiohttp rather than the standard library: it is already installed (kopf depends on it), and the
engine needs an asyncio HTTP server that can stream and an HTTP client (decode -> prefill
bootstrap) in the same event loop, which the standard library offers only synchronously.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import json
import logging
import signal
import sys
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

log = logging.getLogger("pdscale.testbed.simengine")

ROLES = ("prefill", "decode")


# -- timing --------------------------------------------------------------------------------


@runtime_checkable
class TimingModel(Protocol):
    """How long one instance takes, in model seconds (before time compression).

    The planner's :class:`pdscale.planner.model.PerformanceModel` satisfies this protocol as is
    (see :func:`planner_timing`)."""

    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        """Compute seconds for one prompt of ``input_tokens`` with ``cached_tokens`` cached."""
        ...

    def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
        """Seconds of one decode step for ``batch`` sequences of mean context (tokens)."""
        ...

    def kv_transfer_seconds(self, tokens: float) -> float:
        """Seconds to move the KV of ``tokens`` prompt tokens from prefill to decode."""
        ...


@dataclass(frozen=True)
class LinearTiming:
    """Default timing model: linear in uncached tokens, batch size and context.

    prefill = overhead + (input - cached) / prefill_tokens_per_second
    TPOT    = decode_step + batch * (per_sequence + mean_context * per_context_token)
    KV      = kv_setup + input / kv_tokens_per_second
    """

    #: uncached prompt tokens computed per second by one prefill instance
    prefill_tokens_per_second: float = 20_000.0
    #: fixed cost per prefill (scheduling, first-token sampling)
    prefill_overhead_seconds: float = 0.005
    #: TPOT at batch 1 and zero context
    decode_step_seconds: float = 0.015
    #: extra TPOT per running sequence
    decode_per_sequence_seconds: float = 0.0001
    #: extra TPOT per sequence per context token (attention reads)
    decode_per_context_token_seconds: float = 0.0
    #: fixed cost of one KV transfer (handshake)
    kv_setup_seconds: float = 0.002
    #: prompt tokens of KV moved per second
    kv_tokens_per_second: float = 2_000_000.0

    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        uncached = max(input_tokens - min(max(cached_tokens, 0.0), input_tokens), 0.0)
        return self.prefill_overhead_seconds + uncached / self.prefill_tokens_per_second

    def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
        per_seq = (
            self.decode_per_sequence_seconds
            + mean_context_tokens * self.decode_per_context_token_seconds
        )
        return self.decode_step_seconds + max(batch, 1.0) * per_seq

    def kv_transfer_seconds(self, tokens: float) -> float:
        return self.kv_setup_seconds + max(tokens, 0.0) / self.kv_tokens_per_second


def planner_timing(profile: str | None = None) -> TimingModel:
    """The planner's performance model for a shipped profile name or a YAML path (None = default).

    The planner's model already has the protocol's three methods with the same units, so the
    simulated engines take exactly the time the planner predicts (before queueing)."""
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import load_profile

    return PerformanceModel(load_profile(profile))


# -- tokens and prefix cache ---------------------------------------------------------------


def prompt_tokens(body: dict[str, Any]) -> list[str]:
    """The prompt of a request as tokens: whitespace-separated words (1 word = 1 token).

    The load generator writes prompts as words, so lengths and shared prefixes are exact
    without a real tokenizer; ``input_ids`` are taken as given."""
    if isinstance(body.get("input_ids"), list):
        return [str(t) for t in body["input_ids"]]
    if "messages" in body:
        parts: list[str] = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return " ".join(parts).split()
    prompt = body.get("text", body.get("prompt", ""))
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return str(prompt).split()


def max_new_tokens(api: str, body: dict[str, Any]) -> int:
    """Output length requested; the simulation always generates exactly this many tokens."""
    if api == "generate":
        value = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
    elif api == "chat":
        value = body.get("max_completion_tokens") or body.get("max_tokens") or 128
    else:
        value = body.get("max_tokens") or 16
    return max(int(value), 1)


class PrefixCache:
    """LRU cache of prompt prefix blocks, so repeated prefixes really are cheaper.

    A block is identified by the hash of the whole prefix up to its end (as radix/paged caches
    do), so a block hits only if everything before it matched too."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if block_tokens <= 0 or capacity_tokens < 0:
            raise ValueError("block_tokens must be > 0 and capacity_tokens >= 0")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _keys(self, tokens: Sequence[str]) -> Iterable[int]:
        h = 0
        for start in range(0, len(tokens) - self.block_tokens + 1, self.block_tokens):
            h = hash((h, tuple(tokens[start : start + self.block_tokens])))
            yield h

    def match(self, tokens: Sequence[str]) -> int:
        """Cached tokens at the start of ``tokens`` (whole blocks); marks them recently used."""
        hit = 0
        for key in self._keys(tokens):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += self.block_tokens
        return hit

    def insert(self, tokens: Sequence[str]) -> None:
        """Cache every whole block of ``tokens``, evicting the least recently used."""
        for key in self._keys(tokens):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks) * self.block_tokens


# The router loads a tokenizer for every model_path a worker reports, from the Hugging Face
# hub unless model_path is a local directory with a tokenizer.json (observed with 0.3.2; its
# own --tokenizer-path does not stop the per-worker load). Words are our tokens, so a
# whitespace word-level tokenizer with one entry serves.
WORD_TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None, "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
}  # fmt: skip


def write_word_tokenizer(directory: str | Path) -> Path:
    """Create ``directory/tokenizer.json`` (atomically; engines may race) and return its path."""
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tokenizer.{uuid.uuid4().hex}.json")
        tmp.write_text(json.dumps(WORD_TOKENIZER))
        tmp.replace(path)
    return path


# -- metrics (Prometheus text format, SGLang names) ------------------------------------------

# Finer than SGLang's 0.1-400 s buckets at the low end: compressed runs have short latencies.
LATENCY_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 400.0,
)  # fmt: skip


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS_SECONDS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            cumulative += n
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass
class Metrics:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted_requests: int = 0
    #: requests answered in full (vLLM's request_success_total)
    finished_requests: int = 0
    #: prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries_total)
    cache_queries: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    #: (prompt, cached) tokens of recent prefills, for the cache_hit_rate gauge
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=256))

    def cache_hit_rate(self) -> float:
        prompt = sum(p for p, _ in self.recent)
        return sum(c for _, c in self.recent) / prompt if prompt else 0.0


def render_metrics(
    m: Metrics, *, model_name: str, role: str, running: int, queued: int, inflight: int
) -> str:
    """Prometheus exposition of one engine under SGLang's metric names (engines.md §4)."""
    labels = f'model_name="{model_name}",engine_type="{role}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float) -> None:
        lines.extend([f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"])

    metric("sglang:num_running_reqs", "gauge", running)
    metric("sglang:num_queue_reqs", "gauge", queued)
    metric("sglang:cache_hit_rate", "gauge", m.cache_hit_rate())
    metric("sglang:prompt_tokens_total", "counter", m.prompt_tokens)
    metric("sglang:generation_tokens_total", "counter", m.generation_tokens)
    metric("sglang:cached_tokens_total", "counter", m.cached_tokens)
    metric("sglang:num_requests_total", "counter", m.requests)
    metric("sglang:num_aborted_requests_total", "counter", m.aborted_requests)
    # not an SGLang metric: what the drain order waits on
    metric("pdscale_sim:inflight_requests", "gauge", inflight)
    for name, hist in (
        ("sglang:time_to_first_token_seconds", m.ttft),
        ("sglang:inter_token_latency_seconds", m.itl),
        ("sglang:e2e_request_latency_seconds", m.e2e),
    ):
        lines.append(f"# TYPE {name} histogram")
        lines.extend(hist.lines(name, labels))
    return "\n".join(lines) + "\n"


def render_vllm_metrics(
    m: Metrics, *, model_name: str, running: int, waiting: int, inflight: int
) -> str:
    """Prometheus exposition of one engine under vLLM's (V1) metric names and labels.

    The role is not a label (vLLM does not know it); Prometheus adds it from the pod. Aborted
    requests are a ``finished_reason`` of ``request_success_total``, as in vLLM."""
    labels = f'engine="0",model_name="{model_name}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, extra: str = "", declare: bool = True) -> None:
        if declare:
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}{extra}}} {value}")

    metric("vllm:num_requests_running", "gauge", running)
    metric("vllm:num_requests_waiting", "gauge", waiting)
    metric("vllm:request_success_total", "counter", m.finished_requests,
           ',finished_reason="length"')  # fmt: skip
    metric("vllm:request_success_total", "counter", m.aborted_requests,
           ',finished_reason="abort"', declare=False)  # fmt: skip
    metric("vllm:prompt_tokens_total", "counter", m.prompt_tokens)
    metric("vllm:generation_tokens_total", "counter", m.generation_tokens)
    metric("vllm:prefix_cache_queries_total", "counter", m.cache_queries)
    metric("vllm:prefix_cache_hits_total", "counter", m.cached_tokens)
    # not a vLLM metric: what the sim's own drain waits on (includes uncollected KV)
    metric("pdscale_sim:inflight_requests", "gauge", inflight)
    for name, hist in (
        ("vllm:time_to_first_token_seconds", m.ttft),
        ("vllm:inter_token_latency_seconds", m.itl),
        ("vllm:e2e_request_latency_seconds", m.e2e),
    ):
        lines.append(f"# TYPE {name} histogram")
        lines.extend(hist.lines(name, labels))
    return "\n".join(lines) + "\n"


# -- vLLM's KV hand-off (NIXL's kv_transfer_params) -----------------------------------------


def remote_prefill_params(body: dict[str, Any]) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a decode request whose prompt was prefilled elsewhere
    (``do_remote_prefill`` and a ``remote_host``), or None: then the decode prefills locally,
    as vLLM does."""
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    if params.get("remote_host") is None or params.get("remote_port") is None:
        return None
    return params


def wants_remote_decode(body: dict[str, Any]) -> bool:
    """A prefill request whose KV a remote decode will read (the router sets this)."""
    params = body.get("kv_transfer_params")
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def prefill_kv_params(
    *, engine_id: str, host: str, port: int | None, request_id: int, blocks: int
) -> dict[str, Any]:
    """What a vLLM prefill with NIXL returns for the decode to read its KV: this instance
    (engine id, side channel host and port), its blocks and the request to collect. The sim's
    side channel is its bootstrap server; ``remote_request_id`` is the room to collect."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }


# -- response formats ------------------------------------------------------------------------


def token_text(index: int) -> str:
    """The text of output token ``index``: one word, so clients can count tokens."""
    return f"t{index} "


def finish_reason(api: str, done: bool, n: int) -> Any:
    if not done:
        return None
    return {"type": "length", "length": n} if api == "generate" else "length"


def stream_chunk(api: str, rid: str, model: str, index: int, n_total: int, meta: dict) -> dict:
    """One streamed chunk carrying output token ``index`` (0-based) of ``n_total``."""
    done = index == n_total - 1
    if api == "generate":
        text = "".join(token_text(i) for i in range(index + 1))  # SGLang streams cumulative text
        info = {**meta, "id": rid, "completion_tokens": index + 1,
                "finish_reason": finish_reason(api, done, n_total)}  # fmt: skip
        return {"text": text, "meta_info": info, "index": 0}
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(api, done, n_total)}
    if api == "chat":
        delta: dict[str, Any] = {"content": token_text(index)}
        if index == 0:
            delta["role"] = "assistant"
        choice["delta"] = delta
        kind = "chat.completion.chunk"
    else:
        choice["text"] = token_text(index)
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip


def full_response(api: str, rid: str, model: str, n: int, meta: dict) -> dict:
    """The non-streaming answer with ``n`` output tokens."""
    text = "".join(token_text(i) for i in range(n))
    if api == "generate":
        info = {
            **meta,
            "id": rid,
            "completion_tokens": n,
            "finish_reason": finish_reason(api, True, n),
        }
        return {"text": text, "meta_info": info}
    usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": n,
             "total_tokens": meta["prompt_tokens"] + n,
             "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}  # fmt: skip
    if api == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length"}  # fmt: skip
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage}  # fmt: skip


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


# -- the engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    role: str
    host: str
    port: int
    #: prefill only: where the bootstrap (KV hand-off) server listens, on ``host``
    bootstrap_port: int | None = None
    model_name: str = "sim-model"
    #: model seconds per wall second (10 = everything runs ten times faster)
    time_compression: float = 1.0
    prefix_cache_tokens: int = 1_000_000
    block_tokens: int = 64
    #: decode batch cap (SGLang --max-running-requests); more requests wait in the queue
    max_running_requests: int = 256
    #: decode waits this long for its room's prefill (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)
    waiting_timeout_seconds: float = 300.0
    #: prefill keeps an uncollected room's KV this long (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)
    bootstrap_timeout_seconds: float = 300.0
    #: simulated warm-up: /health answers 503 for this long after start (wall seconds)
    startup_seconds: float = 0.0
    #: or: warm until this wall-clock moment (Unix seconds), the moment its pod turns Ready
    ready_at_unix_seconds: float | None = None
    #: a drain that wants to exit gives up waiting for in-flight work after this long
    drain_timeout_seconds: float = 600.0
    #: reported as ``model_path``; the router loads a tokenizer from it, from the Hugging Face
    #: hub unless it is a local directory with a tokenizer.json (see write_word_tokenizer)
    model_path: str | None = None
    #: which engine's API and metric names to speak: "sglang" or "vllm"
    dialect: str = "sglang"


DIALECTS = ("sglang", "vllm")


class Room:
    """The prefill side of one bootstrap room: computed-or-not and collected-or-not."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.input_tokens = 0
        self.cached_tokens = 0
        self.owned = False  # a prefill request for this room arrived (else only a decode poll)
        self.serving = False  # its HTTP handler still runs (and is counted as such)
        self.failed = False  # the prefill was refused: the decode half must fail, not wait
        self.collected = False
        self.created = time.monotonic()


@dataclass
class DecodeSequence:
    """A decode sequence in the running batch."""

    context_tokens: int
    remaining: int
    tokens: asyncio.Queue[float | None]


class EngineBusy(Exception):
    """The engine refuses new work (warming up or draining) -> HTTP 503."""


class SimEngine:
    def __init__(self, config: EngineConfig, timing: TimingModel) -> None:
        if config.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {config.role!r}")
        if config.time_compression <= 0:
            raise ValueError("time_compression must be > 0")
        if config.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, not {config.dialect!r}")
        if config.dialect == "vllm" and config.role == "prefill" and not config.bootstrap_port:
            raise ValueError("a vllm-dialect prefill needs a bootstrap port (its KV side channel)")
        self.config = config
        self.timing = timing
        self.metrics = Metrics()
        self.cache = PrefixCache(config.prefix_cache_tokens, config.block_tokens)
        # one warm-up clock: a given moment (its pod's Ready), else startup_seconds from now
        self.ready_at = (config.ready_at_unix_seconds if config.ready_at_unix_seconds is not None
                         else time.time() + config.startup_seconds)
        self.draining = False
        self.exit_requested = asyncio.Event()
        self._handlers = 0  # HTTP requests being served (prefill and decode)
        self._rooms: dict[int, Room] = {}
        self._prefill_queue: asyncio.Queue[tuple[list[str], Room, asyncio.Future[None]]] = (
            asyncio.Queue()
        )
        self._prefill_running = 0
        self._decode_waiting = 0  # waiting for KV or for a batch slot
        self._batch: list[DecodeSequence] = []
        self._batch_changed = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_running_requests)
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: prompts this instance computed itself on the decode side (no remote prefill)
        self.local_prefills = 0
        self.engine_id = uuid.uuid4().hex

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None)
        )
        if self.config.role == "prefill":
            self._tasks.append(asyncio.create_task(self._prefill_loop()))
            self._tasks.append(asyncio.create_task(self._expire_rooms()))
        else:
            self._tasks.append(asyncio.create_task(self._decode_loop()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    def wall(self, model_seconds: float) -> float:
        return model_seconds / self.config.time_compression

    @property
    def ready(self) -> bool:
        return not self.draining and time.time() >= self.ready_at

    def inflight(self) -> int:
        """Requests not finished: being served, plus prefilled KV not yet collected by decode."""
        uncollected = sum(
            1 for r in self._rooms.values() if r.owned and not r.serving and not r.collected
        )
        return self._handlers + uncollected

    def running(self) -> int:
        return self._prefill_running if self.config.role == "prefill" else len(self._batch)

    def queued(self) -> int:
        if self.config.role == "prefill":
            return self._prefill_queue.qsize()
        return self._decode_waiting

    def _update_idle(self) -> None:
        if self.inflight() == 0:
            self._idle.set()
        else:
            self._idle.clear()

    def begin_drain(self, *, exit_when_done: bool) -> None:
        if not self.draining:
            log.info("draining: %d in flight", self.inflight())
        self.draining = True
        if exit_when_done:
            self.exit_requested.set()

    async def wait_idle(self, timeout_seconds: float) -> bool:
        """True when nothing is in flight, False if ``timeout_seconds`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_seconds)
            return True
        except TimeoutError:
            return False

    def state(self) -> dict[str, Any]:
        return {
            "role": self.config.role,
            "ready": self.ready,
            "draining": self.draining,
            "inflight": self.inflight(),
            "running": self.running(),
            "queued": self.queued(),
            "cached_tokens_in_cache": len(self.cache),
            "dialect": self.config.dialect,
            "local_prefills": self.local_prefills,
        }

    # -- prefill --------------------------------------------------------------------------
    def _room(self, room_id: int) -> Room:
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = Room()
        return room

    async def _prefill_loop(self) -> None:
        # one prompt at a time, first come first served: queueing delay is part of TTFT
        while True:
            tokens, room, finished = await self._prefill_queue.get()
            if finished.cancelled():
                continue
            self._prefill_running = 1
            try:
                cached = self.cache.match(tokens)
                await asyncio.sleep(self.wall(self.timing.prefill_seconds(len(tokens), cached)))
                self.cache.insert(tokens)
                room.input_tokens, room.cached_tokens = len(tokens), cached
                self.metrics.recent.append((len(tokens), cached))
                room.done.set()
                if not finished.done():
                    finished.set_result(None)
            finally:
                self._prefill_running = 0

    async def _expire_rooms(self) -> None:
        # KV nobody collected (decode gone, or a poll for a room whose prefill never came)
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for room_id, room in list(self._rooms.items()):
                age = now - room.created
                if room.collected or age > self.config.bootstrap_timeout_seconds:
                    del self._rooms[room_id]
            self._update_idle()

    async def prefill(self, tokens: list[str], room_id: int | None) -> Room:
        """Queue and compute one prompt; the room then waits for its decode to collect it."""
        room = self._room(room_id) if room_id is not None else Room()
        room.owned = room.serving = True
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._prefill_queue.put((tokens, room, finished))
        try:
            await finished
        except asyncio.CancelledError:
            # the router gave up on this prefill: its decode half must not wait for the KV
            room.collected = room.failed = True
            room.done.set()
            raise
        if room_id is None:
            room.collected = True
        return room

    async def collect(self, room_id: int) -> Room:
        """Bootstrap server side: wait until the room's prefill is done, then hand it over."""
        room = self._room(room_id)
        await asyncio.wait_for(room.done.wait(), self.config.waiting_timeout_seconds)
        room.collected = True
        self._update_idle()
        return room

    # -- decode ---------------------------------------------------------------------------
    async def _fetch_kv(self, body: dict[str, Any], tokens: list[str]) -> tuple[int, int]:
        """Wait for this request's prefill (by room) and the KV transfer; (input, cached)."""
        if self.config.dialect == "vllm":
            params = remote_prefill_params(body) or {}
            host, port = params.get("remote_host"), params.get("remote_port")
            room = params.get("remote_request_id") if params else None
        else:
            host, port, room = (
                body.get("bootstrap_host"),
                body.get("bootstrap_port"),
                body.get("bootstrap_room"),
            )
        if host is None or room is None:
            # not disaggregated: compute the prefill here, without a queue
            self.local_prefills += 1
            cached = self.cache.match(tokens)
            await asyncio.sleep(self.wall(self.timing.prefill_seconds(len(tokens), cached)))
            self.cache.insert(tokens)
            if self.config.dialect == "vllm":
                self.metrics.cache_queries += len(tokens)
                self.metrics.cached_tokens += cached
            return len(tokens), cached
        if not is_loopback(str(host)):
            raise ValueError(f"bootstrap_host {host!r} is not a loopback address")
        assert self._session is not None
        url = f"http://{host}:{port}/sim/kv/{int(room)}"
        async with self._session.get(
            url, timeout=ClientTimeout(total=self.config.waiting_timeout_seconds + 5)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"bootstrap {url} answered {resp.status}")
            info = await resp.json()
        await asyncio.sleep(self.wall(self.timing.kv_transfer_seconds(info["input_tokens"])))
        return int(info["input_tokens"]), int(info["cached_tokens"])

    async def _decode_loop(self) -> None:
        # continuous batching: every step emits one token to every running sequence, and a
        # step takes TPOT(batch, mean context). Deadlines, not sleeps, so error doesn't add up.
        next_step = time.monotonic()
        while True:
            if not self._batch:
                self._batch_changed.clear()
                await self._batch_changed.wait()
                next_step = time.monotonic()
            batch = len(self._batch)
            mean_context = sum(s.context_tokens for s in self._batch) / batch
            step = self.wall(self.timing.tpot_seconds(batch, mean_context))
            now = time.monotonic()
            next_step = max(next_step, now - step) + step
            await asyncio.sleep(max(next_step - now, 0.0))
            stamp = time.monotonic()
            for seq in list(self._batch):
                seq.remaining -= 1
                seq.context_tokens += 1
                seq.tokens.put_nowait(stamp)
                if seq.remaining <= 0:
                    seq.tokens.put_nowait(None)
                    self._batch.remove(seq)

    async def decode(self, body: dict[str, Any], tokens: list[str], n_out: int):
        """Async iterator of token timestamps: the first right after the KV arrives (it was
        sampled by prefill), then one per decode step. Yields (index, wall time, meta)."""
        self._decode_waiting += 1
        waiting = True
        try:
            n_in, cached = await self._fetch_kv(body, tokens)
            meta = {"prompt_tokens": n_in, "cached_tokens": cached}
            await self._slots.acquire()
            self._decode_waiting -= 1
            waiting = False
        except BaseException:
            if waiting:
                self._decode_waiting -= 1
            raise
        seq = DecodeSequence(context_tokens=n_in + 1, remaining=n_out - 1, tokens=asyncio.Queue())
        try:
            yield 0, time.monotonic(), meta
            if seq.remaining > 0:
                self._batch.append(seq)
                self._batch_changed.set()
                index = 1
                while (stamp := await seq.tokens.get()) is not None:
                    yield index, stamp, meta
                    index += 1
        finally:
            if seq in self._batch:
                self._batch.remove(seq)
            self._slots.release()

    # -- HTTP -----------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self.ready:
            raise EngineBusy("draining" if self.draining else "warming up")
        self._handlers += 1
        self._idle.clear()

    def _end(self) -> None:
        self._handlers -= 1
        self._update_idle()

    async def handle_generate(self, request: web.Request, api: str) -> web.StreamResponse:
        try:
            self._begin()
        except EngineBusy as exc:
            await self._refuse_room(request)
            return web.json_response(
                {"error": {"message": f"engine {exc}", "code": 503}}, status=503
            )
        arrived = time.monotonic()
        try:
            body = await request.json()
            tokens = prompt_tokens(body)
            n_out = max_new_tokens(api, body)
            rid = str(body.get("rid") or uuid.uuid4().hex)
            self.metrics.requests += 1
            if self.config.role == "prefill":
                return await self._serve_prefill(request, api, body, tokens, rid, arrived)
            return await self._serve_decode(request, api, body, tokens, n_out, rid, arrived)
        except asyncio.CancelledError:
            self.metrics.aborted_requests += 1
            raise
        except ConnectionResetError:
            # the router (or its client) went away mid-request; nobody reads the answer
            self.metrics.aborted_requests += 1
            return web.Response(status=499)
        finally:
            self._end()

    async def _refuse_room(self, request: web.Request) -> None:
        # A refused prefill must fail its room at once, as SGLang's bootstrap does: otherwise
        # the decode half, sent at the same time, waits out the whole waiting timeout.
        if self.config.role != "prefill":
            return
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            room_id = (await request.json()).get("bootstrap_room")
            if room_id is not None:
                room = self._room(int(room_id))
                room.failed = True
                room.done.set()

    async def _serve_prefill(self, request, api, body, tokens, rid, arrived):
        if self.config.dialect == "vllm":
            # vLLM: no room from the router; mint one and name it in kv_transfer_params
            room_id = uuid.uuid4().int >> 65 if wants_remote_decode(body) else None
        else:
            room_id = body.get("bootstrap_room")
        room = await self.prefill(tokens, int(room_id) if room_id is not None else None)
        try:
            return await self._answer_prefill(request, api, body, rid, arrived, room, room_id)
        finally:
            room.serving = False  # from here on only the uncollected KV keeps it in flight

    async def _answer_prefill(self, request, api, body, rid, arrived, room, room_id):
        self.metrics.prompt_tokens += room.input_tokens
        self.metrics.cached_tokens += room.cached_tokens
        self.metrics.ttft.observe(time.monotonic() - arrived)
        self.metrics.e2e.observe(time.monotonic() - arrived)
        meta = {"prompt_tokens": room.input_tokens, "cached_tokens": room.cached_tokens}
        extra: dict[str, Any] = {}
        if self.config.dialect == "vllm":
            self.metrics.cache_queries += room.input_tokens
            self.metrics.generation_tokens += 1
            self.metrics.finished_requests += 1
            if room_id is not None:
                extra["kv_transfer_params"] = prefill_kv_params(
                    engine_id=self.engine_id, host=self.config.host,
                    port=self.config.bootstrap_port, request_id=room_id,
                    blocks=-(-room.input_tokens // self.config.block_tokens),
                )  # fmt: skip
        # Like SGLang's prefill server (and vLLM's with max_tokens=1): the answer carries the
        # one token prefill sampled.
        if not body.get("stream"):
            answer = full_response(api, rid, self.config.model_name, 1, meta)
            return web.json_response({**answer, **extra})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = stream_chunk(api, rid, self.config.model_name, 0, 1, meta)
        await resp.write(sse({**chunk, **extra}))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def _serve_decode(self, request, api, body, tokens, n_out, rid, arrived):
        model = self.config.model_name
        stream = bool(body.get("stream"))
        resp: web.StreamResponse | None = None
        previous = None
        meta: dict[str, Any] = {}
        try:
            async for index, stamp, meta in self.decode(body, tokens, n_out):
                if previous is None:
                    self.metrics.ttft.observe(stamp - arrived)
                else:
                    self.metrics.itl.observe(stamp - previous)
                previous = stamp
                self.metrics.generation_tokens += 1
                if stream:
                    if resp is None:
                        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                        await resp.prepare(request)
                    await resp.write(sse(stream_chunk(api, rid, model, index, n_out, meta)))
        except (ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            # KV never came (prefill died or timed out): SGLang reports this as an abort
            self.metrics.aborted_requests += 1
            log.warning("request %s failed waiting for KV: %s", rid, exc)
            error = {"error": {"message": f"KV transfer failed: {exc}", "code": 500}}
            if resp is None:
                return web.json_response(error, status=500)
            await resp.write(sse(error))
            return resp  # no [DONE]: the client sees a truncated stream
        self.metrics.e2e.observe(time.monotonic() - arrived)
        if self.config.dialect == "vllm":
            # vLLM counts every finished request's prompt, prefilled here or not
            self.metrics.prompt_tokens += int(meta.get("prompt_tokens", len(tokens)))
            self.metrics.finished_requests += 1
        if not stream:
            return web.json_response(full_response(api, rid, model, n_out, meta))
        if api == "chat" and (body.get("stream_options") or {}).get("include_usage"):
            usage = full_response(api, rid, model, n_out, meta)["usage"]
            await resp.write(sse({"id": rid, "object": "chat.completion.chunk", "model": model,
                                  "choices": [], "usage": usage}))  # fmt: skip
        assert resp is not None
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="")
        return web.Response(status=503, text="draining" if self.draining else "warming up")

    def server_info(self) -> dict[str, Any]:
        c = self.config
        return {
            "model_path": c.model_path or c.model_name,
            "served_model_name": c.model_name,
            "tokenizer_path": c.model_path or c.model_name,
            "disaggregation_mode": c.role,
            "disaggregation_bootstrap_port": c.bootstrap_port,
            "tp_size": 8,
            "dp_size": 1,
            "page_size": c.block_tokens,
            "max_running_requests": c.max_running_requests,
            "version": "pdscale-sim",
        }

    async def handle_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def handle_model_info(self, request: web.Request) -> web.Response:
        name = self.config.model_name
        return web.json_response(
            {"model_path": self.config.model_path or name, "served_model_name": name,
             "is_generation": True}
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model_name, "object": "model"}]}
        )

    async def handle_get_load(self, request: web.Request) -> web.Response:
        # SGLang's shape: one entry per DP rank; num_reqs counts everything in flight here
        context = sum(s.context_tokens for s in self._batch)
        return web.json_response([{
            "dp_rank": 0, "num_reqs": self.inflight(), "num_waiting_reqs": self.queued(),
            "num_tokens": context,
        }])  # fmt: skip

    async def handle_metrics(self, request: web.Request) -> web.Response:
        if self.config.dialect == "vllm":
            text = render_vllm_metrics(
                self.metrics, model_name=self.config.model_name, running=self.running(),
                waiting=self.queued(), inflight=self.inflight(),
            )  # fmt: skip
            return web.Response(text=text, content_type="text/plain")
        text = render_metrics(
            self.metrics, model_name=self.config.model_name, role=self.config.role,
            running=self.running(), queued=self.queued(), inflight=self.inflight(),
        )  # fmt: skip
        return web.Response(text=text, content_type="text/plain")

    async def handle_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def handle_drain(self, request: web.Request) -> web.Response:
        self.begin_drain(exit_when_done=request.query.get("exit") in ("1", "true"))
        return web.json_response(self.state())

    async def handle_kv(self, request: web.Request) -> web.Response:
        try:
            room = await self.collect(int(request.match_info["room"]))
        except TimeoutError:
            return web.json_response({"error": "prefill of this room never finished"}, status=504)
        if room.failed:
            return web.json_response({"error": "prefill of this room was refused"}, status=409)
        return web.json_response(
            {"input_tokens": room.input_tokens, "cached_tokens": room.cached_tokens}
        )

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "pdscale-sim"})

    def vllm_app(self) -> web.Application:
        """vLLM's OpenAI server: no /generate, /server_info or /get_load."""
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        for path, api in (("/v1/chat/completions", "chat"), ("/v1/completions", "completions")):
            r.add_post(path, functools.partial(self.handle_generate, api=api))
        r.add_get("/health", self.handle_health)
        r.add_get("/version", self.handle_version)
        r.add_get("/v1/models", self.handle_models)
        r.add_get("/metrics", self.handle_metrics)
        r.add_get("/sim/state", self.handle_state)
        r.add_post("/sim/drain", self.handle_drain)
        return app

    def app(self) -> web.Application:
        if self.config.dialect == "vllm":
            return self.vllm_app()
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        for path, api in (
            ("/generate", "generate"),
            ("/v1/chat/completions", "chat"),
            ("/v1/completions", "completions"),
        ):
            r.add_post(path, functools.partial(self.handle_generate, api=api))
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.handle_health)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.handle_server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.handle_model_info)
        r.add_get("/v1/models", self.handle_models)
        r.add_get("/get_load", self.handle_get_load)
        r.add_get("/metrics", self.handle_metrics)
        r.add_get("/sim/state", self.handle_state)
        r.add_post("/sim/drain", self.handle_drain)
        return app

    async def handle_bootstrap_health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/sim/kv/{room}", self.handle_kv)
        app.router.add_get("/health", self.handle_bootstrap_health)
        return app


# -- process ---------------------------------------------------------------------------------


class _DropHttp2Probe(logging.Filter):
    """The router opens each worker with an HTTP/2 prior-knowledge probe (gRPC detection);
    aiohttp refuses it and logs a traceback per worker. The refusal is the intended answer."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


async def serve(engine: SimEngine, *, on_ready: Callable[[], None] | None = None) -> int:
    """Run ``engine`` until SIGTERM/SIGINT (then drain) or a drain with exit; returns exit code."""
    await engine.start()
    runners = [web.AppRunner(engine.app(), access_log=None)]
    sites = [(engine.config.host, engine.config.port)]
    if engine.config.role == "prefill" and engine.config.bootstrap_port:
        runners.append(web.AppRunner(engine.bootstrap_app(), access_log=None))
        sites.append((engine.config.host, engine.config.bootstrap_port))
    for runner, (host, port) in zip(runners, sites, strict=True):
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=1024).start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, functools.partial(engine.begin_drain, exit_when_done=True))
    if on_ready:
        on_ready()
    await engine.exit_requested.wait()
    drained = await engine.wait_idle(engine.config.drain_timeout_seconds)
    log.info("exiting: drained=%s inflight=%d", drained, engine.inflight())
    for runner in reversed(runners):
        await runner.cleanup()
    await engine.close()
    return 0 if drained else 3


def add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("timing (model seconds; see LinearTiming)")
    group.add_argument("--profile", help="use the planner's performance model for this profile "
                       "(shipped name or YAML path) instead of the linear model below")  # fmt: skip
    for f in dataclasses.fields(LinearTiming):
        group.add_argument("--" + f.name.replace("_", "-"), type=float, default=f.default)


def timing_from_args(args: argparse.Namespace) -> TimingModel:
    if args.profile:
        return planner_timing(args.profile)
    return LinearTiming(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LinearTiming)})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pdscale.testbed.simengine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--dialect", choices=DIALECTS, default="sglang",
                   help="speak SGLang's API and metric names (default), or vLLM's (PD via "
                   "vllm-router with kv_transfer_params, vllm: metrics, no /get_load)")  # fmt: skip
    p.add_argument("--host", required=True, help="a 127.0.0.0/8 address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-port", type=int, default=8998,
                   help="prefill only (the vllm dialect's KV side channel too)")  # fmt: skip
    p.add_argument("--model-name", default="sim-model")
    p.add_argument("--time-compression", type=float, default=1.0)
    p.add_argument("--prefix-cache-tokens", type=int, default=1_000_000)
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--waiting-timeout-seconds", type=float, default=300.0)
    p.add_argument("--bootstrap-timeout-seconds", type=float, default=300.0)
    p.add_argument("--startup-seconds", type=float, default=0.0)
    p.add_argument("--ready-at", type=float, default=None, dest="ready_at_unix_seconds",
                   help="warm until this Unix time instead (overrides --startup-seconds)")
    p.add_argument("--drain-timeout-seconds", type=float, default=600.0)
    p.add_argument("--model-path", help="directory reported to the router as model_path; a "
                   "word-level tokenizer.json is written there so the router loads it locally "
                   "instead of asking the Hugging Face hub (default: --model-name, and the "
                   "router tries the hub)")  # fmt: skip
    p.add_argument("--log-level", default="INFO")
    add_timing_arguments(p)
    return p


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        role=args.role, host=args.host, port=args.port,
        bootstrap_port=args.bootstrap_port if args.role == "prefill" else None,
        model_name=args.model_name, time_compression=args.time_compression,
        prefix_cache_tokens=args.prefix_cache_tokens, block_tokens=args.block_tokens,
        max_running_requests=args.max_running_requests,
        waiting_timeout_seconds=args.waiting_timeout_seconds,
        bootstrap_timeout_seconds=args.bootstrap_timeout_seconds,
        startup_seconds=args.startup_seconds, ready_at_unix_seconds=args.ready_at_unix_seconds,
        drain_timeout_seconds=args.drain_timeout_seconds,
        model_path=args.model_path, dialect=args.dialect,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not is_loopback(args.host):
        print(f"--host {args.host} is not a loopback address; refusing", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_DropHttp2Probe())
    config, timing = config_from_args(args), timing_from_args(args)
    if config.model_path:
        write_word_tokenizer(config.model_path)

    def ready() -> None:
        print(f"simengine ready role={args.role} url=http://{args.host}:{args.port}", flush=True)

    return asyncio.run(serve(SimEngine(config, timing), on_ready=ready))


if __name__ == "__main__":
    sys.exit(main())
