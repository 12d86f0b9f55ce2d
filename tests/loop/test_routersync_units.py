"""Router worker sync without a router: the diff (sglang-router 0.3.2's and smg 1.13's
listings), unreadable listings, and the scale-down release order."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdscale.operator.clients.routersync import (
    RouterClient,
    RouterError,
    RouterWorker,
    SGLangWorkerList,
    WorkerSpec,
    diff_workers,
    drain_and_stop,
    parse_worker_list,
)

P1 = WorkerSpec("http://127.0.0.11:30000", "prefill", 8998)
P2 = WorkerSpec("http://127.0.0.12:30000", "prefill", 8998)
D1 = WorkerSpec("http://127.0.0.21:30000", "decode")
D2 = WorkerSpec("http://127.0.0.22:30000", "decode")


def listed(spec: WorkerSpec, id_: str = "", **kw) -> RouterWorker:
    return RouterWorker(id_ or spec.url, spec.url, spec.role, spec.bootstrap_port, **kw)


def test_no_change_when_router_matches():
    assert diff_workers([P1, D1], [listed(P1), listed(D1)]).empty


def test_adds_missing_and_removes_extra():
    plan = diff_workers([P1, D1, D2], [listed(P1), listed(P2), listed(D1)])
    assert plan.add == (D2,)
    assert [w.url for w in plan.remove] == [P2.url]
    assert plan.replace == ()


def test_url_spelling_does_not_count_as_a_difference():
    router = RouterWorker("x", "HTTP://127.0.0.11:30000/", "prefill", 8998)
    assert diff_workers([P1], [router]).empty


def test_wrong_role_or_bootstrap_port_is_replaced():
    wrong_port = RouterWorker("a", P1.url, "prefill", 9000)
    wrong_role = RouterWorker("b", D1.url, "prefill", 8998)
    plan = diff_workers([P1, D1], [wrong_port, wrong_role])
    assert plan.add == () and plan.remove == ()
    assert {(old.id, new) for old, new in plan.replace} == {("a", P1), ("b", D1)}


def test_unhealthy_listed_worker_is_left_to_the_router():
    # health is the router's business (it stops routing to it); membership is ours
    assert diff_workers([D1], [listed(D1, healthy=False)]).empty


# -- smg 1.13's entry states -----------------------------------------------------------------

def test_a_draining_entry_is_never_removed_again():
    # smg keeps a deleted worker listed as draining for its settle time; a second DELETE (or
    # a POST of its URL) meanwhile can make the late removal take a new registration with it
    plan = diff_workers([P1], [listed(P1), listed(D1, status="draining")])
    assert plan.empty and plan.remove == () and plan.held == ()


def test_a_desired_url_still_draining_is_held_not_added():
    old = listed(D1, status="draining")
    plan = diff_workers([P1, D1], [listed(P1), old])
    assert plan.empty and plan.add == () and plan.held == (old,)


def test_a_draining_entry_does_not_hide_a_live_one_of_the_same_url():
    plan = diff_workers([D1], [listed(D1, "old", status="draining"), listed(D1, "new")])
    assert plan.empty and plan.held == ()


def test_a_pending_entry_of_a_desired_url_is_held_not_added_or_compared():
    # smg lists a registration it has not reached yet; it carries no role to compare
    pending = RouterWorker("p", D1.url, "regular", status="pending", healthy=False)
    plan = diff_workers([D1], [pending])
    assert plan.empty and plan.held == (pending,)


def test_a_pending_entry_of_an_unwanted_url_is_removed():
    pending = RouterWorker("p", D2.url, "regular", status="pending", healthy=False)
    plan = diff_workers([D1], [listed(D1), pending])
    assert plan.remove == (pending,) and plan.held == ()


def test_ready_not_ready_and_failed_entries_count_as_listed():
    # health is the router's business; membership is ours (no re-add, no removal)
    entries = [listed(P1, status="ready"), listed(D1, status="not_ready", healthy=False),
               listed(D2, status="failed", healthy=False)]
    assert diff_workers([P1, D1, D2], entries).empty


SMG_ENTRY = {"id": "01a2", "url": D1.url, "worker_type": "decode", "is_healthy": False,
             "status": "draining", "load": 0, "labels": {"dp_size": "1"}}
ROUTER_032_ENTRY = {"id": "w1", "url": P1.url, "worker_type": "prefill", "bootstrap_port": 8998,
                    "is_healthy": True}


def test_both_routers_listings_are_read():
    body = json.dumps({"workers": [SMG_ENTRY, ROUTER_032_ENTRY], "total": 2, "stats": {}})
    smg, old = parse_worker_list(body)
    assert smg.draining and smg.status == "draining" and not smg.healthy
    assert old == RouterWorker("w1", P1.url, "prefill", 8998, True, "")
    assert not old.draining and not old.pending


#: replies a router (or a proxy in front of it) might give that are not a worker list
GARBAGE = [
    "", "not json", "<html><body>502 Bad Gateway</body></html>", '{"workers": [', "null", "[]",
    '"workers"', "{}", '{"workers": null}', '{"workers": {"id": "a"}}', '{"workers": [null]}',
    '{"workers": [1]}', '{"workers": [{"url": "http://a:1"}]}', '{"workers": [{"id": "a"}]}',
    '{"workers": [{"id": 7, "url": "http://a:1"}]}', '{"workers": [{"id": "a", "url": ["x"]}]}',
    '{"workers": [{"id": "a", "url": "http://a:1", "bootstrap_port": "8998"}]}',
    '{"workers": [{"id": "a", "url": "http://a:1", "bootstrap_port": 1.5}]}',
    '{"workers": [{"id": "a", "url": "http://a:1", "worker_type": {}}]}',
    '{"workers": [{"id": "a", "url": "http://a:1", "status": 3}]}', "NaN", "1e999",
]


def _mangled(seed: int) -> str:
    """A valid listing cut or corrupted at a seeded place."""
    rng = random.Random(seed)
    good = json.dumps({"workers": [SMG_ENTRY, ROUTER_032_ENTRY]})
    cut = rng.randrange(1, len(good) - 1)
    return good[:cut] if rng.random() < 0.5 else good[:cut] + rng.choice("]}{[,:\"'") + good[cut:]


@pytest.mark.parametrize("body", GARBAGE)
def test_an_unreadable_listing_is_a_router_error_that_says_why(body):
    with pytest.raises(RouterError, match="GET /workers"):
        parse_worker_list(body)


def test_seeded_mangled_listings_never_read_as_a_list_of_something_else():
    for seed in range(300):
        body = _mangled(seed)
        try:
            workers = parse_worker_list(body)
        except RouterError:
            continue
        # a corruption that still parses must still be a list of real entries
        assert all(isinstance(w.url, str) and isinstance(w.id, str) for w in workers), body


class _Router(BaseHTTPRequestHandler):
    """Answers GET /workers with ``server.body``; records every other call."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        # what the routers (and most proxies) claim, whatever the body: the client must read
        # the body, not trust the header
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200, self.server.body.encode())  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        self.server.calls.append(("POST", self.path))  # type: ignore[attr-defined]
        self._answer(202, b"{}")

    do_DELETE = do_POST


@pytest.fixture
def garbage_router() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    server.body, server.calls = "", []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_router_answering_garbage_is_unknown_and_the_sync_holds_and_says_why(garbage_router, caplog):
    """Before: a non-JSON or misshapen /workers reply raised out of listed() and make_equal()
    (ValueError, KeyError, AttributeError), into the planner loop's tick."""
    workers = SGLangWorkerList([f"http://127.0.0.1:{garbage_router.server_address[1]}"])
    bodies = GARBAGE + [_mangled(seed) for seed in range(40)]
    for body in bodies:
        garbage_router.body = body  # type: ignore[attr-defined]
        try:
            parse_worker_list(body)
            continue  # a mangled body that is still a listing
        except RouterError:
            pass
        assert workers.listed() is None, body
        with caplog.at_level(logging.WARNING, logger="pdscale.operator.clients.routersync"):
            caplog.clear()
            workers.make_equal(frozenset({P1, D1}))
        assert "worker sync holds until the next tick: GET /workers" in caplog.text, body
    # it never acted on what it could not read
    assert garbage_router.calls == []  # type: ignore[attr-defined]


def test_spec_validation():
    with pytest.raises(ValueError, match="role"):
        WorkerSpec("http://127.0.0.1:1", "regular")
    with pytest.raises(ValueError, match="bootstrap"):
        WorkerSpec("http://127.0.0.1:1", "decode", 8998)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def run_drain(inflight_series, *, timeout=10.0, fail_polls=0):
    """Drain against fakes; returns (result, event log)."""
    clock = FakeClock()
    events: list[str] = []
    series = list(inflight_series)

    async def remove():
        events.append(f"remove@{clock.now:.1f}")

    async def inflight():
        nonlocal fail_polls
        if fail_polls:
            fail_polls -= 1
            raise ConnectionError("engine unreachable")
        value = series.pop(0) if len(series) > 1 else series[0]
        events.append(f"inflight={value}")
        return value

    async def stop():
        events.append(f"stop@{clock.now:.1f}")

    result = asyncio.run(drain_and_stop(
        "http://127.0.0.21:30000", remove_from_router=remove, inflight=inflight, stop=stop,
        drain_timeout_seconds=timeout, settle_seconds=0.5, poll_seconds=1.0,
        clock=clock, sleep=clock.sleep,
    ))  # fmt: skip
    return result, events


def test_drain_removes_from_router_then_waits_for_zero_then_stops():
    result, events = run_drain([3, 2, 1, 0])
    assert events == ["remove@0.0", "inflight=3", "inflight=2", "inflight=1", "inflight=0",
                      "stop@3.0"]  # fmt: skip
    assert result.drained and result.inflight_at_stop == 0 and result.inflight_at_removal == 3
    assert result.steps == ("removed_from_router", "drained", "stopped")


def test_drain_timeout_still_stops_and_says_so():
    result, events = run_drain([5], timeout=3.0)
    assert events[0] == "remove@0.0" and events[-1].startswith("stop@")
    assert not result.drained and result.inflight_at_stop == 5
    assert result.steps == ("removed_from_router", "drain_timeout", "stopped")


def test_unreachable_engine_is_not_taken_for_idle():
    result, events = run_drain([0], fail_polls=2)
    # two failed polls cost two poll intervals; only the real zero ends the wait
    assert result.drained and events == ["remove@0.0", "inflight=0", "stop@2.0"]
    assert result.inflight_at_removal == 0


def test_zero_right_after_removal_waits_out_the_settle_time():
    # the router may have picked this worker just before the removal and not sent yet
    _, events = run_drain([0])
    assert events == ["remove@0.0", "inflight=0", "inflight=0", "stop@1.0"]


class _Removing(_Router):
    """smg removing a worker: after the DELETE, the entry is listed ``draining`` for
    ``server.draining_listings`` more listings, then gone."""

    def do_GET(self) -> None:
        server = self.server
        entry = {"id": "01a2", "url": P1.url, "worker_type": "prefill", "bootstrap_port": 8998,
                 "is_healthy": True, "status": "ready", **server.health}  # type: ignore[attr-defined]
        workers = [entry]
        if server.deleted:  # type: ignore[attr-defined]
            server.listings += 1  # type: ignore[attr-defined]
            gone = server.listings > server.draining_listings  # type: ignore[attr-defined]
            workers = [] if gone else [{**entry, "status": "draining", "is_healthy": False}]
        self._answer(200, json.dumps({"workers": workers}).encode())

    def do_DELETE(self) -> None:
        self.server.deleted = True  # type: ignore[attr-defined]
        self._answer(202, b"{}")


@pytest.mark.parametrize(("health", "listings_waited"), [
    # ours: no settle time, so smg drops it in a moment; until then its overload veto counts it
    ({"health": {"drain_settle_secs": 0}}, 4),
    # someone else's: draining for 5 s, already out of routing, not waited for
    ({"health": {"drain_settle_secs": 5}}, 1),
    ({}, 1),
])
def test_a_removal_waits_until_a_worker_with_no_settle_time_has_gone(health, listings_waited):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Removing)
    server.health, server.deleted, server.listings = health, False, 0  # type: ignore[attr-defined]
    server.draining_listings = 3  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def remove() -> None:
        from aiohttp import ClientSession
        async with ClientSession() as session:
            client = RouterClient(f"http://127.0.0.1:{server.server_address[1]}", session,
                                  poll_seconds=0.001)  # fmt: skip
            (worker,) = await client.list_workers()
            assert worker.drain_settle_seconds == health.get("health", {}).get("drain_settle_secs")
            await client.remove_worker(worker, timeout_seconds=10)

    try:
        asyncio.run(remove())
    finally:
        server.shutdown()
        server.server_close()
    assert server.listings == listings_waited  # type: ignore[attr-defined]
