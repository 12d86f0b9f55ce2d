"""The simulated engine's pure parts: prefix cache, timing, request parsing, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from pdscale.testbed.simengine import (
    LinearTiming,
    Metrics,
    PrefixCache,
    TimingModel,
    full_response,
    max_new_tokens,
    planner_timing,
    prompt_tokens,
    render_metrics,
    stream_chunk,
)


def words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_prefix_cache_hits_whole_shared_blocks_only():
    cache = PrefixCache(capacity_tokens=1000, block_tokens=4)
    first = words("s", 10) + words("a", 6)
    assert cache.match(first) == 0
    cache.insert(first)
    # shares 10 tokens = 2 whole blocks of 4; the third block differs in its last 2 tokens
    second = words("s", 10) + words("b", 6)
    assert cache.match(second) == 8
    assert cache.match(first) == 16


def test_prefix_cache_needs_the_whole_prefix_before_a_block():
    cache = PrefixCache(capacity_tokens=1000, block_tokens=4)
    cache.insert(words("s", 8))
    # same second block, different first block: a radix cache gives nothing
    assert cache.match(words("x", 4) + words("s", 8)[4:]) == 0


def test_prefix_cache_evicts_least_recently_used():
    cache = PrefixCache(capacity_tokens=8, block_tokens=4)  # two blocks
    a, b = words("a", 4), words("b", 4)
    cache.insert(a)
    cache.insert(b)
    cache.match(a)  # a is now the most recent
    cache.insert(words("c", 4))
    assert cache.match(a) == 4
    assert cache.match(b) == 0
    assert len(cache) == 8


def test_linear_timing_formulas():
    t = LinearTiming(prefill_tokens_per_second=1000, prefill_overhead_seconds=0.01,
                     decode_step_seconds=0.02, decode_per_sequence_seconds=0.001,
                     decode_per_context_token_seconds=1e-6, kv_setup_seconds=0.003,
                     kv_tokens_per_second=1e5)  # fmt: skip
    assert t.prefill_seconds(500, 100) == pytest.approx(0.01 + 0.4)
    assert t.prefill_seconds(500, 900) == pytest.approx(0.01)  # cache never exceeds the prompt
    assert t.tpot_seconds(10, 1000) == pytest.approx(0.02 + 10 * (0.001 + 0.001))
    assert t.kv_transfer_seconds(1000) == pytest.approx(0.003 + 0.01)


def test_planner_performance_model_is_a_timing_model():
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import load_profile

    timing = planner_timing("article-xpyd")
    assert isinstance(timing, TimingModel)
    reference = PerformanceModel(load_profile("article-xpyd"))
    # the article profile: 20,000 prompt tokens/s -> 2,000 uncached tokens take 0.1 s
    assert timing.prefill_seconds(2000, 0) == pytest.approx(0.1)
    assert timing.tpot_seconds(150, 3000) == reference.tpot_seconds(150, 3000)


def test_prompt_tokens_from_each_api():
    assert prompt_tokens({"text": "a b  c"}) == ["a", "b", "c"]
    assert prompt_tokens({"input_ids": [5, 6]}) == ["5", "6"]
    chat = {"messages": [{"role": "system", "content": "x y"},
                         {"role": "user", "content": [{"type": "text", "text": "z"}]}]}  # fmt: skip
    assert prompt_tokens(chat) == ["x", "y", "z"]
    assert prompt_tokens({"prompt": "p q"}) == ["p", "q"]


def test_max_new_tokens_per_api():
    assert max_new_tokens("generate", {"sampling_params": {"max_new_tokens": 7}}) == 7
    # the router rewrites chat's max_tokens into max_completion_tokens
    assert max_new_tokens("chat", {"max_completion_tokens": 9, "max_tokens": 3}) == 9
    assert max_new_tokens("chat", {"max_tokens": 3}) == 3
    assert max_new_tokens("completions", {}) == 16


def test_stream_chunks_carry_one_token_each_and_finish_last():
    meta = {"prompt_tokens": 3, "cached_tokens": 0}
    chunks = [stream_chunk("chat", "r", "m", i, 3, meta) for i in range(3)]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["t0 ", "t1 ", "t2 "]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    gen = stream_chunk("generate", "r", "m", 1, 3, meta)
    assert gen["text"] == "t0 t1 " and gen["meta_info"]["completion_tokens"] == 2
    full = full_response("completions", "r", "m", 2, meta)
    assert full["choices"][0]["text"] == "t0 t1 " and full["usage"]["completion_tokens"] == 2


def test_metrics_use_sglang_names_and_labels():
    m = Metrics(prompt_tokens=100, cached_tokens=40, requests=2, generation_tokens=7)
    m.recent.append((100, 40))
    m.ttft.observe(0.03)
    m.ttft.observe(2.5)
    gauges = {"running": 1, "waiting": 3, "bootstrap": 2, "inflight": 5, "token_usage": 0.25}
    text = render_metrics(m, model_name="sim", role="prefill", gauges=gauges, inflight=4)
    labels = '{model_name="sim",engine_type="prefill"}'
    for line in (
        f"sglang:num_running_reqs{labels} 1",
        f"sglang:num_queue_reqs{labels} 3",
        f"sglang:num_prefill_bootstrap_queue_reqs{labels} 2",
        f"sglang:num_prefill_inflight_queue_reqs{labels} 5",
        f"sglang:num_decode_prealloc_queue_reqs{labels} 0",
        f"sglang:token_usage{labels} 0.25",
        f"sglang:prompt_tokens_total{labels} 100",
        f"sglang:cached_tokens_total{labels} 40",
        f"sglang:generation_tokens_total{labels} 7",
        f"sglang:num_requests_total{labels} 2",
        f"sglang:cache_hit_rate{labels} 0.4",
        f"sglang:time_to_first_token_seconds_count{labels} 2",
        # SGLang's default TTFT buckets start at 0.1 s: 30 ms lands in the first
        'sglang:time_to_first_token_seconds_bucket{model_name="sim",engine_type="prefill",le="0.1"} 1',
        'sglang:time_to_first_token_seconds_bucket{model_name="sim",engine_type="prefill",le="2.0"} 1',
        'sglang:time_to_first_token_seconds_bucket{model_name="sim",engine_type="prefill",le="4.0"} 2',
        "# TYPE sglang:inter_token_latency_seconds histogram",
    ):
        assert line in text.splitlines(), line


def test_a_prefill_is_in_flight_until_its_kv_reached_the_decode():
    # in-process, through the HTTP surfaces: the generate port and the bootstrap port. SGLang:
    # the prefill waits for its decode's handshake, computes, holds the KV for the transfer,
    # and only then answers; /get_load never counts the transfer, the sim's exit does.
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from pdscale.testbed.simengine import EngineConfig, SimEngine

    async def scenario():
        timing = LinearTiming(prefill_tokens_per_second=1e5, kv_setup_seconds=0.2)
        engine = SimEngine(EngineConfig("prefill", "127.0.0.1", 0, bootstrap_port=1), timing)
        await engine.start()
        api = TestClient(TestServer(engine.app(), host="127.0.0.1"))
        bootstrap = TestClient(TestServer(engine.bootstrap_app(), host="127.0.0.1"))
        await api.start_server()
        await bootstrap.start_server()
        try:
            body = {"text": "a " * 1000, "sampling_params": {"max_new_tokens": 4}}
            answers = [asyncio.create_task(api.post("/generate", json=body | {"bootstrap_room": r}))
                       for r in (42, 43)]  # fmt: skip
            await asyncio.sleep(0.05)
            waiting = (await (await api.get("/sim/state")).json())["queues"]["bootstrap"]
            kv = asyncio.create_task(bootstrap.get("/sim/kv/42"))
            await asyncio.sleep(0.1)  # computed, in transfer
            state = await (await api.get("/sim/state")).json()
            load = (await (await api.get("/get_load")).json())[0]["num_reqs"]
            kv_answer = await (await kv).json()
            await bootstrap.get("/sim/kv/43")
            statuses = [(await a).status for a in answers]
            after = (await (await api.get("/sim/state")).json())["inflight"]
            return waiting, state, load, kv_answer, statuses, after
        finally:
            await api.close()
            await bootstrap.close()
            await engine.close()

    waiting, state, load, kv, statuses, after = asyncio.run(scenario())
    assert waiting == 2
    assert (state["inflight"], state["queues"]["inflight"], state["queues"]["bootstrap"]) == (2, 1, 1)
    assert load == 1  # the bootstrap-queued one only: the transfer is not in /get_load
    assert kv == {"input_tokens": 1000, "cached_tokens": 0}
    assert statuses == [200, 200] and after == 0


def test_decode_batch_cap_queues_the_rest_and_tpot_grows_with_the_batch():
    import asyncio
    import time

    from aiohttp.test_utils import TestClient, TestServer

    from pdscale.testbed.simengine import EngineConfig, SimEngine

    step, per_seq = 0.01, 0.005
    timing = LinearTiming(prefill_tokens_per_second=1e6, decode_step_seconds=step,
                          decode_per_sequence_seconds=per_seq)  # fmt: skip

    async def scenario():
        engine = SimEngine(EngineConfig("decode", "127.0.0.1", 0, max_running_requests=2), timing)
        await engine.start()
        api = TestClient(TestServer(engine.app(), host="127.0.0.1"))
        await api.start_server()
        try:
            body = {"text": "a b c", "sampling_params": {"max_new_tokens": 11}}

            async def one():
                t0 = time.monotonic()
                answer = await (await api.post("/generate", json=body)).json()
                return time.monotonic() - t0, answer

            tasks = [asyncio.create_task(one()) for _ in range(4)]
            # every state seen until all four arrived (a fixed sleep ran out on a busy machine)
            seen = []
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                state = await (await api.get("/sim/state")).json()
                seen.append((state["running"], state["queued"]))
                if state["running"] + state["queued"] == 4 or any(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.005)
            return seen, await asyncio.gather(*tasks)
        finally:
            await api.close()
            await engine.close()

    seen, results = asyncio.run(scenario())
    # two run, the other two queue; never more than the cap at once
    assert seen[-1] == (2, 2), seen
    assert max(running for running, _ in seen) <= 2, seen
    assert all(a["meta_info"]["completion_tokens"] == 11 for _, a in results)
    durations = sorted(d for d, _ in results)
    # two at a time: 10 steps at batch 2 each, and the second pair starts after the first
    batch2 = 10 * (step + 2 * per_seq)
    # the lower bounds are the model's (the second pair waits for the first); the upper ones
    # allow a busy machine's scheduling delay on each 20 ms step (the cap itself is held by
    # the second pair's lower bound: four at batch 4 would all finish in 1.5 * batch2)
    assert batch2 <= durations[1] < batch2 * 2.0, durations
    assert 2 * batch2 <= durations[3] < 2 * batch2 * 2.0, durations


def test_engine_flags_of_a_pod_become_the_sims_flags():
    from pdscale.testbed.simengine import build_parser, config_from_args, engine_flags

    sglang = ["--model-path", "/m", "--bucket-time-to-first-token", "0.05", "0.1", "0.2",
              "--decode-log-interval=10", "--tp", "8", "--max-running-requests", "64"]  # fmt: skip
    assert engine_flags(sglang) == ["--bucket-time-to-first-token", "0.05", "0.1", "0.2",
                                    "--decode-log-interval", "10",
                                    "--max-running-requests", "64"]  # fmt: skip
    assert engine_flags(["--max-num-seqs", "32", "--enforce-eager"]) == [
        "--max-running-requests", "32"]
    assert engine_flags(["--bucket-inter-token-latency=0.01,0.02"]) == [
        "--bucket-inter-token-latency", "0.01", "0.02"]
    # a batch cap is the instance's over its DP ranks, as each engine applies it: SGLang's is
    # the instance's rounded down to a multiple of the ranks, vLLM's is each rank's
    assert engine_flags(["--dp-size", "8", "--max-running-requests", "100"]) == [
        "--max-running-requests", "96"]
    assert engine_flags(["--max-num-seqs=16", "--data-parallel-size", "2"]) == [
        "--max-running-requests", "32"]
    args = build_parser().parse_args(["--role", "decode", "--host", "127.0.0.1", "--port", "1",
                                      *engine_flags(sglang)])  # fmt: skip
    config = config_from_args(args)
    assert config.bucket_time_to_first_token == (0.05, 0.1, 0.2)
    assert (config.decode_log_interval, config.max_running_requests) == (10, 64)


# -- prefill passes, as SGLang and vLLM batch (and the replay models: prefill_batches.py) ------

def _prefill_finish_times(chunk_tokens: int, prompts: list[list[str]]) -> list[float]:
    """When each prompt's prefill completes (seconds after they were queued together)."""
    import asyncio

    from pdscale.testbed.simengine import EngineConfig, SimEngine
    from pdscale.testbed.simengine.room import Room

    timing = LinearTiming(prefill_tokens_per_second=10_000, prefill_overhead_seconds=0.0)

    async def scenario() -> list[float]:
        engine = SimEngine(EngineConfig(role="prefill", host="127.0.0.1", port=1,
                                        prefill_chunk_tokens=chunk_tokens), timing)
        await engine.start()
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()

            async def one(tokens: list[str]) -> float:
                await engine.prefill(tokens, Room())
                return loop.time() - t0

            return list(await asyncio.gather(*(one(p) for p in prompts)))
        finally:
            await engine.close()

    return asyncio.run(scenario())


def test_prompts_queued_together_finish_together_in_one_pass():
    # 2 x 1,000 tokens at 10,000 tokens/s: one pass of 0.2 s; one at a time, the first would
    # finish at 0.1 s
    first, second = _prefill_finish_times(8192, [words("a", 1000), words("b", 1000)])
    assert abs(first - second) < 0.02 and 0.19 <= first < 0.3


def test_a_prompt_over_the_budget_spans_passes_and_the_next_fills_the_last():
    # budget 1,500: the long prompt takes passes of 1,500 and 500, the short one fills the
    # second pass beside its last chunk, so both finish with it, at 0.3 s
    long, short = _prefill_finish_times(1500, [words("a", 2000), words("b", 1000)])
    assert abs(long - short) < 0.02 and 0.29 <= long < 0.4


def test_a_prompt_cached_whole_still_computes_its_last_token():
    # SGLang matches at most len - 1 tokens of a prompt (the last one's logits are needed), so
    # a repeated 1,024-token prompt (16 whole blocks of 64, all cached) computes one token:
    # the pass costs overhead + 1 token, and the room reports 1,023 cached, as the replay does
    import asyncio

    from pdscale.testbed.simengine import EngineConfig, SimEngine
    from pdscale.testbed.simengine.room import Room

    timing = LinearTiming(prefill_tokens_per_second=10_000, prefill_overhead_seconds=0.0)
    seen: list[float] = []

    class Spy:
        def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
            seen.append(input_tokens - cached_tokens)
            return timing.prefill_seconds(input_tokens, cached_tokens)

        def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
            return timing.tpot_seconds(batch, mean_context_tokens)

        def kv_transfer_seconds(self, tokens: float) -> float:
            return timing.kv_transfer_seconds(tokens)

    async def scenario() -> list[int]:
        engine = SimEngine(EngineConfig(role="prefill", host="127.0.0.1", port=1), Spy())
        await engine.start()
        try:
            cached = []
            for _ in range(2):
                room = Room()
                await engine.prefill(words("w", 1024), room)
                cached.append(room.cached_tokens)
            return cached
        finally:
            await engine.close()

    assert asyncio.run(scenario()) == [0, 1023]
    assert seen == [1024, 1]


def test_a_sequence_joining_a_running_step_gets_its_next_token_a_full_step_later():
    # SGLang merges a new request into the running batch between forward passes: one that
    # joins while a step runs waits for that step to end, then takes a whole step. A decode
    # step of 50 ms; B joins 25 ms into A's second step, so B's second token comes with A's
    # third step (75 ms after its first), not with the step that was running (25 ms)
    import asyncio

    from pdscale.testbed.simengine import EngineConfig, SimEngine

    timing = LinearTiming(prefill_tokens_per_second=1e9, prefill_overhead_seconds=0.0,
                          decode_step_seconds=0.05, decode_per_sequence_seconds=0.0)  # fmt: skip

    async def scenario() -> list[float]:
        engine = SimEngine(EngineConfig("decode", "127.0.0.1", 0), timing)
        await engine.start()
        try:
            async def stamps(n_out: int) -> list[float]:
                return [t async for _, t, _ in engine.decode({}, ["w"], n_out)]

            a = asyncio.create_task(stamps(6))
            await asyncio.sleep(0.075)
            b = await stamps(3)
            await a
            return b
        finally:
            await engine.close()

    b = asyncio.run(scenario())
    assert 0.065 <= b[1] - b[0] < 0.11, b
    assert 0.04 <= b[2] - b[1] < 0.07, b


def test_the_request_log_names_each_prompt_an_engine_took(tmp_path):
    # the fidelity harness's record of which instance served which request (the router
    # drops a chat request's rid, so the prompt's digest is the key)
    import asyncio
    import json

    from aiohttp.test_utils import TestClient, TestServer

    from pdscale.testbed.simengine import EngineConfig, SimEngine
    from pdscale.testbed.simengine.wire import prompt_key

    log = tmp_path / "requests.jsonl"

    async def scenario() -> None:
        engine = SimEngine(EngineConfig("decode", "127.0.0.1", 0, request_log=str(log)),
                           LinearTiming(decode_step_seconds=0.001))
        await engine.start()
        api = TestClient(TestServer(engine.app(), host="127.0.0.1"))
        await api.start_server()
        try:
            for text in ("one two three", "four five"):
                body = {"model": "sim-model", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
                assert (await api.post("/v1/chat/completions", json=body)).status == 200
        finally:
            await api.close()
            await engine.close()

    asyncio.run(scenario())
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [x["prompt"] for x in lines] == [prompt_key(["one", "two", "three"]), prompt_key(["four", "five"])]
    assert {x["role"] for x in lines} == {"decode"}
    assert prompt_key(["one", "two"]) != prompt_key(["one two"])  # tokens, not their text


@contextlib.asynccontextmanager
async def host_holding_the_loop(seconds: float = 0.03):  # type: ignore[no-untyped-def]
    """A busy host: another task holds the event loop ``seconds`` at a time while the body
    runs, so every wall-clock sleep of the engine overruns."""
    busy = True

    async def hog() -> None:
        while busy:
            time.sleep(seconds)  # the host's other work, holding the loop
            await asyncio.sleep(0)

    hogging = asyncio.create_task(hog())
    try:
        yield
    finally:
        busy = False
        await hogging


def test_the_modelled_tpot_is_the_steps_modelled_length_however_slow_the_host():
    # A host too busy to wake the decode loop on time (here a task blocking the event loop
    # 30 ms at a time) stretches every real step, and so the TPOT a client measures; the
    # engine's modelled TPOT is the steps' modelled length: A's 5 steps of 20 ms, and B's,
    # which joined while a step ran, that whole step more over its 2 (an upper bound). B names
    # a cohort (``metadata.cohort``): its TPOT is counted apart from A's
    from pdscale.testbed.simengine import EngineConfig, SimEngine, render_metrics

    step = 0.02
    timing = LinearTiming(prefill_tokens_per_second=1e9, prefill_overhead_seconds=0.0,
                          decode_step_seconds=step, decode_per_sequence_seconds=0.0)  # fmt: skip

    async def scenario() -> tuple[list[float], list[float], SimEngine]:
        engine = SimEngine(EngineConfig("decode", "127.0.0.1", 0), timing)
        await engine.start()

        try:
            async def stamps(n_out: int, body: dict) -> list[float]:
                return [t async for _, t, _ in engine.decode(body, ["w"], n_out)]

            async with host_holding_the_loop():
                a = asyncio.create_task(stamps(6, {}))
                while engine._step_in_flight == 0.0:  # A's first step runs
                    await asyncio.sleep(0.001)
                b = await stamps(3, {"metadata": {"cohort": "phase-b"}})
                a_stamps = await a
            return a_stamps, b, engine
        finally:
            await engine.close()

    a, b, engine = asyncio.run(scenario())
    assert len(a) == 6 and len(b) == 3
    wall_tpot = (a[-1] - a[0]) / (len(a) - 1)
    assert wall_tpot > 1.3 * step, a  # the busy host stretched A's steps
    hists = engine.metrics.modelled_tpot
    assert set(hists) == {"", "phase-b"} and hists[""].count == hists["phase-b"].count == 1
    # A: 5 steps of exactly `step`; B: 2 steps and the whole step in flight when it joined
    assert hists[""].total == pytest.approx(step)
    assert hists["phase-b"].total == pytest.approx(3 * step / 2)
    text = render_metrics(engine.metrics, model_name="m", role="decode", gauges={}, inflight=0)
    name = 'pdscale_sim:request_modelled_tpot_seconds_bucket{model_name="m",engine_type="decode",'
    assert f'{name}le="0.015"}} 0' in text and f'{name}le="0.025"}} 1' in text
    assert f'{name}cohort="phase-b",le="0.025"}} 0' in text
    assert f'{name}cohort="phase-b",le="0.035"}} 1' in text
    assert text.count("# TYPE pdscale_sim:request_modelled_tpot_seconds histogram") == 1


def test_a_cohort_is_a_plain_name_and_their_number_is_bounded():
    from pdscale.testbed.simengine.metrics import MAX_COHORTS, Metrics
    from pdscale.testbed.simengine.wire import cohort_of

    assert cohort_of({"metadata": {"cohort": "all-rise"}}) == "all-rise"
    # nothing that needs quoting in a label value, nothing that is not a string
    for bad in ('a"b', "a\\nb", "", "x" * 65, 7, None):
        assert cohort_of({"metadata": {"cohort": bad}}) == ""
    for body in ({}, {"metadata": "all-rise"}, {"metadata": None}, {"user": "all-rise"}):
        assert cohort_of(body) == ""
    m = Metrics()
    for k in range(MAX_COHORTS + 5):
        m.observe_modelled_tpot(f"c{k}", 0.01)
    assert len(m.modelled_tpot) == MAX_COHORTS + 1 and m.modelled_tpot[""].count == 5
    assert sum(h.count for h in m.modelled_tpot.values()) == MAX_COHORTS + 5


def test_the_modelled_prefill_time_is_the_passes_modelled_length_however_slow_the_host():
    # The same for a prefill's queue and compute (the TTFT a grant of prefills buys): a host
    # holding the event loop 30 ms at a time stretches each 20 ms pass; the modelled time of
    # A (alone) is its pass, of B (queued while A's pass ran, in a cohort) A's pass whole and
    # its own
    from pdscale.testbed.simengine import EngineConfig, SimEngine, render_metrics
    from pdscale.testbed.simengine.room import Room

    pass_seconds = 0.02
    timing = LinearTiming(prefill_tokens_per_second=1e9, prefill_overhead_seconds=pass_seconds,
                          decode_step_seconds=0.01, decode_per_sequence_seconds=0.0)  # fmt: skip

    async def scenario() -> tuple[float, SimEngine]:
        engine = SimEngine(EngineConfig("prefill", "127.0.0.1", 0), timing)
        await engine.start()

        try:
            async with host_holding_the_loop():
                started = time.monotonic()
                a = asyncio.create_task(engine.prefill(["a"] * 8, Room()))
                while engine._prefill_running == 0:  # A's pass runs
                    await asyncio.sleep(0.001)
                await engine.prefill(["b"] * 8, Room(), "phase-b")
                await a
                wall = time.monotonic() - started
            return wall, engine
        finally:
            await engine.close()

    wall, engine = asyncio.run(scenario())
    assert wall > 1.3 * 2 * pass_seconds  # the busy host stretched the two passes
    hists = engine.metrics.modelled_prefill
    assert set(hists) == {"", "phase-b"} and hists[""].count == hists["phase-b"].count == 1
    assert hists[""].total == pytest.approx(pass_seconds)
    assert hists["phase-b"].total == pytest.approx(2 * pass_seconds)
    text = render_metrics(engine.metrics, model_name="m", role="prefill", gauges={}, inflight=0)
    name = 'pdscale_sim:request_modelled_prefill_seconds_bucket{model_name="m",engine_type="prefill",'
    assert f'{name}le="0.05"}} 1' in text and f'{name}cohort="phase-b",le="0.05"}} 1' in text
    assert text.count("# TYPE pdscale_sim:request_modelled_prefill_seconds histogram") == 1
