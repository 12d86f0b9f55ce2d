"""The operator's high availability, on the whole product (chart, two operator processes with
their own identities, real router and Prometheus, simulated engines on fake 8xH200 nodes):

1. the leader is killed (SIGKILL) in the middle of a drain: the follower takes the Lease over
   and finishes that drain, and the pod is removed only once its engine holds no request;
2. a PDCluster is deleted while requests are in flight: its finalizer holds the deletion until
   every engine is out of the router and idle, then garbage collection removes the children;
   no request fails.

The steps share one stack and one PDCluster and run in file order (the second deletes it).
About four minutes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client
from test_failures import World, in_flight, request

from pdscale.testbed.demo import (
    GROUP,
    OLD_DEFAULT_ROUTER,
    PLURAL,
    VERSION,
    load_pdcluster,
    router_url,
)
from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME, NS = "fail", "default"  # test_failures.World's PDCluster
INTERVAL_SECONDS = 10
DRAINING = "pdscale.io/draining-since"
FINALIZER = "pdscale.io/drain"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("ha")
    with Stack(workdir=workdir / "stack", nodes=10, profile="demo-sim", progress=False,
               release_namespace="pdscale-ha") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        # the stack's first operator (operator-0) leads; a second replica follows
        wait_for(lambda: stack.leader() == "operator-0", timeout_seconds=60, what="operator-0 leading")
        stack.start_operator("operator-1")
        api = api_client(stack.kubeconfig)
        custom = client.CustomObjectsApi(api)
        body = load_pdcluster(NAME, NS, stack.prometheus.url)
        spec = body["spec"]
        # measured behind sglang-router 0.3.2, which admits everything: named, not defaulted
        spec["router"].update(OLD_DEFAULT_ROUTER)
        # Fixed counts (min = max): only the user's change below makes the planner drain.
        spec["prefill"].update(replicas=1, minReplicas=1, maxReplicas=1)
        # A drain may take up to 5 x preStopDrainSeconds before it gives up waiting: 150 s,
        # longer than any request here, so only an idle engine ends a drain (or a deletion).
        for role in ("prefill", "decode"):
            spec[role].update(preStopDrainSeconds=30, terminationGracePeriodSeconds=60)
        spec["decode"].update(replicas=3, minReplicas=3, maxReplicas=3)
        spec["planner"]["nodeBudget"] = 10
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        core = client.CoreV1Api(api)
        w = World(stack, core, client.AppsV1Api(api), custom,
                  router_url(core, NS, NAME, spec["router"]["port"]))
        wait_for(lambda: len(w.listed()) == 4, timeout_seconds=120,
                 what="the router listing 1 prefill and 3 decode workers")
        yield w
        stack.remove_pdcluster(NS, NAME)


def held_at_deletion(w: World, pod: str) -> int | None:
    """What an engine held when its pod was deleted: the simulated kubelet reads its load when
    it first sees the deletion (SIGTERM comes only after the preStop sleep)."""
    return w.stack.fleet.in_flight_at_deletion.get(f"{NS}/{pod}") if w.stack.fleet else None


def test_leader_killed_mid_drain_the_follower_finishes_it_only_once_idle(world: World):
    w = world
    assert w.pdc()["metadata"].get("finalizers") == [FINALIZER], "the leader adds its finalizer"
    decode = {p.metadata.name for p in w.pods("decode")}
    assert len(decode) == 3
    loader = w.send([request(i, 600) for i in range(6)])
    wait_for(lambda: all((in_flight(p) or 0) > 0 for p in w.pods("decode")), timeout_seconds=30,
             what="each decode engine holding a request")
    w.patch_spec({"decode": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2}})
    draining = wait_for(lambda: next((p for p in w.pods("decode")
                                      if (p.metadata.annotations or {}).get(DRAINING)), None),
                        timeout_seconds=3 * INTERVAL_SECONDS, what="a decode pod marked draining")
    url = f"http://{draining.status.pod_ip}:8000"
    wait_for(lambda: url not in w.listed(), timeout_seconds=10, what="the router letting go")
    leader = w.stack.leader()
    assert leader == "operator-0"
    w.stack.kill_operator(leader)
    killed_at = time.time()
    name = draining.metadata.name
    work_at_kill = in_flight(draining)
    assert work_at_kill and work_at_kill > 0, f"{name} was idle when the leader died: no test"

    # The follower takes over once the dead leader's Lease has expired (8 s in the stack).
    wait_for(lambda: w.stack.leader() == "operator-1", timeout_seconds=30, interval_seconds=0.5,
             what="operator-1 taking the Lease over")
    took_over = time.time() - killed_at
    readings: list[tuple[float, int | None]] = []

    def removed() -> bool:
        try:
            pod = w.core.read_namespaced_pod(name, NS)
        except client.ApiException as exc:
            return exc.status == 404
        if pod.metadata.deletion_timestamp is not None:
            return True
        readings.append((time.time(), in_flight(pod)))
        return False

    wait_for(removed, timeout_seconds=120, interval_seconds=0.5, what=f"{name} removed after its drain")
    assert any((n or 0) > 0 for _, n in readings), "the drain ended before the new leader saw work"
    wait_for(lambda: held_at_deletion(w, name) is not None, timeout_seconds=30,
             what=f"{name}'s engine read at its deletion")
    held = held_at_deletion(w, name)
    assert held == 0, f"{name} removed while its engine held {held} requests; readings {readings[-5:]}"
    finished = [e for e in w.events("DrainFinished") if name in e.message]
    assert finished and finished[0].first_timestamp.timestamp() >= killed_at - 1
    assert {p.metadata.name for p in w.pods("decode") if not p.metadata.deletion_timestamp} \
        == decode - {name}, "a pod other than the drained one was removed"
    loader.join(timeout=120)
    failed = [r for r in w.records if not r.ok]
    assert len(w.records) == 6 and not failed, f"failed requests: {[r.error for r in failed]}"
    print(f"takeover {took_over:.1f} s after the kill")
    # the killed pod restarts as a follower (same identity: the same pod), the stack has two again
    w.stack.start_operator("operator-0")
    time.sleep(3)
    assert w.stack.leader() == "operator-1", "a restarted replica must not take the Lease back"


def test_pdcluster_deleted_with_requests_in_flight_waits_for_them(world: World):
    w = world
    w.records.clear()
    engines = {p.metadata.name for role in ("prefill", "decode") for p in w.pods(role)
               if not p.metadata.deletion_timestamp}
    routers = {p.metadata.name for p in w.pods("router")}
    assert engines and routers
    loader = w.send([request(200 + i, 600) for i in range(4)])
    wait_for(lambda: all((in_flight(p) or 0) > 0 for p in w.pods("decode")
                         if not p.metadata.deletion_timestamp),
             timeout_seconds=30, what="each decode engine holding a request")
    w.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
    deleted_at = time.time()

    # The router lets every engine go at once; nothing is removed while work is in flight.
    wait_for(lambda: not w.listed(), timeout_seconds=15, what="the router listing no worker")
    readings: list[tuple[float, int, bool]] = []  # (when, engines' work, PDCluster still there)

    def gone() -> bool:
        # pods first: a PDCluster still there afterwards was there when they were listed
        pods = [p for role in ("prefill", "decode") for p in w.pods(role)]
        try:
            pdc = w.pdc()
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            pdc = None
        work = sum(in_flight(p) or 0 for p in pods)
        readings.append((time.time(), work, pdc is not None))
        if pdc is not None:
            assert pdc["metadata"]["deletionTimestamp"] and FINALIZER in pdc["metadata"]["finalizers"]
            assert {p.metadata.name for p in pods} >= engines, "an engine went before the drain"
        return pdc is None

    wait_for(gone, timeout_seconds=150, interval_seconds=0.5, what="the PDCluster gone")
    released = time.time()
    assert any(work > 0 and present for _, work, present in readings), \
        f"the deletion did not wait for in-flight work: {readings[:5]}"
    # Garbage collection removes every child; each engine was idle when its pod was deleted.
    wait_for(lambda: not any(w.pods(role) for role in ("prefill", "decode", "router")),
             timeout_seconds=90, what="every pod of the PDCluster gone")
    for name in engines:
        wait_for(lambda n=name: held_at_deletion(w, n) is not None, timeout_seconds=30,
                 what=f"{name}'s engine read at its deletion")
        assert held_at_deletion(w, name) == 0, f"{name} deleted holding work"
    assert not w.apps.list_namespaced_deployment(
        NS, label_selector=f"app.kubernetes.io/instance={NAME}").items
    loader.join(timeout=120)
    failed = [r for r in w.records if not r.ok]
    assert len(w.records) == 4 and not failed, f"failed requests: {[r.error for r in failed]}"
    print(f"deletion held {released - deleted_at:.1f} s for in-flight work")
