"""The operator's least-privilege RBAC, as pure builders (the Helm chart and tests use them).

What each rule is for:
- PDClusters: watch them, write their status, and patch their metadata for the operator's
  finalizer (added once, removed when a deletion has drained). RBAC cannot narrow a patch to
  metadata: the code's only PDCluster patch is a JSON patch of /metadata/finalizers (with a
  test op), never the spec. No update, no delete.
- Deployments, Services: create and server-side apply the children (SSA create needs create
  and patch), watch them for ready counts and drift. No delete: garbage collection removes
  children through their owner references.
- NetworkPolicies: who may reach the engines and the router (``network``), applied like the
  other children.
- ServiceAccounts: the router's identity (it has no permissions: the operator, not the
  router, keeps its worker list).
- Pods: read engine and router pods for the planner and the router sync; patch engine pods
  to mark a drain (annotation and pod-deletion-cost). No delete: the ReplicaSet removes the
  drained pod when the planner lowers replicas.
- ConfigMaps: the planner's memory (<name>-planner), owned by the PDCluster.
- Events: report.
- CustomResourceDefinitions (read): kopf checks that the PDCluster resource exists.

Leader election (``leader_rules``): a Role in the operator's own namespace, not cluster-wide:
create Leases (create cannot be limited to a name), get and update only the leader Lease.
"""

from __future__ import annotations

from typing import Any

from .leader import LEASE_NAME
from .pdcluster import GROUP, PLURAL

NAME = "pdscale-operator"
NAMESPACE = "pdscale-system"

_READ = ["get", "list", "watch"]
_APPLY = ["get", "create", "patch"]


def rules() -> list[dict[str, Any]]:
    """Everything the operator needs, as one ClusterRole (watching all namespaces)."""
    return [*namespaced_rules(), *cluster_rules()]


def cluster_rules() -> list[dict[str, Any]]:
    """What only a ClusterRole can grant: reading the CRD (kopf checks the resource exists)."""
    return [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": _READ}]


def watching_rules() -> list[dict[str, Any]]:
    """Added to the ClusterRole only with ``watchNamespaces``: kopf, told which namespaces to
    watch, lists namespaces to follow them (without this it retries for about a minute
    before it falls back)."""
    return [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]


def namespaced_rules() -> list[dict[str, Any]]:
    """What the operator needs in a namespace it watches; with ``watchNamespaces`` the chart
    grants these as a Role in each of them and nowhere else."""
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": [*_READ, "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
        # Setting blockOwnerDeletion on children needs update on the owner's finalizers
        # where the OwnerReferencesPermissionEnforcement admission plugin is on.
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": [*_READ, "create", "patch"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": [*_READ, "create", "patch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _APPLY},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": _APPLY},
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*_READ, "patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": _APPLY},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]


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
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "update"]},
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
