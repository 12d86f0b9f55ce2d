"""One tenant's Prometheus cannot hold another's plan: the loop ticks PDClusters concurrently,
each within its own bounds, and returns at its deadline whatever a hostile server does. Four
PDClusters name a loopback "Prometheus" that never answers, drips, streams for ever or answers
500 with a secret page (the admin's allow-list admits loopback here, so the bounds are what is
tested); a fifth names a healthy one and is planned in the first tick, on time."""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from test_planner_loop import NS, FakeKube, FakeWorkerLists, FakeWorkers, _pod, _spec_doc

from pdscale.operator.api import tenant_policy
from pdscale.operator.loop.planner_loop import PlannerLoop
from pdscale.testbed.hostile_http import HealthyPrometheus, HostileServer

HOSTILE = ("silent", "drip", "stream", "error")


@pytest.fixture
def loopback_allowed(monkeypatch):
    monkeypatch.setenv(tenant_policy.POLICY_ENV, json.dumps({"allowedPrometheusURLs": ["127.0.0.1"]}))
    tenant_policy.configured.cache_clear()
    yield
    tenant_policy.configured.cache_clear()


def _pdcluster(kube: FakeKube, name: str, url: str, ip: str) -> None:
    doc = _spec_doc(mode="Recommend", prometheusURL=url)
    doc["metadata"].update(name=name, uid=f"uid-{name}")
    kube.objects[("PDCluster", NS, name)] = doc
    kube.pods += [_pod(f"{name}-prefill-a", "prefill", f"{ip}.1", instance=name),
                  _pod(f"{name}-decode-a", "decode", f"{ip}.2", instance=name)]


def _planner(kube: FakeKube, name: str) -> dict:
    return ((kube.get("PDCluster", NS, name) or {}).get("status") or {}).get("planner") or {}


@pytest.mark.slow  # real servers and ticks on the wall clock (~20 s): out of make test-fast
def test_a_hostile_prometheus_delays_neither_the_loop_nor_another_pdclusters_plan(loopback_allowed):
    healthy = ThreadingHTTPServer(("127.0.0.1", 0), HealthyPrometheus)
    threading.Thread(target=healthy.serve_forever, daemon=True).start()
    servers = {kind: HostileServer(kind, give_up_seconds=60, drip_every_seconds=0.2) for kind in HOSTILE}
    try:
        kube = FakeKube()
        for i, (kind, server) in enumerate(servers.items()):
            _pdcluster(kube, f"hostile-{kind}", server.url, f"10.1.{i}")
        _pdcluster(kube, "healthy", f"http://127.0.0.1:{healthy.server_address[1]}", "10.2.0")
        loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
        # a deadline well under the hostile ones' 10 s query bound, with room for a healthy plan
        # on a busy host (at 2 s, a host at load 15-20 finished it after the first tick)
        loop.tick_deadline_seconds = 5.0

        def timed_tick() -> float:
            started = time.monotonic()
            ticked = threading.Thread(target=loop.tick_all, daemon=True)
            ticked.start()
            ticked.join(timeout=15)  # bounded here whatever the loop does
            assert not ticked.is_alive(), "the tick is held by a hostile Prometheus"
            return time.monotonic() - started

        took = timed_tick()
        assert took < 7.0, f"the tick took {took:.1f} s (deadline 5 s)"
        planner = _planner(kube, "healthy")
        assert planner.get("lastDecision"), "the healthy PDCluster was not planned in the first tick"
        assert "unreachable" not in planner["metrics"]
        # the slow ones still read (bounded by their query deadline, 10 s); a tick meanwhile
        # does not start them again and is as quick
        assert {"serving/hostile-silent", "serving/hostile-drip"} <= loop.running
        assert timed_tick() < 7.0
        end = time.monotonic() + 30
        while loop.running and time.monotonic() < end:
            time.sleep(0.2)
        assert not loop.running, f"still planning after 30 s: {loop.running}"
        metrics = {kind: _planner(kube, f"hostile-{kind}").get("metrics", "") for kind in HOSTILE}
        assert metrics["silent"].startswith("Prometheus unreachable: no whole answer within 10 s")
        assert metrics["drip"].startswith("Prometheus unreachable: no whole answer within 10 s")
        assert metrics["stream"].startswith("no metrics read (query failed: answer over 1024 KiB)")
        assert metrics["error"].startswith("no metrics read (query failed: HTTP 5xx)")
        for kind, line in metrics.items():
            assert "check spec.planner.prometheusURL" in line, line
            assert servers["error"].secret not in line and "admin console" not in line, kind
            assert len(line) < 200, line
    finally:
        healthy.shutdown()
        for server in servers.values():
            server.close()


def test_a_url_the_policy_refuses_is_never_queried():
    tenant_policy.configured.cache_clear()  # the default policy: a spec names no Prometheus
    with HostileServer("error") as server:
        kube = FakeKube()
        _pdcluster(kube, "refused", server.url, "10.3.0")
        PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers())).tick_all()
        assert server.connections == 0
    metrics = _planner(kube, "refused")["metrics"]
    assert "spec.planner.prometheusURL is refused" in metrics and "allowedPrometheusURLs" in metrics


def _bounded_tick(loop: PlannerLoop) -> float:
    """``tick_all`` in a thread, waited for 15 s at most (whatever the loop does)."""
    started = time.monotonic()
    ticked = threading.Thread(target=loop.tick_all, daemon=True)
    ticked.start()
    ticked.join(timeout=15)
    assert not ticked.is_alive(), "the tick is held by a hostile Prometheus"
    return time.monotonic() - started


@pytest.mark.slow  # real servers and ticks on the wall clock (~20 s): out of make test-fast
def test_slow_pdclusters_hold_at_most_their_share_of_the_workers(loopback_allowed):
    # however many tenants point at a server that never answers, the others find a worker
    healthy = ThreadingHTTPServer(("127.0.0.1", 0), HealthyPrometheus)
    threading.Thread(target=healthy.serve_forever, daemon=True).start()
    try:
        with HostileServer("silent", give_up_seconds=60) as silent:
            kube = FakeKube()
            for i in range(3):
                _pdcluster(kube, f"slow-{i}", silent.url, f"10.4.{i}")
            _pdcluster(kube, "healthy", f"http://127.0.0.1:{healthy.server_address[1]}", "10.5.0")
            loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
            loop.tick_deadline_seconds = 5.0  # as in the test above: room for a busy host
            # as the last ticks left it: two slow ones still reading (their share), a third due
            slow = [f"{NS}/slow-{i}" for i in range(3)]
            loop.slow = set(slow)
            loop.slow_workers = 2
            loop.running = {slow[0], slow[1]}
            assert _bounded_tick(loop) < 7.0
            assert silent.connections == 0  # slow-2 waits for a slow worker to come free
            assert _planner(kube, "healthy").get("lastDecision")
            # one slow one ends: its share goes to the slow one that waited longest
            loop.running.discard(slow[0])
            loop.finished_at[slow[0]] = time.monotonic()
            assert _bounded_tick(loop) < 7.0
            assert silent.connections == 1 and slow[2] in loop.running and slow[0] not in loop.running
            end = time.monotonic() + 30
            while slow[2] in loop.running and time.monotonic() < end:
                time.sleep(0.2)
            assert slow[2] not in loop.running and slow[2] in loop.slow  # it outlasted a tick again
    finally:
        healthy.shutdown()


def test_a_tick_returns_when_a_finished_pdclusters_plan_falls_due_not_at_the_deadline(monkeypatch):
    # A slow Prometheus used to hold the tick to its deadline, so a plan falling due meanwhile
    # waited for it (CI saw a healthy plan 9 s late beside four hostile servers). The slow
    # one never finishes here: the tick returns for the other's due, with it still running.
    kube = FakeKube()
    _pdcluster(kube, "slow", "http://127.0.0.1:1", "10.6.0")
    _pdcluster(kube, "due", "http://127.0.0.1:1", "10.6.1")
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick_deadline_seconds = 3600.0  # only the due can end this tick
    release = threading.Event()

    def tick_one(key, *_args):
        if key.endswith("/slow"):
            release.wait(60)
            return None
        return time.time() + 0.2  # its next plan, due almost at once

    monkeypatch.setattr(loop, "_tick_one", tick_one)
    try:
        ticked = threading.Thread(target=loop.tick_all, daemon=True)
        ticked.start()
        ticked.join(timeout=30)
        assert not ticked.is_alive(), "the tick waited for the slow PDCluster past the other's due"
        assert not release.is_set()
    finally:
        release.set()
