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
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pdscale.planner.observe import Role

from .dialect import Dialect
from .metrics import Exposition, Metrics

if TYPE_CHECKING:
    from .engine import Room, SimEngine


def render_vllm_metrics(
    m: Metrics, *, model_name: str, running: int, waiting: int, inflight: int
) -> str:
    """Prometheus exposition of one engine under vLLM's (V1) metric names and labels.

    The role is not a label (vLLM does not know it); Prometheus adds it from the pod. Aborted
    requests are a ``finished_reason`` of ``request_success_total``, as in vLLM."""
    out = Exposition(f'engine="0",model_name="{model_name}"')
    out.sample("vllm:num_requests_running", "gauge", running)
    out.sample("vllm:num_requests_waiting", "gauge", waiting)
    out.sample("vllm:request_success_total", "counter", m.finished_requests,
               ',finished_reason="length"')  # fmt: skip
    out.sample("vllm:request_success_total", "counter", m.aborted_requests,
               ',finished_reason="abort"', declare=False)  # fmt: skip
    out.sample("vllm:prompt_tokens_total", "counter", m.prompt_tokens)
    out.sample("vllm:generation_tokens_total", "counter", m.generation_tokens)
    out.sample("vllm:prefix_cache_queries_total", "counter", m.cache_queries)
    out.sample("vllm:prefix_cache_hits_total", "counter", m.cached_tokens)
    # not a vLLM metric: what the sim's own drain waits on (includes uncollected KV)
    out.sample("pdscale_sim:inflight_requests", "gauge", inflight)
    out.histogram("vllm:time_to_first_token_seconds", m.ttft)
    out.histogram("vllm:inter_token_latency_seconds", m.itl)
    out.histogram("vllm:e2e_request_latency_seconds", m.e2e)
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

    def __init__(self, engine: SimEngine) -> None:
        if engine.role == Role.PREFILL and not engine.config.bootstrap_port:
            raise ValueError("a vllm-dialect prefill needs a bootstrap port (its KV side channel)")
        super().__init__(engine)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/version", self.handle_version)

    def render_metrics(self) -> str:
        e = self.engine
        return render_vllm_metrics(
            e.metrics, model_name=e.config.model_name, running=e.running(),
            waiting=e.queued(), inflight=e.inflight(),
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
        m.cache_queries += room.input_tokens
        m.generation_tokens += 1
        m.finished_requests += 1
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

    def count_decode_done(self, meta: dict[str, Any], tokens: list[str]) -> None:
        self.engine.metrics.prompt_tokens += int(meta.get("prompt_tokens", len(tokens)))
        self.engine.metrics.finished_requests += 1

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "pdscale-sim"})
