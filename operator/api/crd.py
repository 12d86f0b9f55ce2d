"""The PDCluster CustomResourceDefinition, generated from the pydantic spec model.

The model (``pdcluster.py``) is the single source of truth; ``crds/pdclusters.pdscale.io.yaml``
is this module's output, checked in so that ``kubectl apply -f crds/`` works, and a test fails
when the two drift. Regenerate with ``python -m pdscale.operator.api.crd > crds/pdclusters.pdscale.io.yaml``.

Pydantic emits JSON Schema; the API server wants a *structural* OpenAPI v3 schema: no ``$ref``,
no ``anyOf`` for optionals, no ``additionalProperties: false`` next to ``properties``. The
conversion below does exactly that and nothing clever.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel

from .pdcluster import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, PDClusterSpec
from .pdpool import POOL_KIND, POOL_PLURAL, POOL_SHORT_NAMES, POOL_SINGULAR, PDPoolSpec

CRD_NAME = f"{PLURAL}.{GROUP}"
POOL_CRD_NAME = f"{POOL_PLURAL}.{GROUP}"

# Cross-field rules the API server can check itself (CEL). The same rules, with the field
# named and the reason given, live in checklist.py for `pdscale render` and the operator.
SPEC_RULES = [
    {
        "rule": "self.parallelism.prefill.tensorParallelSize"
        " <= self.parallelism.decode.tensorParallelSize",
        "message": "parallelism.prefill.tensorParallelSize must not exceed "
        "parallelism.decode.tensorParallelSize",
        "fieldPath": ".parallelism.prefill.tensorParallelSize",
    },
    {
        "rule": "self.engine.kind != 'VLLM' || self.kvTransfer.backend == 'NIXL'",
        "message": "kvTransfer.backend must be NIXL when engine.kind is VLLM",
        "fieldPath": ".kvTransfer.backend",
    },
    {
        "rule": "!has(self.router.kind) || self.router.kind == self.engine.kind",
        "message": "router.kind must match engine.kind",
        "fieldPath": ".router.kind",
    },
    # a scheduled floor above a role's maximum could never be met (the planner caps it there)
    {
        "rule": "!has(self.planner.schedules) || self.planner.schedules.all(s, "
        "s.minPrefillReplicas <= self.prefill.maxReplicas)",
        "message": "planner.schedules: minPrefillReplicas must not exceed prefill.maxReplicas",
        "fieldPath": ".planner.schedules",
    },
    {
        "rule": "!has(self.planner.schedules) || self.planner.schedules.all(s, "
        "s.minDecodeReplicas <= self.decode.maxReplicas)",
        "message": "planner.schedules: minDecodeReplicas must not exceed decode.maxReplicas",
        "fieldPath": ".planner.schedules",
    },
]


def _describe(text: str | None) -> str | None:
    # Docstrings carry line breaks from source wrapping; kubectl explain reflows anyway.
    return " ".join(text.split()) if text else None


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Convert one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = dict(target)
        merged.update(node)  # the field's own description/default win over the class's
        node = merged
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        types = sorted(v.get("type", "") for v in variants)
        if types == ["integer", "string"]:
            out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
            if node.get("description"):
                out["description"] = _describe(node["description"])
            if node.get("default") is not None:
                out["default"] = node["default"]
            return out
        if len(variants) != 1:
            raise ValueError(f"cannot express anyOf {variants!r} structurally")
        inner = _structural(variants[0], defs)
        for key in ("description", "default"):
            if node.get(key) is not None:
                inner[key] = node[key]
        if "description" in inner:
            inner["description"] = _describe(inner["description"])
        return inner

    out = {}
    kind = node.get("type")
    if node.get("description"):
        out["description"] = _describe(node["description"])
    if kind:
        out["type"] = kind
    for key in ("enum", "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems",
                "maxItems"):
        if key in node:
            out[key] = node[key]
    if "default" in node and node["default"] is not None:
        out["default"] = node["default"]
    if kind == "object":
        props = node.get("properties")
        if props:
            out["properties"] = {k: _structural(v, defs) for k, v in props.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs)
        elif extra is True or (not props and extra is None):
            out["x-kubernetes-preserve-unknown-fields"] = True
        if "x-kubernetes-validations" in node:
            out["x-kubernetes-validations"] = copy.deepcopy(node["x-kubernetes-validations"])
    if kind == "array":
        out["items"] = _structural(node["items"], defs)
        for key in ("x-kubernetes-list-type", "x-kubernetes-list-map-keys"):
            if key in node:
                out[key] = copy.deepcopy(node[key])
    return out


_NO_DEFAULT = "x-pdscale-no-default"  # transient marker, removed before output


def _defaults_of(node: dict[str, Any]) -> dict[str, Any]:
    """The object the API server would build from `{}` by structural defaulting."""
    out = {}
    for name, child in (node.get("properties") or {}).items():
        if "default" in child:
            out[name] = copy.deepcopy(child["default"])
    return out


def _default_empty_objects(node: dict[str, Any], required: bool) -> None:
    """Give optional objects whose own fields all have defaults a default: the API server
    only defaults inside objects that exist, and the model treats an absent section as
    all-defaults (default_factory). The default is written out in full, not `{}`: CEL rules
    on the object are checked against the default itself, before any nested defaulting."""
    props = node.get("properties")
    if not props:
        return
    for name, child in props.items():
        child_required = name in node.get("required", [])
        _default_empty_objects(child, child_required)
    if (node.get("type") == "object" and not required and not node.get("required")
            and not node.get(_NO_DEFAULT)):
        node.setdefault("default", _defaults_of(node))


def spec_schema(model: type[BaseModel] = PDClusterSpec,
                rules: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The structural OpenAPI schema of `.spec`, from PDClusterSpec (or another spec model:
    ``rules`` are its top-level CEL rules, SPEC_RULES for the PDCluster's)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _structural(raw, defs)
    schema["x-kubernetes-validations"] = copy.deepcopy(SPEC_RULES if rules is None else rules)
    # Optional sub-objects that default to None in the model (e.g. weights, rdma) must stay
    # absent: mark them so _default_empty_objects leaves them alone.
    optional_none = _optional_none_paths(model)
    for path in optional_none:
        node = schema
        for part in path:
            node = node["properties"][part]
        node[_NO_DEFAULT] = True
    _default_empty_objects(schema, required=True)
    for path in optional_none:
        node = schema
        for part in path:
            node = node["properties"][part]
        del node[_NO_DEFAULT]
    return schema


def _optional_none_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sub = annotation
        if sub is None:
            continue
        if field.default is None and not field.is_required():
            paths.append((*prefix, alias))
        paths.extend(_optional_none_paths(sub, (*prefix, alias)))
    return paths


def _condition_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Ready, Progressing, Degraded, SpecValid, ChildrenApplied."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase reason (conditions.py)."},
            "message": {"type": "string", "description": "Human-readable detail."},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    }


def _role_status_schema(role: str) -> dict[str, Any]:
    if role == "router":
        return {
            "type": "object",
            "description": "The router Deployment's counts.",
            "properties": {
                "desiredReplicas": {"type": "integer", "description": "spec replicas."},
                "readyReplicas": {"type": "integer", "description": "Pods that pass readiness."},
                "updatedReplicas": {"type": "integer", "description": "Pods on the current spec."},
            },
        }
    return {
        "type": "object",
        "description": f"The {role} instances (a Deployment's pods, or a LeaderWorkerSet's "
        "groups when an instance spans several nodes) and their nodes.",
        "properties": {
            "desiredReplicas": {"type": "integer", "description": "Instances applied (replicas)."},
            "readyReplicas": {"type": "integer",
                              "description": "Instances that serve (a group: every pod Ready)."},
            "updatedReplicas": {"type": "integer", "description": "Instances on the current spec."},
            "nodesPerInstance": {"type": "integer",
                                 "description": "Nodes one instance spans (the live group size)."},
            "desiredNodes": {"type": "integer", "description": "desiredReplicas x nodesPerInstance."},
            "readyNodes": {"type": "integer", "description": "readyReplicas x nodesPerInstance."},
        },
    }


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Observed state, written by the operator.",
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "metadata.generation this status describes.",
            },
            "conditions": {
                "type": "array",
                "description": "Ready, Progressing, Degraded, SpecValid, ChildrenApplied.",
                "items": _condition_schema(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "prefill": _role_status_schema("prefill"),
            "decode": _role_status_schema("decode"),
            "router": _role_status_schema("router"),
            "derived": {
                "type": "object",
                "description": "Settings the operator derived from the spec (transfer timeouts; the "
                "router's prefill admission: prefillInflightPerWorker, prefillQueueSize, "
                "prefillQueueTimeoutSeconds, absent when admission is off).",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "planner": {
                "type": "object",
                "description": "The planner's last decision (filled in by the planner).",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }


def _crd(name: str, *, kind: str, plural: str, singular: str, short_names: Sequence[str],
         columns: list[dict[str, Any]], description: str, spec: dict[str, Any],
         status: dict[str, Any]) -> dict[str, Any]:
    """A namespaced CRD of ours (apiextensions.k8s.io/v1): one served and stored version with
    a status subresource, in the pdscale category."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["pdscale"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def build_crd() -> dict[str, Any]:
    """The complete CRD manifest (apiextensions.k8s.io/v1)."""
    ready = '.status.conditions[?(@.type=="Ready")].status'
    return _crd(
        CRD_NAME, kind=KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
        columns=[
            {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.kind"},
            {"name": "P-Ready", "type": "integer",
             "jsonPath": ".status.prefill.readyReplicas"},
            {"name": "P-Desired", "type": "integer",
             "jsonPath": ".status.prefill.desiredReplicas"},
            {"name": "D-Ready", "type": "integer",
             "jsonPath": ".status.decode.readyReplicas"},
            {"name": "D-Desired", "type": "integer",
             "jsonPath": ".status.decode.desiredReplicas"},
            # instances of several nodes (LeaderWorkerSet groups): nodes each
            {"name": "P-Nodes/Inst", "type": "integer",
             "jsonPath": ".spec.prefill.nodesPerInstance", "priority": 1},
            {"name": "D-Nodes/Inst", "type": "integer",
             "jsonPath": ".spec.decode.nodesPerInstance", "priority": 1},
            {"name": "P-Nodes", "type": "integer",
             "jsonPath": ".status.prefill.readyNodes", "priority": 1},
            {"name": "D-Nodes", "type": "integer",
             "jsonPath": ".status.decode.readyNodes", "priority": 1},
            {"name": "Planner", "type": "string", "jsonPath": ".spec.planner.mode"},
            {"name": "Refused/min", "type": "integer",
             "jsonPath": ".status.planner.refusedRequestsPerMinute"},
            {"name": "Decision", "type": "string",
             "jsonPath": ".status.planner.lastDecision", "priority": 1},
            {"name": "Ready", "type": "string", "jsonPath": ready},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        description="PDCluster: one model served by prefill and decode fleets on whole GPU "
        "nodes, behind a P/D router.",
        spec=spec_schema(), status=status_schema())


def _pool_status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Observed state, written by the pool's planner.",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64",
                                   "description": "metadata.generation this status describes."},
            "conditions": {
                "type": "array",
                "description": "Ready (the pool's planner runs), Degraded.",
                "items": _condition_schema(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "nodes": {"type": "integer", "description": "Nodes in the pool (spec or counted)."},
            "grantedNodes": {"type": "integer", "description": "Nodes granted to members."},
            "members": {
                "type": "array",
                "description": "Per member: the nodes granted this interval and why.",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "grantedNodes": {"type": "integer"},
                        "neededNodes": {"type": "integer"},
                        "heldNodes": {"type": "integer"},
                        "reason": {"type": "string"},
                    },
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        },
    }


def build_pool_crd() -> dict[str, Any]:
    """The PDPool CRD (apiextensions.k8s.io/v1), from PDPoolSpec."""
    model_rules = PDPoolSpec.model_config.get("json_schema_extra") or {}
    assert isinstance(model_rules, dict)
    rules = copy.deepcopy(model_rules.get("x-kubernetes-validations", []))
    schema = spec_schema(PDPoolSpec, rules)  # type: ignore[arg-type]
    return _crd(
        POOL_CRD_NAME, kind=POOL_KIND, plural=POOL_PLURAL, singular=POOL_SINGULAR,
        short_names=POOL_SHORT_NAMES,
        columns=[
            {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
            {"name": "Granted", "type": "integer", "jsonPath": ".status.grantedNodes"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        description="PDPool: whole GPU nodes shared by several PDClusters under one joint "
        "plan; the admin's object (membership, priorities and guarantees are decided here, "
        "never by a PDCluster).",
        spec=schema, status=_pool_status_schema())


#: the generated CRDs by file name under crds/ (and the chart's crds/)
CRD_FILES = {
    "pdclusters.pdscale.io.yaml": "pdclusters",
    "pdpools.pdscale.io.yaml": "pdpools",
}


def render_yaml(which: str = "pdclusters") -> str:
    """One generated CRD: ``pdclusters`` (the default) or ``pdpools``."""
    source, crd = {"pdclusters": ("pdcluster.py", build_crd),
                   "pdpools": ("pdpool.py", build_pool_crd)}[which]
    arg = "" if which == "pdclusters" else f" {which}"
    header = (
        f"# GENERATED from operator/api/{source} by `python -m pdscale.operator.api.crd{arg}`; "
        "do not edit by hand.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(render_yaml(*sys.argv[1:2]))
