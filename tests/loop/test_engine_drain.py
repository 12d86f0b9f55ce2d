"""One simulated engine on its own: graceful drain on SIGTERM, and the admin drain."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from pdscale.testbed.loadgen import RequestSpec, send_one

# live engine processes timed on the wall clock: out of make test-fast (its pure tier has no
# live engines), in make test
pytestmark = pytest.mark.slow


def long_request(tokens_out: int) -> RequestSpec:
    return RequestSpec(0, "drain", 0.0, 8, tokens_out, " ".join(f"w{i}" for i in range(8)))


def test_sigterm_finishes_in_flight_work_refuses_new_and_exits_cleanly(fleet):
    engine = fleet.start_engine("decode")

    async def scenario():
        async with aiohttp.ClientSession() as session:
            # no bootstrap fields: the decode engine prefills locally, then decodes 40 steps
            running = asyncio.create_task(
                send_one(session, engine.url, "chat", long_request(40), "sim-model", 0.0, 30)
            )
            while engine.state()["inflight"] == 0:
                await asyncio.sleep(0.01)
            engine.popen.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            state = engine.state()
            async with session.get(engine.url + "/health") as health:
                health_status = health.status
            refused = await send_one(session, engine.url, "chat", long_request(3), "sim-model",
                                     0.0, 30)  # fmt: skip
            return await running, state, health_status, refused

    record, state, health_status, refused = asyncio.run(scenario())
    assert record.ok, f"{record.error}; {fleet.describe()}"
    assert state["draining"] and state["inflight"] == 1
    assert health_status == 503
    assert refused.status == 503 and not refused.ok
    assert engine.popen.wait(10) == 0, engine.tail()


def test_admin_drain_without_exit_keeps_the_process_and_reports_in_flight(fleet):
    engine = fleet.start_engine("decode")

    async def scenario():
        async with aiohttp.ClientSession() as session:
            # long enough to still decode when /get_load answers after the drain: 20 tokens
            # finished in between on a busy machine (issue 47), leaving num_reqs at 0
            running = asyncio.create_task(
                send_one(session, engine.url, "generate", long_request(200), "sim-model", 0.0, 30)
            )
            while engine.state()["inflight"] == 0:
                await asyncio.sleep(0.01)
            async with session.post(engine.url + "/sim/drain") as resp:
                drained = await resp.json()
            async with session.get(engine.url + "/get_load") as resp:
                load = await resp.json()
            return await running, drained, load

    record, drained, load = asyncio.run(scenario())
    assert record.ok, record.error
    assert drained["draining"] and drained["inflight"] == 1 and load[0]["num_reqs"] == 1
    time.sleep(0.3)
    assert engine.popen.poll() is None  # drain without exit: the pod decides when to stop
    assert engine.state()["inflight"] == 0


def test_time_compression_and_the_planner_profile_set_the_pace(fleet):
    # the planner's default profile, four times faster than modelled
    from pdscale.testbed.simengine import planner_timing

    compression = 4.0
    engine = fleet.start_engine("decode", "--profile", "deepseek-fp8-8xh200-sglang",
                                "--time-compression", str(compression))  # fmt: skip
    model = planner_timing("deepseek-fp8-8xh200-sglang")
    n_in, n_out = 4000, 30
    spec = RequestSpec(0, "pace", 0.0, n_in, n_out, " ".join(f"p{i}" for i in range(n_in)))

    async def one():
        async with aiohttp.ClientSession() as session:
            return await send_one(session, engine.url, "chat", spec, "sim-model", 0.0, 30)

    record = asyncio.run(one())
    assert record.ok, record.error
    # no bootstrap fields: the engine prefills locally (no queue, no KV transfer)
    ttft = model.prefill_seconds(n_in, 0) / compression
    tpot = model.tpot_seconds(1, n_in + n_out / 2) / compression
    print(f"\ncompressed x{compression}: TTFT {record.ttft_seconds:.4f}s (model {ttft:.4f}s), "
          f"TPOT {record.tpot_seconds:.5f}s (model {tpot:.5f}s)")  # fmt: skip
    assert ttft <= record.ttft_seconds <= ttft + 0.03, (record.ttft_seconds, ttft)
    # a token's step is a few ms of sleep, and a busy machine adds its scheduling delay to
    # each (measured with 18 runnable processes on two cores: 2.1x the model's pace); the
    # bound still tells the compressed pace from the uncompressed one (4x)
    assert tpot * 0.95 <= record.tpot_seconds <= tpot * 3.0, (record.tpot_seconds, tpot)
