"""The P/D router: its Deployment, Service and identity.

The router starts with no workers; the operator keeps its worker list equal to the Ready,
non-draining engine pods (workerlist.py): through the SGLang router's ``/workers`` API, or
by announcing them to the vLLM router's ZMQ discovery (vllm_discovery.py). Not the
router's own Kubernetes discovery: it drops a worker only when its pod goes away, so a pod
could not leave the router before its drain, and the release order (router first, then the
pod) could not hold. A router with no API access also needs no RBAC of its own.
"""

from __future__ import annotations

from typing import Any

from pdscale.operator.api import names
from pdscale.operator.api.names import Owner, metadata
from pdscale.operator.api.pdcluster import (
    PDClusterSpec,
    RouterKind,
    RouterSpec,
    RoutingPolicy,
    SGLangGateway,
)
from pdscale.planner.profile import Profile

from .admission import Admission
from .admission import derive as derive_admission

_POLICY = {
    RoutingPolicy.CACHE_AWARE: "cache_aware",
    RoutingPolicy.POWER_OF_TWO: "power_of_two",
    RoutingPolicy.ROUND_ROBIN: "round_robin",
    RoutingPolicy.RANDOM: "random",
}


def prefill_choice(spec: PDClusterSpec) -> RoutingPolicy:
    """How the rendered router really picks a PD prefill: its ``prefillPolicy``, except that
    sglang-router 0.3.2 (router.gateway SGLangRouter) picks at random under CacheAware, because its PD
    prefill policy never gets a prefix tree (tests/loop/test_router_prefill_tree.py). smg
    follows the prefix; vllm-router is taken at its policy's word (not observed). A spec
    without a router section (a replay of the CRD's defaults) has the default router: smg,
    cache-aware."""
    r: RouterSpec | None = getattr(spec, "router", None)
    if r is None:
        return RoutingPolicy.CACHE_AWARE
    if (r.prefill_policy is RoutingPolicy.CACHE_AWARE and kind(spec) is RouterKind.SGLANG
            and r.gateway is SGLangGateway.SGLANG_ROUTER):
        return RoutingPolicy.RANDOM
    return r.prefill_policy


def kind(spec: PDClusterSpec) -> RouterKind:
    return spec.router.kind or RouterKind(spec.engine.kind.value)


def smg(spec: PDClusterSpec) -> bool:
    """The router pod runs the smg gateway (an SGLang router whose readiness needs workers)."""
    return kind(spec) is RouterKind.SGLANG and spec.router.gateway is SGLangGateway.SMG


def args(spec: PDClusterSpec, profile: Profile | None = None) -> tuple[list[str], list[str]]:
    """(command, args) of the router container; ``profile`` prices the derived admission
    (None: the spec's shipped profile, admission.spec_profile)."""
    r = spec.router
    common = [
        "--host", "0.0.0.0",
        "--port", str(r.port),
        "--prefill-policy", _POLICY[r.prefill_policy],
        "--decode-policy", _POLICY[r.decode_policy],
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(r.metrics_port),
    ]
    if smg(spec):
        # the same flags as sglang-router (smg kept its launcher's names); pdscale's drain
        # waits for the engine itself, and the operator registers each worker with no drain
        # settle time (routersync.py, docs/routers.md: smg's overload veto)
        command = ["python3", "-m", "smg", "launch"]
        mode = ["--pd-disaggregation", *admission_args(admission(spec, profile))]
    elif kind(spec) is RouterKind.SGLANG:
        command = ["python3", "-m", "sglang_router.launch_router"]
        mode = ["--pd-disaggregation"]
    else:
        # vllm-router has no worker API in PD mode and will not start without static workers
        # unless its ZMQ discovery runs: the operator announces the workers there.
        command = ["vllm-router"]
        mode = ["--vllm-pd-disaggregation",
                "--vllm-discovery-address", f"0.0.0.0:{r.discovery_port}",
                "--kv-connector", "nixl"]
    return command, [*mode, *common, *r.extra_args]


def admission(spec: PDClusterSpec, profile: Profile | None = None) -> Admission | None:
    """The prefill admission the router is rendered with (None: it admits everything): on by
    default in front of smg, derived from the profile and the TTFT target (admission.py)."""
    return derive_admission(spec, profile, smg=smg(spec))


def admission_args(adm: Admission | None) -> list[str]:
    """smg's prefill admission flags (none when admission is off)."""
    if adm is None:
        return []
    return ["--prefill-max-inflight-requests-per-worker", str(adm.prefill_inflight_per_worker),
            "--prefill-queue-size", str(adm.queue_size),
            "--prefill-queue-timeout-secs", str(adm.queue_timeout_seconds)]


def gateway_note(spec: PDClusterSpec, profile: Profile | None = None) -> str:
    """One line: which router program is rendered and why, and its admission."""
    if kind(spec) is RouterKind.VLLM:
        return "router: vllm-router (engine.kind VLLM; smg is not offered for vLLM yet), no admission"
    explicit = "router.gateway" in spec.router.model_fields_set
    if smg(spec):
        why = "router.gateway SMG" if explicit else "the default gateway (router.gateway unset)"
        adm = admission(spec, profile)
        how = ("admission off (router.admission.enabled false)" if adm is None
               else f"admission {adm.prefill_inflight_per_worker} per prefill, queue "
                    f"{adm.queue_size}, timeout {adm.queue_timeout_seconds} s; {adm.reason}")
        return f"router: smg ({why}); {how}"
    return ("router: sglang-router 0.3.2 (router.gateway SGLangRouter): PD prefills at random, "
            "no admission")


def rbac(owner: Owner, spec: PDClusterSpec) -> list[dict[str, Any]]:
    """The router's own identity: a ServiceAccount with no permissions (it reads no API)."""
    name = names.child_name(owner.name, "router")
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(owner, name, "router")}]


def deployment(owner: Owner, spec: PDClusterSpec) -> dict[str, Any]:
    r = spec.router
    name = names.child_name(owner.name, "router")
    command, router_args = args(spec)
    container = {
        "name": "router",
        "image": r.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": router_args,
        "ports": [
            {"name": "http", "containerPort": r.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": r.metrics_port, "protocol": "TCP"},
            *([{"name": "discovery", "containerPort": r.discovery_port, "protocol": "TCP"}]
              if kind(spec) is RouterKind.VLLM else []),
        ],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http", "scheme": "HTTP"},
                           "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3,
                           "successThreshold": 1},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http", "scheme": "HTTP"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3,
                          "successThreshold": 1},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, "router"),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": names.selector_labels(owner.name, "router")},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": names.labels(owner.name, "router"),
                    "annotations": {"prometheus.io/scrape": "true",
                                    "prometheus.io/port": str(r.metrics_port)},
                },
                "spec": {
                    "serviceAccountName": name,
                    "containers": [container],
                    "enableServiceLinks": False,
                },
            },
        },
    }


def service(owner: Owner, spec: PDClusterSpec) -> dict[str, Any]:
    """The Service clients call: the model's OpenAI-compatible endpoint."""
    r = spec.router
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, names.child_name(owner.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(owner.name, "router"),
            "ports": [
                {"name": "http", "port": r.port, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": r.metrics_port, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
