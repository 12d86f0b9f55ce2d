"""The announcer's pure parts: the message vllm-router's discovery reads, and when a worker
that is no longer announced counts as gone from the router."""

from __future__ import annotations

import msgpack

from pdscale.operator.vllm_discovery import (
    LEAVE_MARGIN_SECONDS,
    PING_TIMEOUT_SECONDS,
    announcement,
    still_listed,
)
from pdscale.routersync import WorkerSpec


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


def test_a_dropped_decode_still_counts_as_listed_for_the_slowest_prefill():
    # vllm-router chose this decode for requests now in their prefill: they reach it later.
    window = PING_TIMEOUT_SECONDS + LEAVE_MARGIN_SECONDS
    sent = {"http://d:8000": 100.0}
    assert still_listed(sent, now=100.0 + window + 5, started=0.0) == set()
    assert still_listed(sent, now=100.0 + window + 5, started=0.0, linger_seconds=25) == set(sent)
