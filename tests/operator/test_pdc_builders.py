"""Pure builders: plain dict assertions on what the operator would apply."""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest
import yaml

from pdscale.operator.api import names
from pdscale.operator.api.names import Owner
from pdscale.operator.render import builders, engines, router
from pdscale.operator.render.checklist import validate
from pdscale.testbed.localcluster import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWNER = Owner(name="glm53", namespace="serving", uid="1234-uid")


def _sample(name: str):
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    return validate(doc["spec"])


@pytest.fixture(scope="module")
def sglang_children():
    spec, derived = _sample("sglang-glm-4p8d.yaml")
    return {(c["kind"], c["metadata"]["name"]): c for c in builders.build_children(OWNER, spec, derived)}


@pytest.fixture(scope="module")
def vllm_children():
    spec, derived = _sample("vllm-nixl-2p4d.yaml")
    return {(c["kind"], c["metadata"]["name"]): c for c in builders.build_children(OWNER, spec, derived)}


def _container(children, role):
    return children[("Deployment", f"glm53-{role}")]["spec"]["template"]["spec"]["containers"][0]


def _args(container) -> dict:
    """Flag -> value ('' for switches, a space-joined list for a flag of several values, as
    SGLang's --bucket-* take), checking no flag is given twice."""
    out, args, i = {}, container["args"], 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--") and flag not in out, f"{flag} twice or not a flag"
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        out[flag], i = " ".join(args[i + 1 : j]), j
    return out


def test_sglang_histograms_have_edges_at_the_slos(sglang_children):
    """The planner reads TTFT/TPOT percentiles from the engines' histograms: the SLO is an edge
    and the edges around it are at most a quarter of it apart, on both roles."""
    from pdscale.operator.render.engines import SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS

    sglang_spec, _ = _sample("sglang-glm-4p8d.yaml")
    for role in ("prefill", "decode"):
        args = _args(_container(sglang_children, role))
        for flag, slo in (("--bucket-time-to-first-token", sglang_spec.slo.ttft_seconds),
                          ("--bucket-inter-token-latency", sglang_spec.slo.tpot_seconds)):
            edges = [float(x) for x in args[flag].split()]
            assert edges == sorted(set(edges))
            assert slo in edges
            near = [e for e in edges if 0.5 * slo <= e <= 1.5 * slo]
            assert max(b - a for a, b in itertools.pairwise(near)) <= 0.25 * slo + 1e-9
        ttft = [float(x) for x in args["--bucket-time-to-first-token"].split()]
        assert set(SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS) <= set(ttft)  # the defaults stay


def _env(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_child_is_built_and_owned(sglang_children):
    assert sorted(sglang_children) == [
        ("Deployment", "glm53-decode"), ("Deployment", "glm53-prefill"),
        ("Deployment", "glm53-router"),
        ("NetworkPolicy", "glm53-engines"), ("NetworkPolicy", "glm53-router"),
        ("Service", "glm53-decode"), ("Service", "glm53-prefill"), ("Service", "glm53-router"),
        ("ServiceAccount", "glm53-router"),
    ]
    for child in sglang_children.values():
        assert child["metadata"]["namespace"] == "serving"
        assert child["metadata"]["ownerReferences"] == [{
            "apiVersion": "pdscale.io/v1alpha1", "kind": "PDCluster", "name": "glm53",
            "uid": "1234-uid", "controller": True, "blockOwnerDeletion": True}]
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "pdscale-operator"
        assert child["metadata"]["annotations"]["pdscale.io/applied-hash"]


def test_without_rdma_an_engine_gets_no_added_capability():
    from pdscale.operator.api.names import Owner
    from pdscale.operator.render.builders import build_children
    from pdscale.operator.render.checklist import validate

    spec, derived = validate({
        "model": {"servedName": "llama", "path": "meta/llama"},
        "engine": {"kind": "VLLM", "image": "vllm/vllm-openai:v0.11.0"},
        "kvTransfer": {"backend": "NIXL"}, "router": {"image": "vllm/vllm-router:v0.1.17"}})
    for child in build_children(Owner("l", "ns"), spec, derived):
        if child["kind"] == "Deployment" and child["metadata"]["name"].endswith(("-prefill", "-decode")):
            c = child["spec"]["template"]["spec"]["containers"][0]
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False}


def test_worker_pods_pin_whole_h200_nodes(sglang_children):
    for role, replicas in (("prefill", 4), ("decode", 8)):
        dep = sglang_children[("Deployment", f"glm53-{role}")]
        assert dep["spec"]["replicas"] == replicas
        pod = dep["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        c = pod["containers"][0]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                        "capabilities": {"add": ["IPC_LOCK"]}}
        assert pod["automountServiceAccountToken"] is False  # no API token in an engine pod
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
        assert {"name": "model", "hostPath": {"path": "/raid/models", "type": "Directory"}} in pod["volumes"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
        assert dep["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/instance": "glm53", "pdscale.io/role": role}
        assert dep["spec"]["template"]["metadata"]["labels"]["pdscale.io/role"] == role


def test_drain_settings_per_role(sglang_children):
    prefill = sglang_children[("Deployment", "glm53-prefill")]["spec"]["template"]["spec"]
    decode = sglang_children[("Deployment", "glm53-decode")]["spec"]["template"]["spec"]
    assert prefill["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 120}}}
    assert prefill["terminationGracePeriodSeconds"] == 180
    assert decode["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 600}}}
    assert decode["terminationGracePeriodSeconds"] == 660


def test_startup_probe_covers_a_cold_start(sglang_children):
    c = _container(sglang_children, "prefill")
    startup = c["startupProbe"]
    # warmupSeconds 900, three times for a cold start, checked every 10 s.
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] == 2700
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_sglang_flags_are_identical_on_both_roles_except_the_mode(sglang_children):
    prefill, decode = _args(_container(sglang_children, "prefill")), _args(_container(sglang_children, "decode"))
    assert prefill["--disaggregation-mode"] == "prefill"
    assert decode["--disaggregation-mode"] == "decode"
    for flag, value in {"--page-size": "64", "--kv-cache-dtype": "fp8_e4m3",
                        "--disaggregation-transfer-backend": "mooncake",
                        "--disaggregation-bootstrap-port": "8998", "--tp-size": "8",
                        "--dp-size": "8", "--ep-size": "8", "--enable-dp-attention": "",
                        "--enable-metrics": "", "--context-length": "1048576",
                        "--disaggregation-ib-device": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
                        "--model-path": "/models/GLM-5.3-FP8", "--served-model-name": "glm-5.3"}.items():
        assert prefill[flag] == decode[flag] == value, flag
    assert decode["--max-running-requests"] == "128"
    assert "--max-running-requests" not in prefill


def test_sglang_env_carries_derived_timeouts_and_heartbeat(sglang_children):
    for role in ("prefill", "decode"):
        env = _env(_container(sglang_children, role))
        assert env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "787"
        assert env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "787"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "5"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"
        assert env["SGLANG_WARMUP_TIMEOUT"] == "1800"


def test_prefill_pods_publish_the_bootstrap_port_for_the_router(sglang_children):
    prefill = sglang_children[("Deployment", "glm53-prefill")]["spec"]["template"]["metadata"]
    decode = sglang_children[("Deployment", "glm53-decode")]["spec"]["template"]["metadata"]
    assert prefill["annotations"]["sglang.ai/bootstrap-port"] == "8998"
    assert "sglang.ai/bootstrap-port" not in decode["annotations"]
    svc = sglang_children[("Service", "glm53-prefill")]["spec"]
    assert svc["clusterIP"] == "None"
    assert {"name": "bootstrap", "port": 8998, "targetPort": "bootstrap", "protocol": "TCP"} in svc["ports"]


def test_allocation_policy_is_rendered_on_both_roles():
    raw = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]
    raw["kvCache"]["decodeAllocationPolicy"] = "PrefillComplete"
    spec, derived = validate(raw)
    for role in ("prefill", "decode"):
        c = engines.sglang(spec, derived, role)
        i = c.args.index("--disaggregation-decode-allocation-policy")
        assert c.args[i + 1] == "prefill_complete"


def test_vllm_nixl_settings(vllm_children):
    for role in ("prefill", "decode"):
        c = _container(vllm_children, role)
        assert c["command"] == ["vllm", "serve"]
        assert c["args"][0] == "/models/Llama-3.3-70B-Instruct-FP8"
        args = _args({"args": c["args"][1:]})
        assert json.loads(args["--kv-transfer-config"]) == {
            "kv_connector": "NixlConnector", "kv_role": "kv_both",
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {"decoder_kv_blocks_ttl": 480}}
        assert args["--tensor-parallel-size"] == "8"
        assert args["--block-size"] == "64"
        env = _env(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
        assert env["VLLM_KV_CACHE_LAYOUT"] == "HND"
        assert env["UCX_NET_DEVICES"] == "mlx5_0,mlx5_1"
    pod = vllm_children[("Deployment", "glm53-prefill")]["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "llama70b-weights",
                                                        "readOnly": True}} in pod["volumes"]


def test_a_pdcluster_naming_no_gateway_gets_smg_with_derived_admission(sglang_children):
    """The default SGLang router is smg in PD mode with prefill admission derived from the
    profile and the TTFT target (read back by smg's own parser), and no workers of its own:
    the operator owns the worker list, so a draining pod never stays routable."""
    from smg.launch_router import parse_router_args

    c = sglang_children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python3", "-m", "smg", "launch"]
    parsed = parse_router_args(c["args"])
    assert parsed.pd_disaggregation
    assert not parsed.service_discovery
    assert not parsed.prefill_urls and not parsed.decode_urls and not parsed.worker_urls
    assert parsed.prefill_policy == "cache_aware" and parsed.decode_policy == "round_robin"
    assert parsed.port == 30000
    # the sample: 2 s TTFT, default profile (a full 8,192-token pass 0.394 s), 2 router pods:
    # 2 passes fit in half the target, shared by the 2 pods; 2 s less 0.79 s -> 1 s
    assert parsed.prefill_max_inflight_requests_per_worker == 1
    assert (parsed.prefill_queue_size, parsed.prefill_queue_timeout_secs) == (256, 1)


def test_sglang_router_named_explicitly_starts_in_pd_mode_with_no_admission():
    """sglang-router 0.3.2 stays selectable for older images; it has no admission."""
    from sglang_router.launch_router import parse_router_args

    doc = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    doc["spec"]["router"]["gateway"] = "SGLangRouter"
    spec, derived = validate(doc["spec"])
    children = {(c["kind"], c["metadata"]["name"]): c for c in builders.build_children(OWNER, spec, derived)}
    c = children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python3", "-m", "sglang_router.launch_router"]
    parsed = parse_router_args(c["args"])
    assert parsed.pd_disaggregation and not parsed.service_discovery
    assert not parsed.prefill_urls and not parsed.decode_urls and not parsed.worker_urls
    assert not any(a.startswith("--prefill-max-inflight") for a in c["args"])
    assert "prefillInflightPerWorker" not in derived.as_status()


def test_vllm_router_starts_in_pd_mode_with_its_discovery_and_no_static_workers(vllm_children):
    """vllm-router has no worker API in PD mode: the operator announces workers to its ZMQ
    discovery, which also lets it start with no --prefill/--decode (it refuses otherwise)."""
    from vllm_router.launch_router import parse_router_args

    d = vllm_children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]
    assert d["command"] == ["vllm-router"]
    parsed = parse_router_args(d["args"])
    assert parsed.vllm_pd_disaggregation and parsed.kv_connector == "nixl"
    assert parsed.vllm_discovery_address == "0.0.0.0:30001"
    assert not parsed.service_discovery and not parsed.prefill_urls and not parsed.decode_urls
    assert {"name": "discovery", "containerPort": 30001, "protocol": "TCP"} in d["ports"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_real_router_starts_with_the_rendered_arguments(engine, sglang_children, vllm_children,
                                                            tmp_path):
    """The routers validate their arguments at start (smg and vllm-router refuse flags they do
    not know; vllm-router's PD mode needs workers or its discovery): the program and the
    arguments we render must start the real binary, with no worker at all."""
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    children = sglang_children if engine == "sglang" else vllm_children
    c = children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]
    args = list(c["args"])
    for flag in ("--host", "--prometheus-host"):
        args[args.index(flag) + 1] = "127.0.0.1"
    port = args[args.index("--port") + 1] = str(free_port())
    args[args.index("--prometheus-port") + 1] = str(free_port())
    if "--vllm-discovery-address" in args:
        args[args.index("--vllm-discovery-address") + 1] = f"127.0.0.1:{free_port()}"
    # the rendered program, as the pod runs it: smg (the default SGLang gateway) or vllm-router
    rendered = list(c["command"])
    command = ([sys.executable, *rendered[1:]] if rendered[0] == "python3"
               else [str(pathlib.Path(sys.executable).parent / rendered[0])])
    log = tmp_path / "router.log"
    with open(log, "wb") as out:
        router = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT,
                                  cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        deadline = time.monotonic() + 180  # a wait on a busy machine; a crash fails at once
        while True:
            assert router.poll() is None, f"router exited: {log.read_text(errors='replace')[-500:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers", timeout=1) as r:
                    assert json.loads(r.read())["total"] == 0
                    break
            except OSError:
                assert time.monotonic() < deadline, f"router not answering: {log.read_text()[-500:]}"
                time.sleep(0.2)
    finally:
        router.terminate()
        router.wait(timeout=10)


def test_router_identity_has_no_permissions(sglang_children):
    assert not [k for k in sglang_children if k[0] in ("Role", "RoleBinding")]
    dep = sglang_children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]
    assert dep["serviceAccountName"] == "glm53-router"
    assert ("ServiceAccount", "glm53-router") in sglang_children


def test_vllm_router_command(vllm_children):
    c = vllm_children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["vllm-router"]
    assert c["args"][0] == "--vllm-pd-disaggregation"


@pytest.mark.parametrize("cluster_name", [
    "a" * 253, "x" * 40, "model.v2.prod", "9lives", "glm53",
])
def test_child_names_fit_and_are_deterministic(cluster_name):
    for role in router_roles():
        name = names.child_name(cluster_name, role)
        assert len(name) <= names.CHILD_NAME_MAX_CHARS
        assert len(name) + names.POD_SUFFIX_CHARS <= 63
        assert name == names.child_name(cluster_name, role)
        assert name.endswith(f"-{role}")
        assert name[0].isalpha() and set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert len(names.base_name(cluster_name)) <= 63  # also a label value


def router_roles():
    return ("prefill", "decode", "router")


def test_long_names_with_a_shared_prefix_stay_distinct():
    a, b = "x" * 50 + "-a", "x" * 50 + "-b"
    assert names.child_name(a, "prefill") != names.child_name(b, "prefill")
    assert names.child_name("glm53", "prefill") == "glm53-prefill"


def test_applied_hash_changes_with_the_spec_only():
    spec, derived = _sample("sglang-glm-4p8d.yaml")
    first = builders.build_children(OWNER, spec, derived)
    again = builders.build_children(OWNER, spec, derived)
    assert [c["metadata"]["annotations"] for c in first] == [c["metadata"]["annotations"] for c in again]
    raw = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]
    raw["engine"]["image"] = "lmsysorg/sglang:next"
    spec2, derived2 = validate(raw)
    changed = {c["metadata"]["name"] + c["kind"]: c["metadata"]["annotations"]["pdscale.io/applied-hash"]
               for c in builders.build_children(OWNER, spec2, derived2)}
    before = {c["metadata"]["name"] + c["kind"]: c["metadata"]["annotations"]["pdscale.io/applied-hash"]
              for c in first}
    assert changed["glm53-prefillDeployment"] != before["glm53-prefillDeployment"]
    assert changed["glm53-routerService"] == before["glm53-routerService"]


def test_offline_render_has_no_owner_references():
    spec, derived = _sample("vllm-nixl-2p4d.yaml")
    for child in builders.build_children(Owner("llama70b", "default"), spec, derived):
        assert "ownerReferences" not in child["metadata"]


def test_router_service():
    spec, _ = _sample("sglang-glm-4p8d.yaml")
    svc = router.service(OWNER, spec)
    assert svc["spec"]["selector"] == {"app.kubernetes.io/instance": "glm53", "pdscale.io/role": "router"}
    assert svc["spec"]["ports"][0] == {"name": "http", "port": 30000, "targetPort": "http", "protocol": "TCP"}


def test_pod_annotations_reach_engine_pods_only():
    raw = yaml.safe_load((ROOT / "examples" / "vllm-nixl-2p4d.yaml").read_text())["spec"]
    raw["placement"]["podAnnotations"] = {"pdscale.io/simulated-ready-delay-seconds": "20"}
    spec, derived = validate(raw)
    children = {(c["kind"], c["metadata"]["name"]): c for c in builders.build_children(OWNER, spec, derived)}
    for role in ("prefill", "decode"):
        ann = children[("Deployment", f"glm53-{role}")]["spec"]["template"]["metadata"]["annotations"]
        assert ann["pdscale.io/simulated-ready-delay-seconds"] == "20"
    router_ann = children[("Deployment", "glm53-router")]["spec"]["template"]["metadata"]["annotations"]
    assert "pdscale.io/simulated-ready-delay-seconds" not in router_ann
