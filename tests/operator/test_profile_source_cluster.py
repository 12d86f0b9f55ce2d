"""A profile of the user's own, in a ConfigMap, used by the running operator (its own identity,
real API server): a Recommend PDCluster naming it shows the profile's source and provenance in
status.planner.profile; ``pdscale profile export`` writes it back out; a broken ConfigMap holds
the planner with a message and an Event naming the field and the ConfigMap."""

from __future__ import annotations

import pytest
from kubernetes import client
from pdc_cluster_helpers import sample, wait_for
from test_profile_source import fitted_yaml

from pdscale.main import main
from pdscale.planner.profile import load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_configmap_profile_is_used_shown_exported_and_a_broken_one_holds(
        cluster, admin_api, namespace, run_operator, tmp_path, monkeypatch):
    core = client.CoreV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "my-profile"}, "data": {"profile.yaml": fitted_yaml()}})
    # Port 9 on loopback: no metrics, so the planner holds on the counts it has, but it plans
    # (and reports its profile) every interval.
    doc = sample("demo-sim.yaml", "rec", **{"planner.mode": "Recommend",
                                            "planner.prometheusURL": "http://127.0.0.1:9",
                                            "planner.profileConfigMap": {"name": "my-profile"}})
    del doc["spec"]["planner"]["profile"]

    def profile_status():
        body = custom.get_namespaced_custom_object("pdscale.io", "v1alpha1", namespace,
                                                   "pdclusters", "rec")
        return ((body.get("status") or {}).get("planner") or {}).get("profile")

    def events(reason):
        return [e for e in core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=rec").items if e.reason == reason]

    with run_operator():
        custom.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdclusters", doc)
        version = core.read_namespaced_config_map("my-profile", namespace).metadata.resource_version
        shown = wait_for(lambda: (p := profile_status()) and "name" in p and p,
                         timeout_seconds=90, what="status.planner.profile")
        assert shown["name"] == "mine"
        assert shown["source"] == f"ConfigMap my-profile@{version}"
        assert shown["provenance"]["tools"] == ["aiperf"]
        assert shown["provenance"]["fittedAt"] == "2026-12-01T10:00:00Z"
        assert shown["provenance"]["points"] == {"prefill": 4, "decode": 4}
        assert "decode.per_context_token_seconds" in shown["provenance"]["notIdentified"]
        assert shown["calibration"]["decodeHeadroomPercent"] == 100
        wait_for(lambda: events("PlannerProfileLoaded"), what="a PlannerProfileLoaded Event")

        # the profile in use, back out of the cluster (the operator's kubeconfig is in force)
        out = tmp_path / "exported.yaml"
        assert main(["profile", "export", f"{namespace}/rec", "-o", str(out)]) == 0
        exported = load_profile(out)
        assert exported.name == "mine"
        assert exported.provenance["calibration"]["exported_from"] == f"ConfigMap my-profile@{version}"
        assert exported.provenance["sources"][0]["tool"] == "aiperf"

        # broken: the planner holds, naming the field and the ConfigMap, and says so once
        core.patch_namespaced_config_map("my-profile", namespace,
                                         {"data": {"profile.yaml": "prefill: [not, a, profile"}})
        broken = wait_for(lambda: (p := profile_status()) and "problem" in p and p,
                          timeout_seconds=60, what="a profile problem in status")
        assert broken["problem"].startswith("spec.planner.profileConfigMap: ")
        assert f"ConfigMap {namespace}/my-profile" in broken["problem"]
        assert "not YAML" in broken["problem"]
        body = custom.get_namespaced_custom_object("pdscale.io", "v1alpha1", namespace,
                                                   "pdclusters", "rec")
        assert body["status"]["planner"]["held"] is True
        assert "spec.planner.profileConfigMap" in body["status"]["planner"]["explanation"]
        warned = wait_for(lambda: events("PlannerProfileInvalid"), what="a PlannerProfileInvalid Event")
        assert f"{namespace}/my-profile" in warned[0].message

        # an oversized one is refused as such, and a fixed one is used again
        core.patch_namespaced_config_map("my-profile", namespace,
                                         {"data": {"profile.yaml": "#" * (300 * 1024)}})
        wait_for(lambda: "over the 256 KiB" in ((profile_status() or {}).get("problem") or ""),
                 timeout_seconds=60, what="the size limit in status")
        core.patch_namespaced_config_map("my-profile", namespace,
                                         {"data": {"profile.yaml": fitted_yaml()}})
        fixed = wait_for(lambda: (p := profile_status()) and "problem" not in p and p,
                         timeout_seconds=60, what="the fixed profile in use")
        assert fixed["name"] == "mine" and fixed["provenance"]["tools"] == ["aiperf"]
