"""The simulated engine's vLLM dialect, alone and behind the real vllm-router 0.1.17 in PD mode
(workers announced on its ZMQ discovery by the operator's Announcer)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import statistics
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from loop_harness import TIMING, Fleet, http_json

from pdscale.operator.clients.engine_probe import engine_in_flight
from pdscale.operator.clients.vllm_discovery import Announcer
from pdscale.planner.prometheus import VLLM_QUERIES
from pdscale.testbed.loadgen import RequestSpec, send_one
from pdscale.testbed.simengine import (
    EngineConfig,
    LinearTiming,
    Metrics,
    SimEngine,
    prefill_kv_params,
    remote_prefill_params,
    render_vllm_metrics,
    wants_remote_decode,
)

MODEL = LinearTiming(
    prefill_tokens_per_second=TIMING["prefill-tokens-per-second"],
    prefill_overhead_seconds=TIMING["prefill-overhead-seconds"],
    decode_step_seconds=TIMING["decode-step-seconds"],
    decode_per_sequence_seconds=TIMING["decode-per-sequence-seconds"],
    kv_setup_seconds=TIMING["kv-setup-seconds"],
    kv_tokens_per_second=TIMING["kv-tokens-per-second"],
)

# What vllm-router 0.1.17 (--kv-connector nixl) puts into the prefill request (observed).
ROUTER_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                         "remote_engine_id": None, "remote_block_ids": None,
                         "remote_host": None, "remote_port": None}  # fmt: skip


# -- pure ------------------------------------------------------------------------------------


def test_every_series_the_planner_queries_for_vllm_is_rendered():
    m = Metrics()
    m.ttft.observe(0.1)
    text = render_vllm_metrics(m, model_name="m", running=2, waiting_capacity=1,
                               waiting_deferred=2, inflight=5)  # fmt: skip
    exposed = {line.split("{", 1)[0] for line in text.splitlines() if not line.startswith("#")}
    wanted = {name for q in VLLM_QUERIES.values() for name in re.findall(r"vllm:\w+", q)}
    assert wanted and wanted <= exposed, wanted - exposed
    assert not any(name.startswith("sglang:") for name in exposed)
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 2' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 3' in text
    wait = 'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason='
    assert wait + '"capacity"} 1' in text and wait + '"deferred"} 2' in text


def test_kv_transfer_params_from_prefill_are_what_decode_reads():
    body = {"messages": [], "kv_transfer_params": ROUTER_PREFILL_PARAMS}
    assert wants_remote_decode(body)
    assert remote_prefill_params(body) is None  # the prefill request is not remote-prefilled
    params = prefill_kv_params(engine_id="e", host="127.0.0.5", port=9000, request_id=7,
                               blocks=3)  # fmt: skip
    assert params["do_remote_prefill"] and not params["do_remote_decode"]
    assert params["remote_block_ids"] == [0, 1, 2] and params["remote_request_id"] == 7
    decode_body = {"messages": [], "kv_transfer_params": json.loads(json.dumps(params))}
    assert remote_prefill_params(decode_body) == params
    assert not wants_remote_decode(decode_body)
    assert remote_prefill_params({"messages": []}) is None


def test_dialect_is_checked():
    with pytest.raises(ValueError, match="dialect"):
        SimEngine(EngineConfig(role="decode", host="127.0.0.1", port=1, dialect="trt"), MODEL)
    with pytest.raises(ValueError, match="bootstrap port"):
        SimEngine(EngineConfig(role="prefill", host="127.0.0.1", port=1, dialect="vllm"), MODEL)


def test_each_dialect_adds_its_own_endpoints_to_the_common_ones():
    def paths(dialect: str) -> set[str]:
        engine = SimEngine(EngineConfig(role="decode", host="127.0.0.1", port=1, dialect=dialect),
                           MODEL)  # fmt: skip
        return {route.resource.canonical for route in engine.app().router.routes()}

    common = {"/v1/chat/completions", "/v1/completions", "/health", "/v1/models", "/metrics",
              "/sim/state", "/sim/drain"}  # fmt: skip
    assert paths("sglang") - common == {"/generate", "/health_generate", "/server_info",
                                        "/get_server_info", "/model_info", "/get_model_info",
                                        "/v1/loads", "/get_load"}  # fmt: skip
    assert paths("vllm") - common == {"/version"}
    assert common <= paths("sglang") & paths("vllm")


# -- processes -------------------------------------------------------------------------------


def post(url: str, body: dict, timeout: float = 10.0) -> dict:
    return http_json(url, method="POST", body=body, timeout=timeout)


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def metrics(engine) -> dict[str, float]:
    """Unlabelled view of an engine's /metrics: first sample per series name."""
    with urllib.request.urlopen(engine.url + "/metrics", timeout=5) as resp:
        out: dict[str, float] = {}
        for line in resp.read().decode().splitlines():
            if line and not line.startswith("#"):
                out.setdefault(line.split("{", 1)[0], float(line.rsplit(" ", 1)[1]))
        return out


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def start_vllm_router(
    fleet: Fleet, prefill: list, decode: list
) -> tuple[str, Announcer, threading.Event]:
    url, address = fleet.start_vllm_router("--policy", "round_robin")
    announcer, stop = Announcer(side_channel_port=5600), threading.Event()
    threading.Thread(target=announcer.run, args=(stop,), daemon=True).start()
    announcer.set_workers(address, [e.spec for e in (*prefill, *decode)])
    # first announcement after 1 s; wait until a request goes through (a wait, long enough
    # for a busy machine, not a check)
    deadline = time.monotonic() + 120
    while True:
        try:
            post(url + "/v1/completions", {"model": "sim-model", "prompt": "warm up",
                                           "max_tokens": 1}, timeout=5)  # fmt: skip
            return url, announcer, stop
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, fleet.router.tail()
            time.sleep(0.3)


def stream(url: str, prompts: list[str], output_tokens: int) -> list:
    async def run() -> list:
        async with aiohttp.ClientSession() as session:
            out = []
            for i, prompt in enumerate(prompts):  # one at a time: nothing queues
                spec = RequestSpec(i, "vllm", 0.0, len(prompt.split()), output_tokens, prompt)
                out.append(await send_one(session, url, "chat", spec, "sim-model", 0.0, 30.0))
            return out

    return asyncio.run(run())


@pytest.mark.slow
def test_vllm_router_pd_through_sim_engines_timing_metrics_and_drain(fleet):
    prefill = fleet.start_engine("prefill", "--dialect", "vllm")
    decode = fleet.start_engine("decode", "--dialect", "vllm")
    url, _, stop = start_vllm_router(fleet, [prefill], [decode])
    try:
        p0, d0 = metrics(prefill), metrics(decode)

        # non-streaming chat and completions: the decode's answer, whole
        chat = post(url + "/v1/chat/completions", {
            "model": "sim-model", "messages": [{"role": "user", "content": words("n", 50)}],
            "max_tokens": 6})  # fmt: skip
        assert chat["choices"][0]["message"]["content"].split() == [f"t{i}" for i in range(6)]
        assert chat["usage"]["prompt_tokens"] == 50 and chat["usage"]["completion_tokens"] == 6
        done = post(url + "/v1/completions", {"model": "sim-model", "prompt": words("c", 20),
                                              "max_tokens": 3})  # fmt: skip
        assert len(done["choices"][0]["text"].split()) == 3

        # streaming, unqueued, 2,000 uncached words each: TTFT ~ prefill + KV, TPOT ~ model
        n_in, n_out = 2000, 30
        records = stream(url, [words(f"s{k}x", n_in) for k in range(3)], n_out)
        assert all(r.ok for r in records), [r.error for r in records] + [fleet.describe()]
        ttft = statistics.median(r.ttft_seconds for r in records)
        tpot = statistics.median(r.tpot_seconds for r in records)
        want_ttft = MODEL.prefill_seconds(n_in) + MODEL.kv_transfer_seconds(n_in)
        want_tpot = MODEL.tpot_seconds(1, n_in)
        print(f"vllm dialect: TTFT {ttft:.4f} s vs {want_ttft:.4f} modelled; "
              f"TPOT {tpot:.5f} s vs {want_tpot:.5f}")  # fmt: skip
        assert want_ttft * 0.95 <= ttft <= want_ttft + 0.15
        assert want_tpot * 0.8 <= tpot <= want_tpot * 2 + 0.005

        # the decode took the prefill's KV: no prefill compute there, nothing in its cache
        assert decode.state()["local_prefills"] == 0
        assert decode.state()["cached_tokens_in_cache"] == 0
        assert prefill.state()["cached_tokens_in_cache"] >= 3 * n_in

        p1, d1 = metrics(prefill), metrics(decode)
        assert "sglang:num_requests_total" not in p1
        n_requests = 1 + 2 + 3  # the warm-up, two non-streaming, three streaming
        assert p1["vllm:request_success_total"] - p0["vllm:request_success_total"] == 5
        assert d1["vllm:request_success_total"] - d0["vllm:request_success_total"] == 5
        assert p1["vllm:request_success_total"] == d1["vllm:request_success_total"] == n_requests
        assert p1["vllm:prompt_tokens_total"] - p0["vllm:prompt_tokens_total"] == 50 + 20 + 3 * n_in
        assert (
            d1["vllm:generation_tokens_total"] - d0["vllm:generation_tokens_total"]
            == 6 + 3 + 3 * n_out
        )
        assert p1["vllm:prefix_cache_queries_total"] > p0["vllm:prefix_cache_queries_total"]
        # the prefill's TTFT is its prefill time (the planner's TTFT series); the decode's ITL
        ttft_count = p1["vllm:time_to_first_token_seconds_count"]
        assert ttft_count - p0["vllm:time_to_first_token_seconds_count"] == 5
        ttft_sum = (
            p1["vllm:time_to_first_token_seconds_sum"] - p0["vllm:time_to_first_token_seconds_sum"]
        )
        want_sum = sum(MODEL.prefill_seconds(n) for n in (50, 20, n_in, n_in, n_in))
        # at least the modelled prefill time; at most each request's life on the prefill (its
        # TTFT is not its decode's time). Not the model plus a margin: a loaded CI pass read
        # 0.49 s against 0.35 + 0.1, each pass stretched by the host
        e2e_sum = (p1["vllm:e2e_request_latency_seconds_sum"]
                   - p0["vllm:e2e_request_latency_seconds_sum"])
        assert want_sum * 0.95 <= ttft_sum <= e2e_sum + 0.005, (ttft_sum, want_sum, e2e_sum)
        assert d1["vllm:inter_token_latency_seconds_count"] - d0[
            "vllm:inter_token_latency_seconds_count"] == 5 + 2 + 3 * (n_out - 1)  # fmt: skip
        assert (
            d1["vllm:inter_token_latency_seconds_sum"] > d0["vllm:inter_token_latency_seconds_sum"]
        )

        # the same prompt again hits the prefill's prefix cache
        hits = p1["vllm:prefix_cache_hits_total"]
        modelled = "pdscale_sim:request_modelled_prefill_seconds_sum"
        before = metrics(prefill)[modelled]
        again = stream(url, [words("s0x", n_in)], 2)
        assert again[0].ok
        # the hit skips the prompt's compute, on the engine's own clock (a client's TTFT
        # would compare two wall times ~0.1 s apart, which a busy host can swap)
        assert metrics(prefill)[modelled] - before < MODEL.prefill_seconds(n_in) / 2
        assert metrics(prefill)["vllm:prefix_cache_hits_total"] - hits >= n_in - 16

        # no /get_load in vLLM: in-flight work is read from the running/waiting gauges
        assert status_of(prefill.url + "/get_load") == 404
        assert status_of(decode.url + "/get_load") == 404
        assert status_of(decode.url + "/generate") in (404, 405)
        assert http_json(decode.url + "/v1/models")["data"][0]["id"] == "sim-model"
        assert engine_in_flight(decode.host, decode.port) == 0

        # a long request: the decode counts it as in flight, then drains it on SIGTERM
        long: list = []
        t = threading.Thread(target=lambda: long.extend(stream(url, [words("L", 100)], 80)))
        t.start()
        deadline = time.monotonic() + 5
        while engine_in_flight(decode.host, decode.port) != 1:
            assert time.monotonic() < deadline, "decode never showed the request in flight"
            time.sleep(0.02)
        decode.popen.send_signal(signal.SIGTERM)
        t.join(15)
        assert long and long[0].ok, long and long[0].error
        assert decode.popen.wait(10) == 0
    finally:
        stop.set()


@pytest.mark.slow
def test_vllm_decode_without_kv_transfer_params_prefills_locally(fleet):
    decode = fleet.start_engine("decode", "--dialect", "vllm")
    n_in = 2000
    t0 = time.monotonic()
    answer = post(decode.url + "/v1/chat/completions", {
        "model": "sim-model", "messages": [{"role": "user", "content": words("x", n_in)}],
        "max_tokens": 2})  # fmt: skip
    elapsed = time.monotonic() - t0
    assert answer["usage"]["completion_tokens"] == 2
    assert decode.state()["local_prefills"] == 1
    # a local prefill, no KV transfer, one decode step
    assert elapsed >= MODEL.prefill_seconds(n_in) * 0.95
    m = metrics(decode)
    assert m["vllm:prefix_cache_queries_total"] == n_in
    assert m["vllm:prompt_tokens_total"] == n_in and m["vllm:request_success_total"] == 1
