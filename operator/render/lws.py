"""Pure: a role whose instances span several nodes, as a LeaderWorkerSet (LWS v0.7.0).

One LWS group is one instance: ``<role>.nodesPerInstance`` pods, each a whole GPU node pinned
exactly as a Deployment's pod is (the leader's template *is* the Deployment's pod template);
``replicas`` counts groups. What differs from a Deployment, and why:

- only the leader (LWS ``worker-index`` 0) is an instance to the rest of pdscale: it serves the
  router-facing HTTP port (SGLang rank 0 runs the tokenizer and API, prefill's bootstrap
  server; vLLM's head runs the only API server), and only it is registered with the router
  (``leaders_only``). The workers keep no bootstrap port and no annotation a router reads;
  vLLM's ``--headless`` workers serve no HTTP at all, so they carry no probe on it.
- ``restartPolicy: RecreateGroupOnPodRestart`` (LWS's default and recommendation): a failed
  pod or container restart recreates the whole group, so an instance is whole or down (its
  leader not Ready, out of the router), never half-serving.
- rollout one group at a time with no surge, as the Deployment's (a fleet at its node budget
  has no spare nodes to surge a group onto).
- ``exclusiveTopologyKey`` becomes the LWS annotation
  ``leaderworkerset.sigs.k8s.io/exclusive-topology``: a group's pods share one value of that
  node label, and no other group uses it (LWS ``pkg/webhooks/pod_webhook.go``).

Field names and defaults: kubernetes-sigs/lws ``api/leaderworkerset/v1/leaderworkerset_types.go``
(../shared/docs/multinode-and-pools.md section 1).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from pdscale.operator.api import multinode
from pdscale.operator.api.pdcluster import EngineKind, PDClusterSpec

GROUP = "leaderworkerset.x-k8s.io"
API_VERSION = f"{GROUP}/v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"

_PREFIX = "leaderworkerset.sigs.k8s.io"
#: set by LWS on every pod of a group; "0" on the leader (v0.7.0 has no role label)
LABEL_WORKER_INDEX = f"{_PREFIX}/worker-index"
LABEL_SET_NAME = f"{_PREFIX}/name"
LABEL_GROUP_INDEX = f"{_PREFIX}/group-index"
ANNOTATION_EXCLUSIVE_TOPOLOGY = f"{_PREFIX}/exclusive-topology"
#: on every pod of a group (LWS's StatefulSet templates): the group's pod count
ANNOTATION_SIZE = f"{_PREFIX}/size"
LEADER_INDEX = "0"

#: ours, on both templates: which pods of a group serve (kubectl get pods -l ...=leader)
LABEL_GROUP_ROLE = "pdscale.io/group-role"

RESTART_POLICY = "RecreateGroupOnPodRestart"
#: pod annotations only a router-facing pod may carry (the SGLang router's discovery reads
#: the first)
_LEADER_ONLY_ANNOTATIONS = ("sglang.ai/bootstrap-port",)
_SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def is_leader(pod: dict[str, Any]) -> bool:
    """True for a pod that is an instance to the router: a Deployment's pod (no LWS label) or
    an LWS group's leader (worker-index "0")."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index = labels.get(LABEL_WORKER_INDEX)
    return index is None or index == LEADER_INDEX


def leaders_only(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that stand for instances: every pod but an LWS group's workers."""
    return [p for p in pods if is_leader(p)]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _group_key(pod: dict[str, Any]) -> tuple[str, str, str] | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if LABEL_SET_NAME not in labels or LABEL_GROUP_INDEX not in labels:
        return None
    return (str(meta.get("namespace", "")), labels[LABEL_SET_NAME], labels[LABEL_GROUP_INDEX])


def instances(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that stand for instances (``leaders_only``), an LWS group's leader Ready only
    while its group is whole: every one of its ``size`` pods present, not deleting and Ready.
    The leader's own readiness says nothing of the other nodes (LWS starts them after it;
    one deleted is about to take the group down, RecreateGroupOnPodRestart), and the router
    must never list half an instance. A leader of a group not whole is returned as a copy
    whose Ready condition is False (reason ``GroupIncomplete``)."""
    pods = list(pods)
    whole: dict[tuple[str, str, str], int] = {}
    for pod in pods:
        key = _group_key(pod)
        if key is not None and _ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            whole[key] = whole.get(key, 0) + 1
    out = []
    for pod in leaders_only(pods):
        key = _group_key(pod)
        size = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SIZE)
        if key is not None and _ready(pod) and (
                not str(size).isdigit() or whole.get(key, 0) < int(str(size))):
            pod = copy.deepcopy(pod)
            for condition in pod["status"]["conditions"]:
                if condition.get("type") == "Ready":
                    condition.update(status="False", reason="GroupIncomplete")
        out.append(pod)
    return out


def _worker_template(leader: dict[str, Any], spec: PDClusterSpec, role: str) -> dict[str, Any]:
    """The non-leader nodes' pod template: the leader's, without what faces the router."""
    template = copy.deepcopy(leader)
    template["metadata"]["labels"][LABEL_GROUP_ROLE] = "worker"
    annotations = template["metadata"]["annotations"]
    for key in _LEADER_ONLY_ANNOTATIONS:
        annotations.pop(key, None)
    container = template["spec"]["containers"][0]
    container["ports"] = [p for p in container["ports"] if p["name"] != "bootstrap"]
    if spec.engine.kind is EngineKind.VLLM:
        # --headless: engines only, no API server, so nothing to probe, scrape or call
        container["command"] = multinode.vllm_headless_command(spec, role)
        container["ports"] = [p for p in container["ports"] if p["name"] != "http"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container.pop(probe, None)
        for key in _SCRAPE_ANNOTATIONS:
            annotations.pop(key, None)
    # SGLang ranks >= 1 answer /health (and /metrics) on --port from a dummy server: the
    # probes stay, so a hung worker rank fails its group through RecreateGroupOnPodRestart
    return template


def leader_worker_set(deployment: dict[str, Any], spec: PDClusterSpec, role: str) -> dict[str, Any]:
    """The role's LeaderWorkerSet, from the Deployment ``builders.worker_deployment`` renders
    for it (its metadata, replicas and pod template): groups of ``nodesPerInstance`` pods."""
    role_spec = getattr(spec, role)
    leader = copy.deepcopy(deployment["spec"]["template"])
    leader["metadata"]["labels"][LABEL_GROUP_ROLE] = "leader"
    metadata = copy.deepcopy(deployment["metadata"])
    if role_spec.exclusive_topology_key:
        metadata.setdefault("annotations", {})[ANNOTATION_EXCLUSIVE_TOPOLOGY] = (
            role_spec.exclusive_topology_key)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "replicas": deployment["spec"]["replicas"],
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": multinode.nodes_per_instance(spec, role),
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": leader,
                "workerTemplate": _worker_template(leader, spec, role),
            },
        },
    }


def group_service(service: dict[str, Any]) -> dict[str, Any]:
    """The role's headless Service for a LeaderWorkerSet of the same name. LWS gives every pod
    of the set that name as its DNS subdomain and creates a Service of it only where none
    exists (``CreateHeadlessServiceIfNotExists``, publishing addresses of pods not yet Ready):
    ours stands in, so it must publish them too. Otherwise ``LWS_LEADER_ADDRESS`` does not
    resolve until the leader is Ready, and the leader is not Ready until the other nodes
    have reached it there (SGLang's --dist-init-addr, vLLM's --data-parallel-address)."""
    out = copy.deepcopy(service)
    out["spec"]["publishNotReadyAddresses"] = True
    return out


def ready_groups(live: dict[str, Any] | None) -> int:
    """Instances (groups) whose every pod is Ready, from the LWS's status.readyReplicas."""
    status = (live or {}).get("status") or {}
    value = status.get("readyReplicas", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
