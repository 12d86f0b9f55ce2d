"""One simulated engine's settings (the command line's options), apart from the engine so the
dialects can read them without importing the engine that holds them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """One engine's settings (the command line's options)."""

    #: "prefill" or "decode" (a :class:`~pdscale.planner.observe.Role` value)
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
    #: prefill pass budget in tokens (SGLang --chunked-prefill-size, vLLM
    #: --max-num-batched-tokens; both 8,192 on H200-class GPUs): a pass takes waiting prompts
    #: until it is spent, and a prompt that does not fit whole goes on in the next pass
    prefill_chunk_tokens: int = 8192
    #: decode batch cap (SGLang --max-running-requests); more requests wait in the queue
    max_running_requests: int = 256
    #: decode waits this long for its room's prefill (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)
    waiting_timeout_seconds: float = 300.0
    #: an SGLang prefill waits this long for its decode's handshake, and keeps a room nobody
    #: collects this long (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)
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
    #: SGLang --decode-log-interval: a decode refreshes its gauges every this many steps
    decode_log_interval: int = 40
    #: an idle SGLang scheduler refreshes its gauges when this long passed since the last
    #: refresh (wall seconds; SGLang's check_memory uses 30 s)
    idle_log_interval_seconds: float = 30.0
    #: histogram buckets (SGLang --bucket-time-to-first-token, --bucket-inter-token-latency,
    #: --bucket-e2e-request-latency); None = the dialect's upstream defaults
    bucket_time_to_first_token: tuple[float, ...] | None = None
    bucket_inter_token_latency: tuple[float, ...] | None = None
    bucket_e2e_request_latency: tuple[float, ...] | None = None
    #: decode KV memory in tokens (SGLang --max-total-tokens): a request waits in the prealloc
    #: queue until its prompt + output fit; None = unlimited. Also token_usage's denominator
    #: (prefix_cache_tokens when None).
    max_total_tokens: int | None = None
    #: vLLM prefill (NIXL): a finished request's KV stays pinned this long for its decode to
    #: pull (wall seconds), then is freed and a later pull fails
    kv_lease_seconds: float = 30.0
    #: append one JSON line per request taken (its prompt's digest, ``wire.prompt_key``, its
    #: ``rid`` and this engine's role and port): which instance served which request, for a
    #: replay that must route as the live router did (bench/engine_fidelity.py). The
    #: harness's, not an engine's: SGLang logs no such file. None = no log.
    request_log: str | None = None
    #: the engine runs in a pod's own network namespace (the kind tier's serving image): its
    #: own address and its peers' (the prefill's bootstrap host) may be the pod network's
    pod_network: bool = False
