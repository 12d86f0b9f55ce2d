"""spec.planner.schedules on the real API server: the CRD's CEL rules and patterns are
accepted when it is installed, admit a good window, and refuse a bad one with their message
(tests/operator/test_schedules_spec.py checks the same rules as text, and the operator's own
checks, without a cluster)."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import sample, wait_for

from pdscale.operator.api import crd
from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WINDOW = {"name": "business-hours", "start": "0 9 * * 1-5", "end": "0 18 * * 1-5",
          "timezone": "Europe/Paris", "minPrefillReplicas": 2, "minDecodeReplicas": 2}


@pytest.fixture
def crd_installed(admin_api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(admin_api)
    body = crd.build_crd()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd.CRD_NAME)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd.CRD_NAME, body)
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         ext.read_custom_resource_definition(crd.CRD_NAME).status.conditions or []),
             what="CRD established")


def _refusal(api: client.ApiClient, namespace: str, *windows: dict) -> str | None:
    """The API server's message for a dry-run create of the sample with these windows (None:
    admitted)."""
    doc = sample("sglang-glm-4p8d.yaml", "sched", **{"planner.schedules": list(windows)})
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, doc, dry_run="All")
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return str(exc.body)
    return None


def test_the_api_server_admits_a_window_and_refuses_bad_ones_with_their_message(
        admin_api, namespace, crd_installed) -> None:
    assert _refusal(admin_api, namespace, WINDOW) is None
    says = {
        "start and end must differ (as in KEDA's cron scaler)": {**WINDOW, "end": WINDOW["start"]},
        "a schedule raises minPrefillReplicas or minDecodeReplicas above 0":
            {**WINDOW, "minPrefillReplicas": 0, "minDecodeReplicas": 0},
        "planner.schedules: minPrefillReplicas must not exceed prefill.maxReplicas":
            {**WINDOW, "minPrefillReplicas": 1000},
        "planner.schedules: minDecodeReplicas must not exceed decode.maxReplicas":
            {**WINDOW, "minDecodeReplicas": 1000},
        "should match": {**WINDOW, "start": "@daily"},  # the pattern: five cron fields
    }
    for message, window in says.items():
        refused = _refusal(admin_api, namespace, window)
        assert refused is not None and message in refused, (message, refused)
    refused = _refusal(admin_api, namespace, {**WINDOW, "timezone": "../etc/passwd"})
    assert refused is not None and "spec.planner.schedules[0].timezone" in refused
    refused = _refusal(admin_api, namespace, WINDOW, WINDOW)
    assert refused is not None and "Duplicate value" in refused
