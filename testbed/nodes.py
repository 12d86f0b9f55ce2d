"""Test-bed objects that work on any cluster reached by a kubeconfig: the local control plane
or a user's kind cluster running kwok. Fake 8xH200 nodes, and the operator's own identity (a
real ServiceAccount token from the TokenRequest API, so RBAC is tested as in production)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException

# kwok only manages nodes carrying this annotation, so a user's real nodes (on a kind cluster
# running kwok inside) are never touched (localcluster starts kwok with it as its selector).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_PRODUCT = "NVIDIA-H200"
GPU_RESOURCE = "nvidia.com/gpu"
# The taint GPU operators conventionally put on GPU nodes: only pods that ask for GPUs land.
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
POOL_LABEL = "pdscale.io/pool"
OPERATOR_NAMESPACE = "pdscale-system"
OPERATOR_SERVICE_ACCOUNT = "pdscale-operator"

# What a real 8xH200 server (HGX H200: 2x 56-core Xeon 8480C, 2 TiB RAM, 8 ConnectX-7 NICs for
# RDMA) reports to Kubernetes with the NVIDIA device plugin and an RDMA device plugin.
H200_CAPACITY = {
    "cpu": "224",
    "memory": "2063Gi",
    "ephemeral-storage": "30Ti",
    "pods": "110",
    GPU_RESOURCE: "8",
    "rdma/ib": "8",
}


def api_client(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def h200_node(name: str, pool: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                POOL_LABEL: pool,
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "143771",
                "node.kubernetes.io/instance-type": "8xH200",
            },
        },
        "spec": {"taints": [dict(GPU_TAINT)]},
        "status": {"capacity": dict(H200_CAPACITY), "allocatable": dict(H200_CAPACITY)},
    }


def cpu_node(name: str, pool: str) -> dict:
    """A fake CPU node (no GPU, no taint): where routers and other non-GPU pods land."""
    node = h200_node(name, pool)
    labels = node["metadata"]["labels"]
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"):
        labels.pop(key)
    labels["node.kubernetes.io/instance-type"] = "cpu-64"
    node["spec"] = {}
    capacity = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "2Ti", "pods": "110"}
    node["status"] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    return node


def ensure_h200_nodes(kubeconfig: Path, count: int, pool: str = "default") -> list[str]:
    """Create fake 8xH200 nodes ``h200-<pool>-<i>`` for i < count (existing ones are kept)."""
    return _ensure_nodes(kubeconfig, [h200_node(f"h200-{pool}-{i:03d}", pool) for i in range(count)])


def ensure_cpu_nodes(kubeconfig: Path, count: int, pool: str = "default") -> list[str]:
    """Create fake CPU nodes ``cpu-<pool>-<i>`` for i < count (existing ones are kept)."""
    return _ensure_nodes(kubeconfig, [cpu_node(f"cpu-{pool}-{i:03d}", pool) for i in range(count)])


def _ensure_nodes(kubeconfig: Path, nodes: list[dict]) -> list[str]:
    api = client.CoreV1Api(api_client(kubeconfig))
    existing = {n.metadata.name for n in api.list_node().items}
    for node in nodes:
        if node["metadata"]["name"] not in existing:
            try:
                api.create_node(node)
            except ApiException as exc:
                if exc.status != 409:
                    raise
    return [n["metadata"]["name"] for n in nodes]


def wait_nodes_ready(kubeconfig: Path, names: list[str], timeout_seconds: float = 60) -> None:
    api = client.CoreV1Api(api_client(kubeconfig))
    deadline = time.monotonic() + timeout_seconds
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for node in api.list_node().items:
            conditions = {c.type: c.status for c in (node.status.conditions or [])}
            if conditions.get("Ready") == "True":
                pending.discard(node.metadata.name)
        if pending:
            time.sleep(0.5)
    if pending:
        raise TimeoutError(
            f"{len(pending)} fake nodes not Ready after {timeout_seconds:.0f}s "
            f"(e.g. {sorted(pending)[0]}): is kwok running with the node stages?"
        )


def operator_kubeconfig(admin_kubeconfig: Path, out: Path, expiration_seconds: int = 86400, *,
                        namespace: str = OPERATOR_NAMESPACE,
                        service_account: str = OPERATOR_SERVICE_ACCOUNT,
                        create: bool = True, wait_seconds: float = 30.0) -> Path:
    """Write a kubeconfig for a ServiceAccount (by default pdscale-system/pdscale-operator),
    token from the TokenRequest API. ``create``: make the namespace and ServiceAccount;
    otherwise wait for them (a Helm release creates them). No RBAC is bound here: what the
    identity may do is the caller's choice."""
    api_c = api_client(admin_kubeconfig)
    core = client.CoreV1Api(api_c)
    if create:
        for make, body in (
            (core.create_namespace, {"metadata": {"name": namespace}}),
            (lambda b: core.create_namespaced_service_account(namespace, b),
             {"metadata": {"name": service_account}}),
        ):
            try:
                make(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            token = core.create_namespaced_service_account_token(
                service_account, namespace, {"spec": {"expirationSeconds": expiration_seconds}},
            ).status.token
            break
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    cfg = api_c.configuration
    cluster: dict[str, object] = {"server": cfg.host}
    if cfg.ssl_ca_cert:
        cluster["certificate-authority"] = cfg.ssl_ca_cert
    if not cfg.verify_ssl:
        cluster["insecure-skip-tls-verify"] = True
    ctx = service_account
    out.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": ctx,
        "clusters": [{"name": ctx, "cluster": cluster}],
        "users": [{"name": ctx, "user": {"token": token}}],
        "contexts": [{"name": ctx, "context": {"cluster": ctx, "user": ctx}}],
    }, indent=2))
    return out
