"""SGLang's dialect, as sglang-router 0.3.2 uses it in PD mode (observed; tests/loop/README.md).

- registration: ``GET /health``, ``/server_info`` and ``/model_info`` (also SGLang's
  ``/get_server_info`` and ``/get_model_info``);
- traffic: ``POST /generate`` besides the OpenAI API, sent to the prefill and the decode
  instance at the same time with ``bootstrap_host``, ``bootstrap_port`` and a router-minted
  ``bootstrap_room`` in the body: the decode collects that room's KV from the prefill's
  bootstrap server;
- load and metrics: ``GET /get_load`` (router ``/get_loads``) and ``/metrics`` under
  ``sglang:`` names, labelled with ``model_name`` and ``engine_type`` (the role).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .dialect import Dialect
from .metrics import Exposition, Metrics

if TYPE_CHECKING:
    from .engine import Room


def render_metrics(
    m: Metrics, *, model_name: str, role: str, running: int, queued: int, inflight: int
) -> str:
    """Prometheus exposition of one engine under SGLang's metric names (engines.md §4)."""
    out = Exposition(f'model_name="{model_name}",engine_type="{role}"')
    out.sample("sglang:num_running_reqs", "gauge", running)
    out.sample("sglang:num_queue_reqs", "gauge", queued)
    out.sample("sglang:cache_hit_rate", "gauge", m.cache_hit_rate())
    out.sample("sglang:prompt_tokens_total", "counter", m.prompt_tokens)
    out.sample("sglang:generation_tokens_total", "counter", m.generation_tokens)
    out.sample("sglang:cached_tokens_total", "counter", m.cached_tokens)
    out.sample("sglang:num_requests_total", "counter", m.requests)
    out.sample("sglang:num_aborted_requests_total", "counter", m.aborted_requests)
    # not an SGLang metric: what the drain order waits on
    out.sample("pdscale_sim:inflight_requests", "gauge", inflight)
    out.histogram("sglang:time_to_first_token_seconds", m.ttft)
    out.histogram("sglang:inter_token_latency_seconds", m.itl)
    out.histogram("sglang:e2e_request_latency_seconds", m.e2e)
    return out.text()


class SGLang(Dialect):
    name = "sglang"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/generate", functools.partial(self.engine.handle_generate, api="generate"))
        router.add_get("/health_generate", self.engine.handle_health)
        for path in ("/server_info", "/get_server_info"):
            router.add_get(path, self.handle_server_info)
        for path in ("/model_info", "/get_model_info"):
            router.add_get(path, self.handle_model_info)
        router.add_get("/get_load", self.handle_get_load)

    def render_metrics(self) -> str:
        e = self.engine
        return render_metrics(
            e.metrics, model_name=e.config.model_name, role=e.config.role,
            running=e.running(), queued=e.queued(), inflight=e.inflight(),
        )  # fmt: skip

    # -- the KV hand-off: the router names the room, the same for both halves ---------------
    def prefill_room(self, body: dict[str, Any]) -> Any:
        return body.get("bootstrap_room")

    def refused_room(self, body: dict[str, Any]) -> Any:
        return body.get("bootstrap_room")

    def kv_source(self, body: dict[str, Any]) -> tuple[Any, Any, Any]:
        return body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")

    def answer_prefill(self, room: Room, room_id: Any) -> dict[str, Any]:
        return {}

    # -- counting: SGLang counts prompts where they are prefilled, and only there -----------
    def count_local_prefill(self, input_tokens: int, cached_tokens: int) -> None:
        pass

    def count_decode_done(self, meta: dict[str, Any], tokens: list[str]) -> None:
        pass

    # -- SGLang's own endpoints -------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        c = self.engine.config
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
        c = self.engine.config
        return web.json_response(
            {"model_path": c.model_path or c.model_name, "served_model_name": c.model_name,
             "is_generation": True}
        )  # fmt: skip

    async def handle_get_load(self, request: web.Request) -> web.Response:
        # SGLang's shape: one entry per DP rank; num_reqs counts everything in flight here
        e = self.engine
        return web.json_response([{
            "dp_rank": 0, "num_reqs": e.inflight(), "num_waiting_reqs": e.queued(),
            "num_tokens": e.context_tokens(),
        }])  # fmt: skip
