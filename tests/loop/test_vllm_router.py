"""The real vllm-router (PyPI 0.1.17) in PD mode, its worker list set by the operator's
announcer (operator/vllm_discovery.py): workers announced take traffic, a worker no longer
announced stops getting new requests within the timeout, and no request fails meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest

from pdscale.loadgen import RequestSpec, send_one
from pdscale.operator.vllm_discovery import LEAVE_MARGIN_SECONDS, PING_TIMEOUT_SECONDS, Announcer

pytestmark = pytest.mark.slow


def served(engine) -> int:
    return int(engine.metric("sglang:num_requests_total"))


def ask(router_url: str, n: int, tag: str, output_tokens: int = 4) -> list:
    async def run() -> list:
        async with aiohttp.ClientSession() as session:
            specs = [RequestSpec(i, tag, 0.0, 8, output_tokens, f"{tag} {i} a b c d e f g")
                     for i in range(n)]
            return await asyncio.gather(*(send_one(session, router_url, "chat", s, "sim-model",
                                                   0.0, 30.0) for s in specs))
    return asyncio.run(run())


def test_announced_workers_take_traffic_and_an_unannounced_one_leaves_without_failures(fleet):
    prefill = fleet.start_engine("prefill")
    decode = [fleet.start_engine("decode") for _ in range(2)]
    router_url, address = fleet.start_vllm_router("--decode-policy", "round_robin")

    announcer = Announcer(side_channel_port=5600)
    stop = threading.Event()
    thread = threading.Thread(target=announcer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert announcer.listed(address) is None  # just started: unknown, not empty
        announcer.set_workers(address, [prefill.spec, *(d.spec for d in decode)])
        time.sleep(2 * 1.0 + 0.5)
        records = ask(router_url, 8, "both")
        assert all(r.ok for r in records), [r.error for r in records if not r.ok]
        assert all(served(d) > 0 for d in decode), "round robin did not reach both decodes"

        # decode[1] drains: no longer announced. Keep traffic flowing while it leaves.
        announcer.set_workers(address, [prefill.spec, decode[0].spec])
        left_at = time.monotonic()
        results: list = []
        while time.monotonic() - left_at < PING_TIMEOUT_SECONDS + LEAVE_MARGIN_SECONDS:
            results += ask(router_url, 2, "leaving")
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert decode[1].url not in (announcer.listed(address) or {decode[1].url})
        before = served(decode[1])
        records = ask(router_url, 8, "after")
        assert all(r.ok for r in records)
        assert served(decode[1]) == before, "the router still sends to a worker it should have dropped"
    finally:
        stop.set()
        thread.join(timeout=5)
