"""Pure builders: a validated spec -> the manifests of every child of a PDCluster.

No I/O. The operator applies what ``build_children`` returns; ``pdscale render`` prints it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pdscale.operator.api import multinode, names
from pdscale.operator.api.names import Owner, metadata
from pdscale.operator.api.pdcluster import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    MAX_ROLE_REPLICAS,
    PDClusterSpec,
    PlannerMode,
)
from pdscale.planner.observe import Role

from . import engines, lws, router
from .derived import Derived
from .network import NetworkSettings, network_policies

STARTUP_PROBE_PERIOD_SECONDS = 10
# A cold start (DeepGEMM JIT, empty page cache) can take several times the warm estimate.
STARTUP_ALLOWANCE_FACTOR = 3
MIN_STARTUP_FAILURES = 30


def _probe(path: str, port: str, *, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def engine_probes(spec: PDClusterSpec, role: str) -> dict[str, dict[str, Any]]:
    """Probes on /health, which both engines serve. SGLang answers 503 while starting and
    vLLM refuses connections until loaded, so the startup probe carries the warm-up time and
    liveness only starts afterwards (a loading engine is never killed as dead)."""
    warmup = getattr(spec, role).warmup_seconds
    startup_failures = max(
        MIN_STARTUP_FAILURES,
        math.ceil(warmup * STARTUP_ALLOWANCE_FACTOR / STARTUP_PROBE_PERIOD_SECONDS),
    )
    return {
        "startupProbe": _probe("/health", "http", period=STARTUP_PROBE_PERIOD_SECONDS,
                               timeout=5, failures=startup_failures),
        "readinessProbe": _probe("/health", "http", period=10, timeout=10, failures=3),
        # Generous: SGLang's /health runs a 1-token generation; a busy engine must not be
        # restarted for a slow answer.
        "livenessProbe": _probe("/health", "http", period=30, timeout=30, failures=5),
    }


def unready_allowance_seconds(spec: PDClusterSpec, role: str) -> float:
    """How long an engine pod may stay not Ready before the PDCluster reports it (Degraded):
    the warm-up the planner counted on, times the cold-start allowance."""
    return float(max(30, getattr(spec, role).warmup_seconds * STARTUP_ALLOWANCE_FACTOR))


def _quantity(value: str | int) -> str:
    return str(value)


def engine_resources(spec: PDClusterSpec, role: str) -> dict[str, Any]:
    role_spec = getattr(spec, role)
    limits = {k: _quantity(v) for k, v in role_spec.resources.limits.items()}
    requests = {k: _quantity(v) for k, v in role_spec.resources.requests.items()}
    gpus = str(spec.placement.gpus_per_node)
    limits[GPU_RESOURCE] = gpus
    requests[GPU_RESOURCE] = gpus
    if spec.placement.rdma is not None:
        count = str(spec.placement.rdma.count)
        limits[spec.placement.rdma.resource_name] = count
        requests[spec.placement.rdma.resource_name] = count
    return {"limits": dict(sorted(limits.items())), "requests": dict(sorted(requests.items()))}


def node_selector(spec: PDClusterSpec) -> dict[str, str]:
    return {**spec.placement.node_selector, GPU_PRODUCT_LABEL: spec.placement.gpu_product}


def tolerations(spec: PDClusterSpec) -> list[dict[str, Any]]:
    out = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for t in spec.placement.tolerations:
        out.append(t.model_dump(mode="json", by_alias=True, exclude_none=True))
    return out


def _volumes(spec: PDClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{
        "name": "dshm",
        # NCCL and the engines' multi-process queues live in /dev/shm; the runtime's 64Mi
        # default is far too small for 8 ranks.
        "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(spec.placement.shared_memory_size)},
    }]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    weights = spec.model.weights
    if weights is not None:
        if weights.pvc is not None:
            volumes.append({"name": "model", "persistentVolumeClaim": {
                "claimName": weights.pvc.claim_name, "readOnly": weights.pvc.read_only}})
            read_only = weights.pvc.read_only
        else:
            assert weights.host_path is not None  # checklist: exactly one source
            volumes.append({"name": "model", "hostPath": {
                "path": weights.host_path.path, "type": "Directory"}})
            read_only = True
        mounts.append({"name": "model", "mountPath": weights.mount_path, "readOnly": read_only})
    return volumes, mounts


def worker_deployment(owner: Owner, spec: PDClusterSpec, derived: Derived, role: str,
                      replicas: int | None = None) -> dict[str, Any]:
    """The prefill or decode Deployment: one pod per whole GPU node. `replicas` overrides
    spec.<role>.replicas (the planner's target in Auto mode)."""
    role_spec = getattr(spec, role)
    rendered = engines.render(spec, derived, role)
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image,
        "imagePullPolicy": "IfNotPresent",
        "command": rendered.command,
        "args": rendered.args,
        "env": rendered.env,
        "ports": [
            {"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"},
            *rendered.ports,
        ],
        "resources": engine_resources(spec, role),
        "volumeMounts": mounts,
        **engine_probes(spec, role),
    }
    # A tenant's engine gets no privilege beyond the runtime's defaults: no escalation (setuid),
    # not privileged, and one added capability only where RDMA needs it. (Dropping the runtime's
    # default capabilities too is not done: untested against real NCCL/NIXL engines here.)
    container["securityContext"] = {"allowPrivilegeEscalation": False, "privileged": False}
    if spec.placement.rdma is not None:
        # RDMA memory registration pins pages: needs IPC_LOCK (unlimited memlock).
        container["securityContext"]["capabilities"] = {"add": ["IPC_LOCK"]}
    if role_spec.pre_stop_drain_seconds > 0:
        # Deletion removes the pod from the router's discovery at once; the sleep keeps the
        # engine serving its in-flight requests until they finish, then SIGTERM follows.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": role_spec.pre_stop_drain_seconds}}}
    annotations = {
        **spec.placement.pod_annotations,
        **rendered.annotations,
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(spec.engine.port),
        "prometheus.io/path": "/metrics",
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "nodeSelector": node_selector(spec),
        "tolerations": tolerations(spec),
        "terminationGracePeriodSeconds": role_spec.termination_grace_period_seconds,
        # Service links would inject an env var per Service in the namespace into the engine.
        "enableServiceLinks": False,
        # Engines never call the API server: no token in a pod whose image the tenant chose.
        "automountServiceAccountToken": False,
    }
    if spec.placement.affinity:
        pod_spec["affinity"] = spec.placement.affinity
    name = names.child_name(owner.name, role)
    progress_deadline = max(600, 2 * role_spec.warmup_seconds * STARTUP_ALLOWANCE_FACTOR)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, role),
        "spec": {
            "replicas": role_spec.replicas if replicas is None else replicas,
            "selector": {"matchLabels": names.selector_labels(owner.name, role)},
            # A fleet at its node budget has no spare 8-GPU node to surge onto: replace one
            # instance at a time instead of stalling the rollout on a Pending pod.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": progress_deadline,
            "template": {
                "metadata": {"labels": names.labels(owner.name, role), "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def worker_service(owner: Owner, spec: PDClusterSpec, role: str) -> dict[str, Any]:
    """Headless Service per role: stable DNS for the pods, and what monitoring selects."""
    ports = [{"name": "http", "port": spec.engine.port, "targetPort": "http", "protocol": "TCP"}]
    if role == "prefill" and spec.engine.kind.value == "SGLang":
        port = spec.kv_transfer.bootstrap_port
        ports.append({"name": "bootstrap", "port": port, "targetPort": "bootstrap", "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, names.child_name(owner.name, role), role),
        "spec": {
            "clusterIP": "None",
            "selector": names.selector_labels(owner.name, role),
            "ports": ports,
        },
    }


def applied_hash(manifest: dict[str, Any]) -> str:
    """Stable digest of a manifest, stored on the child so that a later reconcile can tell
    "unchanged" without a write."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stamp(manifest: dict[str, Any]) -> dict[str, Any]:
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations.pop(names.ANNOTATION_APPLIED_HASH, None)
    annotations[names.ANNOTATION_APPLIED_HASH] = applied_hash(manifest)
    return manifest


def planned_replicas(spec: PDClusterSpec, status: dict[str, Any] | None) -> dict[str, int]:
    """Replicas per role to run. In planner mode Auto, the planner's target
    (status.planner.replicas, written by the planner loop) wins over spec.<role>.replicas,
    raised to minReplicas (more instances never drop a request); otherwise the spec's
    replicas. A lowered maxReplicas is not applied here: the ReplicaSet would remove pods
    of its choosing, mid-request. The planner's next decision respects it, and the loop
    removes the excess through drains."""
    out = {role.value: getattr(spec, role).replicas for role in Role}
    if spec.planner.mode is not PlannerMode.AUTO:
        return out
    planned = ((status or {}).get("planner") or {}).get("replicas") or {}
    for role in Role:
        value = planned.get(role.value)
        if isinstance(value, int) and not isinstance(value, bool):
            r = getattr(spec, role)
            # the CRD's cap: status is no spec, nothing there may pass what a spec may not
            out[role.value] = min(max(r.min_replicas, value), MAX_ROLE_REPLICAS)
    return out


def build_children(owner: Owner, spec: PDClusterSpec, derived: Derived,
                   replicas: dict[str, int] | None = None,
                   network: NetworkSettings | None = None) -> list[dict[str, Any]]:
    """Every child of the PDCluster, in apply order: identity and RBAC for the router, the
    worker Services and Deployments, then the router (which needs workers to be useful)."""
    replicas = replicas or {}
    # who may reach the pods comes first: no pod of ours ever runs unfenced
    children: list[dict[str, Any]] = [*network_policies(owner, spec, network or NetworkSettings()),
                                      *router.rbac(owner, spec)]
    for role in Role:  # manifests carry plain strings (YAML has no enum)
        service = worker_service(owner, spec, role.value)
        if multinode.is_group(spec, role.value):
            service = lws.group_service(service)
        children.append(service)
        deployment = worker_deployment(owner, spec, derived, role.value, replicas.get(role))
        if multinode.is_group(spec, role.value):  # instances of several nodes: LWS groups
            deployment = lws.leader_worker_set(deployment, spec, role.value)
        children.append(deployment)
    children.append(router.service(owner, spec))
    children.append(router.deployment(owner, spec))
    return [stamp(c) for c in children]


# -- the planner's memory -----------------------------------------------------------------------
#: the key under which the planner's memory (planning.history_to_json) is kept
PLANNER_MEMORY_KEY = "history.json"


def planner_memory_name(cluster_name: str) -> str:
    """``<name>-planner``: one ConfigMap per PDCluster."""
    return f"{names.base_name(cluster_name)}-planner"


def planner_memory(owner: Owner, history_json: str) -> dict[str, Any]:
    """The ConfigMap that keeps the planner's memory across operator restarts. Owned by the
    PDCluster (it goes with it); not a ``build_children`` child: the planner loop, not the
    reconcile, writes it, once per planning interval."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": planner_memory_name(owner.name),
            "namespace": owner.namespace,
            "labels": {names.LABEL_MANAGED_BY: names.MANAGER,
                       names.LABEL_INSTANCE: names.base_name(owner.name)},
            "ownerReferences": names.owner_references(owner),
        },
        "data": {PLANNER_MEMORY_KEY: history_json},
    }
