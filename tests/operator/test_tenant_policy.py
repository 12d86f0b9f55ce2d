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
    # (none names a Prometheus: the operator's serves them; the demo's is filled in, and
    # allowed, by the test bed's admin)
    assert refused(spec_of(example)) == {}


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


# -- the gaps a hostile tenant found (issue 42) -------------------------------------------------
VLLM = ROOT / "examples" / "vllm-nixl-2p4d.yaml"


def test_remote_code_of_a_hub_model_is_refused_by_default():
    hub = spec_of(GLM, **{"model.path": "some-org/some-model", "model.trustRemoteCode": True})
    del hub["model"]["weights"]
    out = refused(hub)
    assert "allowTrustRemoteCode" in out["spec.model.trustRemoteCode"]
    assert refused(hub, TenantPolicy(allow_trust_remote_code=True)) == {}
    # from a weights volume the admin's policy already governs: allowed
    assert "spec.model.trustRemoteCode" not in refused(spec_of(GLM))


def test_a_node_selector_is_refused_with_affinity():
    spec = spec_of(GLM, **{"placement.nodeSelector": {"kubernetes.io/hostname": "victim-node"}})
    out = refused(spec, TenantPolicy(allow_affinity=False))
    assert "allowAffinity" in out["spec.placement.nodeSelector"]
    assert refused(spec) == {}
    # an empty affinity pins nothing: allowed either way (as at admission)
    assert refused(spec_of(GLM, **{"placement.affinity": {}}), TenantPolicy(allow_affinity=False)) == {}


@pytest.mark.parametrize("key", ["k8s.v1.cni.cncf.io/networks", "cni.projectcalico.org/ipAddrs",
                                 "v1.multus-cni.io/default-network", "kubernetes.io/egress-bandwidth"])
def test_network_annotations_are_refused_unless_named(key):
    spec = spec_of(GLM, **{"placement.podAnnotations": {"team": "a", key: "x"}})
    out = refused(spec)
    assert list(out) == [f"spec.placement.podAnnotations.{key}"]
    assert "allowedPodAnnotationKeys" in out[f"spec.placement.podAnnotations.{key}"]
    domain = key.split("/")[0] + "/"
    assert refused(spec, TenantPolicy(allowed_pod_annotation_keys=("*", domain))) == {}
    assert refused(spec, TenantPolicy(allowed_pod_annotation_keys=("*", key))) == {}
    only_team = TenantPolicy(allowed_pod_annotation_keys=("team",))
    assert list(refused(spec, only_team)) == [f"spec.placement.podAnnotations.{key}"]


@pytest.mark.parametrize(("image", "ok"), [
    ("registry.corp.example/sglang:1", True), ("registry.corp.example:5000/x:1", True),
    ("registry.corp.example@sha256:" + "a" * 64, True), ("registry.corp.example", True),
    ("registry.corp.example.attacker.io/x:1", False), ("registry.corp.examplex/x", False),
])
def test_an_image_prefix_ends_at_a_boundary(image, ok):
    policy = TenantPolicy(allowed_image_prefixes=("registry.corp.example",))
    out = refused(spec_of(GLM, **{"engine.image": image}), policy)
    assert ("spec.engine.image" not in out) is ok


@pytest.mark.parametrize("resource", ["nvidia.com/mig-1g.10gb", "amd.com/gpu", "nvidia.com/gpu.shared",
                                      "gpu.intel.com/i915"])
def test_accelerators_are_no_rdma_device_nor_an_extra_resource(resource):
    with pytest.raises(SpecError, match=re.escape("spec.placement.rdma.resourceName")):
        validate(spec_of(GLM, **{"placement.rdma": {"resourceName": resource}}))
    with pytest.raises(SpecError, match=re.escape("spec.prefill.resources.requests")):
        validate(spec_of(GLM, **{"prefill.resources": {"requests": {resource: "1"}}}))
    validate(spec_of(GLM, **{"placement.rdma": {"resourceName": "rdma/hca_shared_devices_a"}}))


def test_weights_claims_are_read_only_and_may_be_limited_to_a_list():
    writable = spec_of(VLLM, **{"model.weights": {"pvc": {"claimName": "llama70b-weights", "readOnly": False}}})
    assert "allowWritableWeights" in refused(writable)["spec.model.weights.pvc.readOnly"]
    assert refused(writable, TenantPolicy(allow_writable_weights=True)) == {}
    other = spec_of(VLLM, **{"model.weights": {"pvc": {"claimName": "someone-elses"}}})
    policy = TenantPolicy(allowed_weights_claims=("llama70b-weights",))
    assert "allowedWeightsClaims" in refused(other, policy)["spec.model.weights.pvc.claimName"]
    assert refused(spec_of(VLLM), policy) == {}


@pytest.mark.parametrize(("path", "ok"), [("/models/", True), ("/models/x/", True), ("/models/x//", False),
                                          ("/models/./x", False)])
def test_host_paths_with_trailing_slashes_read_as_directories(path, ok):
    spec = spec_of(GLM, **{"model.weights.hostPath.path": path})
    assert ("spec.model.weights.hostPath.path" not in refused(spec)) is ok


def test_the_admission_policy_names_the_same_accelerators():
    from pdscale.operator.api.pdcluster import GPU_CLASS_PREFIXES, GPU_CLASS_RESOURCES
    text = (ROOT / "charts" / "pdscale" / "templates" / "admission-policy.yaml").read_text()
    variables = dict(re.findall(r"- name: (gpu\w+)\n\s+expression: '(\[.*\])'", text))
    assert tuple(json.loads(variables["gpuResources"])) == GPU_CLASS_RESOURCES
    assert tuple(json.loads(variables["gpuPrefixes"])) == GPU_CLASS_PREFIXES
# -- the Prometheus a spec may name: the admin's choice -------------------------------------
def test_by_default_no_spec_names_a_prometheus():
    out = refused(spec_of(GLM, **{"planner.prometheusURL": "http://10.0.0.1:8080/internal"}))
    assert list(out) == ["spec.planner.prometheusURL"]
    assert "allowedPrometheusURLs is empty" in out["spec.planner.prometheusURL"]
    assert "operator.prometheusURL" in out["spec.planner.prometheusURL"] or \
        "prometheus.url" in out["spec.planner.prometheusURL"]


ALLOWED = ("http://prom.monitoring:9090", "https://thanos.example/prom/", "vm.monitoring.svc",
           "mimir.monitoring.svc:8080")


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://prom.monitoring:9090", True),
    ("http://prom.monitoring:9090/", True),
    ("http://prom.monitoring:9090/sub/path", True),
    ("http://prom.monitoring:90901", False),  # a prefix is not a boundary
    ("http://prom.monitoring:9090@evil.example/", False),  # userinfo trick
    ("http://prom.monitoring:9090.evil.example/", False),
    ("https://prom.monitoring:9090", False),  # another scheme is another URL
    ("https://thanos.example/prom", True),
    ("https://thanos.example/prom/api", True),
    ("https://thanos.example/promx", False),
    ("http://vm.monitoring.svc", True),
    ("https://vm.monitoring.svc:8428/select/0/prometheus", True),  # a host: any port, any path
    ("http://vm.monitoring.svc.evil.example", False),
    ("http://user@vm.monitoring.svc/", False),
    ("http://mimir.monitoring.svc:8080/prometheus", True),
    ("http://mimir.monitoring.svc:8081/prometheus", False),
    ("http://mimir.monitoring.svc/prometheus", False),  # the entry names its port
    ("http://169.254.169.254/latest/meta-data", False),
    ("http://kubernetes.default.svc/api", False),
])
def test_an_allow_list_admits_urls_below_a_url_and_hosts_with_or_without_a_port(url, allowed):
    policy = TenantPolicy(allowed_prometheus_urls=ALLOWED)
    out = refused(spec_of(GLM, **{"planner.prometheusURL": url}), policy)
    assert ("spec.planner.prometheusURL" not in out) is allowed, out
    if not allowed:
        assert "allowedPrometheusURLs" in out["spec.planner.prometheusURL"]


def test_any_prometheus_only_when_the_admin_says_so():
    policy = TenantPolicy(allowed_prometheus_urls=("*",))
    assert refused(spec_of(GLM, **{"planner.prometheusURL": "http://anything:1"}), policy) == {}


def test_a_spec_without_a_url_is_valid_and_planned_with_the_operators():
    from pdscale.operator.loop.planning import OPERATOR_PROMETHEUS, metrics_source

    spec, _ = validate(spec_of(GLM, **{"planner.mode": "Recommend"}), TenantPolicy())
    assert metrics_source(spec, "http://prom.monitoring:9090", TenantPolicy()) == (
        "http://prom.monitoring:9090", OPERATOR_PROMETHEUS, None)
    url, _, why = metrics_source(spec, None, TenantPolicy())
    assert url is None and "operator.prometheusURL" in why


def test_the_planner_never_queries_a_url_the_policy_refuses():
    # the loop plans specs the reconcile may have refused (admitted before the policy changed)
    from pdscale.operator.loop.planning import metrics_source
    from pdscale.operator.render.checklist import parse

    spec = parse(spec_of(GLM, **{"planner.mode": "Recommend",
                                 "planner.prometheusURL": "http://10.0.0.1:8080/"}))
    url, source, why = metrics_source(spec, "http://prom.monitoring:9090", TenantPolicy())
    assert url is None and source == "spec.planner.prometheusURL" and "refused" in why
    allowed = TenantPolicy(allowed_prometheus_urls=("10.0.0.1:8080",))
    assert metrics_source(spec, None, allowed)[0] == "http://10.0.0.1:8080/"
