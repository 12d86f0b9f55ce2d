"""pytest fixtures for tests that need a real cluster or a real Prometheus.

Import them in a conftest (``from pdscale.testbed.fixtures import cluster, namespace, ...``). The
cluster is the local control plane started once per session, or, when ``KUBECONFIG`` is set,
the cluster it points to (a user's kind cluster with kwok): the same suite runs on both.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .localcluster import LocalCluster
from .localprometheus import LocalPrometheus
from .lwscontroller import LWSController
from .nodes import api_client, ensure_h200_nodes, operator_kubeconfig, wait_nodes_ready


def wait_for(fn: Callable[[], Any], *, timeout_seconds: float = 60, interval_seconds: float = 0.25,
             what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy (and return that); tests wait on
    conditions, never on bare sleeps. The error names what was awaited and the last value."""
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_seconds)
    raise TimeoutError(f"timed out after {timeout_seconds:.0f}s waiting for {what}; last: {last!r}")


@dataclass
class ClusterHandle:
    kubeconfig: Path  # admin
    operator_kubeconfig: Path  # ServiceAccount pdscale-system/pdscale-operator, no RBAC bound
    local: LocalCluster | None  # None when the suite runs against KUBECONFIG

    def ensure_h200_nodes(self, n: int, pool: str = "default") -> list[str]:
        names = ensure_h200_nodes(self.kubeconfig, n, pool)
        wait_nodes_ready(self.kubeconfig, names)
        return names


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    workdir = tmp_path_factory.mktemp("cluster")
    existing = os.environ.get("KUBECONFIG")
    if existing:
        kubeconfig = Path(existing)
        yield ClusterHandle(kubeconfig, operator_kubeconfig(kubeconfig, workdir / "operator.kubeconfig"), None)
        return
    local = LocalCluster(workdir=workdir)
    local.start()
    try:
        op = operator_kubeconfig(local.kubeconfig, workdir / "operator.kubeconfig")
        yield ClusterHandle(local.kubeconfig, op, local)
    finally:
        local.stop()


@pytest.fixture
def admin_api(cluster: ClusterHandle) -> client.ApiClient:
    return api_client(cluster.kubeconfig)


@pytest.fixture
def namespace(admin_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (its objects go with it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": name, "labels": {"pdscale.io/test": "true"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrometheus]:
    prom = LocalPrometheus(workdir=tmp_path_factory.mktemp("prometheus"))
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def lws_controller(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[LWSController | None]:
    """The real LeaderWorkerSet controller on the local cluster, for the tests that need it
    (only they start it). None on a KUBECONFIG cluster, which must have LWS v0.7.0 installed."""
    if cluster.local is None:
        yield None
        return
    controller = LWSController(cluster.local, tmp_path_factory.mktemp("lws"))
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()
