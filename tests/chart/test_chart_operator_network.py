"""The operator's own endpoints: the metrics bind address comes from the chart's values, and
the chart's NetworkPolicy admits the metrics port from the monitoring namespaces alone (pure:
helm template; no CNI here enforces a NetworkPolicy, so presence and selectors are checked)."""

from __future__ import annotations

import pytest
from test_chart import by_kind, render

from pdscale.operator.loop import telemetry


def _operator_policy(docs: list[dict]) -> dict:
    (policy,) = [d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"] == "pdscale-operator"]
    return policy


def test_the_metrics_port_admits_the_monitoring_namespaces_of_the_values_alone():
    docs = render("networkPolicy.monitoringNamespaces={mon-a,mon-b}", "operator.metricsPort=9200",
                  "operator.healthPort=8081")
    spec = _operator_policy(docs)["spec"]
    (deployment,) = by_kind(docs, "Deployment")
    assert spec["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    assert spec["policyTypes"] == ["Ingress"]
    by_port = {rule["ports"][0]["port"]: rule.get("from") for rule in spec["ingress"]}
    assert by_port.keys() == {9200, 8081}  # nothing else of the operator's is reachable
    assert by_port[9200] == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["mon-a", "mon-b"]}]}}]
    assert by_port[8081] is None  # the kubelet's probes come from the node


def test_no_policy_when_the_admin_turns_them_off():
    docs = render("networkPolicy.enabled=false")
    assert [d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"] == "pdscale-operator"] == []


@pytest.mark.parametrize(("value", "expected"), [(None, "0.0.0.0"), ("127.0.0.1", "127.0.0.1")])
def test_the_metrics_bind_address_is_a_value(value, expected):
    docs = render(*([f"operator.metricsBindAddress={value}"] if value else []))
    (deployment,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDSCALE_METRICS_HOST"] == expected


def test_the_operator_listens_where_the_chart_says(monkeypatch):
    served = []
    monkeypatch.setattr(telemetry, "start_http_server", lambda port, addr: served.append((port, addr)))
    monkeypatch.setenv("PDSCALE_METRICS_PORT", "9200")
    monkeypatch.setenv("PDSCALE_METRICS_HOST", "127.0.0.1")
    telemetry.serve_metrics_from_environment()
    assert served == [(9200, "127.0.0.1")]
