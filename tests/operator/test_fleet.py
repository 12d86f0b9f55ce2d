"""The ordered actuation, pure: which pods drain, when a drain finishes, what replicas become."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pdscale.operator.api.names import DELETION_COST_ANNOTATION, DRAINING_ANNOTATION
from pdscale.operator.clients.routersync import WorkerSpec
from pdscale.operator.loop.fleet import (
    PodView,
    plan_role_actions,
    pod_view,
    role_state,
    router_workers,
)


def pod(name, ready=True, draining_since=None, in_flight=0, deleting=False, created=0.0, ip=None,
        in_router=False, drained=False):
    return PodView(name=name, role="decode", ip=ip or f"127.1.0.{len(name)}", ready=ready,
                   created_at_seconds=created, ready_since_seconds=0.0 if ready else None,
                   deleting=deleting, draining_since_seconds=draining_since, in_flight=in_flight,
                   in_router=in_router, drained=drained and draining_since is not None)


def step(target, pods, replicas=None, now=100.0, timeout=60.0):
    return plan_role_actions("decode", target, pods, len(pods) if replicas is None else replicas,
                             now_seconds=now, drain_timeout_seconds=timeout)


def test_scale_up_adds_replicas():
    a = step(4, [pod("a"), pod("b")])
    assert a.replicas == 4 and not a.start_drain


def test_scale_up_counts_pods_not_yet_created():
    # replicas already 4 with 2 pods: the two missing ones are on their way, not to be re-added
    assert step(4, [pod("a"), pod("b")], replicas=4).replicas is None


def test_scale_down_drains_the_least_loaded_ready_pod_and_keeps_replicas():
    a = step(2, [pod("a", in_flight=9), pod("b", in_flight=1), pod("c", in_flight=None)])
    assert a.start_drain == ("b",)  # unknown load counts as busy
    assert a.replicas is None  # nothing removed before the drain


def test_warming_pods_go_first_without_a_drain():
    a = step(1, [pod("a"), pod("w", ready=False)])
    assert a.start_drain == () and a.replicas == 1


def test_drain_finishes_when_idle_then_replicas_drop_by_one():
    pods = [pod("a"), pod("b", draining_since=90.0, in_flight=3)]
    busy = step(1, pods)
    assert busy.finish_drain == () and busy.replicas is None
    assert "b drains (3 in flight)" in busy.waiting
    idle = step(1, [pod("a"), pod("b", draining_since=90.0, in_flight=0)])
    assert idle.finish_drain == ("b",) and idle.replicas == 1


def test_drain_timeout_finishes_a_busy_or_silent_pod():
    a = step(1, [pod("a"), pod("b", draining_since=10.0, in_flight=None)], now=100.0, timeout=60)
    assert a.finish_drain == ("b",)


def test_a_drain_never_finishes_while_the_router_lists_the_pod():
    listed = PodView(name="b", role="decode", ip="127.1.0.9", ready=True, created_at_seconds=0.0,
                     draining_since_seconds=0.0, in_flight=0, in_router=True)
    a = step(1, [pod("a"), listed], now=1000.0, timeout=60)  # idle and long past the timeout
    assert a.finish_drain == () and a.replicas is None
    assert any("still listed by the router" in w for w in a.waiting)


def test_an_idle_decode_awaited_by_prefill_waits_until_the_drain_timeout():
    awaited = replace(pod("b", draining_since=50.0, in_flight=0), awaited_by_prefill=True)
    a = step(1, [pod("a"), awaited], now=100.0, timeout=60)  # idle: it would go without the flag
    assert a.finish_drain == () and a.replicas is None
    assert any("queued at prefill" in w for w in a.waiting)
    # a prefill that never clears must not hold the fleet forever: the timeout passes it
    assert step(1, [pod("a"), awaited], now=110.0, timeout=60).finish_drain == ("b",)


def test_a_drained_pod_waits_while_another_pod_warms():
    # The ReplicaSet would remove the warming pod instead of the drained one.
    a = step(2, [pod("a"), pod("w", ready=False), pod("b", draining_since=50.0, in_flight=0)])
    assert a.finish_drain == ()
    assert any("waits for warming" in w for w in a.waiting)


def test_a_drain_that_ends_while_another_goes_on_first_lowers_its_deletion_cost():
    # Both drains carry the same deletion cost; the ReplicaSet breaks the tie by removing the
    # newest pod, which here is the one still busy (seen in CI: a vLLM decode cut mid-drain).
    old_idle = pod("old", draining_since=80.0, in_flight=0, created=0.0)
    new_busy = pod("new", draining_since=90.0, in_flight=2, created=50.0)
    a = step(1, [pod("a"), old_idle, new_busy])
    assert a.mark_drained == ("old",) and a.finish_drain == () and a.replicas is None
    assert any("old drained; waits until the ReplicaSet sees it" in w for w in a.waiting)
    # once its lower cost is seen, it goes
    b = step(1, [pod("a"), replace(old_idle, drained=True), new_busy])
    assert b.finish_drain == ("old",) and b.replicas == 2 and b.mark_drained == ()


def test_a_drain_ends_at_once_when_no_other_drain_goes_on():
    a = step(1, [pod("a"), pod("b", draining_since=90.0, in_flight=0)])
    assert a.mark_drained == () and a.finish_drain == ("b",)


def test_a_drained_pod_waits_while_a_pod_still_draining_would_be_removed_before_it():
    # a pod still draining that is not Ready, or that kept a drained mark from before (its
    # drain held again after an operator restart), ranks as low as the finished one
    idle = pod("old", draining_since=80.0, in_flight=0, drained=True)
    for other in (pod("x", ready=False, draining_since=85.0, in_flight=1),
                  pod("x", draining_since=85.0, in_flight=0, in_router=True, drained=True)):
        a = step(1, [pod("a"), idle, other])
        assert a.finish_drain == () and a.replicas is None
        assert any("would remove x first" in w for w in a.waiting)


def test_pod_view_reads_the_drained_cost_only_on_a_draining_pod():
    def listed(annotations):
        return pod_view({"metadata": {"name": "d", "annotations": annotations}}, "decode")
    assert listed({DRAINING_ANNOTATION: "5", DELETION_COST_ANNOTATION: "-2000"}).drained
    assert not listed({DRAINING_ANNOTATION: "5", DELETION_COST_ANNOTATION: "-1000"}).drained
    assert not listed({DELETION_COST_ANNOTATION: "-2000"}).drained


def test_target_rising_during_a_drain_undrains_instead_of_adding():
    a = step(2, [pod("a"), pod("b", draining_since=90.0, in_flight=2)])
    assert a.undrain == ("b",) and a.replicas is None and a.finish_drain == ()


def test_role_state_counts_by_state_and_estimates_warmup():
    pods = [pod("a"), pod("w", ready=False, created=90.0), pod("d", draining_since=1.0),
            pod("x", deleting=True)]
    s = role_state(pods, now_seconds=100.0, warmup_seconds=300.0, readings_seconds=60.0)
    assert (s.ready, len(s.warming), s.draining) == (1, 1, 2)
    assert s.warming[0].ready_at_seconds == 390.0


def test_replicas_ordered_but_not_yet_made_count_as_warming_from_now():
    # a Deployment at 4 whose ReplicaSet has made 3 pods (one draining still counts: the
    # replicas hold it until its drain ends; one deleting does not: it is being replaced)
    pods = [pod("a"), pod("w", ready=False, created=90.0), pod("d", draining_since=1.0),
            pod("x", deleting=True)]
    s = role_state(pods, now_seconds=100.0, warmup_seconds=300.0, readings_seconds=60.0, ordered=4)
    assert (s.ready, s.draining) == (1, 2)
    assert [w.ready_at_seconds for w in s.warming] == [390.0, 400.0]
    # fewer ordered than made (a scale-down under way): nothing added, nothing removed
    assert len(role_state(pods, 100.0, 300.0, readings_seconds=60.0, ordered=1).warming) == 1


def test_recently_ready_means_ready_within_the_readings_window():
    # the interval's readings include a pod's first, cold passes only if it became Ready within
    # the window they are read over; the replay counts over the same span (interval_stats)
    pods = [replace(pod("a"), ready_since_seconds=95.0), replace(pod("b"), ready_since_seconds=80.0),
            replace(pod("c"), ready_since_seconds=10.0)]
    assert role_state(pods, 100.0, 300.0, readings_seconds=10.0).recently_ready == 1
    assert role_state(pods, 100.0, 300.0, readings_seconds=60.0).recently_ready == 2
    assert role_state(pods, 100.0, 300.0, readings_seconds=120.0).recently_ready == 3


def test_router_workers_are_exactly_the_serving_pods():
    pods = [pod("a", ip="127.1.0.5"), pod("w", ready=False), pod("d", draining_since=1.0),
            pod("x", deleting=True)]
    assert router_workers(pods, port=30000, bootstrap_port=8998) == {
        WorkerSpec("http://127.1.0.5:30000", "decode", None)}


pods_strategy = st.lists(
    st.builds(
        lambda i, ready, drain, flight, deleting, listed, drained, created: pod(
            f"p{i}", ready=ready, draining_since=drain, in_flight=flight, deleting=deleting,
            in_router=listed, drained=drained, created=created),
        st.integers(0, 10**6), st.booleans(), st.one_of(st.none(), st.floats(0, 100)),
        st.one_of(st.none(), st.integers(0, 5)), st.booleans(), st.booleans(), st.booleans(),
        st.floats(0, 100)),
    max_size=8, unique_by=lambda p: p.name)


def replicaset_may_remove(live, count):
    """Every pod the ReplicaSet controller may remove when it removes ``count`` of ``live``:
    it ranks not-ready before Ready, then the lower pod-deletion-cost, then (among others)
    the newer pod; pods tied with the last one removed on readiness and cost may be picked
    (the later criteria are not modelled here, so any of them may)."""
    if count <= 0:
        return set()

    def rank(p):
        cost = (-2000 if p.drained else -1000) if p.draining else 0
        return (p.ready, cost)

    ranked = sorted(live, key=rank)
    boundary = rank(ranked[min(count, len(ranked)) - 1])
    return {p.name for p in live if rank(p) <= boundary}


@settings(max_examples=300, deadline=None)
@given(pods=pods_strategy, target=st.integers(0, 10), extra=st.integers(0, 3))
def test_no_serving_pod_is_ever_removed_without_a_drain(pods, target, extra):
    live = [p for p in pods if not p.deleting]
    replicas = len(live) + extra
    a = plan_role_actions("decode", target, pods, replicas, now_seconds=100.0,
                          drain_timeout_seconds=60.0)
    new = replicas if a.replicas is None else a.replicas
    assert new >= 0
    removed = replicas - new
    if removed > 0:
        # Every removal is a not-yet-created pod, a warming pod, or a finished drain.
        warming = sum(1 for p in live if not p.ready and not p.draining)
        assert removed <= extra + warming + len(a.finish_drain)
        if a.finish_drain:
            assert all(p.ready for p in live if not p.draining)
    # ... and the ReplicaSet, removing the pods it ranks lowest, can only pick those.
    acceptable = set(a.finish_drain) | {p.name for p in live if not p.ready and not p.draining}
    assert replicaset_may_remove(live, len(live) - new) <= acceptable
    for name in a.finish_drain:
        p = next(p for p in pods if p.name == name)
        assert not p.in_router
        assert p.draining and (p.in_flight == 0 or 100.0 - p.draining_since_seconds >= 60.0)
    assert not set(a.start_drain) & set(a.finish_drain)
