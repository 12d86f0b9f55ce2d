"""Fixtures for the operator's integration tests: the CRD and the operator's RBAC installed by
the admin, the operator running under KopfRunner with its own ServiceAccount identity, and
polling helpers (never bare sleeps)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pdc_cluster_helpers import CPU_NODE, DECOY_NODE, POOL, wait_for


def _create_or_replace(create, read, replace, body):
    from kubernetes.client.rest import ApiException

    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = read(body["metadata"]["name"])
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        replace(body["metadata"]["name"], body)


@pytest.fixture(scope="session")
def operator_installed(cluster) -> None:
    """CRDs (PDCluster, PDPool), ClusterRole (from operator/render/rbac.py) and its binding to the operator's SA, applied by
    the admin; plus an untainted CPU node for the router and a decoy GPU node of another
    product that no engine pod may use."""
    from kubernetes import client

    from pdscale.operator.api import crd
    from pdscale.operator.render import rbac
    from pdscale.testbed.nodes import api_client, h200_node, wait_nodes_ready

    api = api_client(cluster.kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    _create_or_replace(ext.create_custom_resource_definition, ext.read_custom_resource_definition,
                       ext.replace_custom_resource_definition, crd.build_crd())
    _create_or_replace(ext.create_custom_resource_definition, ext.read_custom_resource_definition,
                       ext.replace_custom_resource_definition, crd.build_pool_crd())
    for name in (crd.CRD_NAME, crd.POOL_CRD_NAME):
        wait_for(lambda name=name: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or []),
            what=f"CRD {name} established")
    rb = client.RbacAuthorizationV1Api(api)
    _create_or_replace(rb.create_cluster_role, rb.read_cluster_role, rb.replace_cluster_role,
                       rbac.cluster_role())
    _create_or_replace(rb.create_cluster_role_binding, rb.read_cluster_role_binding,
                       rb.replace_cluster_role_binding, rbac.cluster_role_binding())
    # leader election: the Lease in the operator's namespace, through a Role (as the chart)
    role, binding = rbac.leader_role(), rbac.leader_role_binding()
    _create_or_replace(lambda b: rb.create_namespaced_role(rbac.NAMESPACE, b),
                       lambda n: rb.read_namespaced_role(n, rbac.NAMESPACE),
                       lambda n, b: rb.replace_namespaced_role(n, rbac.NAMESPACE, b), role)
    _create_or_replace(lambda b: rb.create_namespaced_role_binding(rbac.NAMESPACE, b),
                       lambda n: rb.read_namespaced_role_binding(n, rbac.NAMESPACE),
                       lambda n, b: rb.replace_namespaced_role_binding(n, rbac.NAMESPACE, b), binding)
    core = client.CoreV1Api(api)
    cpu = h200_node(CPU_NODE, POOL)
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"):
        cpu["metadata"]["labels"].pop(key)
    cpu["metadata"]["labels"]["pdscale.io/pool"] = "cpu"
    cpu["spec"] = {}
    for field in ("capacity", "allocatable"):
        cpu["status"][field] = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    decoy = h200_node(DECOY_NODE, POOL)
    decoy["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    for node in (cpu, decoy):
        _create_or_replace(core.create_node, core.read_node, core.replace_node, node)
    # Room for two 4P8D fleets: a test's pods may still be terminating when the next one starts.
    cluster.ensure_h200_nodes(40, POOL)
    wait_nodes_ready(cluster.kubeconfig, [CPU_NODE, DECOY_NODE])


@pytest.fixture
def run_operator(cluster, operator_installed, monkeypatch) -> Iterator[Callable[[], Any]]:
    """Factory: `with run_operator() as runner:` runs the operator under KopfRunner as the
    ServiceAccount pdscale-system/pdscale-operator (never the admin)."""
    import kopf
    from kopf.testing import KopfRunner

    monkeypatch.setenv("KUBECONFIG", str(cluster.operator_kubeconfig))
    monkeypatch.setenv("PDSCALE_WATCH_TIMEOUT_SECONDS", "10")
    monkeypatch.setenv("PDSCALE_LEADER_NAMESPACE", "pdscale-system")
    # the admin of this test cluster lets PDClusters name a Prometheus on loopback (the
    # tests' own, or a port where none listens); the rest of the policy is the default
    from pdscale.operator.api import tenant_policy

    monkeypatch.setenv(tenant_policy.POLICY_ENV, '{"allowedPrometheusURLs": ["127.0.0.1"]}')
    tenant_policy.configured.cache_clear()
    runners: list[KopfRunner] = []

    def start() -> KopfRunner:
        settings = kopf.OperatorSettings()
        settings.watching.server_timeout = 10
        runner = KopfRunner(["run", "--all-namespaces", "--standalone", "-m",
                             "pdscale.operator.handlers"], settings=settings)
        runners.append(runner)
        return runner

    yield start
    tenant_policy.configured.cache_clear()  # the environment is restored after this fixture
    for runner in runners:
        if runner.exception is not None:
            raise runner.exception
