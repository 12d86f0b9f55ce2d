"""The P/D router: its Deployment, Service, identity, and the worker list it consumes.

The worker list is not a static file: prefill and decode pods come and go as the planner
rescales them. The router therefore discovers workers itself from the Kubernetes API, by the
per-role selector labels every engine pod carries (names.selector_labels) and, for prefill,
the ``sglang.ai/bootstrap-port`` pod annotation. Deleting a pod removes it from the router
before the pod's preStop drain ends: the order "router first, then the pod" holds by design.
"""

from __future__ import annotations

from typing import Any

from . import names
from .names import Owner, metadata
from .pdcluster import PDClusterSpec, RouterKind, RoutingPolicy

_POLICY = {
    RoutingPolicy.CACHE_AWARE: "cache_aware",
    RoutingPolicy.POWER_OF_TWO: "power_of_two",
    RoutingPolicy.ROUND_ROBIN: "round_robin",
    RoutingPolicy.RANDOM: "random",
}


def kind(spec: PDClusterSpec) -> RouterKind:
    return spec.router.kind or RouterKind(spec.engine.kind.value)


def _selector_arg(labels: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(labels.items())]


def worker_discovery(owner: Owner, spec: PDClusterSpec) -> dict[str, Any]:
    """The router's worker-list configuration: where it finds prefill workers (with their
    bootstrap port) and decode workers."""
    return {
        "namespace": owner.namespace,
        "port": spec.engine.port,
        "prefillSelector": names.selector_labels(owner.name, "prefill"),
        "decodeSelector": names.selector_labels(owner.name, "decode"),
        "bootstrapPortAnnotation": "sglang.ai/bootstrap-port",
    }


def args(owner: Owner, spec: PDClusterSpec) -> tuple[list[str], list[str]]:
    """(command, args) of the router container."""
    r = spec.router
    discovery = worker_discovery(owner, spec)
    common = [
        "--host", "0.0.0.0",
        "--port", str(r.port),
        "--service-discovery",
        "--prefill-selector", *_selector_arg(discovery["prefillSelector"]),
        "--decode-selector", *_selector_arg(discovery["decodeSelector"]),
        "--service-discovery-namespace", discovery["namespace"],
        # Docs disagree on the default (80 vs 8000): always explicit.
        "--service-discovery-port", str(discovery["port"]),
        "--prefill-policy", _POLICY[r.prefill_policy],
        "--decode-policy", _POLICY[r.decode_policy],
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(r.metrics_port),
    ]
    if kind(spec) is RouterKind.SGLANG:
        command = ["python3", "-m", "sglang_router.launch_router"]
        mode = ["--pd-disaggregation"]
    else:
        # vllm-project/router is a fork of the SGLang router and keeps its discovery flags.
        command = ["vllm-router"]
        mode = ["--vllm-pd-disaggregation"]
    return command, [*mode, *common, *r.extra_args]


def rbac(owner: Owner, spec: PDClusterSpec) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding: the router may read pods in its namespace."""
    name = names.child_name(owner.name, "router")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": metadata(owner, name, "router")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": metadata(owner, name, "router"),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": metadata(owner, name, "router"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]},
    ]


def deployment(owner: Owner, spec: PDClusterSpec) -> dict[str, Any]:
    r = spec.router
    name = names.child_name(owner.name, "router")
    command, router_args = args(owner, spec)
    container = {
        "name": "router",
        "image": r.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": router_args,
        "ports": [
            {"name": "http", "containerPort": r.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": r.metrics_port, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http", "scheme": "HTTP"},
                           "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3,
                           "successThreshold": 1},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http", "scheme": "HTTP"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3,
                          "successThreshold": 1},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, "router"),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": names.selector_labels(owner.name, "router")},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": names.labels(owner.name, "router"),
                    "annotations": {"prometheus.io/scrape": "true",
                                    "prometheus.io/port": str(r.metrics_port)},
                },
                "spec": {
                    "serviceAccountName": name,
                    "containers": [container],
                    "enableServiceLinks": False,
                },
            },
        },
    }


def service(owner: Owner, spec: PDClusterSpec) -> dict[str, Any]:
    """The Service clients call: the model's OpenAI-compatible endpoint."""
    r = spec.router
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, names.child_name(owner.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(owner.name, "router"),
            "ports": [
                {"name": "http", "port": r.port, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": r.metrics_port, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
