"""The operator's RBAC against the real API server's audit log: run the operator as its own
ServiceAccount through a PDCluster's life (created, Ready, planned, drained, deleted) and read
back, from the API server's own record, every request it made. Each was granted (none was
refused), and every grant a request can show was used.

What an audit log cannot show, and where it is checked instead: permissions the server checks
beyond a request's verb (``kube.IMPLIED``: the create behind an apply that creates, the
finalizers update behind blockOwnerDeletion), and the namespace watch kopf makes only with
``watchNamespaces`` (this run watches every namespace); test_rbac.py holds those to the code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import sample, wait_for

from pdscale.operator import rbac
from pdscale.operator.drain import DRAINING_ANNOTATION
from pdscale.operator.kube import IMPLIED, REQUESTS, Need
from pdscale.operator.leader import LEASE_NAME
from pdscale.operator.pdcluster import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OPERATOR_USER = f"system:serviceaccount:{rbac.NAMESPACE}:{rbac.NAME}"


def operator_requests(audit_log: Path, offset: int) -> list[tuple[Need, int]]:
    """(need, HTTP code) of every request the operator's identity made after ``offset``."""
    out = []
    with audit_log.open("rb") as f:
        f.seek(offset)
        for line in f:
            event = json.loads(line)
            ref = event.get("objectRef")
            if event["user"]["username"] != OPERATOR_USER or ref is None:
                continue  # non-resource requests (discovery) need no grant of ours
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            code = (event.get("responseStatus") or {}).get("code", 0)
            out.append((Need(ref.get("apiGroup", ""), resource, event["verb"]), code))
    return out


def test_every_request_is_granted_and_every_grant_is_used(cluster, admin_api, namespace,
                                                          run_operator):
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log (KUBECONFIG points elsewhere)")
    audit_log = cluster.local.audit_log
    # The Lease left by an earlier test would spare the operator its create.
    coordination = client.CoordinationV1Api(admin_api)
    try:
        coordination.delete_namespaced_lease(LEASE_NAME, rbac.NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    offset = audit_log.stat().st_size if audit_log.exists() else 0
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    # Auto with a Prometheus that refuses at once: the planner holds within the bounds, so a
    # lowered maximum drains a decode pod (the drain marks) with no metrics at all.
    doc = sample("demo-sim.yaml", "audit", **{"planner.prometheusURL": "http://127.0.0.1:9"})

    def pdcluster():
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit")

    def memory_version():
        try:
            return core.read_namespaced_config_map("audit-planner", namespace).metadata.resource_version
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    with run_operator():
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
        first = wait_for(memory_version, timeout_seconds=120, what="the planner's memory created")
        wait_for(lambda: memory_version() not in (None, first), timeout_seconds=60,
                 what="the planner's memory written again")
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit",
                                              {"spec": {"decode": {"maxReplicas": 1, "replicas": 1}}})
        wait_for(lambda: any(DRAINING_ANNOTATION in (p.metadata.annotations or {}) for p in
                             core.list_namespaced_pod(namespace, label_selector=(
                                 "app.kubernetes.io/instance=audit")).items),
                 timeout_seconds=90, what="a decode pod marked draining")
        assert pdcluster()["metadata"].get("finalizers")
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "audit")

        def gone():
            try:
                pdcluster()
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, timeout_seconds=120, what="the PDCluster drained and deleted")
        # kopf's watches (server timeout 10 s here) are logged when they end
        wait_for(lambda: Need("apiextensions.k8s.io", "customresourcedefinitions", "watch") in
                 {n for n, _ in operator_requests(audit_log, offset)},
                 timeout_seconds=60, what="a finished CRD watch in the audit log")

    made = operator_requests(audit_log, offset)
    refused = sorted({(n, code) for n, code in made if code in (401, 403)})
    assert refused == [], f"the API server refused these: {refused}"
    granted = {Need(g, r, v) for rule in rbac.rules() + rbac.leader_rules()
               for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    used = {n for n, _ in made}
    assert used - granted == set(), "made, but not granted"
    assert granted - set(IMPLIED) - used == set(), "granted, but no request of this run used it"
    # and the code's declarations are what the server saw
    assert used == set(REQUESTS) | {n for n in rbac.KOPF_NEEDS
                                    if (n.group, n.resource) != rbac.NAMESPACES}
