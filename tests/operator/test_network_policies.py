"""Who may reach a PDCluster's pods: engines only from their own PDCluster, the operator and
monitoring; the router's serving port from anywhere, the vLLM discovery port from the operator
alone. (Presence and selectors only: no CNI here enforces a NetworkPolicy.)"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pdscale.operator.api.names import Owner, labels
from pdscale.operator.render.builders import build_children
from pdscale.operator.render.checklist import validate
from pdscale.operator.render.network import NetworkSettings, network_policies

ROOT = Path(__file__).resolve().parents[2]


def children(example: str, settings: NetworkSettings | None = None) -> dict[str, dict]:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    spec, derived = validate(doc["spec"])
    out = build_children(Owner(doc["metadata"]["name"], "team-a", uid="u"), spec, derived,
                         network=settings)
    return {c["metadata"]["name"]: c for c in out if c["kind"] == "NetworkPolicy"}


def selects(selector: dict, pod_labels: dict[str, str]) -> bool:
    if any(pod_labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(pod_labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
               if e["operator"] == "In")


def test_engines_accept_their_own_pdcluster_the_operator_and_monitoring_only():
    policies = children("sglang-glm-4p8d.yaml")
    engines = policies["glm53-engines"]["spec"]
    for role in ("prefill", "decode"):
        assert selects(engines["podSelector"], labels("glm53", role))
    assert not selects(engines["podSelector"], labels("glm53", "router"))
    assert not selects(engines["podSelector"], labels("other", "prefill"))
    same, fenced = engines["ingress"]
    assert selects(same["from"][0]["podSelector"], labels("glm53", "router"))
    assert "namespaceSelector" not in same["from"][0]  # this namespace only
    operator, monitoring = fenced["from"]
    assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "pdscale-system"}
    assert operator["podSelector"]["matchLabels"] == {"app.kubernetes.io/component": "operator",
                                                      "app.kubernetes.io/name": "pdscale"}
    assert monitoring["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    engine_port = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]["engine"].get("port", 30000)
    assert fenced["ports"] == [{"protocol": "TCP", "port": engine_port}]  # the serving port, where metrics are


def test_the_vllm_discovery_port_is_the_operators_alone():
    router = next(p["spec"] for n, p in children("vllm-nixl-2p4d.yaml").items() if n.endswith("-router"))
    discovery = [r for r in router["ingress"] if len(r.get("from", [])) == 1]
    assert len(discovery) == 1 and "podSelector" in discovery[0]["from"][0]
    serving = [r for r in router["ingress"] if "from" not in r]
    assert len(serving) == 1  # requests from anywhere, on the serving port only
    sglang_router = next(p["spec"] for n, p in children("sglang-glm-4p8d.yaml").items() if n.endswith("-router"))
    assert len(sglang_router["ingress"]) == 2  # no discovery port to open


def test_the_admin_names_the_operator_and_monitoring_or_turns_them_off():
    settings = NetworkSettings.from_environment({"PDSCALE_NETWORK_POLICY": json.dumps({
        "operatorNamespace": "ops", "operatorPodLabels": {"app": "op"},
        "monitoringNamespaces": ["prom"]})})
    engines = children("sglang-glm-4p8d.yaml", settings)["glm53-engines"]["spec"]
    operator, monitoring = engines["ingress"][1]["from"]
    assert operator["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "ops"
    assert operator["podSelector"]["matchLabels"] == {"app": "op"}
    assert monitoring["namespaceSelector"]["matchExpressions"][0]["values"] == ["prom"]
    assert children("sglang-glm-4p8d.yaml", NetworkSettings(enabled=False)) == {}


def test_the_network_policies_are_owned_like_every_child():
    doc = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    spec, _ = validate(doc["spec"])
    for policy in network_policies(Owner("glm53", "team-a", uid="u"), spec, NetworkSettings()):
        assert policy["metadata"]["ownerReferences"][0]["uid"] == "u"
        assert policy["metadata"]["namespace"] == "team-a"
