"""Differential: the chart's admission policy against the operator's tenant policy.

The tenant policy is enforced twice with rules written twice: in CEL by the chart's
ValidatingAdmissionPolicy (templates/admission-policy.yaml, evaluated by a real API server)
and in Python by the operator (operator/api/tenant_policy.py, plus the checklist's accelerator
rules). This fuzzes PDClusters on the fields those rules read (images at and past a prefix's
boundary, host paths with trailing, doubled and dotted slashes and ``/`` itself, empty and
non-empty affinity and node selectors, network and other annotations, hub models with
remote code, writable and foreign weight claims, accelerator resources, extra arguments,
environment, tolerations) under three policies (the chart's default, a strict one, an open
one), and counts the documents on which the two disagree.

Each document is created with ``dryRun=All`` in a namespace whose binding selects one policy:
admission refuses it (the policy's Forbidden) or not; the operator refuses it when its
``refusals`` or its accelerator checks name a field. Documents the spec model refuses are
not compared (counted as ``schema``); one the API server refuses for another reason than the
policy is counted as ``server-schema`` (expected 0). What is left out on purpose: the
environment names the operator renders itself (the operator refuses them, admission cannot
know them: they depend on the rendering).

    .venv/bin/python bench/admission_diff.py [--count 20000] [--seed 1] [--threads 4]
                                             [--out out/admission_diff.json]

It starts a local control plane (or uses $KUBECONFIG) and needs helm (e2e/cluster/build).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from pdscale.operator.api import crd
from pdscale.operator.api.pdcluster import GPU_PRODUCT_LABEL, GROUP, PLURAL, VERSION, PDClusterSpec
from pdscale.operator.api.tenant_policy import TenantPolicy, refusals
from pdscale.operator.render import checklist
from pdscale.testbed.localcluster import DEFAULT_BIN_DIR, LocalCluster
from pdscale.testbed.nodes import api_client

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "pdscale"
HELM = DEFAULT_BIN_DIR / "helm"

#: the tenantPolicy values of each policy compared (merged over the chart's defaults)
POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "strict": {
        "allowedImagePrefixes": ["lmsysorg/sglang", "docker.io/lmsysorg/sglang:", "registry.corp.example",
                                 "vllm/vllm-openai:", "vllm/vllm-router@", "registry.other.example/"],
        "allowedHostPathPrefixes": ["/models/", "/raid/models"],
        "allowExtraArgs": False,
        "reservedEnvNames": ["NCCL_DEBUG"],
        "allowedPodAnnotationKeys": ["team", "corp.example/", "k8s.v1.cni.cncf.io/networks"],
        "allowedTolerationKeys": ["dedicated"],
        "allowAffinity": False,
        "allowedWeightsClaims": ["weights", "llama70b-weights"],
    },
    "open": {
        "allowedImagePrefixes": ["*"],
        "allowedHostPathPrefixes": ["/"],
        "allowEnv": False,
        "allowPodAnnotations": False,
        "allowTrustRemoteCode": True,
        "allowWritableWeights": True,
    },
}

# ---- the generator ---------------------------------------------------------------------------

IMAGES = ["lmsysorg/sglang:v0.5.6-cu129", "lmsysorg/sglang", "lmsysorg/sglangx:1", "lmsysorg/sglang@sha256:0a",
          "docker.io/lmsysorg/sglang:v1", "docker.io/lmsysorg/sglang", "vllm/vllm-openai:v0.11.0",
          "vllm/vllm-openai", "vllm/vllm-router:v1", "vllm/vllm-router@sha256:1", "vllm/vllm-routerx",
          "registry.corp.example/sglang:1", "registry.corp.example", "registry.corp.example:5000/x:1",
          "registry.corp.example@sha256:00", "registry.corp.example.attacker.io/x:1",
          "registry.corp.examplex/y", "registry.other.example/a", "registry.other.example",
          "registry.other.examplex/a", "evil.example/miner:1"]
HOST_PATHS = ["/", "/models", "/models/", "/models//", "/models/x", "/models/x/", "/models/./x",
              "/models/.", "//models", "/raid/models", "/raid/models/", "/raid/modelsx", "/etc",
              "/models/x//y", "/raid//models", "/raid/models/a/b/", "/modelsx", "/x/models"]
CLAIMS = ["weights", "llama70b-weights", "someone-elses"]
AFFINITIES: list[Any] = [{}, {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
    {"podAntiAffinity": {}}]
NODE_SELECTORS: list[dict[str, str]] = [{}, {"kubernetes.io/hostname": "n1"},
                                        {GPU_PRODUCT_LABEL: "NVIDIA-H200"}]
ANNOTATION_KEYS = ["team", "example.com/x", "corp.example/a", "k8s.v1.cni.cncf.io/networks",
                   "k8s.v1.cni.cncf.io/other", "cni.projectcalico.org/ipAddrs", "v1.multus-cni.io/default-network",
                   "kubernetes.io/egress-bandwidth", "kubernetes.io/ingress-bandwidth", "k8s.ovn.org/x",
                   "network.cilium.io/y", "io.cilium/z", "kubernetes.io/egress-bandwidthx", "corp.examplex/a"]
RESOURCES = ["rdma/ib", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "nvidia.com/gpu.shared",
             "gpu.intel.com/i915", "rdma/hca_shared_devices_a", "nvidia.com/hostdev", "amd.com/gpux",
             "habana.ai/gaudi", "aws.amazon.com/neuroncore", "google.com/tpu"]
TOLERATION_KEYS: list[Any] = ["nvidia.com/gpu", "dedicated", None, "", "other"]


def examples() -> list[dict[str, Any]]:
    out = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        # no prometheusURL: the operator's own serves, and the allow-list's rule has its own
        # differential (tests/chart/test_chart.py, every Prometheus URL)
        out.append(doc)
    return out


def _image(rng: random.Random, spec: dict[str, Any]) -> None:
    spec[rng.choice(["engine", "router"])]["image"] = rng.choice(IMAGES)


def _host_path(rng: random.Random, spec: dict[str, Any]) -> None:
    spec["model"]["weights"] = {"hostPath": {"path": rng.choice(HOST_PATHS)}, "mountPath": "/models"}


def _pvc(rng: random.Random, spec: dict[str, Any]) -> None:
    pvc: dict[str, Any] = {"claimName": rng.choice(CLAIMS)}
    if rng.random() < 0.6:
        pvc["readOnly"] = rng.random() < 0.5
    spec["model"]["weights"] = {"pvc": pvc, "mountPath": "/models"}


def _hub(rng: random.Random, spec: dict[str, Any]) -> None:
    spec["model"].pop("weights", None)
    spec["model"]["path"] = "some-org/some-model"


def _remote_code(rng: random.Random, spec: dict[str, Any]) -> None:
    spec["model"]["trustRemoteCode"] = rng.random() < 0.7


def _affinity(rng: random.Random, spec: dict[str, Any]) -> None:
    spec.setdefault("placement", {})["affinity"] = copy.deepcopy(rng.choice(AFFINITIES))


def _node_selector(rng: random.Random, spec: dict[str, Any]) -> None:
    spec.setdefault("placement", {})["nodeSelector"] = dict(rng.choice(NODE_SELECTORS))


def _annotations(rng: random.Random, spec: dict[str, Any]) -> None:
    keys = rng.sample(ANNOTATION_KEYS, rng.randint(0, 3))
    spec.setdefault("placement", {})["podAnnotations"] = {k: "v" for k in keys}


def _rdma(rng: random.Random, spec: dict[str, Any]) -> None:
    spec.setdefault("placement", {})["rdma"] = {"resourceName": rng.choice(RESOURCES), "count": 1}


def _resources(rng: random.Random, spec: dict[str, Any]) -> None:
    role = spec.setdefault(rng.choice(["prefill", "decode"]), {})
    section = rng.choice(["requests", "limits"])
    key = rng.choice(["cpu", "memory", *RESOURCES])
    role.setdefault("resources", {}).setdefault(section, {})[key] = "1"


def _args(rng: random.Random, spec: dict[str, Any]) -> None:
    spec.setdefault(rng.choice(["engine", "prefill", "decode", "router"]), {})["extraArgs"] = (
        rng.choice([[], ["--log-level", "info"]]))


def _env(rng: random.Random, spec: dict[str, Any]) -> None:
    spec.setdefault(rng.choice(["engine", "prefill", "decode"]), {})["env"] = rng.choice(
        [[], [{"name": "FOO", "value": "1"}], [{"name": "NCCL_DEBUG", "value": "INFO"}]])


def _tolerations(rng: random.Random, spec: dict[str, Any]) -> None:
    key = rng.choice(TOLERATION_KEYS)
    toleration: dict[str, Any] = {"operator": "Exists"}
    if key is not None:
        toleration["key"] = key
    spec.setdefault("placement", {})["tolerations"] = rng.choice([[], [toleration]])


MUTATIONS = [_image, _host_path, _pvc, _hub, _remote_code, _affinity, _node_selector, _annotations,
             _rdma, _resources, _args, _env, _tolerations]


def generate(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    bases = examples()
    docs = []
    for i in range(count):
        doc = copy.deepcopy(rng.choice(bases))
        doc["metadata"] = {"name": f"d{i}"}
        for mutate in rng.sample(MUTATIONS, rng.randint(1, 4)):
            mutate(rng, doc["spec"])
        docs.append(doc)
    return docs


# ---- the two verdicts ------------------------------------------------------------------------

def _gpu_fields(spec: PDClusterSpec) -> list[str]:
    """The checklist's accelerator refusals (the admission policy carries them too)."""
    return [p.field for p in checklist.check(spec)
            if p.field == "spec.placement.rdma.resourceName"
            or (".resources." in p.field and ("accelerator" in p.message or "nvidia.com/gpu" in p.message))]


def operator_verdict(doc: dict[str, Any], policy: TenantPolicy) -> list[str] | None:
    """The fields the operator refuses (empty: accepted); None when the spec model refuses it."""
    try:
        spec = PDClusterSpec.model_validate(doc["spec"])
    except ValueError:
        return None
    return sorted({f for f, _ in refusals(spec, policy)} | set(_gpu_fields(spec)))


def admission_verdict(custom: client.CustomObjectsApi, namespace: str, doc: dict[str, Any]) -> str:
    """'accepted', 'policy' (the tenant policy refused it) or 'schema: ...' (anything else)."""
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc, dry_run="All")
    except ApiException as exc:
        body = exc.body or ""
        if "ValidatingAdmissionPolicy" in body:
            return "policy"
        return f"schema: HTTP {exc.status} {body[:300]}"
    return "accepted"


# ---- the cluster -----------------------------------------------------------------------------

def chart_policy(name: str, overrides: dict[str, Any], namespace: str) -> tuple[dict, dict]:
    """The chart's ValidatingAdmissionPolicy and binding for ``overrides``, renamed for
    ``name`` and bound to ``namespace`` only."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"tenantPolicy": overrides}, f)
        values = f.name
    try:
        out = subprocess.run([str(HELM), "template", "t", str(CHART), "-n", "pdscale-system", "-f", values,
                              "--kube-version", "1.34.4"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(values)
    docs = [d for d in yaml.safe_load_all(out) if d]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    full = f"diff-{name}-{namespace}"
    policy["metadata"] = {"name": full}
    binding["metadata"] = {"name": full}
    binding["spec"]["policyName"] = full
    binding["spec"]["matchResources"] = {"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    return policy, binding


def install(api: client.ApiClient, run: str) -> dict[str, str]:
    """The CRD, and per policy a namespace with the chart's policy bound there; returns the
    namespace of each policy once each policy refuses a probe there."""
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(crd.build_crd())
    except ApiException as exc:
        if exc.status != 409:
            raise
        live = ext.read_custom_resource_definition(crd.CRD_NAME)
        body = crd.build_crd()
        body["metadata"]["resourceVersion"] = live.metadata.resource_version
        ext.replace_custom_resource_definition(crd.CRD_NAME, body)
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    namespaces = {}
    for name, overrides in POLICIES.items():
        ns = f"diff-{name}-{run}"
        core.create_namespace({"metadata": {"name": ns}})
        policy, binding = chart_policy(name, overrides, ns)
        admission.create_validating_admission_policy(policy)
        admission.create_validating_admission_policy_binding(binding)
        namespaces[name] = ns
    custom = client.CustomObjectsApi(api)
    probe = examples()[0]
    probe["metadata"] = {"name": "probe"}
    probe["spec"]["engine"]["image"] = "evil.example/miner:1"
    deadline = time.monotonic() + 120
    for name, ns in namespaces.items():
        while admission_verdict(custom, ns, probe) != "policy":
            if time.monotonic() > deadline:
                raise RuntimeError(f"policy {name} not in force in {ns}")
            time.sleep(0.5)
    return namespaces


def uninstall(api: client.ApiClient, namespaces: dict[str, str]) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for name, ns in namespaces.items():
        for delete in (admission.delete_validating_admission_policy_binding,
                       admission.delete_validating_admission_policy):
            try:
                delete(f"diff-{name}-{ns}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        client.CoreV1Api(api).delete_namespace(ns, propagation_policy="Background")


def run(count: int, seed: int, threads: int, api: client.ApiClient) -> dict[str, Any]:
    namespaces = install(api, uuid.uuid4().hex[:6])
    try:
        return _compare(count, seed, threads, api, namespaces)
    finally:
        uninstall(api, namespaces)


def _compare(count: int, seed: int, threads: int, api: client.ApiClient,
             namespaces: dict[str, str]) -> dict[str, Any]:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["tenantPolicy"]
    policies = {name: TenantPolicy.from_mapping({**defaults, **o}) for name, o in POLICIES.items()}
    names = list(POLICIES)
    docs = generate(count, seed)
    custom = client.CustomObjectsApi(api)
    counts: collections.Counter[str] = collections.Counter()
    disagreements: list[dict[str, Any]] = []
    server_schema: list[dict[str, Any]] = []

    def one(i: int) -> tuple[int, str, list[str] | None, str]:
        which = names[i % len(names)]
        doc = docs[i]
        said = operator_verdict(doc, policies[which])
        if said is None:
            return i, which, None, ""
        return i, which, said, admission_verdict(custom, namespaces[which], doc)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for i, which, said, admitted in pool.map(one, range(count)):
            if said is None:
                counts["schema"] += 1
                continue
            if admitted.startswith("schema"):
                counts["server-schema"] += 1
                server_schema.append({"policy": which, "doc": docs[i], "server": admitted})
                continue
            operator_refuses, admission_refuses = bool(said), admitted == "policy"
            counts[f"{which}:{'refused' if operator_refuses else 'accepted'}"] += 1
            if operator_refuses != admission_refuses:
                disagreements.append({"policy": which, "operator": said, "admission": admitted,
                                      "spec": docs[i]["spec"]})
    return {"count": count, "seed": seed, "seconds": round(time.monotonic() - started, 1),
            "compared": count - counts["schema"] - counts["server-schema"],
            "disagreements": len(disagreements), "outcomes": dict(sorted(counts.items())),
            "examples": disagreements[:20], "server_schema_examples": server_schema[:5]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "out" / "admission_diff.json")
    args = parser.parse_args(argv)
    existing = os.environ.get("KUBECONFIG")
    local = None
    if existing:
        api = api_client(pathlib.Path(existing))
    else:
        local = LocalCluster(workdir=pathlib.Path(tempfile.mkdtemp(prefix="admission-diff-")))
        local.start()
        api = api_client(local.kubeconfig)
    try:
        result = run(args.count, args.seed, args.threads, api)
    finally:
        if local is not None:
            local.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if "examples" not in k}, indent=1))
    for example in result["examples"][:5]:
        print(json.dumps(example)[:600], file=sys.stderr)
    return 0 if result["disagreements"] == 0 and not result["server_schema_examples"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
