"""The admin's tenant policy refuses, naming the field and the policy key, what a PDCluster
author may not put into pods; and nothing in a spec takes what the operator owns."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from pdscale.operator.api.tenant_policy import TenantPolicy, refusals
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.operator.render.engines import operator_env_names

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def spec_of(path: Path, **changes) -> dict:
    spec = copy.deepcopy(yaml.safe_load(path.read_text())["spec"])
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return spec


def refused(spec_dict: dict, policy: TenantPolicy | None = None) -> dict[str, str]:
    spec, derived = validate(spec_dict)
    return dict(refusals(spec, policy or TenantPolicy(), operator_env_names(spec, derived)))


GLM = ROOT / "examples" / "sglang-glm-4p8d.yaml"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_shipped_examples_pass_the_default_policy(example):
    spec = spec_of(example)
    spec.setdefault("planner", {}).setdefault("prometheusURL", "http://prometheus:9090")  # the demo's is filled in
    assert refused(spec) == {}


def test_an_image_from_elsewhere_is_refused_naming_the_field_and_the_key():
    out = refused(spec_of(GLM, **{"engine.image": "evil.example/miner:1"}))
    assert list(out) == ["spec.engine.image"]
    assert "allowedImagePrefixes" in out["spec.engine.image"]


def test_any_image_only_when_the_admin_says_so():
    policy = TenantPolicy(allowed_image_prefixes=("*",))
    assert refused(spec_of(GLM, **{"router.image": "my.registry/router:2"}), policy) == {}


@pytest.mark.parametrize("path", ["/", "/etc", "/var/lib/kubelet", "/raid/models-evil",
                                  "//raid/models"])  # ".." is the checklist's: never valid
def test_a_host_directory_outside_the_allowed_ones_is_refused(path):
    out = refused(spec_of(GLM, **{"model.weights": {"hostPath": {"path": path}}}))
    assert "allowedHostPathPrefixes" in out["spec.model.weights.hostPath.path"]


def test_a_host_directory_below_an_allowed_one_is_fine():
    assert refused(spec_of(GLM, **{"model.weights": {"hostPath": {"path": "/raid/models/glm"}}})) == {}


def test_no_host_path_at_all_when_the_admin_allows_none():
    out = refused(spec_of(GLM), TenantPolicy(allowed_host_path_prefixes=()))
    assert "spec.model.weights.hostPath.path" in out


def test_extra_args_env_annotations_and_affinity_can_each_be_switched_off():
    spec = spec_of(GLM, **{"engine.env": [{"name": "FOO", "value": "1"}],
                           "placement.podAnnotations": {"team": "a"},
                           "placement.affinity": {"nodeAffinity": {}}})
    policy = TenantPolicy(allow_extra_args=False, allow_env=False, allow_pod_annotations=False,
                          allow_affinity=False)
    out = refused(spec, policy)
    assert "allowExtraArgs" in out["spec.engine.extraArgs"]
    assert "allowEnv" in out["spec.engine.env"]
    assert "allowPodAnnotations" in out["spec.placement.podAnnotations"]
    assert "allowAffinity" in out["spec.placement.affinity"]


@pytest.mark.parametrize("key", ["controller.kubernetes.io/pod-deletion-cost",
                                 "pdscale.io/draining-since", "sglang.ai/bootstrap-port"])
def test_the_operators_annotations_are_never_the_specs(key):
    with pytest.raises(SpecError, match=re.escape(f"spec.placement.podAnnotations: {key} is set by the operator")):
        validate(spec_of(GLM, **{"placement.podAnnotations": {key: "1"}}))


def test_an_environment_variable_the_operator_renders_is_reserved():
    out = refused(spec_of(GLM, **{"prefill.env": [
        {"name": "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "value": "1"}]}))
    assert "the operator sets it" in out["spec.prefill.env[0].name"]


def test_the_admins_reserved_environment_names():
    policy = TenantPolicy(reserved_env_names=("NCCL_DEBUG",))
    out = refused(spec_of(GLM, **{"engine.env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}), policy)
    assert "reservedEnvNames" in out["spec.engine.env[0].name"]


def test_tolerations_limited_to_the_allowed_keys_and_an_empty_key_names_why():
    policy = TenantPolicy(allowed_toleration_keys=("dedicated",))
    spec = spec_of(GLM, **{"placement.tolerations": [
        {"key": "dedicated", "operator": "Exists"}, {"operator": "Exists"},
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]})
    out = refused(spec, policy)
    assert set(out) == {"spec.placement.tolerations[1].key", "spec.placement.tolerations[2].key"}
    assert "tolerates every taint" in out["spec.placement.tolerations[1].key"]


def test_nothing_overrides_the_gpu_request():
    with pytest.raises(SpecError, match=re.escape("spec.decode.resources.limits")):
        validate(spec_of(GLM, **{"decode.resources": {"limits": {"nvidia.com/gpu": "1"}}}))
    with pytest.raises(SpecError, match=re.escape("spec.placement.rdma.resourceName")):
        validate(spec_of(GLM, **{"placement.rdma": {"resourceName": "nvidia.com/gpu"}}))


def test_the_policy_from_the_charts_values_round_trips_and_refuses_typos():
    values = yaml.safe_load((ROOT / "charts" / "pdscale" / "values.yaml").read_text())
    policy = TenantPolicy.from_environment({"PDSCALE_TENANT_POLICY": json.dumps(values["tenantPolicy"])})
    assert policy == TenantPolicy()  # the chart's defaults are the operator's
    with pytest.raises(ValueError, match="allowedImagePrefix"):
        TenantPolicy.from_mapping({"allowedImagePrefix": ["*"]})
    with pytest.raises(ValueError, match="allowEnv must be true or false"):
        TenantPolicy.from_mapping({"allowEnv": "yes"})
    with pytest.raises(ValueError, match="allowedHostPathPrefixes must be a list of strings"):
        TenantPolicy.from_mapping({"allowedHostPathPrefixes": "/"})
    assert TenantPolicy.from_environment({}) == TenantPolicy()


@pytest.mark.parametrize("profile", ["/dev/zero", "../../etc/passwd", "nope"])
def test_the_profile_is_a_shipped_name_never_a_path(profile):
    spec = spec_of(GLM, **{"planner.profile": profile})
    with pytest.raises(SpecError, match=re.escape("spec.planner.profile")):
        validate(spec)


def test_the_operator_loads_a_profile_by_name_only():
    from pdscale.planner.profile import ProfileError, shipped_profile, shipped_profiles

    assert "demo-sim" in shipped_profiles()
    assert shipped_profile("demo-sim").name
    with pytest.raises(ProfileError, match="no shipped profile named '/dev/zero'"):
        shipped_profile("/dev/zero")


def test_the_command_line_refuses_a_huge_file_as_a_profile(tmp_path):
    from pdscale.planner.profile import ProfileError, load_profile

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1 << 20))
    with pytest.raises(ProfileError, match="not a profile"):
        load_profile(big)
