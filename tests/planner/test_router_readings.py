"""What the planner reads of smg's prefill admission through a real Prometheus: the requests
the router holds count in the prefill queue, and its refusals as ``rejected_rps``; behind a
router that refuses nothing (or is not scraped) the queue is the engines' and the refusals
are zero, not unknown. Metric names as smg 1.13 exports them (checked against the binary:
``smg_pd_prefill_admission_queued``, ``smg_pd_prefill_admission_rejections_total{reason}``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pdscale.planner.prometheus import prometheus_client, read_metrics, render_queries
from pdscale.testbed.shape_change_engines import serve_metrics

pytestmark = pytest.mark.prometheus

SCOPE = {"namespace": "ns", "pdcluster": "pd"}


def _readings(prometheus, names: tuple[str, ...], ready: Callable[[dict], bool]) -> dict:
    queries = render_queries("sglang", namespace="ns", pdcluster="pd", window_seconds=5,
                             percentile=0.9)
    client = prometheus_client(prometheus.url)
    deadline = time.monotonic() + 40
    values: dict = {}
    while time.monotonic() < deadline:
        snap = read_metrics(client, {n: queries[n] for n in names}, time.time())
        values = {n: (None if r is None else r.value) for n, r in snap.readings.items()}
        if ready(values):
            return values
        time.sleep(0.5)
    return values


def test_smg_admission_counts_in_the_prefill_queue_and_as_rejections(prometheus):
    started = time.monotonic()
    # an engine that has served 5 requests a second, 7 waiting; a router holding 3 and
    # refusing 2 a second
    engine = serve_metrics(lambda: (
        "sglang:num_queue_reqs 7\n"
        f"sglang:num_requests_total {5 * (time.monotonic() - started):.1f}\n"))
    router = serve_metrics(lambda: (
        "smg_pd_prefill_admission_queued 3\n"
        f'smg_pd_prefill_admission_rejections_total{{reason="queue_timeout"}} '
        f"{2 * (time.monotonic() - started):.1f}\n"
        'smg_pd_prefill_admission_rejections_total{reason="queue_full"} 0\n'))
    try:
        prometheus.set_targets("engine", [f"127.0.0.1:{engine.server_address[1]}"],
                               {**SCOPE, "role": "prefill"})
        prometheus.set_targets("router", [f"127.0.0.1:{router.server_address[1]}"],
                               {**SCOPE, "role": "router"})
        names = ("queue_depth_prefill", "rejected_rps")
        # (a rate needs its window filled before it settles: wait for it, up to 40 s)
        got = _readings(prometheus, names, lambda v: v["queue_depth_prefill"] == 10
                        and abs((v["rejected_rps"] or 0) - 2.0) < 0.6)
        assert got["queue_depth_prefill"] == 10
        assert got["rejected_rps"] == pytest.approx(2.0, rel=0.3)

        # the router gone from the scrape (sglang-router, or smg not scraped): the engines'
        # queue, and no refusals rather than an unknown
        prometheus.set_targets("router", [])
        got = _readings(prometheus, names, lambda v: v["queue_depth_prefill"] == 7
                        and v["rejected_rps"] == 0)
        assert got == {"queue_depth_prefill": 7, "rejected_rps": 0}
    finally:
        prometheus.set_targets("engine", [])
        prometheus.set_targets("router", [])
        engine.shutdown()
        router.shutdown()
