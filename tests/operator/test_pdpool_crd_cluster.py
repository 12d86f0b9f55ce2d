"""The generated PDPool CRD on a real API server: it is accepted (its CEL rules compile
within the cost budget) and its rules refuse what the model refuses."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import wait_for

from pdscale.operator.api import crd
from pdscale.testbed.nodes import api_client

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def pools(cluster) -> client.CustomObjectsApi:
    api = api_client(cluster.kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    body = crd.build_pool_crd()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd.POOL_CRD_NAME)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd.POOL_CRD_NAME, body)
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         ext.read_custom_resource_definition(crd.POOL_CRD_NAME).status.conditions
                         or []), what="PDPool CRD established")
    return client.CustomObjectsApi(api)


def _pool(name: str, spec: dict) -> dict:
    return {"apiVersion": "pdscale.io/v1alpha1", "kind": "PDPool", "metadata": {"name": name},
            "spec": spec}


def test_a_pool_is_admitted_with_its_defaults(pools, namespace):
    made = pools.create_namespaced_custom_object(
        "pdscale.io", "v1alpha1", namespace, "pdpools",
        _pool("serving", {"nodes": 24, "members": [{"name": "chat", "priority": 100,
                                                    "guaranteedNodes": 8}, {"name": "docs"}]}))
    assert made["spec"]["gpuProduct"] == "NVIDIA-H200"
    assert made["spec"]["horizonSeconds"] == 1800
    assert made["spec"]["members"][1] == {"name": "docs", "priority": 0, "guaranteedNodes": 0}


@pytest.mark.parametrize("spec, message", [
    ({"members": [{"name": "a"}, {"name": "a"}]}, "each PDCluster may be listed once"),
    ({"nodes": 10, "members": [{"name": "a", "guaranteedNodes": 6},
                               {"name": "b", "guaranteedNodes": 5}]},
     "must not sum to more than nodes"),
])
def test_the_api_server_refuses(pools, namespace, spec, message):
    with pytest.raises(ApiException) as err:
        pools.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdpools",
                                              _pool("bad", spec))
    assert err.value.status == 422 and message in err.value.body
