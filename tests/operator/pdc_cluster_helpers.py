"""Helpers shared by the operator's integration tests (polling, samples pinned to the pool)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

from pdscale.testbed.fixtures import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
POOL = "operator"
CPU_NODE = "cpu-operator-000"
DECOY_NODE = "h100-operator-000"

__all__ = ["CPU_NODE", "DECOY_NODE", "POOL", "expected_children", "pod_ready", "sample", "wait_for"]


def pod_ready(pod: Any) -> bool:
    """A listed pod (kubernetes client object) running with its Ready condition True."""
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def sample(name: str, cluster_name: str | None = None, **overrides: Any) -> dict[str, Any]:
    """An example PDCluster, pinned to this suite's node pool, with dotted-path overrides."""
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    if cluster_name:
        doc["metadata"]["name"] = cluster_name
    doc["spec"].setdefault("placement", {}).setdefault("nodeSelector", {})["pdscale.io/pool"] = POOL
    for dotted, value in overrides.items():
        node = doc["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = copy.deepcopy(value)
    return doc


PLURALS = {"Deployment": "deployments", "Service": "services", "ServiceAccount": "serviceaccounts",
           "Role": "roles", "RoleBinding": "rolebindings", "ConfigMap": "configmaps",
           "NetworkPolicy": "networkpolicies"}


def expected_children(doc: dict[str, Any], namespace: str) -> dict[str, list[str]]:
    """What the builders say this PDCluster owns, by plural: the integration tests check the
    cluster against the pure builders instead of a second, hand-kept list."""
    from pdscale.operator.api.names import Owner
    from pdscale.operator.render.builders import build_children
    from pdscale.operator.render.checklist import validate

    spec, derived = validate(doc["spec"])
    out: dict[str, list[str]] = {plural: [] for plural in PLURALS.values()}
    for child in build_children(Owner(doc["metadata"]["name"], namespace), spec, derived):
        out[PLURALS[child["kind"]]].append(child["metadata"]["name"])
    return {k: sorted(v) for k, v in out.items()}
