"""SGLang's dialect, as sglang-router 0.3.2 and the smg gateway use it in PD mode (observed;
tests/loop/README.md; what each signal means: docs/conformance.md).

- registration: ``GET /health``, ``/server_info`` and ``/model_info`` (also SGLang's
  ``/get_server_info`` and ``/get_model_info``);
- traffic: ``POST /generate`` besides the OpenAI API, sent to the prefill and the decode
  instance at the same time with ``bootstrap_host``, ``bootstrap_port`` and a router-minted
  ``bootstrap_room`` in the body: the decode collects that room's KV from the prefill's
  bootstrap server;
- load: ``GET /v1/loads?include=core,disagg,queues,memory`` (SGLang's
  ``entrypoints/v1_loads.py``) and ``GET /get_load``, the deprecated shim over it, whose
  ``num_reqs`` leaves out the prefill's inflight (KV being transferred) queue;
- metrics: ``/metrics`` under ``sglang:`` names, labelled with ``model_name`` and
  ``engine_type`` (the role); request counters move when a request *finishes* (generation
  tokens in one lump), queue gauges only when a batch is logged.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .dialect import Dialect
from .metrics import (
    SGLANG_E2E_BUCKETS_SECONDS,
    SGLANG_ITL_BUCKETS_SECONDS,
    SGLANG_TTFT_BUCKETS_SECONDS,
    Exposition,
    Metrics,
)

if TYPE_CHECKING:
    from .room import Room

#: SGLang's DEFAULT_FORCE_STREAM_INTERVAL (managers/scheduler_output_processor_mixin.py)
FORCE_STREAM_INTERVAL_TOKENS = 50
#: ``/v1/loads`` sections (``include=``); "all" names every one
LOADS_SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues")


def render_metrics(
    m: Metrics, *, model_name: str, role: str, gauges: Mapping[str, float], inflight: int
) -> str:
    """Prometheus exposition of one engine under SGLang's metric names.

    ``gauges`` are the queue lengths as last logged (keys of
    :meth:`~.engine.SimEngine.queues` plus ``token_usage``): the prefill's waiting, bootstrap
    and inflight queues or the decode's waiting, prealloc and transfer queues."""
    out = Exposition(f'model_name="{model_name}",engine_type="{role}"')
    out.sample("sglang:num_running_reqs", "gauge", gauges.get("running", 0))
    # the waiting queue only: never the bootstrap, inflight, prealloc or transfer queues
    out.sample("sglang:num_queue_reqs", "gauge", gauges.get("waiting", 0))
    # v0.5.23's name (num_prefill_prealloc_queue_reqs before it)
    out.sample("sglang:num_prefill_bootstrap_queue_reqs", "gauge", gauges.get("bootstrap", 0))
    out.sample("sglang:num_prefill_inflight_queue_reqs", "gauge", gauges.get("inflight", 0))
    out.sample("sglang:num_decode_prealloc_queue_reqs", "gauge", gauges.get("prealloc", 0))
    out.sample("sglang:num_decode_transfer_queue_reqs", "gauge", gauges.get("transfer", 0))
    out.sample("sglang:token_usage", "gauge", gauges.get("token_usage", 0.0))
    out.sample("sglang:cache_hit_rate", "gauge", m.cache_hit_rate())
    out.sample("sglang:prompt_tokens_total", "counter", m.prompt_tokens)
    out.sample("sglang:generation_tokens_total", "counter", m.generation_tokens)
    out.sample("sglang:cached_tokens_total", "counter", m.cached_tokens)
    out.sample("sglang:num_requests_total", "counter", m.requests)
    out.sample("sglang:num_aborted_requests_total", "counter", m.aborted_requests)
    # v0.5.23: forward_execution_seconds_total, categories extend and decode (observability/
    # metrics_collector.py, model_executor/model_runner.py; SGLANG_ENABLE_METRICS_DEVICE_TIMER)
    out.sample("sglang:forward_execution_seconds_total", "counter", m.busy_prefill_seconds,
               ',category="extend"')
    out.sample("sglang:forward_execution_seconds_total", "counter", m.busy_decode_seconds,
               ',category="decode"', declare=False)
    # not an SGLang metric: what the sim's own exit waits on
    out.sample("pdscale_sim:inflight_requests", "gauge", inflight)
    # not an engine metric: the requests' TPOT had each decode step its modelled length
    out.histograms_by("pdscale_sim:request_modelled_tpot_seconds", "cohort", m.modelled_tpot)
    # and the prompts' time on a prefill (queue and compute) had each pass its modelled length
    out.histograms_by("pdscale_sim:request_modelled_prefill_seconds", "cohort", m.modelled_prefill)
    out.histogram("sglang:time_to_first_token_seconds", m.ttft)
    out.histogram("sglang:inter_token_latency_seconds", m.itl)
    out.histogram("sglang:e2e_request_latency_seconds", m.e2e)
    out.histogram("sglang:prompt_tokens_histogram", m.prompt)
    # (SGLang records other stages too; the planner reads this one)
    out.histogram("sglang:per_stage_req_latency_seconds", m.prefill_forward, ',stage="prefill_forward"')
    return out.text()


class SGLang(Dialect):
    name = "sglang"
    waits_for_handshake = True
    finishes_after_transfer = True
    pins_kv = False

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/generate", functools.partial(self.engine.handle_generate, api="generate"))
        router.add_get("/health_generate", self.engine.handle_health)
        for path in ("/server_info", "/get_server_info"):
            router.add_get(path, self.handle_server_info)
        for path in ("/model_info", "/get_model_info"):
            router.add_get(path, self.handle_model_info)
        router.add_get("/v1/loads", self.handle_loads)
        router.add_get("/get_load", self.handle_get_load)

    def default_buckets(self) -> tuple[tuple[float, ...], ...]:
        return SGLANG_TTFT_BUCKETS_SECONDS, SGLANG_ITL_BUCKETS_SECONDS, SGLANG_E2E_BUCKETS_SECONDS

    def render_metrics(self) -> str:
        e = self.engine
        return render_metrics(e.metrics, model_name=e.config.model_name, role=e.config.role,
                              gauges=e.logged, inflight=e.inflight())  # fmt: skip

    # -- the KV hand-off: the router names the room, the same for both halves ---------------
    def prefill_room(self, body: dict[str, Any]) -> Any:
        return body.get("bootstrap_room")

    def refused_room(self, body: dict[str, Any]) -> Any:
        return body.get("bootstrap_room")

    def kv_source(self, body: dict[str, Any]) -> tuple[Any, Any, Any]:
        return body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")

    # -- counting: at finish (TokenizerManager.collect_metrics -> observe_one_finished_request),
    # the whole completion in one lump; a prefill finishes once its KV transfer is done --------
    def answer_prefill(self, room: Room, room_id: Any) -> dict[str, Any]:
        self._finished(room.input_tokens, room.cached_tokens, 1)
        return {}

    def count_local_prefill(self, input_tokens: int, cached_tokens: int) -> None:
        pass

    def output_chunk_tokens(self, stream: bool) -> int:
        # the scheduler sends a non-streaming request's output when it finishes or every
        # DEFAULT_FORCE_STREAM_INTERVAL (50) tokens: its TTFT is that first chunk's
        return 1 if stream else FORCE_STREAM_INTERVAL_TOKENS

    def count_first_token(self, meta: dict[str, Any]) -> None:
        pass

    def count_token(self) -> None:
        pass

    def count_decode_done(self, meta: dict[str, Any], tokens: list[str], n_out: int) -> None:
        # a decode's prompt was prefilled elsewhere: it has no cache hits of its own
        self._finished(int(meta.get("prompt_tokens", len(tokens))), 0, n_out)

    def _finished(self, prompt: int, cached: int, generated: int) -> None:
        m = self.engine.metrics
        m.requests += 1
        m.prompt_tokens += prompt
        m.prompt.observe(prompt)
        m.cached_tokens += cached
        m.generation_tokens += generated

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
            "decode_log_interval": c.decode_log_interval,
            "bucket_time_to_first_token": list(self.engine.metrics.ttft.buckets),
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

    def rank_load(self, include: set[str]) -> dict[str, Any]:
        """One DP rank's entry of ``/v1/loads`` (live, not the logged gauges): the core
        fields, and the sections ``include`` names (SchedulerLoadInquirer.get_loads)."""
        e = self.engine
        q = e.queues()
        prefill = e.config.role == "prefill"
        # "waiting" as the load counts it: the waiting queue plus the bootstrap queue (P) or
        # the prealloc and transfer queues (D); never the prefill's inflight queue
        waiting = q["waiting"] + (q["bootstrap"] if prefill else q["prealloc"] + q["transfer"])
        load: dict[str, Any] = {
            "dp_rank": 0, "timestamp": time.time(),
            "num_running_reqs": q["running"], "num_waiting_reqs": waiting,
            "num_total_reqs": q["running"] + waiting,
            "num_used_tokens": e.used_tokens(), "num_total_tokens": e.used_tokens(),
            "max_total_num_tokens": e.token_capacity(),
            "token_usage": round(e.token_usage(), 4), "gen_throughput": 0.0,
            "cache_hit_rate": round(e.metrics.cache_hit_rate(), 4), "utilization": 0.0,
            "max_running_requests": e.config.max_running_requests,
        }  # fmt: skip
        every = "all" in include
        if every or "disagg" in include:
            load["disaggregation"] = {
                "mode": e.config.role,
                "prefill_bootstrap_queue_reqs": q.get("bootstrap", 0),
                "prefill_inflight_queue_reqs": q.get("inflight", 0),
                "decode_prealloc_queue_reqs": q.get("prealloc", 0),
                "decode_transfer_queue_reqs": q.get("transfer", 0),
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0,
            }  # fmt: skip
        if every or "queues" in include:
            load["queues"] = {"waiting": q["waiting"], "grammar": 0, "paused": 0, "retracted": 0}
        if every or "memory" in include:
            load["memory"] = {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                              "token_capacity": e.token_capacity()}  # fmt: skip
        return load

    async def handle_loads(self, request: web.Request) -> web.Response:
        include = {s.strip() for s in request.query.get("include", "core").split(",") if s}
        unknown = include - {*LOADS_SECTIONS, "all"}
        if unknown:
            return web.json_response({"error": f"unknown include {sorted(unknown)}"}, status=400)
        dp_rank = request.query.get("dp_rank")
        loads = [self.rank_load(include)] if dp_rank in (None, "0") else []
        total_running = sum(d["num_running_reqs"] for d in loads)
        total_waiting = sum(d["num_waiting_reqs"] for d in loads)
        n = max(len(loads), 1)
        return web.json_response({
            "timestamp": datetime.now(UTC).isoformat(), "version": "pdscale-sim",
            "dp_rank_count": len(loads), "loads": loads,
            "aggregate": {
                "total_running_reqs": total_running, "total_waiting_reqs": total_waiting,
                "total_reqs": total_running + total_waiting,
                "total_used_tokens": sum(d["num_used_tokens"] for d in loads),
                "total_tokens": sum(d["num_total_tokens"] for d in loads),
                "avg_token_usage": sum(d["token_usage"] for d in loads) / n,
                "avg_throughput": 0.0, "avg_utilization": 0.0,
            },
        })  # fmt: skip

    async def handle_get_load(self, request: web.Request) -> web.Response:
        # the deprecated shim over /v1/loads' core: num_reqs = running + waiting, which on a
        # prefill leaves out the requests whose KV is still being transferred
        load = self.rank_load({"core"})
        return web.json_response([{
            "dp_rank": 0, "num_reqs": load["num_total_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": load["num_used_tokens"],
            "num_pending_tokens": 0, "ts_tic": time.time(),
        }])  # fmt: skip
