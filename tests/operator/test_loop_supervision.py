"""The operator's background loops outlive their failures, and the liveness probe tells a
loop that keeps failing (retrying, and saying so) from one whose tick is blocked (stuck);
kopf's /healthz answers 500 only for the latter. Every Kubernetes call carries a timeout."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import urllib.error
import urllib.request

import kopf
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from pdscale.operator import handlers
from pdscale.operator.clients.kube import (
    DEFAULT_REQUEST_TIMEOUT,
    Kube,
    api_client_from_environment,
    request_timeout_from_environment,
)
from pdscale.operator.loop.planner_loop import MIN_SLEEP_SECONDS, backoff_seconds, supervise
from pdscale.operator.loop.telemetry import LOOP_ERRORS, Heartbeats, stuck_after_seconds
from pdscale.testbed.localcluster import free_port


class Stop(BaseException):
    """Ends a supervised loop in a test (not an Exception: the loop must not swallow it)."""


class RecordedBeats(Heartbeats):
    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[float] = []

    def beat(self, loop: str, now: float, next_in_seconds: float, bound_seconds: float) -> None:
        self.recorded.append(next_in_seconds)
        super().beat(loop, now, next_in_seconds, bound_seconds)


def _failures() -> list[BaseException]:
    return [ApiException(status=503, reason="Service Unavailable"),
            urllib3.exceptions.MaxRetryError(None, "/api", "connection refused"),  # type: ignore[arg-type]
            ConnectionResetError("reset by peer"),
            TimeoutError("read timed out"),
            KeyError("a bug")]


def test_a_failing_tick_is_logged_counted_and_retried_with_capped_backoff(caplog):
    errors = _failures()
    ticks: list[str] = []
    delays: list[float] = []
    beats = RecordedBeats()

    async def tick() -> None:
        if errors:
            ticks.append("failed")
            raise errors.pop(0)
        ticks.append("ok")

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) > 7:
            raise Stop

    before = LOOP_ERRORS.labels("test-fails")._value.get()
    caplog.set_level(logging.WARNING, "pdscale.operator.loop.planner_loop")
    with pytest.raises(Stop):
        asyncio.run(supervise("test-fails", tick, 2.0, beats, sleep=sleep))
    assert ticks == ["failed"] * 5 + ["ok"] * 2
    # the interval; after each failure in a row, doubled, capped at 30 s; back once it works
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 2.0, 2.0]
    assert LOOP_ERRORS.labels("test-fails")._value.get() - before == 5
    logged = [r for r in caplog.records if "test-fails loop: tick failed" in r.getMessage()]
    assert len(logged) == 5 and all(r.exc_info for r in logged)
    assert "KeyError" in logged[-1].getMessage()
    # the start, and every finished tick, failed or not, is a beat; stopping forgets the loop
    assert beats.recorded == delays
    assert "test-fails" not in beats.beats


def test_a_tick_that_says_when_its_next_plan_is_due_is_woken_then_not_a_whole_tick_late():
    soon = [3.5, 20.0, -4.0, None]
    delays: list[float] = []

    async def tick() -> float | None:
        return soon.pop(0)

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) > 4:
            raise Stop

    with pytest.raises(Stop):
        asyncio.run(supervise("test-due", tick, 5.0, RecordedBeats(), sleep=sleep))
    # sooner when due sooner; never later than the tick; an overdue plan never spins the loop
    assert delays == [5.0, 3.5, 5.0, MIN_SLEEP_SECONDS, 5.0]


def test_cancelling_a_supervised_loop_stops_it_and_it_no_longer_counts_for_the_probe():
    beats = Heartbeats()

    async def main() -> None:
        task = asyncio.create_task(supervise("test-cancel", _noop, 0.01, beats))
        await asyncio.sleep(0.05)
        assert "test-cancel" in beats.beats
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "test-cancel" not in beats.beats

    asyncio.run(main())


async def _noop() -> None:
    return None


def test_backoff_doubles_per_failure_and_is_capped():
    assert backoff_seconds(5.0, 0) == 5.0
    assert [backoff_seconds(5.0, n, 30.0) for n in (1, 2, 3)] == [10.0, 20.0, 30.0]
    assert backoff_seconds(0.1, 1, 30.0) == 2.0  # a sub-second loop still backs off in seconds


def test_the_stuck_bound_is_three_intervals_at_least_a_minute_or_configured(monkeypatch):
    monkeypatch.delenv("PDSCALE_LOOP_STUCK_SECONDS", raising=False)
    assert stuck_after_seconds(5) == 60 and stuck_after_seconds(40) == 120
    monkeypatch.setenv("PDSCALE_LOOP_STUCK_SECONDS", "15")
    assert stuck_after_seconds(5) == 15


def test_a_loop_is_stuck_only_when_its_due_tick_has_not_finished_within_the_bound():
    beats = Heartbeats()
    beats.beat("planner", 100.0, 5.0, 60.0)   # next tick due at 105
    beats.beat("resync", 100.0, 30.0, 60.0)   # failing: backing off 30 s, due at 130
    assert beats.stuck(160.0) == {}
    assert beats.stuck(166.0) == {"planner": 66.0}
    beats.beat("planner", 165.0, 5.0, 60.0)   # it finished one after all
    assert beats.stuck(185.0) == {}  # due at 130: 60 s more to finish it
    assert beats.stuck(195.0) == {"resync": 95.0}


def test_a_loop_whose_tick_blocks_is_stuck_and_one_that_keeps_failing_is_not():
    beats = Heartbeats()
    release = threading.Event()

    async def failing() -> None:
        raise ConnectionRefusedError("the API server is down")

    async def blocked() -> None:
        await asyncio.to_thread(release.wait, 5)

    async def main() -> dict[str, float]:
        tasks = [asyncio.create_task(supervise("test-failing", failing, 0.01, beats)),
                 asyncio.create_task(supervise("test-blocked", blocked, 0.01, beats))]
        await asyncio.sleep(0.3)
        # as the probe sees it once the bound (here 60 s) has passed: only a beat counts
        beats.beats = {k: (last - 61.0, due - 61.0, b) if k == "test-blocked" else (last, due, b)
                       for k, (last, due, b) in beats.beats.items()}
        stuck = beats.stuck(time.monotonic())
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return stuck

    assert set(asyncio.run(main())) == {"test-blocked"}


def _healthz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_kopfs_healthz_answers_500_while_a_loop_is_stuck(monkeypatch):
    from kopf._core.engines.indexing import OperatorIndexers
    from kopf._core.engines.probing import health_reporter
    from kopf._core.intents.registries import OperatorRegistry

    beats = Heartbeats()
    monkeypatch.setattr(handlers, "HEARTBEATS", beats)
    registry = OperatorRegistry()
    kopf.on.probe(id="loops", registry=registry)(handlers.loops_alive)  # only our probe
    settings = kopf.OperatorSettings()
    url = f"http://127.0.0.1:{free_port()}/healthz"

    async def main() -> tuple[tuple[int, str], tuple[int, str]]:
        ready = asyncio.Event()
        server = asyncio.create_task(health_reporter(url, memo=kopf.Memo(),
                                                     indices=OperatorIndexers().indices,
                                                     registry=registry, settings=settings,
                                                     ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 10)
        now = time.monotonic()
        beats.beat("planner", now, 5.0, 60.0)
        healthy = await asyncio.to_thread(_healthz, url)
        beats.beat("planner", now - 200.0, 5.0, 60.0)
        await asyncio.sleep(10.1)  # kopf keeps a probe's result for 10 s
        stuck = await asyncio.to_thread(_healthz, url)
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        return healthy, stuck

    (ok_code, ok_body), (stuck_code, _) = asyncio.run(main())
    assert ok_code == 200 and '"planner"' in ok_body
    assert stuck_code == 500


def test_the_probe_raises_naming_the_stuck_loop(monkeypatch):
    beats = Heartbeats()
    monkeypatch.setattr(handlers, "HEARTBEATS", beats)
    beats.beat("resync", time.monotonic() - 500, 1.0, 60.0)
    with pytest.raises(kopf.PermanentError, match="resync finished no tick for 5"):
        handlers.loops_alive()


# -- timeouts on every Kubernetes call --------------------------------------------------------
def test_the_request_timeout_defaults_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv("PDSCALE_KUBE_TIMEOUT_SECONDS", raising=False)
    assert request_timeout_from_environment() == DEFAULT_REQUEST_TIMEOUT == (5.0, 30.0)
    monkeypatch.setenv("PDSCALE_KUBE_TIMEOUT_SECONDS", "2,7")
    assert request_timeout_from_environment() == (2.0, 7.0)
    monkeypatch.setenv("PDSCALE_KUBE_TIMEOUT_SECONDS", "3")
    assert request_timeout_from_environment() == (3.0, 3.0)
    monkeypatch.setenv("PDSCALE_KUBE_TIMEOUT_SECONDS", "0")
    with pytest.raises(ValueError):
        request_timeout_from_environment()


def test_a_kubernetes_call_to_a_server_that_never_answers_times_out_once(tmp_path, monkeypatch):
    """A listening socket that accepts and says nothing (a paused API server): each call
    ends after one read timeout (urllib3 would retry a timed-out read three more times)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{listener.getsockname()[1]}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube(api_client_from_environment(), request_timeout=(1.0, 1.0))
    calls = [lambda: kube.get("ConfigMap", "ns", "x"), kube.list_pdclusters,
             lambda: kube.list_pods(None, {"a": "b"}),
             lambda: kube.apply({"kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "x"}}),
             lambda: kube.patch_status("ns", "x", {}),
             lambda: kube.patch_pod("ns", "x", {}),
             lambda: kube.create_event({"metadata": {"namespace": "ns"}})]
    try:
        for call in calls:
            started = time.monotonic()
            with pytest.raises(urllib3.exceptions.HTTPError):
                call()
            assert time.monotonic() - started < 1.9
    finally:
        listener.close()
