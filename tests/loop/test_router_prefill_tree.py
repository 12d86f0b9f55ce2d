"""Does the real SGLang router route PD prefill cache-aware for the workers the operator adds?

The operator registers every worker through ``POST /workers`` (operator/clients/routersync.py). With
``--prefill-policy cache_aware``, sglang-router 0.3.2 never builds a prefix tree for its PD
prefill policy: the per-model policy is initialised ("Initializing cache-aware policy with N
workers for model sim-model"), the separate prefill policy the PD router routes with never is
(no "Initializing prefill cache-aware policy"), so every request logs "No tree found for model
'sim-model', using random worker selection" and its prefill is picked at random - whatever
model the worker reports or the POST names (docs/routers.md, "PD prefill routing"). smg 1.13
initialises the prefill policy on each added worker and keeps a prefix on one prefill.

These tests pin both behaviours: when the sglang-router one fails after an upgrade, its prefill
routing is cache-aware again and the replay's model of it must follow."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from loop_harness import SGLANG_ROUTER, SMG, Fleet, http_json

from pdscale.operator.clients.routersync import RouterClient

pytestmark = pytest.mark.slow

POLICIES = ("--policy", "cache_aware", "--prefill-policy", "cache_aware",
            "--decode-policy", "round_robin", "--log-level", "debug")  # fmt: skip
NO_TREE = "No tree found for model 'sim-model', using random worker selection"
PREFILL_TREE = "Initializing prefill cache-aware policy"
REQUESTS = 12  # all on one prefill by chance when random: 2 / 2**12


async def _register(router_url: str, fleet: Fleet, engines) -> None:
    async with aiohttp.ClientSession() as session:
        client = RouterClient(router_url, session)
        for e in engines:
            await client.add_worker(e.spec)


def _prefills_chosen(fleet: Fleet, gateway: str) -> tuple[list[int], str]:
    """Which of two operator-registered prefills served each of :data:`REQUESTS` sequential
    requests sharing a 400-word prefix (half /generate, half /v1/completions, all naming the
    model), and the router's log without colours."""
    prefill = [fleet.start_engine("prefill") for _ in range(2)]
    decode = [fleet.start_engine("decode")]
    url = fleet.start_router([], [], *POLICIES, gateway=gateway)
    asyncio.run(_register(url, fleet, prefill + decode))
    fleet.wait_router_workers(3)
    prefix = " ".join(f"w{i}" for i in range(400))
    chosen, before = [], [0.0, 0.0]
    for k in range(REQUESTS):
        text = f"{prefix} tail{k}"
        if k % 2:
            body = {"model": "sim-model", "prompt": text, "max_tokens": 2}
            http_json(url + "/v1/completions", method="POST", body=body, timeout=30)
        else:
            body = {"model": "sim-model", "text": text, "sampling_params": {"max_new_tokens": 2}}
            http_json(url + "/generate", method="POST", body=body, timeout=30)
        after = [e.metric("sglang:num_requests_total") for e in prefill]
        chosen.append(next(i for i in range(2) if after[i] > before[i]))
        before = after
    assert fleet.router is not None
    return chosen, re.sub(r"\x1b\[[0-9;]*m", "", fleet.router.log.read_text())


def test_sglang_router_routes_api_added_pd_prefills_at_random(fleet):
    chosen, log = _prefills_chosen(fleet, SGLANG_ROUTER)
    # the per-model policy has its tree under the very id the requests are looked up by
    assert re.search(r"Initializing cache-aware policy with \d+ workers for model sim-model", log)
    assert PREFILL_TREE not in log, fleet.describe()
    assert log.count(NO_TREE) >= REQUESTS, fleet.describe()
    assert len(set(chosen)) == 2, chosen


def test_smg_keeps_an_api_added_prefix_on_one_prefill(fleet):
    chosen, log = _prefills_chosen(fleet, SMG)
    assert PREFILL_TREE in log, fleet.describe()
    assert NO_TREE not in log, fleet.describe()
    assert len(set(chosen)) == 1, chosen
