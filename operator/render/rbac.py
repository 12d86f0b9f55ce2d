"""The operator's least-privilege RBAC, as pure builders (the Helm chart and tests use them).

The rules are derived, never hand-kept: every permission granted is a ``Need`` that something
uses, and every request made is granted.
- ``kube.REQUESTS``: every request the operator's own code makes (``Kube._call`` refuses any
  other before it leaves), each with the call that makes it;
- ``kube.IMPLIED``: what the API server checks beyond a request's own verb (a server-side apply
  that creates checks create; blockOwnerDeletion on children checks the owner's finalizers
  where OwnerReferencesPermissionEnforcement is on);
- ``KOPF_NEEDS``: kopf's own requests for the handlers in ``handlers`` (each watch is a list,
  then a watch), its CRD observer, and with ``watchNamespaces`` its namespace observer.

What is not granted, and why: no delete anywhere (garbage collection removes children through
their owner references; the ReplicaSet removes a drained pod when the replicas drop); no
update of PDClusters or their spec (RBAC cannot narrow a patch to metadata: the code's only
PDCluster patch is a JSON patch of /metadata/finalizers, with a test op); no pod get or watch
(the operator lists pods); no Event patch (kopf's posting is off; the operator posts new Events).

Leader election (``leader_rules``): a Role in the operator's own namespace, not cluster-wide:
create Leases (create cannot be limited to a name), get and update only the leader Lease.
tests/operator/test_rbac.py checks these derivations; test_rbac_cluster.py runs the operator
against a real API server and compares its audit log with the grants.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdscale.operator.api.names import LEASE_NAME
from pdscale.operator.api.pdcluster import GROUP, PLURAL
from pdscale.operator.clients.kube import IMPLIED, REQUESTS, Need

NAME = "pdscale-operator"
NAMESPACE = "pdscale-system"

LEASES = ("coordination.k8s.io", "leases")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")
#: cluster-scoped: a PDPool without spec.nodes counts its nodes
NODES = ("", "nodes")

#: kopf's own requests, each watch being a list followed by watches: the three event handlers
#: of ``handlers``; its CRD observer (without it kopf warns and never notices a CRD change);
#: with ``watchNamespaces``, its namespace observer (without it kopf retries for about a
#: minute before it falls back). Posting (Events) and peering are off in ``handlers``.
KOPF_NEEDS: dict[Need, str] = {
    **{Need(group, resource, verb): f"kopf watches {resource} ({why})"
       for group, resource, why in [(GROUP, PLURAL, "pdcluster_changed, pdcluster_deleting"),
                                    ("apps", "deployments", "deployment_changed"),
                                    ("leaderworkerset.x-k8s.io", "leaderworkersets",
                                     "leaderworkerset_changed"),
                                    ("", "services", "service_changed"),
                                    (GROUP, "pdpools", "pdpool_changed"),
                                    (*CRDS, "its resource observer"),
                                    (*NAMESPACES, "with watchNamespaces: its namespace observer")]
       for verb in ("list", "watch")},
}


def needs() -> dict[Need, str]:
    """Every permission the operator needs, with why: its requests, what the server implies
    from them, and kopf's."""
    return {**REQUESTS, **IMPLIED, **KOPF_NEEDS}


_VERB_ORDER = {verb: i for i, verb in enumerate(["get", "list", "watch", "create", "update", "patch"])}


def _rules(wanted: Iterable[Need]) -> list[dict[str, Any]]:
    """One rule per (group, resource), in first-seen order, verbs in a fixed order."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for need in wanted:
        verbs.setdefault((need.group, need.resource), set()).add(need.verb)
    return [{"apiGroups": [group], "resources": [resource],
             "verbs": sorted(vs, key=lambda v: (_VERB_ORDER.get(v, len(_VERB_ORDER)), v))}
            for (group, resource), vs in verbs.items()]


def _where(need: Need) -> str:
    """Which grant holds a need: the Lease Role, the ClusterRole alone, the ClusterRole only
    with watchNamespaces, or every watched namespace."""
    key = (need.group, need.resource)
    return {LEASES: "leader", CRDS: "cluster", NODES: "cluster", NAMESPACES: "watching"}.get(key, "namespaced")


def rules() -> list[dict[str, Any]]:
    """Everything the operator needs, as one ClusterRole (watching all namespaces)."""
    return [*namespaced_rules(), *cluster_rules()]


def cluster_rules() -> list[dict[str, Any]]:
    """What only a ClusterRole can grant: following the CRDs (kopf's resource observer)."""
    return _rules(n for n in needs() if _where(n) == "cluster")


def watching_rules() -> list[dict[str, Any]]:
    """Added to the ClusterRole only with ``watchNamespaces``: kopf, told which namespaces to
    watch, lists namespaces to follow them (without this it retries for about a minute
    before it falls back)."""
    return _rules(n for n in needs() if _where(n) == "watching")


def namespaced_rules() -> list[dict[str, Any]]:
    """What the operator needs in a namespace it watches; with ``watchNamespaces`` the chart
    grants these as a Role in each of them and nowhere else."""
    return _rules(n for n in needs() if _where(n) == "namespaced")


def cluster_role(name: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pdscale"}},
        "rules": rules(),
    }


def cluster_role_binding(name: str = NAME, namespace: str = NAMESPACE,
                         service_account: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pdscale"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def leader_rules(lease: str = LEASE_NAME) -> list[dict[str, Any]]:
    """The Lease needs, narrowed to the one Lease where RBAC can: create cannot name its object."""
    verbs = next(r["verbs"] for r in _rules(n for n in needs() if _where(n) == "leader"))
    named = [v for v in verbs if v != "create"]
    return [
        *([{"apiGroups": [LEASES[0]], "resources": [LEASES[1]], "verbs": ["create"]}]
          if "create" in verbs else []),
        {"apiGroups": [LEASES[0]], "resources": [LEASES[1]], "resourceNames": [lease],
         "verbs": named},
    ]


def leader_role(name: str = NAME, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"{name}-leader-election", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "pdscale"}},
        "rules": leader_rules(),
    }


def leader_role_binding(name: str = NAME, namespace: str = NAMESPACE,
                        service_account: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{name}-leader-election", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "pdscale"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": f"{name}-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
