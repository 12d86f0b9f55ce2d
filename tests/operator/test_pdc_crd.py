"""The CRD in crds/ and the pydantic model agree: same file, same defaults, same bounds."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from pdscale.operator.api import crd
from pdscale.operator.api.pdcluster import PDClusterSpec, dump
from pdscale.operator.render.checklist import parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdclusters.pdscale.io.yaml"
# Our samples (other examples belong to other work and are checked there).
EXAMPLES = [ROOT / "examples" / "sglang-glm-4p8d.yaml", ROOT / "examples" / "vllm-nixl-2p4d.yaml"]

MINIMAL = {
    "model": {"servedName": "m", "path": "org/model"},
    "engine": {"kind": "SGLang", "image": "img"},
    "router": {"image": "router-img"},
}


def _schema() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _apply_defaults(schema: dict, value):
    """The API server's structural defaulting, for the subset of OpenAPI the CRD uses."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k in value:
                value[k] = _apply_defaults(extra, value[k])
    if schema.get("type") == "array" and isinstance(value, list):
        return [_apply_defaults(schema["items"], v) for v in value]
    return value


def _prune(value):
    """Empty lists and maps mean the same as absent ones; drop them before comparing."""
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ([], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def test_checked_in_crd_is_the_generated_one():
    assert CRD_FILE.read_text() == crd.render_yaml(), (
        "crds/ is stale: run python -m pdscale.operator.api.crd > crds/pdclusters.pdscale.io.yaml"
    )


@pytest.mark.parametrize("raw", [MINIMAL, *[yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES]],
                         ids=["minimal", *[p.stem for p in EXAMPLES]])
def test_api_server_defaults_equal_model_defaults(raw):
    by_crd = _apply_defaults(_schema()["properties"]["spec"], copy.deepcopy(raw))
    by_model = dump(parse(raw))
    assert _prune(by_crd) == _prune(by_model)


def _walk(schema: dict, path: str = "spec"):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_documented():
    for path, node in _walk(_schema()["properties"]["spec"]):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title"} & node.keys(), path
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), path
        if node.get("type") == "object":
            assert node.get("additionalProperties") is not False, path
        if not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def _model_fields(model, path="spec"):
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        alias = field.alias or name
        yield f"{path}.{alias}", field
        origin = getattr(field.annotation, "__origin__", None)
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                sub = f"{path}.{alias}[]" if origin is list else f"{path}.{alias}"
                yield from _model_fields(arg, sub)


def test_every_model_field_is_in_the_schema_with_its_bounds_and_requiredness():
    nodes = dict(_walk(_schema()["properties"]["spec"]))
    parents = {}
    for path, node in nodes.items():
        for req in node.get("required", []):
            parents[f"{path}.{req}"] = True
    seen = 0
    for path, field in _model_fields(PDClusterSpec):
        assert path in nodes, f"{path} missing from the CRD"
        node = nodes[path]
        assert parents.get(path, False) == field.is_required(), path
        for meta in field.metadata:
            for attr, key in (("ge", "minimum"), ("le", "maximum"), ("min_length", "minLength")):
                if getattr(meta, attr, None) is not None:
                    assert node[key] == getattr(meta, attr), f"{path}.{key}"
        seen += 1
    assert seen > 60  # the walk really covered the model


def test_crd_names_status_and_columns():
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert doc["metadata"]["name"] == "pdclusters.pdscale.io"
    assert doc["spec"]["names"]["shortNames"] == ["pdc"]
    version = doc["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["P-Ready"] == ".status.prefill.readyReplicas"
    assert columns["D-Desired"] == ".status.decode.desiredReplicas"
    assert columns["Planner"] == ".spec.planner.mode"
    assert columns["Decision"] == ".status.planner.lastDecision"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'


def test_cel_rules_sit_where_they_apply():
    spec = _schema()["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("tensorParallelSize" in r for r in rules)
    assert any("NIXL" in r for r in rules)
    role_rules = [r["rule"] for r in spec["properties"]["prefill"]["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.maxReplicas" in role_rules
    weights = spec["properties"]["model"]["properties"]["weights"]
    assert weights["x-kubernetes-validations"][0]["rule"] == "has(self.pvc) != has(self.hostPath)"
    # Optional sections that are absent by default must not get a default object.
    assert "default" not in weights
    assert "default" not in spec["properties"]["placement"]["properties"]["rdma"]
    assert spec["properties"]["kvCache"]["default"] == {
        "pageSizeTokens": 64, "dtype": "Auto", "layout": "Auto"}
    assert spec["properties"]["prefill"]["default"]["minReplicas"] == 1


# -- the other direction: what the CRD admits, the model takes (or refuses, naming the field) --

#: free-form values: the schema lets any key through (maps of user data), so their keys are
#: data, not field names
def _free_form(node: dict) -> bool:
    return bool(node.get("x-kubernetes-preserve-unknown-fields")) or isinstance(
        node.get("additionalProperties"), dict)


def _schema_fields(node: dict, path: str = "spec"):
    """Field paths the CRD declares (not the keys of free-form maps)."""
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _schema_fields(sub, f"{path}.{name}")
    if "items" in node:
        yield from _schema_fields(node["items"], f"{path}[]")


def test_every_field_the_crd_declares_is_a_model_field():
    model_paths = {path for path, _ in _model_fields(PDClusterSpec)}
    crd_paths = {path for path, _ in _schema_fields(_schema()["properties"]["spec"])}
    assert crd_paths - model_paths == set(), "the CRD admits these; the model knows nothing of them"
    assert model_paths - crd_paths == set()


def test_the_crd_names_fields_in_camel_case_only():
    import re

    for path, _ in _schema_fields(_schema()["properties"]["spec"]):
        name = path.rsplit(".", 1)[-1].removesuffix("[]")
        assert re.fullmatch(r"[a-z][A-Za-z0-9]*", name), path


def _full_spec() -> dict:
    """A sample with every default filled in: every section present, to rename and vary."""
    return dump(parse(yaml.safe_load(EXAMPLES[0].read_text())["spec"]))


def _keys(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _keys(v, (*path, k))


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def test_the_model_refuses_a_snake_case_spelling_the_crd_would_prune():
    """The API server drops a field its schema does not name; the model must not take it
    either (``pdscale render`` would otherwise render what the cluster never sees)."""
    from pdscale.operator.render.checklist import SpecError

    spec = _full_spec()
    free = {path for path, node in _schema_fields(_schema()["properties"]["spec"]) if _free_form(node)}
    renamed = 0
    for keys in list(_keys(spec)):
        if _snake(keys[-1]) == keys[-1] or any(
                "spec." + ".".join(keys[:i]) in free for i in range(1, len(keys))):
            continue
        doc = copy.deepcopy(spec)
        parent = doc
        for k in keys[:-1]:
            parent = parent[k]
        parent[_snake(keys[-1])] = parent.pop(keys[-1])
        with pytest.raises(SpecError) as refused:
            parse(doc)
        fields = [p.field for p in refused.value.problems]
        assert any(_snake(keys[-1]) in f or keys[-1] in f for f in fields), (keys, fields)
        renamed += 1
    assert renamed > 30


def _admitted_values(node: dict) -> list:
    """Values the CRD's schema admits at one leaf: its bounds, its enum, both booleans."""
    if "enum" in node:
        return list(node["enum"])
    kind = node.get("type")
    if kind == "boolean":
        return [True, False]
    if kind == "integer":
        low, high = node.get("minimum", 0), node.get("maximum", 2**31 - 1)
        return [low, high]
    if kind == "number":
        return [node.get("minimum", 0.0), node.get("maximum", 1e9)]
    if kind == "string" and "pattern" not in node and "format" not in node:
        return ["x" * max(1, node.get("minLength", 1))]
    return []


def test_what_the_crd_admits_the_model_accepts_or_refuses_naming_a_field():
    """Every leaf of the sample set, one at a time, to each value the schema admits there:
    the operator's validation takes it, or refuses with problems that name fields of the
    CRD (the SpecValid=False message); never an exception of another kind."""
    from pdscale.operator.render.checklist import SpecError, validate

    spec = _full_spec()
    nodes = dict(_schema_fields(_schema()["properties"]["spec"]))
    known = set(nodes) | {"spec"}
    accepted = refused = 0
    for keys in list(_keys(spec)):
        path = "spec." + ".".join(keys)
        node = nodes.get(path)
        if node is None:
            continue  # a key inside a free-form map
        for value in _admitted_values(node):
            doc = copy.deepcopy(spec)
            parent = doc
            for k in keys[:-1]:
                parent = parent[k]
            parent[keys[-1]] = value
            try:
                validate(doc)
                accepted += 1
            except SpecError as exc:
                refused += 1
                for problem in exc.problems:
                    named = problem.field.split("[")[0].rstrip(".")
                    assert problem.message and any(
                        named == k or named.startswith(k + ".") for k in known), (path, value, problem)
    assert accepted > 50 and refused > 0, (accepted, refused)
