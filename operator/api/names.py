"""Deterministic child names and the labels that select a PDCluster's pods per role.

A PDCluster name may be a 253-character DNS subdomain with dots; Service names must be
63-character DNS labels, and a Deployment's pods are named ``<deployment>-<10-char hash>-<5>``.
Keeping every child name within CHILD_NAME_MAX_CHARS keeps pod names (and their hostnames)
within 63 characters too, so nothing downstream truncates a suffix away.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from .pdcluster import GROUP, KIND, VERSION

POD_NAME_MAX_CHARS = 63
# "-" + ReplicaSet hash (up to 10) + "-" + 5 random characters.
POD_SUFFIX_CHARS = 17
CHILD_NAME_MAX_CHARS = POD_NAME_MAX_CHARS - POD_SUFFIX_CHARS  # 46
ROLE_SUFFIXES = ("prefill", "decode", "router")
_LONGEST_SUFFIX = max(len(s) for s in ROLE_SUFFIXES) + 1  # "-prefill"
BASE_MAX_CHARS = CHILD_NAME_MAX_CHARS - _LONGEST_SUFFIX  # 38
HASH_CHARS = 5
#: how a hashed base name ends; a name kept unchanged never does (see base_name)
_HASHED = re.compile(rf"-[0-9a-f]{{{HASH_CHARS}}}$")

MANAGER = "pdscale-operator"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_ROLE = f"{GROUP}/role"
ANNOTATION_APPLIED_HASH = f"{GROUP}/applied-hash"
#: a pod the loop drains carries the epoch second its drain began (read by status and the checks)
DRAINING_ANNOTATION = "pdscale.io/draining-since"
#: the ReplicaSet removes the pod of lowest cost first (the loop lowers a draining pod's)
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: the Lease the operator's replicas elect their leader with (leader.py, and its RBAC rule)
LEASE_NAME = "pdscale-operator-leader"


def base_name(cluster_name: str) -> str:
    """A DNS-1035 label of at most BASE_MAX_CHARS characters that identifies the PDCluster.

    Unchanged for ordinary names; otherwise sanitized and truncated, with a hash of the full
    name appended so that two long names sharing a prefix stay distinct.

    The mapping is injective (up to the hash): a name kept as it is never ends like a
    hashed one (``-`` and HASH_CHARS hex digits), so such a name is hashed too. Without that,
    ``team-llm-88439`` (kept) and ``team.llm`` (hashed to ``team-llm-88439``) would share
    every child, label and the planner memory.
    """
    clean = re.sub(r"[^a-z0-9-]", "-", cluster_name.lower())
    if clean and not clean[0].isalpha():
        clean = "p" + clean
    if clean == cluster_name and len(clean) <= BASE_MAX_CHARS and not _HASHED.search(clean):
        return clean
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:HASH_CHARS]
    keep = BASE_MAX_CHARS - HASH_CHARS - 1
    return f"{clean[:keep].rstrip('-')}-{digest}"


def child_name(cluster_name: str, role: str) -> str:
    """Name of the Deployment/Service/ServiceAccount for one role (prefill, decode, router)."""
    return f"{base_name(cluster_name)}-{role}"


def selector_labels(cluster_name: str, role: str) -> dict[str, str]:
    """The labels a router or the planner uses to select this PDCluster's pods of one role.
    Immutable once a Deployment exists, so they carry nothing that can change."""
    return {LABEL_INSTANCE: base_name(cluster_name), LABEL_ROLE: role}


def labels(cluster_name: str, role: str) -> dict[str, str]:
    return {
        LABEL_NAME: "pdscale",
        **selector_labels(cluster_name, role),
        LABEL_COMPONENT: role,
        LABEL_MANAGED_BY: MANAGER,
    }


@dataclass(frozen=True)
class Owner:
    """The PDCluster that owns the children. ``uid`` is None when rendering offline."""

    name: str
    namespace: str
    uid: str | None = None


def owner_references(owner: Owner) -> list[dict[str, Any]]:
    if owner.uid is None:
        return []
    return [{
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }]


def metadata(owner: Owner, name: str, role: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
    }
    refs = owner_references(owner)
    if refs:
        meta["ownerReferences"] = refs
    return meta
