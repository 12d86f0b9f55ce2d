"""Router worker sync without a router: the diff, and the scale-down release order."""

from __future__ import annotations

import asyncio

import pytest

from pdscale.operator.routersync import RouterWorker, WorkerSpec, diff_workers, drain_and_stop

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
