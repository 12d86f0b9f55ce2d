"""The PDPool CRD in crds/ and its pydantic model agree; the model's rules refuse what the
CEL rules refuse."""

from __future__ import annotations

import copy
import pathlib

import pydantic
import pytest
import yaml

from pdscale.operator.api import crd
from pdscale.operator.api.pdpool import PDPoolSpec

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdpools.pdscale.io.yaml"

POOL = {
    "nodeSelector": {"pool": "serving-a"},
    "nodes": 24,
    "members": [
        {"name": "chat", "priority": 100, "guaranteedNodes": 8},
        {"name": "docs", "priority": 10, "guaranteedNodes": 4},
        {"name": "agents"},
    ],
}


def _spec_schema() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]


def _apply_defaults(schema: dict, value):
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _apply_defaults(sub, value[name])
    if schema.get("type") == "array" and isinstance(value, list):
        return [_apply_defaults(schema["items"], v) for v in value]
    return value


def _prune(value):
    """Empty lists and maps mean the same as absent ones."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v not in ([], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def test_checked_in_crd_is_the_generated_one():
    assert CRD_FILE.read_text() == crd.render_yaml("pdpools"), (
        "crds/ is stale: run python -m pdscale.operator.api.crd pdpools > crds/pdpools.pdscale.io.yaml"
    )


@pytest.mark.parametrize("raw", [POOL, {}], ids=["three-members", "empty"])
def test_api_server_defaults_equal_model_defaults(raw):
    by_crd = _apply_defaults(_spec_schema(), copy.deepcopy(raw))
    by_model = PDPoolSpec.model_validate(raw).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert _prune(by_crd) == _prune(by_model)
    assert by_crd.get("horizonSeconds") == 1800


def test_the_crd_carries_the_models_cross_field_rules():
    rules = {r["rule"]: r["message"] for r in _spec_schema()["x-kubernetes-validations"]}
    assert any("exists_one" in r for r in rules)
    assert any(".sum() <= self.nodes" in r for r in rules)
    members = _spec_schema()["properties"]["members"]
    assert members["maxItems"] == 64  # bounds the CEL rules' cost


def test_a_pdcluster_only_names_a_pool_it_cannot_set_its_share():
    """Tenancy: a PDCluster author may ask to plan in a pool (spec.planner.pool: its name and
    namespace, nothing else), never pick a priority, a guarantee or a size; the pool's
    members list decides (pool_refusal, tests/operator/test_pool_loop.py)."""
    pdc = yaml.safe_load((ROOT / "crds" / "pdclusters.pdscale.io.yaml").read_text())
    spec = pdc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pool = spec["properties"]["planner"]["properties"]["pool"]
    assert set(pool["properties"]) == {"name", "namespace"}
    text = yaml.safe_dump(spec)
    assert "guaranteedNodes" not in text and "priority:" not in text


@pytest.mark.parametrize("raw, message", [
    ({"members": [{"name": "a"}, {"name": "a"}]}, "each PDCluster may be listed once"),
    ({"nodes": 10, "members": [{"name": "a", "guaranteedNodes": 6},
                               {"name": "b", "guaranteedNodes": 5}]},
     "guaranteedNodes sum to 11, more than nodes 10"),
    ({"members": [{"name": "A"}]}, "String should match pattern"),
    ({"members": [{"name": "a", "guaranteedNodes": -1}]}, "greater than or equal to 0"),
    ({"nodes": 0}, "greater than or equal to 1"),
    ({"membersx": []}, "Extra inputs are not permitted"),
    ({"surplusPricePercent": 101}, "less than or equal to 100"),
    ({"surplusPricePercent": -1}, "greater than or equal to 0"),
    ({"surplusPricePercent": 0.75}, "valid integer"),
])
def test_model_refuses(raw, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        PDPoolSpec.model_validate(raw)
