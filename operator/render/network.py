"""Pure: the NetworkPolicies of one PDCluster, who may reach its engines and its router.

Without them any pod in the cluster could send prompts straight to an engine, join a KV
transfer, or announce itself to the vLLM router's discovery and receive prompts. With them:

- engines (prefill and decode) accept traffic from the pods of their own PDCluster only (the
  router proxies to them, prefill and decode exchange KV and bootstrap with each other), from
  the operator (it probes their load before removing one), and from the monitoring namespaces
  (Prometheus scrapes their metrics on the serving port);
- the router accepts requests from anywhere on its serving port (it is the service clients
  call), its metrics port from the monitoring namespaces and the operator, and the vLLM
  router's discovery port from the operator alone (only the operator announces workers).

What a NetworkPolicy cannot do: the SGLang router serves its worker API (``/workers``) on the
same port as requests, so a policy cannot keep other pods from calling it; an admin who needs
that puts an authenticating proxy or a service mesh in front. A NetworkPolicy is enforced only
by a CNI that implements it (Calico, Cilium, ...); without one it is inert.

The admin sets who "the operator" and "monitoring" are in the chart (values.networkPolicy),
passed to the operator as ``PDSCALE_NETWORK_POLICY``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any

from pdscale.operator.api import names
from pdscale.operator.api.names import Owner
from pdscale.operator.api.pdcluster import PDClusterSpec, RouterKind

from .router import kind as router_kind

POLICY_ENV = "PDSCALE_NETWORK_POLICY"
ENGINE_ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class NetworkSettings:
    """Who the operator and the monitoring are, as label selectors (the chart's values)."""

    enabled: bool = True
    #: the namespace the operator runs in, and its pods' labels
    operator_namespace: str = "pdscale-system"
    operator_pod_labels: tuple[tuple[str, str], ...] = (
        ("app.kubernetes.io/component", "operator"), ("app.kubernetes.io/name", "pdscale"))
    #: namespaces whose pods may scrape metrics (matched by kubernetes.io/metadata.name)
    monitoring_namespaces: tuple[str, ...] = ("monitoring",)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> NetworkSettings:
        raw = (os.environ if environ is None else environ).get(POLICY_ENV)
        if not raw:
            return cls()
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"{POLICY_ENV} must be a JSON object")
        labels = data.get("operatorPodLabels", dict(cls.operator_pod_labels))
        monitoring = data.get("monitoringNamespaces", list(cls.monitoring_namespaces))
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise ValueError(f"{POLICY_ENV}: operatorPodLabels must map strings to strings")
        if not isinstance(monitoring, list) or not all(isinstance(v, str) for v in monitoring):
            raise ValueError(f"{POLICY_ENV}: monitoringNamespaces must be a list of strings")
        return cls(enabled=bool(data.get("enabled", True)),
                   operator_namespace=str(data.get("operatorNamespace", cls.operator_namespace)),
                   operator_pod_labels=tuple(sorted(labels.items())),
                   monitoring_namespaces=tuple(monitoring))


@functools.cache
def configured() -> NetworkSettings:
    """The operator process's settings, read once from its environment (a malformed value
    stops the operator's start)."""
    return NetworkSettings.from_environment()


def _operator_peer(settings: NetworkSettings) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": settings.operator_namespace}},
            "podSelector": {"matchLabels": dict(settings.operator_pod_labels)}}


def _monitoring_peer(settings: NetworkSettings) -> dict[str, Any]:
    return {"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In",
        "values": list(settings.monitoring_namespaces)}]}}


def _same_cluster_peer(owner: Owner) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {names.LABEL_INSTANCE: names.base_name(owner.name)}}}


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def _policy(owner: Owner, name: str, component: str, selector: dict[str, Any],
            ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(owner, name, component),
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def network_policies(owner: Owner, spec: PDClusterSpec, settings: NetworkSettings
                     ) -> list[dict[str, Any]]:
    """The engines' and the router's NetworkPolicies (none when the admin turned them off)."""
    if not settings.enabled:
        return []
    engines = _policy(
        owner, f"{names.base_name(owner.name)}-engines", "engines",
        {"matchLabels": {names.LABEL_INSTANCE: names.base_name(owner.name)},
         "matchExpressions": [{"key": names.LABEL_ROLE, "operator": "In", "values": list(ENGINE_ROLES)}]},
        [{"from": [_same_cluster_peer(owner)]},
         {"from": [_operator_peer(settings), _monitoring_peer(settings)],
          "ports": [_tcp(spec.engine.port)]}])
    r = spec.router
    router_ingress: list[dict[str, Any]] = [
        {"ports": [_tcp(r.port)]},  # the service clients call
        {"from": [_operator_peer(settings), _monitoring_peer(settings)], "ports": [_tcp(r.metrics_port)]},
    ]
    if router_kind(spec) is RouterKind.VLLM:
        router_ingress.append({"from": [_operator_peer(settings)], "ports": [_tcp(r.discovery_port)]})
    router = _policy(owner, f"{names.base_name(owner.name)}-router", "router",
                     {"matchLabels": names.selector_labels(owner.name, "router")}, router_ingress)
    return [engines, router]
