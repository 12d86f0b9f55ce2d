"""The P/D pre-launch checklist as validation and derived defaults.

A spec passes ``validate`` or fails with every problem at once, each naming the field path
(``spec.parallelism.prefill.tensorParallelSize``) and the reason. The same messages reach the
user through ``pdscale render`` (exit 2) and the operator's ``SpecValid=False`` condition.

What is *impossible by construction* is not checked here: page size, KV dtype, layout and the
decode allocation policy are single fields rendered onto both roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic

from pdscale.operator.api import multinode
from pdscale.operator.api.names import DELETION_COST_ANNOTATION, DRAINING_ANNOTATION
from pdscale.operator.api.pdcluster import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    EngineKind,
    KVCacheLayout,
    PDClusterSpec,
    RoleParallelism,
    RoleSpec,
    RoutingPolicy,
    TransferBackend,
    is_gpu_class,
)
from pdscale.operator.api.tenant_policy import TenantPolicy, refusals
from pdscale.planner.profile import shipped_profiles
from pdscale.planner.schedule import cron_problem, timezone_problem

from . import router
from .derived import TIMEOUT_MARGIN_PERCENT, Derived, derive, minimum_transfer_timeout_seconds
from .engines import decode_batch_cap, operator_env_names

# Pod annotations the operator owns: the router reads the first, scrapers the next three; the
# drain writes the last two (a spec that set them could pick which pod a scale-down removes,
# or make a pod look drained).
OPERATOR_POD_ANNOTATIONS = ("sglang.ai/bootstrap-port", "prometheus.io/scrape",
                            "prometheus.io/port", "prometheus.io/path",
                            DELETION_COST_ANNOTATION, DRAINING_ANNOTATION)

# Seconds an engine needs after SIGTERM to close sockets and exit, on top of the drain.
SHUTDOWN_SECONDS = 10


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """An invalid PDCluster spec; ``problems`` lists every field at fault."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _loc(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse(raw: dict[str, Any] | None) -> PDClusterSpec:
    """The spec dict (camelCase, as in the resource) -> model, or SpecError naming fields."""
    try:
        # camelCase only, as the CRD names them: the API server prunes a snake_case key, so
        # the model (which takes field names from Python) must not take one from a document
        return PDClusterSpec.model_validate(raw or {}, by_name=False)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            message = err["msg"]
            if err["type"] == "extra_forbidden":
                message = "unknown field"
            problems.append(Problem(_loc(err["loc"]), message))
        raise SpecError(problems) from None


def _check_parallelism(spec: PDClusterSpec, role: str, p: RoleParallelism) -> list[Problem]:
    out = []
    base = f"spec.parallelism.{role}"
    engine = spec.engine.kind
    gpus, how = multinode.gpus_used(engine, p)
    per_node = spec.placement.gpus_per_node
    nodes = multinode.nodes_per_instance(spec, role)
    if nodes == 1 and gpus != per_node:
        out.append(Problem(base, f"uses {gpus} GPUs ({how}) but placement.gpusPerNode is "
                                 f"{per_node}; one instance must occupy exactly one whole node"))
    elif gpus != per_node * nodes:
        out.append(Problem(base, f"uses {gpus} GPUs ({how}) but {role}.nodesPerInstance "
                                 f"{nodes} x placement.gpusPerNode {per_node} = "
                                 f"{per_node * nodes}; one instance must occupy exactly its "
                                 f"whole nodes"))
    tp, dp, ep = p.tensor_parallel_size, p.data_parallel_size, p.expert_parallel_size
    if engine is EngineKind.SGLANG:
        if p.data_parallel_attention and (dp < 2 or tp % dp):
            out.append(Problem(f"{base}.dataParallelSize",
                               f"DP-attention needs dataParallelSize > 1 dividing "
                               f"tensorParallelSize {tp}; got {dp}"))
        if ep > 1 and (ep > tp or tp % ep):
            out.append(Problem(f"{base}.expertParallelSize",
                               f"SGLang expert parallelism must divide tensorParallelSize {tp}; "
                               f"got {ep}"))
    else:
        if p.data_parallel_attention:
            out.append(Problem(f"{base}.dataParallelAttention",
                               "VLLM has no DP-attention switch; use dataParallelSize with "
                               "expertParallelSize instead"))
        if ep not in (1, tp * dp):
            out.append(Problem(f"{base}.expertParallelSize",
                               f"VLLM's --enable-expert-parallel spans tensorParallelSize x "
                               f"dataParallelSize = {tp * dp}; expertParallelSize must be 1 or "
                               f"{tp * dp}, got {ep}"))
    return out


def _check_role(role: str, r: RoleSpec) -> list[Problem]:
    out = []
    base = f"spec.{role}"
    if r.min_replicas > r.max_replicas:
        out.append(Problem(f"{base}.minReplicas",
                           f"{r.min_replicas} exceeds maxReplicas {r.max_replicas}"))
    elif not r.min_replicas <= r.replicas <= r.max_replicas:
        out.append(Problem(f"{base}.replicas",
                           f"{r.replicas} is outside [minReplicas {r.min_replicas}, "
                           f"maxReplicas {r.max_replicas}]"))
    needed = r.pre_stop_drain_seconds + SHUTDOWN_SECONDS
    if r.termination_grace_period_seconds < needed:
        out.append(Problem(f"{base}.terminationGracePeriodSeconds",
                           f"{r.termination_grace_period_seconds} s would kill the pod before "
                           f"it drains; needs at least {needed} s (preStopDrainSeconds "
                           f"{r.pre_stop_drain_seconds} + {SHUTDOWN_SECONDS} s to shut down)"))
    for section, quantities in (("requests", r.resources.requests), ("limits", r.resources.limits)):
        if GPU_RESOURCE in quantities:
            out.append(Problem(f"{base}.resources.{section}",
                               f"{GPU_RESOURCE} is set by placement.gpusPerNode (whole nodes); "
                               f"remove it here"))
        others = sorted(k for k in quantities if k != GPU_RESOURCE and is_gpu_class(k))
        if others:
            out.append(Problem(f"{base}.resources.{section}",
                               f"{', '.join(others)}: accelerators come from placement.gpusPerNode "
                               f"(whole nodes) only"))
    return out


def _check_timeouts(spec: PDClusterSpec) -> list[Problem]:
    out = []
    kvt = spec.kv_transfer
    minimum = minimum_transfer_timeout_seconds(spec)
    why = (f"the slowest prefill ({spec.model.max_context_length_tokens} tokens at "
           f"{kvt.conservative_prefill_tokens_per_second} tokens/s plus "
           f"{TIMEOUT_MARGIN_PERCENT}% margin) needs at least {minimum} s")
    sglang_only = {
        "bootstrapTimeoutSeconds": kvt.bootstrap_timeout_seconds,
        "waitingTimeoutSeconds": kvt.waiting_timeout_seconds,
    }
    for name, value in sglang_only.items():
        if value is None:
            continue
        if spec.engine.kind is not EngineKind.SGLANG:
            out.append(Problem(f"spec.kvTransfer.{name}",
                               "applies to SGLang only; VLLM uses decoderKVBlocksTTLSeconds"))
        elif value < minimum:
            out.append(Problem(f"spec.kvTransfer.{name}", f"{value} s is too short: {why}"))
    ttl = kvt.decoder_kv_blocks_ttl_seconds
    if ttl is not None:
        if spec.engine.kind is not EngineKind.VLLM:
            out.append(Problem("spec.kvTransfer.decoderKVBlocksTTLSeconds",
                               "applies to VLLM NIXL only"))
        elif ttl < minimum:
            out.append(Problem("spec.kvTransfer.decoderKVBlocksTTLSeconds",
                               f"{ttl} s is too short: prefill would free blocks while decode "
                               f"still waits; {why}"))
    return out


def check(spec: PDClusterSpec) -> list[Problem]:
    """Every cross-field rule of the checklist; an empty list means valid. Problems come in
    the order of the spec's sections, so a user fixes them top to bottom."""
    out: list[Problem] = []
    for rules in (_check_topology, _check_engine_pairs, _check_timeouts, _check_ports,
                  _check_roles, _check_placement, _check_model, _check_router, _check_planner):
        out += rules(spec)
    return out


def _check_topology(spec: PDClusterSpec) -> list[Problem]:
    """Complete and compatible on both roles."""
    par = spec.parallelism
    out: list[Problem] = []
    for role in ("prefill", "decode"):
        out += _check_parallelism(spec, role, getattr(par, role))
    out += [Problem(field, message) for field, message in multinode.problems(spec)]
    if par.prefill.tensor_parallel_size > par.decode.tensor_parallel_size:
        out.append(Problem("spec.parallelism.prefill.tensorParallelSize",
                           f"{par.prefill.tensor_parallel_size} exceeds "
                           f"parallelism.decode.tensorParallelSize "
                           f"{par.decode.tensor_parallel_size}; decode cannot take KV from a "
                           f"wider prefill"))
    return out


def _check_engine_pairs(spec: PDClusterSpec) -> list[Problem]:
    """Engine/backend/router pairs we render and have checked, and the shared KV settings the
    engine must support."""
    engine = spec.engine.kind
    out: list[Problem] = []
    if engine is EngineKind.VLLM and spec.kv_transfer.backend is not TransferBackend.NIXL:
        out.append(Problem("spec.kvTransfer.backend",
                           f"{spec.kv_transfer.backend.value} is not supported with VLLM; use NIXL"))
    if spec.router.kind is not None and spec.router.kind.value != engine.value:
        out.append(Problem("spec.router.kind",
                           f"{spec.router.kind.value} router cannot pair {engine.value} workers; "
                           f"use {engine.value} or leave it unset"))
    if engine is EngineKind.VLLM and spec.kv_cache.decode_allocation_policy is not None:
        out.append(Problem("spec.kvCache.decodeAllocationPolicy",
                           "is an SGLang setting; VLLM has no equivalent"))
    if engine is EngineKind.SGLANG and spec.kv_cache.layout is not KVCacheLayout.AUTO:
        out.append(Problem("spec.kvCache.layout",
                           f"SGLang has no KV layout setting; {spec.kv_cache.layout.value} "
                           f"cannot be enforced, use Auto"))
    return out


def _check_ports(spec: PDClusterSpec) -> list[Problem]:
    if spec.engine.kind is EngineKind.SGLANG and spec.kv_transfer.bootstrap_port == spec.engine.port:
        return [Problem("spec.kvTransfer.bootstrapPort",
                        f"{spec.kv_transfer.bootstrap_port} collides with engine.port")]
    return []


def _check_roles(spec: PDClusterSpec) -> list[Problem]:
    out = [p for role in ("prefill", "decode") for p in _check_role(role, getattr(spec, role))]
    try:
        decode_batch_cap(spec)  # the planner and the replay size decode with it
    except ValueError as exc:
        field, _, message = str(exc).partition(": ")
        out.append(Problem(field, message))
    return out


def _check_placement(spec: PDClusterSpec) -> list[Problem]:
    out: list[Problem] = []
    pinned = spec.placement.node_selector.get(GPU_PRODUCT_LABEL)
    if pinned is not None and pinned != spec.placement.gpu_product:
        out.append(Problem(f"spec.placement.nodeSelector.{GPU_PRODUCT_LABEL}",
                           f"{pinned!r} contradicts placement.gpuProduct "
                           f"{spec.placement.gpu_product!r}"))
    taken = sorted(set(spec.placement.pod_annotations) & set(OPERATOR_POD_ANNOTATIONS))
    if taken:
        out.append(Problem("spec.placement.podAnnotations",
                           f"{', '.join(taken)} is set by the operator"))
    if spec.placement.rdma is not None and is_gpu_class(spec.placement.rdma.resource_name):
        out.append(Problem("spec.placement.rdma.resourceName",
                           f"{spec.placement.rdma.resource_name} is an accelerator resource "
                           f"(GPUs come from placement.gpusPerNode), not an RDMA device"))
    return out


def _check_model(spec: PDClusterSpec) -> list[Problem]:
    weights = spec.model.weights
    if weights is None:
        return []
    out: list[Problem] = []
    if (weights.pvc is None) == (weights.host_path is None):
        out.append(Problem("spec.model.weights", "exactly one of pvc or hostPath must be set"))
    mount = weights.mount_path.rstrip("/") + "/"
    if not (spec.model.path + "/").startswith(mount):
        out.append(Problem("spec.model.path",
                           f"{spec.model.path!r} is not under weights.mountPath "
                           f"{weights.mount_path!r}"))
    return out


def _check_router(spec: PDClusterSpec) -> list[Problem]:
    out: list[Problem] = []
    # The router starts with no workers (the operator adds them through its worker API), and
    # sglang-router refuses power-of-two with fewer than two workers at start.
    for role in ("prefill", "decode"):
        if getattr(spec.router, f"{role}_policy") is RoutingPolicy.POWER_OF_TWO:
            out.append(Problem(f"spec.router.{role}Policy",
                               "PowerOfTwo is refused by the router when it starts with fewer "
                               "than 2 workers, and pdscale starts it with none (workers join "
                               "as they become Ready); use RoundRobin, Random or CacheAware"))
    if spec.router.port == spec.router.metrics_port:
        out.append(Problem("spec.router.metricsPort", "collides with router.port"))
    # router.gateway applies to SGLang routers only: a vLLM spec's is ignored, never refused,
    # since the API server stores the CRD's default (SMG) in every PDCluster, vLLM's included
    adm = spec.router.admission
    if adm is not None and adm.enabled and not router.smg(spec):
        out.append(Problem("spec.router.admission", "only smg has prefill admission (leave "
                           "router.gateway unset, or SMG); sglang-router 0.3.2 and vllm-router "
                           "0.1.17 admit everything (set admission.enabled: false or drop it)"))
    return out


def _check_planner(spec: PDClusterSpec) -> list[Problem]:
    planner = spec.planner
    out: list[Problem] = []
    # no URL is no error: the operator's own Prometheus (the admin's) serves the PDClusters
    # that name none, and a planner with neither holds and says so (planning.metrics_source)
    if planner.node_budget is not None and (multinode.is_group(spec, "prefill")
                                            or multinode.is_group(spec, "decode")):
        out += _check_group_budget(spec, planner.node_budget)
    elif planner.node_budget is not None:
        floor = spec.prefill.min_replicas + spec.decode.min_replicas
        now = spec.prefill.replicas + spec.decode.replicas
        if planner.node_budget < floor:
            out.append(Problem("spec.planner.nodeBudget",
                               f"{planner.node_budget} is below prefill.minReplicas + "
                               f"decode.minReplicas = {floor}"))
        elif planner.node_budget < now:
            out.append(Problem("spec.planner.nodeBudget",
                               f"{planner.node_budget} is below prefill.replicas + "
                               f"decode.replicas = {now}"))
    out += _check_schedules(spec)
    if planner.profile is not None and planner.profile not in shipped_profiles():
        # a name, never a path: a tenant must not make the operator open a file of its choice
        out.append(Problem("spec.planner.profile",
                           f"{planner.profile!r} is not a shipped profile; shipped: {shipped_profiles()}"))
    return out


def _check_schedules(spec: PDClusterSpec) -> list[Problem]:
    """Each scheduled window: its cron expressions and time zone as the planner reads them
    (planner/schedule.py; admission checks only their shape), and minimums the fleet can
    hold: within each role's maxReplicas and, alone, within the node budget."""
    out: list[Problem] = []
    kp = multinode.nodes_per_instance(spec, "prefill")
    kd = multinode.nodes_per_instance(spec, "decode")
    budget = spec.planner.node_budget
    for i, s in enumerate(spec.planner.schedules):
        at = f"spec.planner.schedules[{i}]"
        for field, expr in (("start", s.start), ("end", s.end)):
            if (why := cron_problem(expr)) is not None:
                out.append(Problem(f"{at}.{field}", why))
        if (why := timezone_problem(s.timezone)) is not None:
            out.append(Problem(f"{at}.timezone", why))
        for role, low in (("prefill", s.min_prefill_replicas), ("decode", s.min_decode_replicas)):
            high = getattr(spec, role).max_replicas
            if low > high:
                out.append(Problem(f"{at}.min{role.capitalize()}Replicas",
                                   f"{low} exceeds {role}.maxReplicas ({high}): the window "
                                   "could never hold it"))
        nodes = s.min_prefill_replicas * kp + s.min_decode_replicas * kd
        if budget is not None and nodes > budget:
            out.append(Problem(at, f"window {s.name!r} holds {nodes} nodes (prefill "
                               f"{s.min_prefill_replicas} x {kp}, decode {s.min_decode_replicas} "
                               f"x {kd}), above planner.nodeBudget ({budget})"))
    return out


def _check_group_budget(spec: PDClusterSpec, budget: int) -> list[Problem]:
    """The node budget against instances of several nodes: each counts its nodes."""
    kp = multinode.nodes_per_instance(spec, "prefill")
    kd = multinode.nodes_per_instance(spec, "decode")
    how = f"(prefill {kp}, decode {kd} nodes per instance)"
    floor = spec.prefill.min_replicas * kp + spec.decode.min_replicas * kd
    now = spec.prefill.replicas * kp + spec.decode.replicas * kd
    if budget < floor:
        return [Problem("spec.planner.nodeBudget",
                        f"{budget} is below the nodes of prefill.minReplicas and "
                        f"decode.minReplicas instances = {floor} {how}")]
    if budget < now:
        return [Problem("spec.planner.nodeBudget",
                        f"{budget} is below the nodes of prefill.replicas and decode.replicas "
                        f"instances = {now} {how}")]
    return []


def validate(raw: dict[str, Any] | None, policy: TenantPolicy | None = None
             ) -> tuple[PDClusterSpec, Derived]:
    """Parse and check a spec, and with ``policy`` hold it to the admin's tenant policy;
    raise SpecError listing every problem."""
    from pdscale.operator.api.k8s_rules import check_spec  # what Kubernetes refuses in the children


    spec = parse(raw)
    problems = check(spec) + [Problem(field, message) for field, message in check_spec(spec)]
    if policy is not None:
        # the operator's own variables are known only for a spec that renders
        operator_env = operator_env_names(spec, derive(spec)) if not problems else frozenset()
        problems += [Problem(f, why) for f, why in refusals(spec, policy, operator_env)]
    if problems:
        raise SpecError(problems)
    return spec, derive(spec)
