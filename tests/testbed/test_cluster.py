"""The local control plane behaves like a real cluster: the scheduler counts GPUs on fake
8xH200 nodes, pods become Ready (after a chosen warm-up), and RBAC refuses the operator what
it was not granted."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.nodes import GPU_PRODUCT, GPU_RESOURCE, POOL_LABEL, api_client

pytestmark = pytest.mark.cluster

READY_DELAY_ANNOTATION = "pdscale.io/simulated-ready-delay-seconds"


def gpu_deployment(name: str, pool: str, replicas: int, annotations: dict | None = None) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT, POOL_LABEL: pool},
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{
                        "name": "engine",
                        "image": "example.invalid/engine:1",
                        "resources": {"limits": {GPU_RESOURCE: "8"}, "requests": {GPU_RESOURCE: "8"}},
                    }],
                },
            },
        },
    }


def pods(admin_api, namespace: str, app: str) -> list:
    return client.CoreV1Api(admin_api).list_namespaced_pod(namespace, label_selector=f"app={app}").items


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def condition_time(pod, kind: str) -> datetime:
    return next(c.last_transition_time for c in pod.status.conditions if c.type == kind)


def test_gpu_pods_land_on_h200_nodes_and_the_scheduler_counts_gpus(cluster, admin_api, namespace):
    pool = f"sched-{uuid.uuid4().hex[:6]}"
    nodes = set(cluster.ensure_h200_nodes(2, pool=pool))
    apps = client.AppsV1Api(admin_api)
    apps.create_namespaced_deployment(namespace, gpu_deployment("engine", pool, replicas=2))

    def two_ready():
        ready = [p for p in pods(admin_api, namespace, "engine") if is_ready(p)]
        return ready if len(ready) == 2 else None

    running = wait_for(two_ready, timeout_seconds=60, what="2 Ready GPU pods")
    assert {p.spec.node_name for p in running} == nodes  # one 8-GPU pod per 8-GPU node
    assert all(p.status.phase == "Running" for p in running)

    # Every GPU of the pool is taken: a third pod must wait, for GPUs and not another reason.
    apps.patch_namespaced_deployment_scale("engine", namespace, {"spec": {"replicas": 3}})

    def unschedulable():
        for p in pods(admin_api, namespace, "engine"):
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return p, c
        return None

    pod, cond = wait_for(unschedulable, timeout_seconds=60, what="an Unschedulable third pod")
    assert pod.status.phase == "Pending"
    assert f"Insufficient {GPU_RESOURCE}" in cond.message


def test_readiness_delay_annotation_delays_ready(cluster, admin_api, namespace):
    pool = f"delay-{uuid.uuid4().hex[:6]}"
    cluster.ensure_h200_nodes(2, pool=pool)
    apps = client.AppsV1Api(admin_api)
    delay_seconds = 8
    apps.create_namespaced_deployment(namespace, gpu_deployment("slow", pool, 1, {READY_DELAY_ANNOTATION: str(delay_seconds)}))
    apps.create_namespaced_deployment(namespace, gpu_deployment("fast", pool, 1))

    def ready_pod(app):
        ready = [p for p in pods(admin_api, namespace, app) if is_ready(p)]
        return ready[0] if ready else None

    fast = wait_for(lambda: ready_pod("fast"), timeout_seconds=60, what="the undelayed pod Ready")
    slow = wait_for(lambda: ready_pod("slow"), timeout_seconds=60, what="the delayed pod Ready")
    # Measured from Initialized (kwok's pod-create stage, which has its own jitter) to Ready;
    # condition times have one-second resolution.
    fast_wait = (condition_time(fast, "Ready") - condition_time(fast, "Initialized")).total_seconds()
    slow_wait = (condition_time(slow, "Ready") - condition_time(slow, "Initialized")).total_seconds()
    assert fast_wait <= 2
    assert delay_seconds - 1 <= slow_wait <= delay_seconds + 2


def test_operator_identity_is_refused_what_rbac_does_not_grant(cluster, admin_api, namespace):
    # What the operator never gets, whatever else the suite has bound to it: Secrets, and any
    # write to Nodes. (The chart lets it list them: a PDPool without spec.nodes counts its nodes.)
    operator = api_client(cluster.operator_kubeconfig)
    core = client.CoreV1Api(operator)
    with pytest.raises(ApiException) as refused:
        core.list_namespaced_secret("kube-system")
    assert refused.value.status == 403
    with pytest.raises(ApiException) as refused_nodes:  # authorised before looked up: 403
        core.patch_node("any-node", {"metadata": {"labels": {"pdscale.io/test": "x"}}})
    assert refused_nodes.value.status == 403
    with pytest.raises(ApiException) as refused_list:
        core.list_namespaced_config_map(namespace)
    assert refused_list.value.status == 403

    # The identity is real and authenticated: granting a Role makes the same call succeed.
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "list-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
    })
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "list-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "pdscale-operator", "namespace": "pdscale-system"}],
    })
    wait_for(lambda: _can_list_configmaps(core, namespace), timeout_seconds=10,
             what="the RoleBinding to take effect")
    with pytest.raises(ApiException) as still_refused:
        core.list_namespaced_secret(namespace)
    assert still_refused.value.status == 403


def _can_list_configmaps(core, namespace: str) -> bool:
    try:
        core.list_namespaced_config_map(namespace)
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True
