"""The planner loop in the running operator (its own identity, real API server): Recommend
mode reports and changes nothing, and a Prometheus it cannot reach makes it hold and say so,
never read as zero load."""

from __future__ import annotations

import pytest
from kubernetes import client
from pdc_cluster_helpers import sample, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_recommend_with_prometheus_down_holds_says_why_and_changes_nothing(
        cluster, admin_api, namespace, run_operator):
    # Port 9 on loopback: nothing listens, the connection is refused at once.
    doc = sample("demo-sim.yaml", "rec", **{"planner.mode": "Recommend",
                                            "planner.prometheusURL": "http://127.0.0.1:9"})
    custom = client.CustomObjectsApi(admin_api)
    apps = client.AppsV1Api(admin_api)
    core = client.CoreV1Api(admin_api)
    with run_operator():
        custom.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdclusters", doc)

        def planner_status():
            body = custom.get_namespaced_custom_object("pdscale.io", "v1alpha1", namespace,
                                                       "pdclusters", "rec")
            return (body.get("status") or {}).get("planner")

        planner = wait_for(lambda: (p := planner_status()) and p.get("lastDecision") and p,
                           timeout_seconds=90, what="a planner decision in status")
        assert planner["mode"] == "Recommend"
        assert planner["held"] is True
        assert "unreachable" in planner["metrics"]
        assert planner["metricsAvailable"] is False
        # The hold is on the counts the fleet has (spec: 1 prefill, 2 decode), not zero.
        assert planner["recommended"] == {"prefill": 1, "decode": 2}
        events = wait_for(lambda: [e for e in core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=rec").items
            if e.reason == "PlannerHolding"], what="a PlannerHolding Event")
        assert "unknown is not zero" in events[0].message

        # Recommend changes nothing: no replicas for the reconcile to apply, Deployments as
        # the spec says; the planner's memory is its only write besides status and Events.
        assert "replicas" not in planner
        assert apps.read_namespaced_deployment("rec-prefill", namespace).spec.replicas == 1
        assert apps.read_namespaced_deployment("rec-decode", namespace).spec.replicas == 2
        memory = core.read_namespaced_config_map("rec-planner", namespace)
        assert memory.metadata.owner_references[0].name == "rec"
