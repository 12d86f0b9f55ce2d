"""Kubernetes' own rules (operator/api/k8s_rules.py): each rule on values it accepts and values the
API server refuses, and, through checklist.validate, a refusal that names the spec field."""

from __future__ import annotations

import copy
import pathlib
from fractions import Fraction

import pytest
import yaml

from pdscale.operator.api import k8s_rules as r
from pdscale.operator.api.pdcluster import Toleration
from pdscale.operator.render.checklist import SpecError, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
GLM = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]
LLAMA = yaml.safe_load((ROOT / "examples" / "vllm-nixl-2p4d.yaml").read_text())["spec"]


def refusals(base: dict, **changes) -> dict[str, str]:
    """validate(base with dotted changes) -> {field: message}; {} when valid."""
    spec = copy.deepcopy(base)
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        validate(spec)
    except SpecError as exc:
        return {p.field: p.message for p in exc.problems}
    return {}


# ---- string rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "abc-1", "1abc", "a" * 63])
def test_dns1123_label_accepts(value):
    assert r.dns1123_label(value) == []


@pytest.mark.parametrize("value", ["", "A", "a_b", "-a", "a-", "a.b", "a" * 64, "é", "a\n"])
def test_dns1123_label_refuses(value):
    assert r.dns1123_label(value)


@pytest.mark.parametrize("value", ["a", "a.b", "a-1.b-2", "1.2.3", ("a" * 63 + ".") * 3 + "a" * 61])
def test_dns1123_subdomain_accepts(value):
    assert r.dns1123_subdomain(value) == []


@pytest.mark.parametrize("value", ["", "a..b", ".a", "a.", "A.b", "a_b", "b" * 254, "a\n"])
def test_dns1123_subdomain_refuses(value):
    assert r.dns1123_subdomain(value)


def test_dns1035_label_starts_with_a_letter():
    assert r.dns1035_label("glm53-router") == []
    assert r.dns1035_label("1abc")
    assert r.dns1035_label("a" * 64)


@pytest.mark.parametrize("value", ["app", "app.kubernetes.io/name", "example.com/A_b.c-1", "a" * 63,
                                   "p" * 253 + "/x"])
def test_qualified_name_accepts(value):
    assert r.qualified_name(value) == []


@pytest.mark.parametrize("value", ["", "/x", "x/", "a/b/c", "-x", "x-", "a" * 64, "Upper.Case/x",
                                   "with space", "p" * 254 + "/x", "ü"])
def test_qualified_name_refuses(value):
    assert r.qualified_name(value)


@pytest.mark.parametrize("value", ["", "a", "NVIDIA-H200", "x.y_z-1", "a" * 63])
def test_label_value_accepts(value):
    assert r.label_value(value) == []


@pytest.mark.parametrize("value", ["-x", "x-", "a b", "a/b", "a:b", "a" * 64, "ü", "a\n"])
def test_label_value_refuses(value):
    assert r.label_value(value)


@pytest.mark.parametrize("value", ["FOO", "foo.bar", "_X", "-x", "a-b_c.d9"])
def test_env_var_name_accepts(value):
    assert r.env_var_name(value) == []


@pytest.mark.parametrize("value", ["", "1ABC", "A=B", "with space", "É", "TAB\tX", "a\n"])
def test_env_var_name_refuses(value):
    assert r.env_var_name(value)


@pytest.mark.parametrize("value", [
    "nginx", "lmsysorg/sglang:v0.5.6-cu129", "registry:5000/a/b:tag", "[::1]:5000/x", "UPPER/case",
    "ghcr.io/org/img@sha256:" + "0" * 64, "my.registry/a__b/c-d.e:1_2", "Example.COM/x:LATEST",
])
def test_image_reference_accepts(value):
    assert r.image_reference(value) == []


@pytest.mark.parametrize("value", [
    "", " lead", "trail ", "repo/UPPER", "Upper", "a:b:c", "a//b", "a@sha256:abc", "img:" + "t" * 129,
    "x" * 256, "é", "a b", "img:",
])
def test_image_reference_refuses(value):
    assert r.image_reference(value)


# ---- quantities and resources ----------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("1", 1), ("64Gi", 64 * 2**30), ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)),
    ("1e3", 1000), ("1E", 10**18), ("+5", 5), ("-1", -1), (".5", Fraction(1, 2)), (8, 8),
    ("9223372036854775807", 2**63 - 1),
])
def test_parse_quantity(value, expected):
    assert r.parse_quantity(value) == expected


@pytest.mark.parametrize("value", ["", "abc", "1Ki ", "1e1.5", "1e400", "1KB", "9" * 30,
                                   "9223372036854775808", 2**63, True, None, 1.5, "8Ei"])
def test_parse_quantity_refuses(value):
    with pytest.raises(ValueError):
        r.parse_quantity(value)


@pytest.mark.parametrize("name", ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi",
                                  "example.com/dev", "rdma/ib", "foo.kubernetes.io/x"])
def test_resource_name_accepts(name):
    assert r.resource_name(name) == []


@pytest.mark.parametrize("name", ["bogus", "hugepages-x", "a/b/c", "Example.com/x", "gpu"])
def test_resource_name_refuses(name):
    assert r.resource_name(name)


def test_resource_requirements():
    ok = r.resource_requirements({"cpu": "4", "memory": "8Gi", "example.com/dev": 2},
                                 {"cpu": 8, "example.com/dev": "2"}, "res")
    assert ok == []
    out = dict(r.resource_requirements({"cpu": "8", "example.com/dev": 1, "example.com/b": 1},
                                       {"cpu": "4", "example.com/dev": 2}, "res"))
    assert out["res.requests[cpu]"] == "must be less than or equal to cpu limit"
    assert out["res.requests[example.com/dev]"] == "must be equal to example.com/dev limit"
    assert out["res.limits[example.com/b]"] == "Limit must be set for non overcommitable resources"
    assert dict(r.resource_requirements({}, {"example.com/dev": "500m"}, "res")) == {
        "res.limits[example.com/dev]": "must be an integer"}
    assert dict(r.resource_requirements({"memory": "-1"}, {}, "res")) == {
        "res.requests[memory]": "must be greater than or equal to 0"}
    assert dict(r.resource_requirements({}, {"hugepages-2Mi": "1Gi"}, "res")) == {
        "res": "HugePages require cpu or memory"}
    assert dict(r.resource_requirements({}, {"hugepages-2Mi": "3Mi", "memory": "1Gi"}, "res")) == {
        "res.limits[hugepages-2Mi]": "must be a multiple of 2Mi"}
    assert r.resource_requirements({}, {"hugepages-1Gi": "2Gi", "memory": "1Gi"}, "res") == []


# ---- maps, metadata --------------------------------------------------------------------------


def test_label_and_annotation_maps():
    assert r.label_map({"a.io/b": "c", "d": ""}, "x") == []
    assert dict(r.label_map({"bad key": "v"}, "x"))["x[bad key]"].startswith("key ")
    assert dict(r.label_map({"k": "bad value"}, "x"))["x[k]"]
    assert r.label_map(["a"], "x") == [("x", "must be a mapping of label keys to string values")]
    assert r.annotation_map({"Example.com/Key": "any value at all\n"}, "x") == []
    assert dict(r.annotation_map({"a/b/c": "v"}, "x"))["x[a/b/c]"]
    assert r.annotation_map({"k": "v" * 300_000}, "x")[0][0] == "x"


def test_pod_annotations_the_api_server_interprets():
    out = dict(r.pod_annotations({"kubernetes.io/config.mirror": "x",
                                  "controller.kubernetes.io/pod-deletion-cost": "99999999999"}, "p"))
    assert set(out) == {"p[kubernetes.io/config.mirror]",
                        "p[controller.kubernetes.io/pod-deletion-cost]"}
    assert r.pod_annotations({"controller.kubernetes.io/pod-deletion-cost": "-5",
                              "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}, "p") == []


@pytest.mark.parametrize(("meta", "field"), [
    (None, "metadata.name"), ([], "metadata"), (5, "metadata"), ({}, "metadata.name"), ({"name": 5}, "metadata.name"),
    ({"name": "Bad_Name"}, "metadata.name"), ({"name": "c" * 254}, "metadata.name"),
    ({"name": "ok", "namespace": "Bad NS"}, "metadata.namespace"),
    ({"name": "ok", "namespace": 5}, "metadata.namespace"),
    ({"name": "ok", "labels": {"k": "bad value"}}, "metadata.labels[k]"),
    ({"name": "ok", "annotations": {"a/b/c": "v"}}, "metadata.annotations[a/b/c]"),
])
def test_object_metadata_refusals_name_the_field(meta, field):
    assert field in dict(r.object_metadata(meta))


@pytest.mark.parametrize("name", ["glm53", "a", "x." * 120 + "x", "b" * 253, "1abc",
                                  "llama-3-70b-instruct-fp8-decode-x"])
def test_any_valid_name_yields_valid_child_names(name):
    assert r.object_metadata({"name": name, "namespace": ""}) == []
    assert r.child_names(name) == []


# ---- tolerations and affinity ----------------------------------------------------------------


def tol(**kw) -> Toleration:
    return Toleration.model_validate(kw)


@pytest.mark.parametrize(("t", "field"), [
    (tol(key="bad key!", operator="Exists"), "t[0].key"),
    (tol(operator="Equal", value="x"), "t[0].operator"),
    (tol(key="k", operator="Exists", value="v"), "t[0].value"),
    (tol(key="k", value="bad value"), "t[0].value"),
    (tol(key="k", operator="Exists", effect="NoSchedule", tolerationSeconds=5), "t[0].effect"),
    (tol(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=2**63),
     "t[0].tolerationSeconds"),
])
def test_toleration_refusals(t, field):
    assert field in dict(r.tolerations([t], "t"))


def test_tolerations_accepted():
    good = [tol(operator="Exists"), tol(key="example.com/x", value="v", effect="NoSchedule"),
            tol(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=-1)]
    assert r.tolerations(good, "t") == []


GOOD_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                  {"key": "gen", "operator": "Gt", "values": ["3"]}],
             "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "example.com/x", "operator": "Exists"}]}}],
    },
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"app": "x"},
                               "matchExpressions": [{"key": "tier", "operator": "NotIn",
                                                     "values": ["a"]}]},
             "namespaces": ["default"], "matchLabelKeys": ["pod-template-hash"]}],
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone"}}],
    },
}


def test_a_full_affinity_passes():
    assert r.affinity(GOOD_AFFINITY, "a") == []


AFFINITY_ERRORS = [
    ([], "a"),
    ({"nodeAfinity": {}}, "a.nodeAfinity"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In"}]}]}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["x"]}]}]}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "bad key", "operator": "Bad"}]}]}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "spec.x", "operator": "In", "values": ["a"]}]}]}}},
     "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchFields[0].key"),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "preference": {}}]}},
     "a.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": "5", "preference": {}}]}},
     "a.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}},
     "a.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"),
    ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "k", "labelSelector": {"matchExpressions": [
            {"key": "k", "operator": "In", "values": ["bad value"]}]}}]}},
     "a.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
     ".matchExpressions[0].values[0]"),
    ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "k", "matchLabelKeys": ["app"]}]}},
     "a.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].matchLabelKeys"),
    ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "k", "namespaces": ["Bad_NS"]}]}},
     "a.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaces[0]"),
    ({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 101, "podAffinityTerm": {"topologyKey": "k"}}]}},
     "a.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
]


@pytest.mark.parametrize(("value", "field"), AFFINITY_ERRORS)
def test_affinity_refusals_name_the_field(value, field):
    assert field in dict(r.affinity(value, "a"))


def test_scalars_int64_and_nul():
    assert r.scalars({"a": [2**63 - 1, -(2**63)], "b": "x", "c": True}, "spec") == []
    out = dict(r.scalars({"a": [1, 2**63], "b": {"c": "x\x00"}}, "spec"))
    assert out == {"spec.a[1]": "must fit in int64 (at most 9223372036854775807)",
                   "spec.b.c": "must not contain a NUL character"}


# ---- through validate: the spec field is named -----------------------------------------------


def test_the_examples_pass():
    assert refusals(GLM) == {}
    assert refusals(LLAMA) == {}


@pytest.mark.parametrize(("changes", "field"), [
    ({"engine.image": "lmsysorg/SGLang:v1"}, "spec.engine.image"),
    ({"router.image": "a b"}, "spec.router.image"),
    ({"engine.env": [{"name": "OK"}, {"name": "OK2"}, {"name": "1BAD"}]}, "spec.engine.env[2].name"),
    ({"prefill.env": [{"name": "A=B"}]}, "spec.prefill.env[0].name"),
    ({"decode.resources": {"requests": {"bogus": 1}}}, "spec.decode.resources.requests[bogus]"),
    ({"prefill.resources": {"limits": {"memory": "lots"}}}, "spec.prefill.resources.limits[memory]"),
    ({"prefill.resources": {"requests": {"example.com/dev": 1}}},
     "spec.prefill.resources.limits[example.com/dev]"),
    ({"placement.gpuProduct": "NVIDIA H200"}, "spec.placement.gpuProduct"),
    ({"placement.nodeSelector": {"pool": "a b"}}, "spec.placement.nodeSelector[pool]"),
    ({"placement.nodeSelector": {"a/b/c": "x"}}, "spec.placement.nodeSelector[a/b/c]"),
    ({"placement.tolerations": [{"operator": "Equal", "value": "x"}]},
     "spec.placement.tolerations[0].operator"),
    ({"placement.affinity": {"nodeAffinity": {"bogus": 1}}}, "spec.placement.affinity.nodeAffinity.bogus"),
    ({"placement.rdma": {"resourceName": "rdma", "count": 1}}, "spec.placement.rdma.resourceName"),
    ({"placement.sharedMemorySize": "1e1.5"}, "spec.placement.sharedMemorySize"),
    ({"placement.sharedMemorySize": "9999999999Ei"}, "spec.placement.sharedMemorySize"),
    ({"placement.podAnnotations": {"bad key!": "x"}}, "spec.placement.podAnnotations[bad key!]"),
    ({"model.weights": {"pvc": {"claimName": "Bad_Claim"}}}, "spec.model.weights.pvc.claimName"),
    ({"model.weights": {"hostPath": {"path": "/raid/../etc"}}, "model.path": "/models/x"},
     "spec.model.weights.hostPath.path"),
    ({"model.weights": {"hostPath": {"path": "/raid"}, "mountPath": "/dev/shm"},
      "model.path": "/dev/shm/x"}, "spec.model.weights.mountPath"),
    ({"planner.nodeBudget": 2**63}, "spec.planner.nodeBudget"),
    ({"slo.ttftMilliseconds": 10**30}, "spec.slo.ttftMilliseconds"),
    ({"kvTransfer.conservativePrefillTokensPerSecond": 2**64},
     "spec.kvTransfer.conservativePrefillTokensPerSecond"),
    ({"model.servedName": "a\x00b"}, "spec.model.servedName"),
])
def test_a_refusal_names_the_spec_field(changes, field):
    out = refusals(GLM, **changes)
    assert field in out, out


@pytest.mark.parametrize(("changes", "field"), [
    ({"engine.port": 5600}, "spec.engine.port"),
    ({"router.discoveryPort": 30000}, "spec.router.discoveryPort"),
])
def test_vllm_port_collisions_name_the_field(changes, field):
    assert field in refusals(LLAMA, **changes)


def test_fields_kubernetes_accepts_still_pass():
    ok = refusals(GLM, **{
        "engine.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "my.var-1"}],
        "placement.tolerations": [{"operator": "Exists"},
                                  {"key": "example.com/x", "operator": "Exists",
                                   "effect": "NoExecute", "tolerationSeconds": 60}],
        "placement.affinity": GOOD_AFFINITY,
        "placement.nodeSelector": {"example.com/pool": "serving"},
        "placement.podAnnotations": {"team": "a b c", "example.com/Note": "anything"},
        "prefill.resources": {"requests": {"cpu": "64", "memory": "1500Gi"},
                              "limits": {"memory": "1800Gi", "example.com/dev": 1}},
    })
    assert ok == {}
