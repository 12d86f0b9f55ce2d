"""An admission policy on the real API server refuses one of a PDCluster's children: the
operator says so (ChildrenApplied=False naming the child and the policy's message, one Warning
Event however often it retries), and applies it once the policy goes."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import sample, wait_for

from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION
from pdscale.operator.reconciler import conditions as c

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

POLICY_SAYS = "decode Deployments are refused here (test policy)"


def _policy(name: str, namespace: str) -> tuple[dict, dict]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["deployments"]}]},
            "validations": [{"expression": "!object.metadata.name.endsWith('-decode')",
                             "message": POLICY_SAYS, "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }
    return policy, binding


def _refused_now(apps: client.AppsV1Api, namespace: str) -> bool:
    """The policy is in force: a dry-run create of a decode Deployment is refused."""
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe-decode"},
             "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                 "metadata": {"labels": {"a": "b"}},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    try:
        apps.create_namespaced_deployment(namespace, probe, dry_run="All")
    except ApiException as exc:
        return exc.status == 403
    return False


def test_a_child_refused_at_admission_is_said_once_and_applied_once_allowed(
        admin_api, namespace, run_operator):
    admission = client.AdmissionregistrationV1Api(admin_api)
    apps = client.AppsV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    name = f"refuse-decode-{namespace}"
    policy, binding = _policy(name, namespace)
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        wait_for(lambda: _refused_now(apps, namespace), what="the test policy in force")
        doc = sample("demo-sim.yaml", "refused", **{"planner.mode": "Off"})

        def conditions():
            body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "refused")
            return body["metadata"]["generation"], {
                x["type"]: x for x in (body.get("status") or {}).get("conditions") or []}

        def warnings():
            return [e for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=refused").items
                if e.reason == c.EVENT_APPLY_REFUSED]

        with run_operator():
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
            applied = wait_for(lambda: (a := conditions()[1].get(c.CHILDREN_APPLIED))
                               and a["status"] == "False" and a, timeout_seconds=60,
                               what="ChildrenApplied=False")
            generation, conds = conditions()
            assert applied["reason"] == c.APPLY_REFUSED
            assert "Deployment/refused-decode" in applied["message"]
            assert "HTTP 403" in applied["message"] and POLICY_SAYS in applied["message"]
            assert applied["observedGeneration"] == generation
            assert (conds[c.READY]["status"], conds[c.READY]["reason"]) == ("False", c.APPLY_REFUSED)
            # The operator keeps retrying (backoff 1, 2, 4, 8 s...): one Event all the same.
            until = time.monotonic() + 10
            while time.monotonic() < until:
                assert len(warnings()) <= 1
                time.sleep(1)
            assert [e.type for e in warnings()] == ["Warning"]
            assert warnings()[0].message == applied["message"]

            admission.delete_validating_admission_policy_binding(name)
            wait_for(lambda: conditions()[1][c.CHILDREN_APPLIED]["status"] == "True",
                     timeout_seconds=120, what="ChildrenApplied=True once the policy went")
            assert conditions()[1][c.CHILDREN_APPLIED]["reason"] == c.APPLIED
            assert apps.read_namespaced_deployment("refused-decode", namespace) is not None
            assert len(warnings()) == 1
    finally:
        for delete in (admission.delete_validating_admission_policy_binding,
                       admission.delete_validating_admission_policy):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
