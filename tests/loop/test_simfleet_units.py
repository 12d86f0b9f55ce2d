"""The simulated fleet's pure parts: when an engine stops warming up."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kubernetes import client

from pdscale.testbed.simengine import EngineConfig, LinearTiming, SimEngine
from pdscale.testbed.simfleet import READY_DELAY_ANNOTATION, engine_ready_at


def pod(delay: str, initialized_at: datetime | None) -> client.V1Pod:
    conditions = [] if initialized_at is None else [
        client.V1PodCondition(type="Initialized", status="True", last_transition_time=initialized_at)]
    return client.V1Pod(metadata=client.V1ObjectMeta(annotations={READY_DELAY_ANNOTATION: delay}),
                        status=client.V1PodStatus(conditions=conditions))


def test_an_engine_is_ready_when_kwok_makes_its_pod_ready_not_later():
    # kwok counts the delay from the Initialized transition; the fleet noticed the pod (and
    # started the engine) 15 s after it, so the engine has 5 s of warm-up left, not 20
    initialized = datetime(2026, 12, 1, 4, 18, 0, tzinfo=UTC)
    assert engine_ready_at(pod("20", initialized), now=initialized.timestamp() + 15) == \
        initialized.timestamp() + 20
    # unknown transition: from now
    assert engine_ready_at(pod("20", None), now=1000.0) == 1020.0


def test_the_engine_warms_until_the_given_moment():
    def engine(ready_at: float) -> SimEngine:
        return SimEngine(EngineConfig("decode", "127.0.0.1", 0, ready_at_unix_seconds=ready_at),
                         LinearTiming())
    assert not engine(time.time() + 60).ready
    assert engine(time.time() - 1).ready


class _Core:
    """The two calls the fleet makes of the API, recorded."""

    def __init__(self, pods: list[client.V1Pod]) -> None:
        self.pods, self.deleted = pods, []

    def list_namespaced_pod(self, namespace, label_selector):
        return client.V1PodList(items=self.pods)

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds, body):
        self.deleted.append((name, grace_period_seconds, body.preconditions.uid))


class _Process:
    def __init__(self, exit_code: int | None) -> None:
        self.exit_code, self.signals = exit_code, []

    def poll(self) -> int | None:
        return self.exit_code

    def send_signal(self, sig) -> None:
        self.signals.append(sig)


def test_a_deleted_pod_is_removed_once_its_engine_has_exited_as_a_kubelet_does(tmp_path):
    """The fleet signals a deleted pod's engine, keeps the pod while the engine drains, and
    removes it (grace 0, by uid) once the engine has exited; a pod nothing runs for yet goes
    at once. (Without it, kwok's stage keeps the pod to its grace period's end.)"""
    import signal

    from pdscale.testbed.simfleet import LABEL_ROLE, Running, SimFleet

    def deleted_pod(name: str, ip: str | None) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, namespace="ns", uid=f"uid-{name}",
                                         labels={LABEL_ROLE: "prefill"},
                                         deletion_timestamp=datetime.now(UTC)),
            status=client.V1PodStatus(pod_ip=ip))

    fleet = SimFleet(kubeconfig=tmp_path / "k", workdir=tmp_path, namespaces=["ns"])
    fleet.core = _Core([deleted_pod("draining", "127.1.0.2"), deleted_pod("unstarted", None)])
    engine = _Process(None)
    fleet.running["ns/draining"] = Running("draining", "prefill", "127.1.0.2", engine, tmp_path / "l")
    fleet.sync()
    assert engine.signals == [signal.SIGTERM] and fleet.core.deleted == [("unstarted", 0, "uid-unstarted")]
    fleet.sync()  # still draining: kept
    assert [d[0] for d in fleet.core.deleted] == ["unstarted", "unstarted"]
    engine.exit_code = 0
    fleet.sync()
    assert ("draining", 0, "uid-draining") in fleet.core.deleted and "ns/draining" not in fleet.running
    assert engine.signals == [signal.SIGTERM]  # signalled once


def test_a_deleted_pod_serves_through_its_prestop_sleep_before_its_engine_is_signalled():
    """A kubelet runs the preStop hook before SIGTERM: the pod keeps its address and serves
    for the sleep (so the operator can drop a pod a rollout deletes from the router before the
    address is free for another pod), and never past its grace period's end."""
    from datetime import timedelta

    from pdscale.testbed.simfleet import sigterm_at

    def deleting(sleep_seconds: int | None, grace_seconds: int) -> client.V1Pod:
        deleted = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)
        pre_stop = None if sleep_seconds is None else client.V1LifecycleHandler(
            sleep=client.V1SleepAction(seconds=sleep_seconds))
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="p", deletion_timestamp=deleted + timedelta(seconds=grace_seconds),
                deletion_grace_period_seconds=grace_seconds),
            spec=client.V1PodSpec(containers=[client.V1Container(
                name="engine", lifecycle=client.V1Lifecycle(pre_stop=pre_stop))]))

    at = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC).timestamp()
    assert sigterm_at(deleting(30, 60)) == at + 30
    assert sigterm_at(deleting(None, 60)) == at  # no hook: signalled at once
    assert sigterm_at(deleting(90, 60)) == at + 60  # the grace period ends the sleep
    assert sigterm_at(deleting(30, 0)) == at  # a forced deletion waits for nothing


def test_the_fleet_does_not_signal_an_engine_during_its_prestop_sleep(tmp_path):
    from datetime import timedelta

    from pdscale.testbed.simfleet import LABEL_ROLE, Running, SimFleet

    now = datetime.now(UTC)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="old", namespace="ns", uid="uid-old",
                                     labels={LABEL_ROLE: "decode"},
                                     deletion_timestamp=now + timedelta(seconds=55),
                                     deletion_grace_period_seconds=60),
        spec=client.V1PodSpec(containers=[client.V1Container(name="engine", lifecycle=client.V1Lifecycle(
            pre_stop=client.V1LifecycleHandler(sleep=client.V1SleepAction(seconds=30))))]),
        status=client.V1PodStatus(pod_ip="127.1.0.3"))
    fleet = SimFleet(kubeconfig=tmp_path / "k", workdir=tmp_path, namespaces=["ns"])
    fleet.core = _Core([pod])
    engine = _Process(None)
    fleet.running["ns/old"] = Running("old", "decode", "127.1.0.3", engine, tmp_path / "l")
    fleet.sync()  # 5 s into its 30 s sleep: still serving, kept, not removed
    assert engine.signals == [] and fleet.core.deleted == [] and "ns/old" in fleet.running
    pod.metadata.deletion_timestamp = now + timedelta(seconds=25)  # 35 s in: the sleep is over
    fleet.sync()
    assert engine.signals and fleet.core.deleted == []  # draining, not yet removed
