"""The demo and the e2e create the router's request counter before their load (testbed.demo.
drive): the real router creates the series at its first request, and Prometheus' rate() of a
series born inside its window under-reads it. They do it with a body the router cannot parse,
so that no engine counts a request: this pins that the router counts it, refuses it itself
and routes nothing."""

from __future__ import annotations

import time

import pytest
from loop_harness import SGLANG_ROUTER, SMG, Fleet

from pdscale.testbed.demo import refused_by_router

pytestmark = pytest.mark.slow

CHAT = 'smg_http_requests_total{method="POST",path="/v1/chat/completions"}'


def _router_count(fleet: Fleet) -> float:
    return fleet.router_metric(CHAT)  # no series yet: 0, the router creates it at the first request


@pytest.mark.parametrize("gateway", [SGLANG_ROUTER, SMG])
def test_a_body_the_router_cannot_parse_is_counted_and_routed_nowhere(fleet: Fleet,
                                                                     gateway: str) -> None:
    prefill, decode = fleet.start_engine("prefill"), fleet.start_engine("decode")
    url = fleet.start_router([prefill], [decode], gateway=gateway)
    assert _router_count(fleet) == 0.0
    assert refused_by_router(url) == 400
    deadline = time.monotonic() + 5
    while _router_count(fleet) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _router_count(fleet) == 1.0
    for engine in (prefill, decode):
        assert engine.metric("sglang:num_requests_total") == 0.0
