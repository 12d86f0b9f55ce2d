"""The announcer's pure parts: the message vllm-router's discovery reads, and when a worker
that is no longer announced counts as gone from the router."""

from __future__ import annotations

import msgpack

from pdscale.operator.clients.routersync import WorkerSpec
from pdscale.operator.clients.vllm_discovery import (
    LEAVE_MARGIN_SECONDS,
    PING_TIMEOUT_SECONDS,
    PrefillBacklog,
    PrefillCount,
    announcement,
    still_listed,
    vllm_totals,
)


def test_announcement_names_the_role_and_both_addresses():
    prefill = msgpack.loads(announcement(WorkerSpec("http://10.1.2.3:8000", "prefill", None), 5600))
    assert prefill == {"type": "P", "http_address": "10.1.2.3:8000", "zmq_address": "10.1.2.3:5600"}
    decode = msgpack.loads(announcement(WorkerSpec("http://10.1.2.4:8000/", "decode", None), 5600))
    assert decode["type"] == "D" and decode["http_address"] == "10.1.2.4:8000"


def test_a_worker_counts_as_listed_until_the_router_timeout_has_passed():
    window = PING_TIMEOUT_SECONDS + LEAVE_MARGIN_SECONDS
    sent = {"http://a:8000": 100.0, "http://b:8000": 100.0 + window}
    assert still_listed(sent, now=100.0 + window + 0.5, started=0.0) == {"http://b:8000"}
    assert still_listed(sent, now=100.0 + window - 0.5, started=0.0) == set(sent)


def test_after_a_restart_everything_counts_as_listed_for_one_timeout():
    # What the previous operator announced is unknown: a drain must not finish on a guess.
    assert still_listed({}, now=10.0, started=8.0) is None
    assert still_listed({}, now=8.0 + PING_TIMEOUT_SECONDS + LEAVE_MARGIN_SECONDS, started=8.0) == set()


METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 40.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 3.0
"""


def test_a_prefill_count_sums_every_finish_reason_and_both_queues():
    count = PrefillCount.from_totals(vllm_totals(METRICS) or {})
    assert count == PrefillCount(finished=43.0, held=7.0)
    assert vllm_totals("vllm:num_requests_running{a=\"b\"} not-a-number") is None
    # a line of some other metric that does not parse is not ours to judge
    assert vllm_totals(METRICS + "vllm:other{x=\"y\"} ???\n") == vllm_totals(METRICS)
    assert PrefillCount.from_totals(vllm_totals("# nothing\n") or {}) is None  # not vLLM: unknown


def test_a_dropped_decode_waits_until_each_prefill_has_served_what_it_held():
    # vllm-router chose this decode for requests now queued at prefill: they reach it later,
    # however long the prefill queue is.
    backlog = PrefillBacklog({"p0": PrefillCount(finished=100, held=30),
                              "p1": PrefillCount(finished=7, held=0)})
    assert backlog.waiting_on() == 30
    # p0 has served 29 of its 30 (and taken new ones): still pending, at any age
    later = backlog.follow({"p0": PrefillCount(129, 50), "p1": PrefillCount(90, 12)}, now=500.0)
    assert later.cleared_at is None and later.pending(now=500.0, linger_seconds=10)
    cleared = later.follow({"p0": PrefillCount(130, 49), "p1": PrefillCount(91, 12)}, now=510.0)
    assert cleared.cleared_at == 510.0
    # the last one it held may still be mid-batch: one slowest prefill more
    assert cleared.pending(now=519.0, linger_seconds=10)
    assert not cleared.pending(now=520.0, linger_seconds=10)
    assert cleared.follow({}, now=600.0) == cleared  # cleared stays cleared


def test_an_unanswering_prefill_holds_the_drain_and_a_gone_or_restarted_one_does_not():
    backlog = PrefillBacklog({"p0": PrefillCount(finished=100, held=3)})
    assert backlog.follow({"p0": None}, now=1.0).cleared_at is None  # unknown is not zero
    assert backlog.follow({}, now=1.0).cleared_at == 1.0  # the pod is gone, its requests too
    # a counter that went down: the engine restarted, and what it held failed with it
    assert backlog.follow({"p0": PrefillCount(finished=2, held=1)}, now=1.0).cleared_at == 1.0
