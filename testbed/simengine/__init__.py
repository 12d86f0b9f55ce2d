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
- load and metrics: ``GET /v1/loads?include=core,disagg,queues,memory`` (the smg gateway's
  poll), ``GET /get_load`` (the deprecated shim over it; sglang-router's ``/get_loads``) and
  ``GET /metrics``;
- a tokenizer: the router loads one for the ``model_path`` a worker reports, from the Hugging
  Face hub unless it is a local directory with a tokenizer.json; ``--model-path DIR`` writes
  one there, so nothing leaves the machine.

Pairing works as in SGLang: a prefill instance runs a bootstrap server on its own host at
``--bootstrap-port``; the decode instance, once it has KV memory for the request, asks it
(``GET /sim/kv/{room}``, a long poll) for the KV of its room. Until then the prefill request
waits in its bootstrap queue; then it is computed, its KV is held for the transfer time (the
inflight queue) and handed over, and only then does the prefill request finish, answer and
count. A prefill that refuses a request (draining) fails its room at once, so the decode half
does not wait for nothing. What every queue, counter, gauge and endpoint means, with the
upstream file it copies and the test that checks it: docs/conformance.md.

``--dialect vllm`` speaks vLLM's part instead, as vllm-router 0.1.17 uses it in PD mode with
``--kv-connector nixl`` (observed; tests/loop/README.md): the router sends the prefill first
(``max_tokens`` 1, non-streaming, ``kv_transfer_params.do_remote_decode``), and then the
original request to the decode with the ``kv_transfer_params`` the prefill answered. The sim's
prefill names itself there (``remote_host``, ``remote_port`` = its bootstrap server, standing
in for NIXL's side channel, ``remote_request_id`` = the room), and the decode collects that
room as above (counted as waiting, reason ``deferred``) and decodes; without them it
prefills locally. The prefill's request finishes with its one token *before* the pull; its KV
stays pinned until the pull ends or ``--kv-lease-seconds`` pass (``/sim/state``
``kv_pinned_requests``; released vLLM has no metric for it). No ``/generate``,
``/server_info`` or ``/get_load``; ``/metrics`` has vLLM's names (``vllm:...``, label
``model_name``).

Time follows a pluggable :class:`TimingModel` (model seconds), divided by
``--time-compression``: a compressed engine behaves like one that is that many times faster in
every respect, so latencies observed by clients and in ``/metrics`` are wall-clock seconds.

Drain: ``SIGTERM`` or ``POST /sim/drain`` makes ``/health`` answer 503 and new requests get 503,
in-flight requests finish; after SIGTERM (or ``/sim/drain?exit=1``) the process exits once
no request is being served (exit status 0) or ``--drain-timeout-seconds`` passed (status 3).
An SGLang prefill request is served until its KV transfer ends; a vLLM prefill does not wait
for its pinned KV, as vLLM does not. ``GET /sim/state`` exposes the in-flight count and every
queue.

aiohttp rather than the standard library: it is already installed (kopf depends on it), and the
engine needs an asyncio HTTP server that can stream and an HTTP client (decode -> prefill
bootstrap) in the same event loop, which the standard library offers only synchronously.
"""

# Layout (the docstring above is also the command line's --help): engine (the core every
# dialect shares: queues, timing, rooms, the HTTP handlers common to both), config (its
# settings) and room (a bootstrap room), which the dialects read too, dialect (what a
# dialect decides) with sglang and vllm (each dialect's endpoints, metric names and KV
# hand-off), timing, prefix_cache, metrics, wire (request parsing, response bodies),
# tokenizer and cli (the process). The names below are the package's public surface.

from .cli import (
    add_timing_arguments,
    build_parser,
    config_from_args,
    engine_flags,
    main,
    serve,
    timing_from_args,
)
from .config import EngineConfig
from .dialect import Dialect, EngineCore
from .engine import (
    DIALECT_CLASSES,
    DIALECTS,
    DecodeSequence,
    EngineBusy,
    KvUnavailable,
    SimEngine,
)
from .metrics import (
    SGLANG_E2E_BUCKETS_SECONDS,
    SGLANG_ITL_BUCKETS_SECONDS,
    SGLANG_TTFT_BUCKETS_SECONDS,
    VLLM_E2E_BUCKETS_SECONDS,
    VLLM_ITL_BUCKETS_SECONDS,
    VLLM_TTFT_BUCKETS_SECONDS,
    Exposition,
    Histogram,
    Metrics,
)
from .prefix_cache import PrefixCache
from .room import Room
from .sglang import LOADS_SECTIONS, SGLang, render_metrics
from .timing import LinearTiming, TimingModel, planner_timing
from .tokenizer import WORD_TOKENIZER, write_word_tokenizer
from .vllm import (
    Vllm,
    prefill_kv_params,
    remote_prefill_params,
    render_vllm_metrics,
    wants_remote_decode,
)
from .wire import (
    finish_reason,
    full_response,
    is_loopback,
    max_new_tokens,
    prompt_tokens,
    sse,
    stream_chunk,
    token_text,
)

__all__ = [
    "DIALECTS", "DIALECT_CLASSES", "LOADS_SECTIONS", "SGLANG_E2E_BUCKETS_SECONDS",
    "SGLANG_ITL_BUCKETS_SECONDS", "SGLANG_TTFT_BUCKETS_SECONDS", "VLLM_E2E_BUCKETS_SECONDS",
    "VLLM_ITL_BUCKETS_SECONDS", "VLLM_TTFT_BUCKETS_SECONDS", "WORD_TOKENIZER", "DecodeSequence",
    "Dialect", "EngineBusy", "EngineConfig", "EngineCore", "Exposition", "Histogram", "KvUnavailable",
    "LinearTiming", "Metrics", "PrefixCache", "Room", "SGLang", "SimEngine", "TimingModel", "Vllm",
    "add_timing_arguments", "build_parser", "config_from_args", "engine_flags", "finish_reason",
    "full_response", "is_loopback", "main", "max_new_tokens", "planner_timing",
    "prefill_kv_params", "prompt_tokens", "remote_prefill_params", "render_metrics",
    "render_vllm_metrics", "serve", "sse", "stream_chunk", "timing_from_args", "token_text",
    "wants_remote_decode", "write_word_tokenizer",
]  # fmt: skip
