"""vLLM's dialect, as vllm-router 0.1.17 uses it in PD mode with ``--kv-connector nixl``
(observed; tests/loop/README.md).

The router sends the prefill first (``max_tokens`` 1, non-streaming,
``kv_transfer_params.do_remote_decode``), then the original request to the decode with the
``kv_transfer_params`` the prefill answered. The sim's prefill names itself there
(``remote_host``, ``remote_port`` = its bootstrap server, standing in for NIXL's side channel,
``remote_request_id`` = the room it minted), and the decode collects that room as in SGLang;
without them the decode prefills locally. No ``/generate``, ``/server_info`` or ``/get_load``;
``/metrics`` has vLLM's names (``vllm:...``, label ``model_name``), whose
``num_requests_running`` + ``num_requests_waiting`` are what the operator reads as in-flight
work.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from aiohttp import web

from pdscale.planner.observe import Role

from .dialect import Dialect
from .metrics import (
    VLLM_E2E_BUCKETS_SECONDS,
    VLLM_ITL_BUCKETS_SECONDS,
    VLLM_PROMPT_TOKENS_BUCKETS,
    VLLM_TTFT_BUCKETS_SECONDS,
    Exposition,
    Metrics,
)

if TYPE_CHECKING:
    from .dialect import EngineCore
    from .room import Room


def render_vllm_metrics(
    m: Metrics, *, model_name: str, running: int, waiting_capacity: int, waiting_deferred: int,
    inflight: int, kv_pinned: int = 0,
) -> str:
    """Prometheus exposition of one engine under vLLM's (V1) metric names and labels.

    ``num_requests_waiting`` counts every waiting request, those waiting for their remote KV
    (``deferred``) as well as those waiting for room (``capacity``). The role is not a label
    (vLLM does not know it); Prometheus adds it from the pod. Aborted requests are a
    ``finished_reason`` of ``request_success_total``, as in vLLM."""
    out = Exposition(f'engine="0",model_name="{model_name}"')
    out.sample("vllm:num_requests_running", "gauge", running)
    out.sample("vllm:num_requests_waiting", "gauge", waiting_capacity + waiting_deferred)
    out.sample("vllm:num_requests_waiting_by_reason", "gauge", waiting_capacity,
               ',reason="capacity"')  # fmt: skip
    out.sample("vllm:num_requests_waiting_by_reason", "gauge", waiting_deferred,
               ',reason="deferred"', declare=False)  # fmt: skip
    out.sample("vllm:request_success_total", "counter", m.finished_requests,
               ',finished_reason="length"')  # fmt: skip
    out.sample("vllm:request_success_total", "counter", m.aborted_requests,
               ',finished_reason="abort"', declare=False)  # fmt: skip
    out.sample("vllm:prompt_tokens_total", "counter", m.prompt_tokens)
    out.sample("vllm:generation_tokens_total", "counter", m.generation_tokens)
    out.sample("vllm:prefix_cache_queries_total", "counter", m.cache_queries)
    out.sample("vllm:prefix_cache_hits_total", "counter", m.cached_tokens)
    # not vLLM metrics: what the sim's own exit waits on, and the KV a prefill keeps pinned
    # for decodes that have not pulled it (released vLLM has no gauge for that)
    out.sample("pdscale_sim:inflight_requests", "gauge", inflight)
    out.sample("pdscale_sim:kv_pinned_requests", "gauge", kv_pinned)
    # not an engine metric: the requests' TPOT had each decode step its modelled length
    out.histograms_by("pdscale_sim:request_modelled_tpot_seconds", "cohort", m.modelled_tpot)
    # and the prompts' time on a prefill (queue and compute) had each pass its modelled length
    out.histograms_by("pdscale_sim:request_modelled_prefill_seconds", "cohort", m.modelled_prefill)
    out.histogram("vllm:time_to_first_token_seconds", m.ttft)
    out.histogram("vllm:inter_token_latency_seconds", m.itl)
    out.histogram("vllm:e2e_request_latency_seconds", m.e2e)
    out.histogram("vllm:request_prompt_tokens", m.prompt)
    out.histogram("vllm:request_prefill_time_seconds", m.prefill_forward)
    return out.text()


# -- the KV hand-off (NIXL's kv_transfer_params) --------------------------------------------


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


class Vllm(Dialect):
    name = "vllm"
    waits_for_handshake = False
    finishes_after_transfer = False
    pins_kv = True

    def __init__(self, engine: EngineCore) -> None:
        if engine.role == Role.PREFILL and not engine.config.bootstrap_port:
            raise ValueError("a vllm-dialect prefill needs a bootstrap port (its KV side channel)")
        super().__init__(engine)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/version", self.handle_version)

    prompt_buckets: ClassVar[tuple[float, ...]] = VLLM_PROMPT_TOKENS_BUCKETS

    def default_buckets(self) -> tuple[tuple[float, ...], ...]:
        return VLLM_TTFT_BUCKETS_SECONDS, VLLM_ITL_BUCKETS_SECONDS, VLLM_E2E_BUCKETS_SECONDS

    def render_metrics(self) -> str:
        # vLLM's gauges are the scheduler's state at its last step: live, in the sim
        e = self.engine
        q = e.queues()
        if e.role == Role.PREFILL:
            capacity, deferred = q["waiting"], 0
        else:
            capacity, deferred = q["waiting"] + q["prealloc"], q["transfer"]
        return render_vllm_metrics(
            e.metrics, model_name=e.config.model_name, running=q["running"],
            waiting_capacity=capacity, waiting_deferred=deferred, inflight=e.inflight(),
            kv_pinned=e.kv_held(),
        )  # fmt: skip

    # -- the KV hand-off: the prefill mints the room and names it in its answer -------------
    def prefill_room(self, body: dict[str, Any]) -> Any:
        return uuid.uuid4().int >> 65 if wants_remote_decode(body) else None

    def refused_room(self, body: dict[str, Any]) -> Any:
        return None  # the room is minted only by a prefill that runs: nobody waits on one

    def kv_source(self, body: dict[str, Any]) -> tuple[Any, Any, Any]:
        params = remote_prefill_params(body) or {}
        room = params.get("remote_request_id") if params else None
        return params.get("remote_host"), params.get("remote_port"), room

    def answer_prefill(self, room: Room, room_id: Any) -> dict[str, Any]:
        e = self.engine
        m = e.metrics
        m.prompt_tokens += room.input_tokens
        m.cache_queries += room.input_tokens
        m.cached_tokens += room.cached_tokens
        m.generation_tokens += 1
        m.finished_requests += 1
        m.prompt.observe(room.input_tokens)  # request_prompt_tokens: at finish, as the counter
        if room_id is None:
            return {}
        return {"kv_transfer_params": prefill_kv_params(
            engine_id=e.engine_id, host=e.config.host, port=e.config.bootstrap_port,
            request_id=room_id, blocks=-(-room.input_tokens // e.config.block_tokens),
        )}  # fmt: skip

    # -- counting: vLLM counts every finished request's prompt, prefilled here or not -------
    def count_local_prefill(self, input_tokens: int, cached_tokens: int) -> None:
        self.engine.metrics.cache_queries += input_tokens
        self.engine.metrics.cached_tokens += cached_tokens

    def output_chunk_tokens(self, stream: bool) -> int:
        return 1  # observed engine-side, per step, streaming or not

    def count_first_token(self, meta: dict[str, Any]) -> None:
        # vLLM counts a prompt when its first token is produced, remote-prefilled or not
        self.engine.metrics.prompt_tokens += int(meta.get("prompt_tokens", 0))

    def count_token(self) -> None:
        self.engine.metrics.generation_tokens += 1  # per engine step

    def count_decode_done(self, meta: dict[str, Any], tokens: list[str], n_out: int) -> None:
        self.engine.metrics.finished_requests += 1
        self.engine.metrics.prompt.observe(int(meta.get("prompt_tokens", 0)))

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "pdscale-sim"})
