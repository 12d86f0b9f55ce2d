"""Every Prometheus query is bounded, whatever the server at the URL does: a deadline over the
whole exchange (a server that never answers, or drips a byte at a time, holds a query no longer
than it), a cap on the answer (one streaming for ever is cut as it streams), one plan's reads
bounded together, and no answer's text in the status a tenant reads (a fixed reason instead).
The servers are real, on loopback (testbed.hostile_http); each gives up by itself after a
while, so that a client without bounds fails these tests on time instead of hanging."""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer

from pdscale.planner.prometheus import (
    READINGS,
    MetricsSnapshot,
    prometheus_client,
    read_metrics,
    render_queries,
)
from pdscale.testbed.hostile_http import HealthyPrometheus, HostileServer

QUERIES = render_queries("sglang", namespace="a", pdcluster="b", window_seconds=60, percentile=0.9)


def _timed(fn):
    started = time.monotonic()
    out = fn()
    return out, time.monotonic() - started


def test_a_server_that_never_answers_holds_a_whole_plan_one_deadline():
    # 22 queries at a 1 s deadline each: a reader that asks each in turn takes 22 s
    with HostileServer("silent", give_up_seconds=40) as server:
        snap, took = _timed(lambda: read_metrics(prometheus_client(server.url, timeout_seconds=1.0),
                                                 QUERIES, 0.0))
    assert took < 4.0, f"a plan's read took {took:.1f} s"
    assert all(v is None for v in snap.readings.values())
    assert snap.unreachable and set(snap.failures.values()) == {"unreachable: no whole answer within 1 s"}
    assert server.connections == 1  # the rest were not asked


def test_a_dripping_server_cannot_stretch_a_query_past_its_deadline():
    # a byte every 0.2 s passes every per-read timeout; only a deadline over the exchange ends it
    with HostileServer("drip", give_up_seconds=15, drip_every_seconds=0.2) as server:
        snap, took = _timed(lambda: read_metrics(prometheus_client(server.url, timeout_seconds=1.5),
                                                 {"rate_rps": "sum(x)"}, 0.0))
        assert server.bytes_sent > 2  # it was dripping when the client gave up
    assert took < 3.5, f"one query took {took:.1f} s"
    assert snap.failures == {"rate_rps": "unreachable: no whole answer within 1.5 s"}


def test_an_answer_streaming_for_ever_is_cut_at_the_cap_not_buffered():
    with HostileServer("stream", give_up_seconds=20) as server:
        client = prometheus_client(server.url, timeout_seconds=10.0, max_answer_bytes=256 * 1024)
        snap, took = _timed(lambda: read_metrics(client, QUERIES, 0.0))
        sent = server.bytes_sent
        assert server.connections == 1  # once too large, the plan's other queries are not sent
    assert set(snap.failures.values()) == {"query failed: answer over 256 KiB"}
    assert took < 5.0, f"one query took {took:.1f} s"
    # what the server got out before the client hung up: the cap and the sockets' buffers
    assert sent < 16 * 1024 * 1024, f"{sent} bytes streamed"


def test_an_error_page_never_reaches_the_status():
    with HostileServer("error") as server:
        snap = read_metrics(prometheus_client(server.url, timeout_seconds=5.0), QUERIES, 0.0)
    assert set(snap.failures.values()) == {"query failed: HTTP 5xx"}
    assert server.secret not in snap.summary() and "internal admin console" not in snap.summary()
    assert server.secret not in json.dumps(dict(snap.failures))
    assert snap.summary() == "no metrics read (query failed: HTTP 5xx)"


def test_an_unreachable_prometheus_is_one_short_line_that_says_what_to_check():
    # nothing listens on port 1 (issue 46: this was 22 query URLs, 3.5 KB)
    snap = read_metrics(prometheus_client("http://127.0.0.1:1", timeout_seconds=2.0), QUERIES, 0.0,
                        source="spec.planner.prometheusURL")
    line = snap.summary()
    assert line == ("Prometheus unreachable: cannot connect: no metrics read, the planner holds; "
                    "check spec.planner.prometheusURL")
    assert len(snap.failures) == len(QUERIES)


def test_a_partial_read_groups_the_unknown_by_reason_in_a_bounded_line():
    failures = {name: "no data" for name in READINGS[:10]}
    failures[READINGS[10]] = "not a number (no traffic in the window?)"
    snap = MetricsSnapshot({name: None for name in READINGS}, failures)
    line = snap.summary()
    assert line.startswith(f"11 of {len(READINGS)} metrics unknown: no data (")
    assert "and 6 more" in line and len(line) < 300


class _SlowAnswers(HealthyPrometheus):
    """A valid answer to every query, each after 0.4 s."""

    delay_seconds = 0.4


def test_one_plans_reads_together_stay_within_its_budget():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        snap, took = _timed(lambda: read_metrics(prometheus_client(url), QUERIES, time.time(),
                                                 budget_seconds=1.5))
    finally:
        server.shutdown()
    assert took < 2.5, f"the reads took {took:.1f} s"
    read = [name for name, v in snap.readings.items() if v is not None]
    assert 1 <= len(read) <= 4
    assert "not read: the 1.5 s for all queries ran out" in snap.failures.values()


def test_a_healthy_prometheus_is_read_as_before():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = prometheus_client(f"http://127.0.0.1:{server.server_address[1]}/")
        answer = client.custom_query("sum(x)", {"time": "1"})
    finally:
        server.shutdown()
    assert answer[0]["value"][1] == "1"
