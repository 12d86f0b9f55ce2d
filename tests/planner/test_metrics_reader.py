"""The metrics reader: PromQL per engine for one PDCluster, and unknown never read as zero.
The last test runs the queries against a real Prometheus scraping SGLang-named metrics."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdscale.planner.observe import RoleState
from pdscale.planner.prometheus import (
    NOT_EXPORTED,
    READINGS,
    MetricsSnapshot,
    observation_from,
    prometheus_client,
    read_metrics,
    render_queries,
    to_reading,
)


def test_every_reading_has_a_query_for_both_engines():
    for engine in ("sglang", "SGLang", "vllm"):
        queries = render_queries(engine, namespace="ns", pdcluster="glm", window_seconds=60, percentile=0.99)
        assert set(queries) == set(READINGS) - NOT_EXPORTED[engine.lower()]
        for q in queries.values():
            assert 'namespace="ns",pdcluster="glm"' in q
            assert "{sel}" not in q and "{window}" not in q


def test_queries_select_the_right_role_and_window():
    q = render_queries("sglang", namespace="a", pdcluster="b", window_seconds=120, percentile=0.99)
    assert q["queue_depth_prefill"] == (
        'sum({__name__=~"sglang[:_](num_queue_reqs|num_prefill_prealloc_queue_reqs|'
        'num_prefill_bootstrap_queue_reqs)",namespace="a",pdcluster="b",role="prefill"})'
        ' + (sum(smg_pd_prefill_admission_queued{namespace="a",pdcluster="b",role="router"})'
        ' or vector(0))')
    assert '[120s]' in q["rate_rps"]
    assert 'role="decode"' in q["tpot_at_percentile_seconds"] and "0.99" in q["tpot_at_percentile_seconds"]


def test_overrides_replace_one_query_and_typos_are_refused():
    q = render_queries("vllm", namespace="a", pdcluster="b", window_seconds=60, percentile=0.99,
                       overrides={"ttft_at_percentile_seconds": "max(router_ttft{{{sel}}})"})
    assert q["ttft_at_percentile_seconds"] == 'max(router_ttft{namespace="a",pdcluster="b"})'
    with pytest.raises(ValueError, match=r"queries\.ttft_p98_seconds: unknown reading"):
        render_queries("vllm", namespace="a", pdcluster="b", window_seconds=60, percentile=0.99,
                       overrides={"ttft_p98_seconds": "x"})
    with pytest.raises(ValueError, match=r"queries\.rate_rps: bad template"):
        render_queries("vllm", namespace="a", pdcluster="b", window_seconds=60, percentile=0.99,
                       overrides={"rate_rps": "sum(x{{{selector}}})"})
    with pytest.raises(ValueError, match=r"engine: unknown engine 'trt'"):
        render_queries("trt", namespace="a", pdcluster="b", window_seconds=60, percentile=0.99)


@pytest.mark.parametrize(("answer", "reason"), [
    ([], "no data"),
    ([{"metric": {}, "value": [0, "NaN"]}], "not a number"),
    ([{"metric": {}, "value": [0, "+Inf"]}], "not a number"),
    ([{"metric": {"a": "1"}, "value": [0, "1"]}, {"metric": {"a": "2"}, "value": [0, "2"]}], "2 series"),
    ([{"metric": {}}], "malformed"),
])
def test_unknown_answers_are_none_with_a_reason(answer, reason):
    reading, why = to_reading(answer, 5.0)
    assert reading is None
    assert reason in why


def test_a_zero_is_a_real_zero():
    # (stamped at the sample's time, not the caller's)
    reading, why = to_reading([{"metric": {}, "value": [6.5, "0"]}], 7.0)
    assert reading is not None and reading.value == 0.0 and reading.at_seconds == 6.5
    assert why is None


class _Refusing:
    def custom_query(self, query):
        raise ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded")


def test_unreachable_prometheus_gives_unknown_everywhere_and_says_so():
    queries = render_queries("sglang", namespace="a", pdcluster="b", window_seconds=60, percentile=0.99)
    snap = read_metrics(_Refusing(), queries, now_seconds=100.0)
    assert all(v is None for v in snap.readings.values())
    assert snap.unreachable
    # one line, not one per query (issue 46): what failed and that the planner holds
    assert snap.summary() == "Prometheus unreachable: cannot connect: no metrics read, the planner holds"
    obs = observation_from(snap, 100.0, RoleState(ready=3), RoleState(ready=5))
    assert obs.rate_rps is None and obs.prefill.queue_depth is None
    assert obs.prefill.ready == 3 and obs.decode.ready == 5


def test_partial_answers_keep_what_was_read():
    snap = MetricsSnapshot({"rate_rps": None, "queue_depth_decode": to_reading(
        [{"metric": {}, "value": [0, "4"]}], 1.0)[0]}, {"rate_rps": "no data"})
    assert not snap.unreachable
    obs = observation_from(snap, 1.0, RoleState(), RoleState())
    assert obs.decode.queue_depth is not None and obs.decode.queue_depth.value == 4.0
    assert obs.rate_rps is None


class _Engine(BaseHTTPRequestHandler):
    """SGLang-named counters growing at known rates: 5 req/s of 2,000 prompt tokens, 40% cached,
    100 output tokens; and the PD queues. The prefill writes the ``sglang:`` prefix, the decode
    ``sglang_`` (an exporter that rewrites the colon): the reader must read both."""

    started_ms = round(time.time() * 1000)

    def do_GET(self):
        # each sample carries the time its value was computed at: Prometheus would otherwise
        # stamp it with the scrape's start, and on a busy machine the handler runs late by a
        # different amount on each target, which moved a ratio across the two by 2% (issue 47)
        now_ms = round(time.time() * 1000)
        t = (now_ms - self.started_ms) / 1000
        role = self.server.role  # type: ignore[attr-defined]
        if role == "prefill":
            lines = [
                f'sglang:num_requests_total{{engine_type="{role}"}} {5 * t:.3f}',
                f'sglang:prompt_tokens_total{{engine_type="{role}"}} {5 * 2000 * t:.3f}',
                f'sglang:cached_tokens_total{{engine_type="{role}"}} {5 * 800 * t:.3f}',
                # waiting 3 + bootstrap 2 count; the inflight queue's prefill is done
                f'sglang:num_queue_reqs{{engine_type="{role}"}} 3',
                f'sglang:num_prefill_prealloc_queue_reqs{{engine_type="{role}"}} 2',
                f'sglang:num_prefill_inflight_queue_reqs{{engine_type="{role}"}} 9',
                # prompts per second: 3 up to 1,000 tokens, 2 between 1,000 and 4,000
                f'sglang:prompt_tokens_histogram_bucket{{engine_type="{role}",le="1000.0"}} {3 * t:.3f}',
                f'sglang:prompt_tokens_histogram_bucket{{engine_type="{role}",le="4000.0"}} {5 * t:.3f}',
                f'sglang:prompt_tokens_histogram_bucket{{engine_type="{role}",le="+Inf"}} {5 * t:.3f}',
                # 0.2 s in forward passes per prompt; another stage that must not count
                f'sglang:per_stage_req_latency_seconds_sum{{engine_type="{role}",stage="prefill_forward"}} {5 * 0.2 * t:.3f}',
                f'sglang:per_stage_req_latency_seconds_count{{engine_type="{role}",stage="prefill_forward"}} {5 * t:.3f}',
                f'sglang:per_stage_req_latency_seconds_sum{{engine_type="{role}",stage="prefill_waiting"}} {5 * 9 * t:.3f}',
                f'sglang:per_stage_req_latency_seconds_count{{engine_type="{role}",stage="prefill_waiting"}} {5 * t:.3f}',
                # GPU busy 0.75 s per second in prefill passes (0.15 s per prompt), under the
                # names and categories of main (0.5) and of v0.5.23 (0.25); decode steps are not
                # prefill's
                f'sglang:gpu_execution_seconds_total{{engine_type="{role}",category="forward_extend"}} {0.5 * t:.3f}',
                f'sglang:forward_execution_seconds_total{{engine_type="{role}",category="extend"}} {0.25 * t:.3f}',
                f'sglang:gpu_execution_seconds_total{{engine_type="{role}",category="forward_decode"}} {9 * t:.3f}',
                f'sglang:forward_execution_seconds_total{{engine_type="{role}",category="decode"}} {9 * t:.3f}',
            ]
        else:
            lines = [
                f'sglang_num_requests_total{{engine_type="{role}"}} {5 * t:.3f}',
                f'sglang_generation_tokens_total{{engine_type="{role}"}} {5 * 100 * t:.3f}',
                # waiting 1 + prealloc 2 + transfer 4
                f'sglang_num_queue_reqs{{engine_type="{role}"}} 1',
                f'sglang_num_decode_prealloc_queue_reqs{{engine_type="{role}"}} 2',
                f'sglang_num_decode_transfer_queue_reqs{{engine_type="{role}"}} 4',
                # the batch swings 4 <-> 8 each second: 6 on average over the window
                f'sglang_num_running_reqs{{engine_type="{role}"}} {4 if int(t) % 2 else 8}',
                # 3 requests streaming on average: 3 s of inter-token gaps per second
                f'sglang_inter_token_latency_seconds_sum{{engine_type="{role}"}} {3 * t:.3f}',
                # 75 tokens a second between them: 40 ms each on average
                f'sglang_inter_token_latency_seconds_count{{engine_type="{role}"}} {75 * t:.3f}',
            ]
        body = "".join(f"{line} {now_ms}\n" for line in lines).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.prometheus
@pytest.mark.slow
def test_reads_a_real_prometheus(prometheus):
    servers = []
    for role in ("prefill", "decode"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
        server.role = role  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        prometheus.set_targets(f"reader-{role}", [f"127.0.0.1:{server.server_address[1]}"],
                               {"namespace": "ns", "pdcluster": "glm", "role": role})
    try:
        queries = render_queries("sglang", namespace="ns", pdcluster="glm", window_seconds=5, percentile=0.99)
        client = prometheus_client(prometheus.url)
        deadline = time.monotonic() + 40
        snap = read_metrics(client, queries, 0.0)
        while time.monotonic() < deadline and (snap.readings["mean_input_tokens"] is None
                                               or snap.readings["mean_output_tokens"] is None):
            time.sleep(1)
            snap = read_metrics(client, queries, 0.0)
        # A rate is only whole once the series spans the window (Prometheus extrapolates less
        # at a series' start): a window and two scrapes more.
        time.sleep(7)
        snap = read_metrics(client, queries, 0.0)
        r = snap.readings
        assert r["rate_rps"] is not None and r["rate_rps"].value == pytest.approx(5, rel=0.25)
        assert r["mean_input_tokens"].value == pytest.approx(2000, rel=0.02)
        assert r["prefix_hit_rate"].value == pytest.approx(0.4, rel=0.02)
        assert r["mean_output_tokens"].value == pytest.approx(100, rel=0.02)
        assert r["prefill_forward_seconds"].value == pytest.approx(0.2, rel=0.02)
        assert r["prefill_busy_seconds_per_request"].value == pytest.approx(0.15, rel=0.02)
        assert r["queue_depth_prefill"].value == 3 + 2 and r["queue_depth_decode"].value == 1 + 2 + 4
        # the gauge now, and its mean over the window (what the interval's TPOTs ran at)
        assert r["running_requests_decode"].value in (4, 8)
        assert r["running_requests_mean_decode"].value == pytest.approx(6, abs=1.0)
        # the requests that decoded over the last scrape, from the inter-token gaps' sum (not
        # the logged gauge)
        assert r["decoding_requests_decode"].value == pytest.approx(3, rel=0.02)
        # and over the whole window, with the gaps' mean: what calibration reads the decode by
        assert r["decoding_requests_mean_decode"].value == pytest.approx(3, rel=0.02)
        assert r["tpot_mean_seconds"].value == pytest.approx(0.04, rel=0.02)
        # 75 tokens streamed a second for 5 prompts prefilled: 15 each, and the first token
        assert r["streamed_output_tokens"].value == pytest.approx(16, rel=0.02)
        # the buckets read as the spread: 3 prompts at 500 and 2 at 2,500, each spread over its
        # bucket (the rate's extrapolation scales every bucket alike)
        mean = (3 * 500 + 2 * 2500) / 5
        square = (3 * (500**2 + 1000**2 / 12) + 2 * (2500**2 + 3000**2 / 12)) / 5
        assert r["input_tokens_square_ratio"].value == pytest.approx(square / mean**2, rel=0.02)
        # No histogram is exported: TTFT is unknown, not zero, and the failure says so.
        assert r["ttft_at_percentile_seconds"] is None and snap.failures["ttft_at_percentile_seconds"] == "no data"
        # Another PDCluster's selector sees nothing at all.
        other = read_metrics(client, render_queries("sglang", namespace="ns", pdcluster="x",
                                                    window_seconds=5, percentile=0.99), 0.0)
        assert all(v is None for v in other.readings.values())
    finally:
        for server in servers:
            server.shutdown()
        for role in ("prefill", "decode"):
            prometheus.set_targets(f"reader-{role}", [])


def test_unreachable_real_endpoint_is_reported_as_unreachable():
    snap = read_metrics(prometheus_client("http://127.0.0.1:1", timeout_seconds=2),
                        {"rate_rps": "sum(x)"}, 0.0)
    assert snap.readings["rate_rps"] is None
    assert snap.failures["rate_rps"].startswith("unreachable")
