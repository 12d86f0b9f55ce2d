"""Leader election decisions (operator/leader.py) against an in-memory Lease store, the
deletion drain's rules and patches (operator/loop/drain.py), and the chart's leader Role."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from pdscale.operator import leader
from pdscale.operator.leader import Action, Conflict, Elector, Record, Settings, decide
from pdscale.operator.loop import drain
from pdscale.operator.loop.fleet import PodView
from pdscale.operator.render import rbac
from pdscale.testbed.localcluster import free_port


class MemoryLeases:
    """A Lease store with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.record: Record | None = None
        self.version = 0
        self.down = False

    def get(self) -> tuple[Record, str] | None:
        if self.down:
            raise OSError("API server unreachable")
        return None if self.record is None else (self.record, str(self.version))

    def create(self, record: Record) -> None:
        if self.record is not None:
            raise Conflict("exists")
        self.record, self.version = record, self.version + 1

    def update(self, record: Record, resource_version: str) -> None:
        if self.down:
            raise OSError("API server unreachable")
        if resource_version != str(self.version):
            raise Conflict("stale")
        self.record, self.version = record, self.version + 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: MemoryLeases, clock: Clock, identity: str) -> Elector:
    return Elector(store, Settings(identity=identity), clock=clock, wall=lambda: 1.7e9)


def test_decide_acquires_free_or_expired_renews_own_never_steals():
    mine = Record(holder="a", lease_duration_seconds=15)
    theirs = Record(holder="b", lease_duration_seconds=15)
    assert decide(None, "a", 0) is Action.CREATE
    assert decide(mine, "a", 0) is Action.RENEW
    assert decide(mine, "a", 100) is Action.RENEW
    assert decide(Record(holder=None, lease_duration_seconds=15), "a", 0) is Action.TAKE
    assert decide(theirs, "a", 14.9) is Action.WAIT
    assert decide(theirs, "a", 15) is Action.TAKE


def test_first_acquires_the_free_lease_and_the_second_waits():
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "a"
    assert store.record.lease_duration_seconds == 15 and store.record.transitions == 0
    assert not b.try_acquire_or_renew()
    clock.now += 14
    assert not b.try_acquire_or_renew()
    assert store.record.holder == "a"


def test_renewing_keeps_the_lease_however_long():
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    for _ in range(20):
        clock.now += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "a"


def test_a_follower_takes_over_once_the_lease_is_unchanged_for_its_duration():
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b first sees the record now
    clock.now += 14.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.1
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1
    # a's next attempt sees another holder: it does not take it back
    assert not a.try_acquire_or_renew()


def test_expiry_is_counted_from_when_this_process_first_saw_the_record():
    """A follower that starts late waits a full duration: it cannot tell how old the renewal is."""
    store, clock = MemoryLeases(), Clock()
    assert elector(store, clock, "a").try_acquire_or_renew()
    clock.now += 100  # a died long ago, unseen by c
    c = elector(store, clock, "c")
    assert not c.try_acquire_or_renew()
    clock.now += 15
    assert c.try_acquire_or_renew()


def test_a_race_for_the_same_lease_has_one_winner():
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    got = store.get  # both read the same (empty) state before either writes
    reads = [got(), got()]
    store.get = lambda: reads.pop(0) if reads else got()  # type: ignore[method-assign]
    results = [a.try_acquire_or_renew(), b.try_acquire_or_renew()]
    assert results == [True, False]
    assert store.record is not None and store.record.holder == "a"


def test_released_lease_is_taken_at_once():
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert store.record is not None and store.record.holder is None
    assert b.try_acquire_or_renew()
    b_record = store.record
    a.release()  # not a's any more: untouched
    assert store.record == b_record


def test_the_leader_gives_up_when_it_cannot_renew_within_the_deadline():
    store, clock = MemoryLeases(), Clock()
    settings = Settings(identity="a", lease_duration_seconds=15, renew_deadline_seconds=10,
                        retry_period_seconds=2)
    a = Elector(store, settings, clock=clock, wall=lambda: 1.7e9)
    assert a.try_acquire_or_renew()
    lost: list[float] = []
    stop = threading.Event()

    class Ticking(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock.now += timeout or 0
            store.down = clock.now > 1005  # the API server goes away after a few renewals
            return stop.is_set()

    a.renew_until_lost(Ticking(), lambda: (lost.append(clock.now), stop.set()))
    assert lost, "never gave up"
    # gave up within the renew deadline after the last renewal, before the Lease expired
    assert 1004 + 10 <= lost[0] <= 1004 + 10 + 2 < 1004 + 15 + 2


def test_the_leader_gives_up_at_once_when_another_holds_the_lease():
    store, clock = MemoryLeases(), Clock()
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew()
    assert store.record is not None
    store.update(replace(store.record, holder="b"), str(store.version))  # e.g. a long GC pause
    lost: list[bool] = []

    class Once(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            return bool(lost)

    a.renew_until_lost(Once(), lambda: lost.append(True))
    assert lost == [True]


def test_settings_from_environment_and_their_order():
    s = Settings.from_environment({"PDSCALE_LEADER_NAMESPACE": "ops", "PDSCALE_LEADER_IDENTITY": "p-1",
                                   "PDSCALE_LEADER_LEASE_DURATION_SECONDS": "8",
                                   "PDSCALE_LEADER_RENEW_DEADLINE_SECONDS": "6",
                                   "PDSCALE_LEADER_RETRY_PERIOD_SECONDS": "1"})
    assert (s.namespace, s.name, s.identity) == ("ops", leader.LEASE_NAME, "p-1")
    assert (s.lease_duration_seconds, s.renew_deadline_seconds, s.retry_period_seconds) == (8, 6, 1)
    default = Settings.from_environment({})
    assert (default.lease_duration_seconds, default.renew_deadline_seconds,
            default.retry_period_seconds) == (15, 10, 2)
    assert str(__import__("os").getpid()) in default.identity
    with pytest.raises(ValueError, match="renew deadline"):
        Settings(lease_duration_seconds=10, renew_deadline_seconds=10)
    assert leader.enabled({}, in_pod=True) and not leader.enabled({"PDSCALE_LEADER_ELECTION": "false"})


def test_an_operator_run_by_hand_runs_alone_and_says_so():
    """`kopf run -m pdscale.operator.handlers --standalone` outside a pod used to wait forever
    for a Lease in pdscale-system, a namespace nothing created, warning every 2 s."""
    assert not leader.enabled({}, in_pod=False)
    assert "runs alone" in leader.off_reason({})
    assert "PDSCALE_LEADER_NAMESPACE" in leader.off_reason({})
    # told where the Lease lives, or told to elect, it elects even outside a pod
    assert leader.enabled({"PDSCALE_LEADER_NAMESPACE": "ops"}, in_pod=False)
    assert leader.enabled({"PDSCALE_LEADER_ELECTION": "true"}, in_pod=False)
    assert not leader.enabled({"PDSCALE_LEADER_ELECTION": "off"}, in_pod=True)


def test_a_missing_lease_namespace_is_said_once_with_the_fix(caplog):
    from kubernetes.client.exceptions import ApiException

    class NoNamespace(MemoryLeases):
        def create(self, record: Record) -> None:
            raise ApiException(status=404, reason="Not Found")

    store, clock = NoNamespace(), Clock()
    a = elector(store, clock, "a")
    with caplog.at_level("WARNING", logger=leader.__name__):
        for _ in range(5):
            assert not a.attempt()
    said = [r for r in caplog.records if r.name == leader.__name__]
    assert len(said) == 1 and said[0].levelname == "ERROR"
    assert "namespace 'pdscale-system' does not exist" in said[0].getMessage()
    assert "kubectl create namespace pdscale-system" in said[0].getMessage()
    assert "PDSCALE_LEADER_ELECTION=false" in said[0].getMessage()


def test_lease_record_round_trips_through_the_spec():
    record = Record(holder="a", lease_duration_seconds=15, renew_time="2026-12-01T00:00:00.000000Z",
                    acquire_time="2026-12-01T00:00:00.000000Z", transitions=3)
    assert Record.from_spec(record.to_spec()) == record
    assert leader.micro_time(0) == "1970-01-01T00:00:00.000000Z"


# ---------------------------------------------------------------------------------------
# Deletion drain (drain.py)


def _body(finalizers: list[str] | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "spec": {}}


def test_the_finalizer_is_added_once_and_never_to_a_deleting_pdcluster():
    assert drain.finalizer_added(_body()) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/metadata/finalizers", "value": [drain.FINALIZER]}]
    assert drain.finalizer_added(_body(["other"])) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": drain.FINALIZER}]
    assert drain.finalizer_added(_body([drain.FINALIZER])) is None
    assert drain.finalizer_added(_body([], deleting=True)) is None


def test_removing_the_finalizer_keeps_the_others():
    assert drain.finalizer_removed(_body(["a", drain.FINALIZER, "b"])) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["a", drain.FINALIZER, "b"]},
        {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "b"]}]
    assert drain.finalizer_removed(_body(["a"])) is None


def _engine(name: str, ip: str | None) -> PodView:
    return PodView(name=name, role="decode", ip=ip, ready=True, created_at_seconds=0.0)


def test_a_deletion_waits_for_every_engine_out_of_the_router_and_idle_or_the_timeout():
    engines = [_engine("p0", "10.0.0.1"), _engine("d0", "10.0.0.2"), _engine("d1", None),
               replace(_engine("d2", "10.0.0.3"), deleting=True)]  # drained before, going

    def state(listed, in_flight, now=10.0):
        return drain.deletion_state(engines, 8000, listed, in_flight, 0.0, now, 150.0)

    idle = {"p0": 0, "d0": 0}
    assert state(set(), idle).done
    assert state(set(), {"p0": 0, "d0": 2}).busy == ("d0",)
    assert not state(set(), {"p0": 0, "d0": 2}).done
    assert not state(set(), {"p0": None, "d0": 0}).done, "no answer is not idle"
    assert state({"http://10.0.0.1:8000"}, idle).listed == ("p0",)
    assert not state(None, idle).done, "an unknown router listing counts as listed"
    assert state(set(), {"p0": 3, "d0": 0}, now=150.0).done  # the timeout ends it anyway


def test_deletion_timeout_is_the_longest_role_drain_timeout_or_the_default():
    assert drain.deletion_timeout_seconds({"spec": {"bogus": 1}}) == drain.DEFAULT_DELETION_DRAIN_SECONDS


# ---------------------------------------------------------------------------------------
# RBAC


def test_leader_election_rbac_is_a_role_for_one_lease():
    role = rbac.leader_role()
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == rbac.NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": [leader.LEASE_NAME], "verbs": ["get", "update"]}]
    binding = rbac.leader_role_binding()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    # nothing about Leases cluster-wide
    assert not any("leases" in r["resources"] for r in rbac.rules())


def test_the_charts_leader_role_is_the_operators():
    from pdscale.testbed.localcluster import DEFAULT_BIN_DIR

    helm = DEFAULT_BIN_DIR / "helm"
    if not helm.is_file():
        pytest.skip("helm not built (e2e/cluster/build)")
    import subprocess
    from pathlib import Path

    import yaml

    chart = Path(__file__).resolve().parents[2] / "charts" / "pdscale"
    out = subprocess.run([str(helm), "template", "t", str(chart), "-n", "ops", "--kube-version", "1.34.4"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    # (the other Role is the namespaced operator rules in the release namespace)
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "ops" and role["rules"] == rbac.leader_rules()
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"
                  and d["metadata"]["name"].endswith("-leader-election")]
    assert binding["subjects"][0]["namespace"] == "ops"
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDSCALE_LEADER_NAMESPACE"] == "ops" and env["PDSCALE_HEALTH_PORT"] == "8080"


def test_a_waiting_follower_answers_the_liveness_probe_then_frees_the_port():
    import asyncio
    import socket
    import urllib.request

    port = free_port()

    async def main() -> None:
        async with leader.follower_health(port):
            answer = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status)
            assert answer == 200
        with socket.socket() as again:  # kopf's own endpoint can bind it now
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("0.0.0.0", port))

    asyncio.run(main())
