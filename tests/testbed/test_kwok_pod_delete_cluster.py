"""A deleted pod goes as a kubelet lets it go (testbed/kwok-pod-delete.yaml): a pod the
simulated fleet runs a process for at its grace period's end at the latest (the fleet removes
it earlier, once the process has exited), a LeaderWorkerSet worker a few seconds later (its
container stops first), any other pod at once. kwok's own stage removed it at
a random moment within the grace period, which held drained engines in the node budget for up
to 30 s after they had exited."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.nodes import GPU_TAINT
from pdscale.testbed.simfleet import LWS_WORKER_INDEX, PROCESS_ANNOTATION

pytestmark = pytest.mark.cluster


def _pod(name: str, node: str, annotations: dict[str, str], grace_seconds: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace_seconds,
            "tolerations": [{**GPU_TAINT, "operator": "Equal"}],
            "containers": [{"name": "engine", "image": "lmsysorg/sglang:v0.5.6-cu129"}],
        },
    }


def _exists(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_a_deleted_pod_with_a_process_stays_until_its_grace_ends_and_any_other_goes_at_once(
        cluster, admin_api, namespace) -> None:
    node = cluster.ensure_h200_nodes(1)[0]
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(namespace, _pod("engine", node, {PROCESS_ANNOTATION: "true"},
                                               grace_seconds=8))
    core.create_namespaced_pod(namespace, _pod("other", node, {}, grace_seconds=60))
    wait_for(lambda: all(core.read_namespaced_pod(n, namespace).status.phase == "Running"
                         for n in ("engine", "other")), timeout_seconds=60)
    deleted = time.monotonic()
    core.delete_namespaced_pod("engine", namespace)
    core.delete_namespaced_pod("other", namespace)
    # no fleet runs here to see the engine's process exit, so it waits out its grace period
    wait_for(lambda: not _exists(core, namespace, "other"), timeout_seconds=10)
    assert time.monotonic() - deleted < 10
    while time.monotonic() < deleted + 4:
        assert _exists(core, namespace, "engine"), "a pod with a process went before its grace ended"
        time.sleep(0.25)
    wait_for(lambda: not _exists(core, namespace, "engine"), timeout_seconds=30)
    assert time.monotonic() - deleted >= 7  # its deadline is in whole seconds


def test_a_deleted_leaderworkerset_worker_goes_seconds_later_as_its_container_stops(
        cluster, admin_api, namespace) -> None:
    """An LWS worker pod (the fleet runs no process for it: its leader serves the group) goes a
    few seconds after its deletion, as a kubelet stops its container first: the LWS controller
    recreates the group only if it reads the pod while it is being deleted."""
    node = cluster.ensure_h200_nodes(1)[0]
    core = client.CoreV1Api(admin_api)
    body = _pod("worker", node, {}, grace_seconds=60)
    body["metadata"]["labels"] = {LWS_WORKER_INDEX: "2"}
    core.create_namespaced_pod(namespace, body)
    wait_for(lambda: core.read_namespaced_pod("worker", namespace).status.phase == "Running",
             timeout_seconds=60)
    deleted = time.monotonic()
    core.delete_namespaced_pod("worker", namespace)
    wait_for(lambda: not _exists(core, namespace, "worker"), timeout_seconds=30)
    # a lower bound: load on the machine can only make it later
    assert time.monotonic() - deleted >= 2.5, "an LWS worker went before its container stopped"
