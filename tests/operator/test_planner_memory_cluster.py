"""What the planner memory's guarded write relies on, from a real API server: a server-side
apply carrying a stale resourceVersion is refused with 409, one carrying the current version
goes through, and a create over an existing object is refused with 409."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from pdscale.operator.clients.kube import Kube

pytestmark = [pytest.mark.cluster]


def _configmap(namespace: str, value: str, version: str | None = None) -> dict:
    meta: dict = {"name": "demo-planner", "namespace": namespace}
    if version is not None:
        meta["resourceVersion"] = version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"memory": value}}


def test_the_api_server_refuses_a_write_over_a_version_not_read(admin_api, namespace):
    kube = Kube(admin_api)
    created = kube.create(_configmap(namespace, "first"))
    with pytest.raises(ApiException) as exists:
        kube.create(_configmap(namespace, "again"))
    assert exists.value.status == 409
    read = created["metadata"]["resourceVersion"]
    newer = kube.apply(_configmap(namespace, "theirs", read))  # the version read: accepted
    with pytest.raises(ApiException) as stale:
        kube.apply(_configmap(namespace, "ours", read))  # that version is gone now
    assert stale.value.status == 409
    stored = kube.get("ConfigMap", namespace, "demo-planner")
    assert stored is not None and stored["data"] == {"memory": "theirs"}
    kube.apply(_configmap(namespace, "ours", newer["metadata"]["resourceVersion"]))
    assert kube.get("ConfigMap", namespace, "demo-planner")["data"] == {"memory": "ours"}
