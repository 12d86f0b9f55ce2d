"""The simulated engines against docs/conformance.md: one test per row of the table.

Each test drives in-process engines (a prefill and a decode paired through the prefill's
bootstrap server, as the routers pair them) and checks what the real engine does for that row,
read from upstream sources: when a counter moves, which queue a gauge or a load field counts,
when a gauge is refreshed, the default buckets, what a NIXL prefill keeps after its request
finished. No cluster, no router, no Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from pdscale.testbed.localcluster import free_port
from pdscale.testbed.simengine import (
    SGLANG_E2E_BUCKETS_SECONDS,
    SGLANG_ITL_BUCKETS_SECONDS,
    SGLANG_TTFT_BUCKETS_SECONDS,
    VLLM_ITL_BUCKETS_SECONDS,
    VLLM_TTFT_BUCKETS_SECONDS,
    EngineConfig,
    LinearTiming,
    SimEngine,
    build_parser,
    config_from_args,
)

HOST = "127.0.0.1"
#: fast prefill, 20 ms decode steps, KV transfer of 0.3 s for 1,000 tokens (observable)
TIMING = LinearTiming(prefill_tokens_per_second=1e6, prefill_overhead_seconds=0.001,
                      decode_step_seconds=0.02, decode_per_sequence_seconds=0.0,
                      kv_setup_seconds=0.0, kv_tokens_per_second=1000 / 0.3)  # fmt: skip
PROMPT_TOKENS = 1000
PROMPT = " ".join(f"w{i}" for i in range(PROMPT_TOKENS))


@dataclass
class Engine:
    engine: SimEngine
    url: str
    session: ClientSession

    async def get(self, path: str) -> Any:
        async with self.session.get(self.url + path) as resp:
            return await resp.json()

    async def status(self, path: str) -> int:
        async with self.session.get(self.url + path) as resp:
            return resp.status

    async def metrics(self) -> dict[str, float]:
        """``/metrics`` as {series with labels: value}, and {name: sum over series}."""
        async with self.session.get(self.url + "/metrics") as resp:
            text = await resp.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                out[series] = float(value)
                name = series.split("{", 1)[0]
                if name != series:
                    out[name] = out.get(name, 0.0) + float(value)
        return out

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body) as resp:
            return resp.status, await resp.json()

    async def stream(self, path: str, body: dict[str, Any]) -> int:
        """Post ``body`` with ``stream`` on and read the event stream to its end."""
        async with self.session.post(self.url + path, json={**body, "stream": True}) as resp:
            await resp.read()
            return resp.status


@contextlib.asynccontextmanager
async def served(config: EngineConfig, timing: LinearTiming = TIMING) -> AsyncIterator[Engine]:
    engine = SimEngine(config, timing)
    await engine.start()
    servers = [TestServer(engine.app(), host=HOST, port=config.port)]
    if config.bootstrap_port:
        servers.append(TestServer(engine.bootstrap_app(), host=HOST, port=config.bootstrap_port))
    for server in servers:
        await server.start_server()
    try:
        async with ClientSession() as session:
            yield Engine(engine, f"http://{HOST}:{config.port}", session)
    finally:
        for server in servers:
            await server.close()
        await engine.close()


def config(role: str, dialect: str = "sglang", **overrides: Any) -> EngineConfig:
    bootstrap = free_port() if role == "prefill" else None
    base = EngineConfig(role=role, host=HOST, port=free_port(), bootstrap_port=bootstrap,
                        dialect=dialect)  # fmt: skip
    return replace(base, **overrides)


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def sglang_pd_request(prefill: Engine, room: int, n_out: int) -> dict[str, Any]:
    """What sglang-router sends to both halves: the same body with the prefill's bootstrap."""
    return {"text": PROMPT, "sampling_params": {"max_new_tokens": n_out},
            "bootstrap_host": HOST, "bootstrap_port": prefill.engine.config.bootstrap_port,
            "bootstrap_room": room}  # fmt: skip


# -- SGLang: counters at finish --------------------------------------------------------------


def test_sglang_decode_counts_a_request_and_its_tokens_when_it_finishes():
    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        async with served(config("prefill")) as p, served(config("decode")) as d:
            body = sglang_pd_request(p, 1, 30)
            done = asyncio.gather(p.post("/generate", body), d.post("/generate", body))
            await until(lambda: _running(d))
            await asyncio.sleep(0.2)  # about ten tokens out of thirty
            during = await d.metrics()
            (sp, _), (sd, answer) = await done
            assert (sp, sd) == (200, 200) and answer["meta_info"]["completion_tokens"] == 30
            return during, await d.metrics()

    during, after = run(scenario)
    for name in ("num_requests_total", "generation_tokens_total", "prompt_tokens_total"):
        assert during[f"sglang:{name}"] == 0, name
    # the whole completion in one lump; a decode counts the full prompt, no cache hits
    assert after["sglang:num_requests_total"] == 1
    assert after["sglang:generation_tokens_total"] == 30
    assert after["sglang:prompt_tokens_total"] == PROMPT_TOKENS
    assert after["sglang:cached_tokens_total"] == 0


async def _running(engine: Engine) -> bool:
    return bool(engine.engine.running())


def test_sglang_prefill_finishes_and_counts_only_after_its_kv_transfer():
    async def scenario() -> tuple[Any, ...]:
        async with served(config("prefill")) as p, served(config("decode")) as d:
            body = sglang_pd_request(p, 7, 2)
            done = asyncio.gather(p.post("/generate", body), d.post("/generate", body))
            # computed (fast), now transferring for 0.3 s: the inflight queue
            await until(lambda: _inflight(p, 1))
            loads = await p.get("/v1/loads?include=core,disagg")
            get_load = await p.get("/get_load")
            counted = (await p.metrics())["sglang:num_requests_total"]
            await done
            after = await p.get("/v1/loads?include=core,disagg")
            return loads, get_load, counted, after, await p.metrics()

    loads, get_load, counted, after, metrics = run(scenario)
    rank = loads["loads"][0]
    assert rank["disaggregation"]["prefill_inflight_queue_reqs"] == 1
    # the shim and the core fields leave the transfer out: "idle" while KV is still moving
    assert (rank["num_running_reqs"], rank["num_waiting_reqs"]) == (0, 0)
    assert get_load[0]["num_reqs"] == 0
    assert counted == 0
    assert after["loads"][0]["disaggregation"]["prefill_inflight_queue_reqs"] == 0
    assert metrics["sglang:num_requests_total"] == 1
    assert metrics["sglang:prompt_tokens_total"] == PROMPT_TOKENS
    # the prompt-length histogram (the planner's prompt spread) counts at the same moment
    assert metrics["sglang:prompt_tokens_histogram_count"] == 1
    assert metrics["sglang:prompt_tokens_histogram_sum"] == PROMPT_TOKENS
    # and its time in forward passes (the planner's prefill speed when idle), the transfer not
    assert metrics["sglang:per_stage_req_latency_seconds_count"] == 1
    assert 0 < metrics["sglang:per_stage_req_latency_seconds_sum"] < 0.3


async def _inflight(engine: Engine, n: int) -> bool:
    return engine.engine.queues()["inflight"] == n


# -- SGLang: the split queues ----------------------------------------------------------------


def test_sglang_prefill_waits_in_the_bootstrap_queue_until_its_decode_asks():
    async def scenario() -> tuple[Any, ...]:
        async with served(config("prefill")) as p:
            task = asyncio.create_task(p.post("/generate", sglang_pd_request(p, 3, 2)))
            await until(lambda: _queue(p, "bootstrap", 1))
            loads = await p.get("/v1/loads?include=core,disagg,queues")
            get_load = await p.get("/get_load")
            p.engine.log_stats()
            gauges = await p.metrics()
            task.cancel()
            return loads, get_load, gauges

    loads, get_load, gauges = run(scenario)
    rank = loads["loads"][0]
    assert rank["disaggregation"]["prefill_bootstrap_queue_reqs"] == 1
    assert rank["queues"]["waiting"] == 0
    assert rank["num_waiting_reqs"] == 1 and get_load[0]["num_reqs"] == 1
    assert gauges["sglang:num_prefill_bootstrap_queue_reqs"] == 1  # v0.5.23's name
    assert gauges["sglang:num_queue_reqs"] == 0  # the waiting queue only


async def _queue(engine: Engine, name: str, n: int) -> bool:
    return engine.engine.queues()[name] == n


def test_sglang_decode_splits_prealloc_transfer_and_waiting_queues():
    # memory for one request at a time: the second waits in prealloc; the first waits for a
    # prefill that never comes, in the transfer queue
    async def scenario() -> tuple[Any, ...]:
        decode = config("decode", max_total_tokens=PROMPT_TOKENS + 10)
        async with served(config("prefill")) as p, served(decode) as d:
            tasks = [asyncio.create_task(d.post("/generate", sglang_pd_request(p, r, 2)))
                     for r in (11, 12)]  # fmt: skip
            await until(lambda: _queue(d, "prealloc", 1))
            await until(lambda: _queue(d, "transfer", 1))
            loads = await d.get("/v1/loads?include=core,disagg,queues")
            get_load = await d.get("/get_load")
            stale = await d.metrics()
            d.engine.log_stats()
            logged = await d.metrics()
            for task in tasks:
                task.cancel()
            return loads, get_load, stale, logged

    loads, get_load, stale, logged = run(scenario)
    rank = loads["loads"][0]
    assert rank["disaggregation"]["decode_prealloc_queue_reqs"] == 1
    assert rank["disaggregation"]["decode_transfer_queue_reqs"] == 1
    assert rank["queues"]["waiting"] == 0
    assert rank["num_waiting_reqs"] == 2 and get_load[0]["num_reqs"] == 2
    # nothing was logged yet (no batch ran, the idle refresh is 30 s away): stale zeros
    assert stale["sglang:num_decode_prealloc_queue_reqs"] == 0
    assert logged["sglang:num_decode_prealloc_queue_reqs"] == 1
    assert logged["sglang:num_decode_transfer_queue_reqs"] == 1
    assert logged["sglang:num_queue_reqs"] == 0  # the decode backlog is not in it
    assert logged["sglang:token_usage"] > 0


def test_sglang_gauges_refresh_every_decode_log_interval_and_when_idle():
    async def scenario() -> list[float]:
        decode = config("decode", decode_log_interval=10, idle_log_interval_seconds=0.3)
        async with served(config("prefill")) as p, served(decode) as d:
            body = sglang_pd_request(p, 5, 40)
            done = asyncio.gather(p.post("/generate", body), d.post("/generate", body))
            await until(lambda: _running(d))
            await asyncio.sleep(0.05)  # two steps in: not logged yet
            seen = [(await d.metrics())["sglang:num_running_reqs"]]
            await asyncio.sleep(0.25)  # past step 10: logged
            seen.append((await d.metrics())["sglang:num_running_reqs"])
            await done
            seen.append((await d.metrics())["sglang:num_running_reqs"])  # stale after finish
            await asyncio.sleep(0.6)  # the idle refresh
            seen.append((await d.metrics())["sglang:num_running_reqs"])
            return seen

    assert run(scenario) == [0, 1, 1, 0]


def test_sglang_inter_token_latency_sum_is_the_time_requests_spent_streaming():
    # each chunk adds the seconds since its request's previous chunk to the sum: two requests
    # decoding side by side for T seconds add about 2T, so the sum's rate is the mean number
    # streaming (the planner bounds the logged running gauge with it). A request that does not
    # stream sends its first chunk at 50 tokens: before that it adds nothing. The streaming
    # time is bounded from both sides, each bound one a busy host only widens: from below by
    # the time after the client saw both decoding (it sees that late, never early), from
    # above by the time since it sent them (a loaded pass read the first as 10% too short)
    async def scenario() -> tuple[float, float, float]:
        async with served(config("prefill")) as p, served(config("decode")) as d:
            sent = asyncio.get_running_loop().time()
            bodies = [sglang_pd_request(p, 60 + k, 30) for k in range(2)]
            done = asyncio.gather(*(p.post("/generate", b) for b in bodies),
                                  *(d.stream("/generate", b) for b in bodies))
            await until(lambda: _running(d))
            seen = asyncio.get_running_loop().time()
            await done
            ended = asyncio.get_running_loop().time()
            return ((await d.metrics())["sglang:inter_token_latency_seconds_sum"],
                    ended - seen, ended - sent)

    itl_sum, at_least, at_most = run(scenario)
    assert 0.8 * 2 * at_least <= itl_sum <= 1.1 * 2 * at_most + 0.05, (itl_sum, at_least, at_most)


def test_sglang_prefill_gauges_are_logged_per_prefill_batch():
    async def scenario() -> tuple[float, float]:
        # a pass budget of one prompt: the two prompts are two batches, the second formed
        # when the first is computed
        prefill = config("prefill", idle_log_interval_seconds=3600,
                         prefill_chunk_tokens=PROMPT_TOKENS)
        async with served(prefill) as p, served(config("decode")) as d:
            before = (await p.metrics())["sglang:num_prefill_inflight_queue_reqs"]
            bodies = [sglang_pd_request(p, r, 2) for r in (21, 22)]
            done = asyncio.gather(*(e.post("/generate", b) for b in bodies for e in (p, d)))
            # the second prompt's batch is logged while the first one's KV is in transfer
            await until(lambda: _inflight(p, 2))
            during = (await p.metrics())["sglang:num_prefill_inflight_queue_reqs"]
            await done
            return before, during

    before, during = run(scenario)
    assert before == 0 and during == 1


def test_sglang_forward_execution_seconds_count_each_prefill_pass_once():
    # three different 1,000-token prompts at 20,000 tokens/s (50 ms each), passes of up to two
    # prompts: however the passes form, the GPU was busy for the three prompts' compute, while
    # the per-stage forward time counts a shared pass once for each of its prompts
    timing = replace(TIMING, prefill_tokens_per_second=20_000.0, prefill_overhead_seconds=0.0)

    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        prefill = config("prefill", prefill_chunk_tokens=2 * PROMPT_TOKENS)
        async with served(prefill, timing) as p, served(config("decode"), timing) as d:
            bodies = [{**sglang_pd_request(p, 40 + k, 2),
                       "text": " ".join(f"p{k}w{i}" for i in range(PROMPT_TOKENS))} for k in range(3)]
            await asyncio.gather(*(e.post("/generate", b) for b in bodies for e in (p, d)))
            return await p.metrics(), await d.metrics()

    pm, dm = run(scenario)
    # v0.5.23: forward_execution_seconds_total, prefill passes in category extend
    busy = pm["sglang:forward_execution_seconds_total"]
    assert [series for series in pm if series.startswith("sglang:forward_execution_seconds_total{")
            and 'category="extend"' in series and pm[series] == busy]
    compute = 3 * PROMPT_TOKENS / 20_000.0
    # (counted per prompt, the shared pass would add 100 ms: passes of 1 and 2 prompts here)
    assert 0.95 * compute <= busy <= compute + 0.06, busy
    assert pm["sglang:per_stage_req_latency_seconds_sum"] >= 0.95 * busy
    # the decode's one step of 20 ms (two tokens: the first came from prefill)
    decode_busy = [v for series, v in dm.items() if 'category="decode"' in series]
    assert decode_busy and 0.019 <= decode_busy[0] <= 0.2


# -- SGLang: histograms ----------------------------------------------------------------------


def _le(metrics: dict[str, float], name: str) -> list[float]:
    return [float(series.split('le="', 1)[1].split('"', 1)[0])
            for series in metrics if series.startswith(name + "_bucket{") and "+Inf" not in series
            ]  # fmt: skip


def test_sglang_histograms_use_upstream_default_buckets_and_the_bucket_flags():
    args = build_parser().parse_args(["--role", "decode", "--host", HOST, "--port", "1",
                                      "--bucket-time-to-first-token", "0.5", "0.05", "0.2"])
    flagged = config_from_args(args)
    assert flagged.bucket_time_to_first_token == (0.05, 0.2, 0.5)

    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        async with served(config("decode")) as plain, served(replace(
                flagged, port=free_port())) as custom:  # fmt: skip
            return await plain.metrics(), await custom.metrics()

    plain, custom = run(scenario)
    assert _le(plain, "sglang:time_to_first_token_seconds") == list(SGLANG_TTFT_BUCKETS_SECONDS)
    assert SGLANG_TTFT_BUCKETS_SECONDS[:6] == (0.1, 0.2, 0.4, 0.6, 0.8, 1)
    assert _le(plain, "sglang:inter_token_latency_seconds") == list(SGLANG_ITL_BUCKETS_SECONDS)
    assert _le(plain, "sglang:e2e_request_latency_seconds") == list(SGLANG_E2E_BUCKETS_SECONDS)
    assert _le(custom, "sglang:time_to_first_token_seconds") == [0.05, 0.2, 0.5]


def test_sglang_non_streaming_ttft_is_observed_on_the_first_chunk_of_50_tokens_or_at_finish():
    async def scenario() -> list[dict[str, float]]:
        async with served(config("prefill")) as p, served(config("decode")) as d:
            seen = []
            for room, n_out in ((31, 30), (32, 60)):
                body = sglang_pd_request(p, room, n_out)
                await asyncio.gather(p.post("/generate", body), d.post("/generate", body))
                seen.append(await d.metrics())
            return seen

    short, long = run(scenario)
    ttft, itl, e2e = ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                      "sglang:e2e_request_latency_seconds")  # fmt: skip
    # 30 tokens, not streamed: one chunk at finish, so TTFT is the whole request
    assert short[ttft + "_sum"] >= 0.3 + 29 * 0.02 and short[itl + "_count"] == 0
    assert abs(short[ttft + "_sum"] - short[e2e + "_sum"]) < 0.05
    # 60 tokens: the first chunk at token 50, then the last 10 as one chunk (10 observations)
    second_ttft = long[ttft + "_sum"] - short[ttft + "_sum"]
    second_e2e = long[e2e + "_sum"] - short[e2e + "_sum"]
    assert long[itl + "_count"] == 10
    assert second_ttft >= 0.3 + 49 * 0.02 and second_e2e - second_ttft >= 9 * 0.02


# -- SGLang: /v1/loads -----------------------------------------------------------------------


def test_sglang_v1_loads_answers_upstream_shape_with_the_included_sections():
    async def scenario() -> tuple[Any, ...]:
        async with served(config("prefill")) as p:
            return (await p.get("/v1/loads"), await p.get("/v1/loads?include=core,disagg"),
                    await p.get("/v1/loads?include=all"), await p.status("/v1/loads?include=x"),
                    await p.get("/v1/loads?dp_rank=1"))  # fmt: skip

    core, disagg, every, bad, other_rank = run(scenario)
    assert {"timestamp", "version", "dp_rank_count", "loads", "aggregate"} <= core.keys()
    assert core["dp_rank_count"] == 1 and core["loads"][0]["dp_rank"] == 0
    assert {"num_running_reqs", "num_waiting_reqs", "num_total_reqs", "num_used_tokens",
            "max_total_num_tokens", "token_usage"} <= core["loads"][0].keys()  # fmt: skip
    assert not {"disaggregation", "queues", "memory"} & core["loads"][0].keys()
    assert disagg["loads"][0]["disaggregation"] == {
        "mode": "prefill", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
        "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0,
        "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": 0.0,
        "kv_transfer_latency_ms": 0.0}  # fmt: skip
    assert {"disaggregation", "queues", "memory"} <= every["loads"][0].keys()
    assert bad == 400
    assert other_rank["loads"] == [] and other_rank["dp_rank_count"] == 0


# -- vLLM: NIXL prefill, deferred decode, counters -------------------------------------------


def vllm_prefill_body() -> dict[str, Any]:
    """What vllm-router 0.1.17 sends the prefill (observed): one token, remote decode."""
    return {"model": "sim-model", "prompt": PROMPT, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}


def test_vllm_prefill_finishes_before_the_pull_and_keeps_its_kv_pinned_until_then():
    async def scenario() -> tuple[Any, ...]:
        async with (served(config("prefill", "vllm")) as p,
                    served(config("decode", "vllm")) as d):  # fmt: skip
            status, answer = await p.post("/v1/completions", vllm_prefill_body())
            assert status == 200
            finished = await p.metrics()
            pinned = (await p.get("/sim/state"))["kv_pinned_requests"]
            decode_body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2,
                           "kv_transfer_params": answer["kv_transfer_params"]}  # fmt: skip
            task = asyncio.create_task(d.post("/v1/completions", decode_body))
            await until(lambda: _queue(d, "transfer", 1))  # pulling for 0.3 s
            deferred = await d.metrics()
            await task
            return finished, pinned, deferred, await d.metrics(), await p.get("/sim/state")

    finished, pinned, deferred, after, state = run(scenario)
    # the hole a drain on running + waiting falls into: nothing running, KV still needed
    assert finished['vllm:request_success_total{engine="0",model_name="sim-model",'
                    'finished_reason="length"}'] == 1  # fmt: skip
    assert finished["vllm:num_requests_running"] + finished["vllm:num_requests_waiting"] == 0
    assert pinned == 1 and finished["pdscale_sim:kv_pinned_requests"] == 1
    # the decode counts the request waiting for its KV as waiting, reason "deferred"
    wait = 'vllm:num_requests_waiting_by_reason{engine="0",model_name="sim-model",reason='
    assert deferred[wait + '"deferred"}'] == 1 and deferred[wait + '"capacity"}'] == 0
    assert deferred["vllm:num_requests_waiting"] == 1
    assert after[wait + '"deferred"}'] == 0 and after["vllm:request_success_total"] == 1
    assert state["kv_pinned_requests"] == 0


def test_vllm_pinned_kv_is_freed_after_the_lease_and_a_late_pull_fails():
    async def scenario() -> tuple[Any, ...]:
        prefill = config("prefill", "vllm", kv_lease_seconds=0.2)
        async with served(prefill) as p, served(config("decode", "vllm")) as d:
            _, answer = await p.post("/v1/completions", vllm_prefill_body())
            await until(lambda: _pinned(p, 0))
            status, _ = await d.post("/v1/completions", {
                "model": "sim-model", "prompt": PROMPT, "max_tokens": 2,
                "kv_transfer_params": answer["kv_transfer_params"]})  # fmt: skip
            return status, await d.metrics()

    status, metrics = run(scenario)
    assert status == 500
    assert metrics['vllm:request_success_total{engine="0",model_name="sim-model",'
                   'finished_reason="abort"}'] == 1  # fmt: skip


async def _pinned(engine: Engine, n: int) -> bool:
    return engine.engine.kv_held() == n


def test_vllm_prefill_process_does_not_wait_for_pinned_kv_on_exit():
    # vLLM's shutdown waits for HTTP requests, not for a decode's pull: an engine stopped
    # with KV pinned drops it (the drain must wait on decodes' deferred count instead). Idle
    # within 5 s, where waiting for the pull would take the 30 s lease (0.1 s was too short
    # for a loaded CI pass to see the request's end)
    async def scenario() -> tuple[int, bool]:
        async with served(config("prefill", "vllm")) as p:
            await p.post("/v1/completions", vllm_prefill_body())
            return p.engine.kv_held(), await p.engine.wait_idle(5.0)

    assert run(scenario) == (1, True)


def test_vllm_decode_counts_success_at_finish_and_prompt_at_first_token():
    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        async with (served(config("prefill", "vllm")) as p,
                    served(config("decode", "vllm")) as d):  # fmt: skip
            _, answer = await p.post("/v1/completions", vllm_prefill_body())
            task = asyncio.create_task(d.post("/v1/completions", {
                "model": "sim-model", "prompt": PROMPT, "max_tokens": 30,
                "kv_transfer_params": answer["kv_transfer_params"]}))  # fmt: skip
            await until(lambda: _running(d))
            await asyncio.sleep(0.2)
            during = await d.metrics()
            await task
            return during, await d.metrics()

    during, after = run(scenario)
    assert during["vllm:request_success_total"] == 0
    assert during["vllm:prompt_tokens_total"] == PROMPT_TOKENS
    assert 0 < during["vllm:generation_tokens_total"] < 30  # per step, not in one lump
    assert after["vllm:request_success_total"] == 1
    assert after["vllm:generation_tokens_total"] == 30
    # request_prompt_tokens is observed when the request finishes, remote-prefilled or not
    assert during["vllm:request_prompt_tokens_count"] == 0
    assert after["vllm:request_prompt_tokens_count"] == 1
    assert after["vllm:request_prompt_tokens_sum"] == PROMPT_TOKENS


def test_vllm_histograms_use_upstream_default_buckets():
    async def scenario() -> dict[str, float]:
        async with served(config("decode", "vllm")) as d:
            return await d.metrics()

    metrics = run(scenario)
    assert _le(metrics, "vllm:inter_token_latency_seconds") == list(VLLM_ITL_BUCKETS_SECONDS)
    assert VLLM_ITL_BUCKETS_SECONDS[:5] == (0.01, 0.025, 0.05, 0.075, 0.1)
    assert _le(metrics, "vllm:time_to_first_token_seconds") == list(VLLM_TTFT_BUCKETS_SECONDS)
    # request_prompt_tokens: build_1_2_5_buckets up to the context length
    assert _le(metrics, "vllm:request_prompt_tokens")[:7] == [1, 2, 5, 10, 20, 50, 100]


# -- the table and these tests stay one ------------------------------------------------------


def test_every_test_the_conformance_table_names_exists_and_every_test_here_is_named():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    table = (root / "docs" / "conformance.md").read_text()
    here = {name for name in globals() if name.startswith("test_")}
    linked = set(re.findall(r"conf::(test_\w+)", table))
    assert linked - here == set(), "the table names tests that do not exist"
    unlinked = here - linked - {"test_every_test_the_conformance_table_names_exists_and_every_"
                                "test_here_is_named"}  # fmt: skip
    assert unlinked == set(), "tests that no row of the table names"
    for path, name in re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", table):
        assert f"def {name}(" in (root / path).read_text(), f"{path}::{name}"
