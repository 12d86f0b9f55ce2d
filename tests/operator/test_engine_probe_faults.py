"""Engine and router probes against engines that misbehave: garbage replies (a seeded list of
several hundred) answer unknown (None) and never raise; a slow-drip server, one that never
answers and a huge body cost at most the probe's deadline plus a little."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdscale.operator.clients.engine_probe import (
    LOADS_PATH,
    engine_in_flight,
    engine_vllm_totals,
    in_flight_from_get_load,
)
from pdscale.operator.clients.routersync import SGLangWorkerList

SLACK_SECONDS = 0.5
DEADLINE = 1.0


@dataclass
class Replies:
    """What the fake engine answers, per path: (status, body, seconds between drips or 0)."""
    paths: dict[str, tuple[int, bytes, float]] = field(default_factory=dict)


def _handler(replies: Replies) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            status, body, drip = replies.paths.get(self.path, (404, b"not found", 0.0))
            try:
                if drip and self.path.endswith("headers"):
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n":
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(drip)
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not drip:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):  # one byte per drip: every read is quick
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(drip)
            except OSError:
                pass  # the probe hung up

    return Handler


@pytest.fixture
def engine() -> Iterator[tuple[int, Replies]]:
    replies = Replies()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(replies))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], replies
    server.shutdown()
    server.server_close()


def garbage_bodies(seed: int = 20261201, count: int = 200) -> list[bytes]:
    """Replies no engine would give as a count: not JSON, wrong types, negative, non-finite,
    fractional, empty, deeply nested, binary; half fixed, half drawn at random."""
    fixed: list[bytes] = [
        b"", b"null", b"true", b"0", b"-1", b"[]", b"{}", b"\"3\"", b"NaN", b"Infinity",
        b"{\"num_reqs\": null}", b"{\"num_reqs\": \"4\"}", b"{\"num_reqs\": -3}",
        b"{\"num_reqs\": 1.5}", b"{\"num_reqs\": NaN}", b"{\"num_reqs\": Infinity}",
        b"{\"num_reqs\": -Infinity}", b"{\"num_reqs\": true}", b"{\"num_reqs\": [1]}",
        b"{\"num_reqs\": {\"a\": 1}}", b"{\"num_reqs\": 1e400}", b"[{\"num_reqs\": 1}, 7]",
        b"[{\"num_reqs\": 1}, {\"num_reqs\": -1}]", b"[null]", b"[[{\"num_reqs\": 1}]]",
        b"{\"num_reqs\": 1", b"<html>502 Bad Gateway</html>", b"\xff\xfe\x00garbage",
        b"[" * 5000 + b"]" * 5000, b"{\"num_reqs\": " + b"9" * 5000 + b"}",
        b"vllm:num_requests_running -4\nvllm:num_requests_waiting 0\n",
        b"vllm:num_requests_running NaN\n", b"vllm:num_requests_running +Inf\n",
        b"vllm:num_requests_running{a=\"b\"} not-a-number\n", b"vllm:num_requests_running\n",
    ]
    rng = random.Random(seed)
    values: list[object] = [None, True, False, "x", -1, -0.5, 2.5, [], {}, [1, 2], {"a": -1},
                            float("nan"), float("inf"), -1e308]
    drawn: list[bytes] = []
    while len(fixed) + len(drawn) < count:
        kind = rng.randrange(4)
        if kind == 0:  # a count of a wrong type or value
            entries = [{"num_reqs": rng.choice(values)} for _ in range(rng.randint(1, 4))]
            drawn.append(json.dumps(entries if rng.random() < 0.5 else entries[0]).encode())
        elif kind == 1:  # random bytes
            drawn.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))))
        elif kind == 2:  # truncated good JSON
            good = json.dumps([{"num_reqs": rng.randint(0, 9)} for _ in range(3)]).encode()
            drawn.append(good[:rng.randint(1, len(good) - 1)])
        else:  # an object of other keys
            drawn.append(json.dumps({rng.choice(["load", "reqs", "x"]): rng.choice(values)}).encode())
    return fixed + drawn


def test_the_garbage_list_is_seeded_and_long_enough():
    assert garbage_bodies() == garbage_bodies() and len(garbage_bodies()) >= 100


def test_every_garbage_get_load_reply_is_unknown_never_an_exception(engine):
    port, replies = engine
    failures = []
    for body in garbage_bodies():
        replies.paths = {"/get_load": (200, body, 0.0), "/metrics": (200, body, 0.0)}
        started = time.monotonic()
        try:
            got = engine_in_flight("127.0.0.1", port, DEADLINE)
        except Exception as exc:  # the failure this test is about
            failures.append((body[:60], repr(exc)))
            continue
        assert time.monotonic() - started < DEADLINE + SLACK_SECONDS
        if got is not None:
            failures.append((body[:60], got))
    assert failures == []


def test_every_garbage_v1_loads_reply_is_unknown_and_never_read_through_get_load(engine):
    port, replies = engine
    failures = []
    for body in garbage_bodies():
        # the shim says idle: a probe that fell back to it would end a drain mid-transfer
        replies.paths = {LOADS_PATH: (200, body, 0.0), "/get_load": (200, b'{"num_reqs": 0}', 0.0)}
        started = time.monotonic()
        try:
            got = engine_in_flight("127.0.0.1", port, DEADLINE)
        except Exception as exc:
            failures.append((body[:60], repr(exc)))
            continue
        assert time.monotonic() - started < DEADLINE + SLACK_SECONDS
        if got is not None:
            failures.append((body[:60], got))
    assert failures == []


def test_garbage_as_vllm_metrics_is_unknown(engine):
    port, replies = engine
    for body in garbage_bodies()[:120]:
        replies.paths = {"/metrics": (200, body, 0.0)}
        assert engine_in_flight("127.0.0.1", port, DEADLINE) is None
        totals = engine_vllm_totals("127.0.0.1", port, DEADLINE)
        assert totals is None or not totals, (body[:60], totals)


def test_good_replies_still_count(engine):
    port, replies = engine
    replies.paths = {"/get_load": (200, b'[{"num_reqs": 2}, {"num_reqs": 3.0}]', 0.0)}
    assert engine_in_flight("127.0.0.1", port, DEADLINE) == 5
    replies.paths = {"/get_load": (200, b'{"num_reqs": 0}', 0.0)}
    assert engine_in_flight("127.0.0.1", port, DEADLINE) == 0
    replies.paths = {"/metrics": (200, b'vllm:num_requests_running{m="a"} 2\n'
                                       b'vllm:num_requests_waiting{m="a"} 1\n', 0.0)}
    assert engine_in_flight("127.0.0.1", port, DEADLINE) == 3


def test_in_flight_from_get_load_is_pure_and_strict():
    assert in_flight_from_get_load(b'{"num_reqs": 4}') == 4
    assert in_flight_from_get_load(b'[{"num_reqs": 1}, {"num_reqs": 2}]') == 3
    for bad in (b'{"num_reqs": -1}', b'{"num_reqs": 0.5}', b'{"num_reqs": NaN}', b"[]",
                b'{"other": 1}', b'{"num_reqs": false}', b"\xff"):
        assert in_flight_from_get_load(bad) is None, bad


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_slow_drip_engine_costs_the_deadline_not_more(engine, where):
    port, replies = engine
    body = b'{"num_reqs": 1}' + b" " * 200
    path = "/get_load" if where == "body" else "/get_load?headers"
    replies.paths = {path: (200, body, 0.2)}  # 0.2 s a byte: each read passes a 2 s timeout
    started = time.monotonic()
    if where == "headers":
        from pdscale.operator.clients.engine_probe import http_get

        got = http_get("127.0.0.1", port, path, time.monotonic() + DEADLINE)
    else:
        got = engine_in_flight("127.0.0.1", port, DEADLINE)
    assert got is None
    assert time.monotonic() - started < DEADLINE + SLACK_SECONDS


def test_an_engine_that_accepts_and_never_answers_costs_the_deadline():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        started = time.monotonic()
        assert engine_in_flight("127.0.0.1", listener.getsockname()[1], DEADLINE) is None
        assert time.monotonic() - started < DEADLINE + SLACK_SECONDS
    finally:
        listener.close()


def test_a_huge_body_is_unknown(engine):
    port, replies = engine
    replies.paths = {"/get_load": (200, b"[" + b'{"num_reqs": 1},' * 400_000 + b"{}]", 0.0),
                     "/metrics": (200, b"vllm:num_requests_running 1\n" * 200_000, 0.0)}
    started = time.monotonic()
    assert engine_in_flight("127.0.0.1", port, 5.0) is None
    assert time.monotonic() - started < 5.0 + SLACK_SECONDS


def test_a_slow_drip_router_costs_its_listing_deadline(engine, monkeypatch):
    port, replies = engine
    replies.paths = {"/workers": (200, b'{"workers": []}' + b" " * 100, 0.2)}
    monkeypatch.setattr(SGLangWorkerList, "LIST_TIMEOUT_SECONDS", DEADLINE)
    started = time.monotonic()
    assert SGLangWorkerList([f"http://127.0.0.1:{port}"]).listed() is None
    assert time.monotonic() - started < DEADLINE + SLACK_SECONDS
