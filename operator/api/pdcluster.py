"""The PDCluster spec: one typed model that holds every default and every field-level rule.

The CRD's OpenAPI schema is generated from these classes (``crd.py``), so a default or a
bound lives here and only here. Cross-field rules (the P/D checklist) are in ``checklist.py``.

Conventions (Kubernetes API conventions): camelCase field names, units in names
(``...Seconds``, ``...Tokens``), integers rather than floats, CamelCase enum values.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "pdscale.io"
VERSION = "v1alpha1"
KIND = "PDCluster"
PLURAL = "pdclusters"
SINGULAR = "pdcluster"
SHORT_NAMES = ["pdc"]

DEFAULT_GPU_PRODUCT = "NVIDIA-H200"
#: most whole nodes one instance may span (the largest published wide-EP decode is 18)
MAX_NODES_PER_INSTANCE = 32
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
#: accelerator resources by exact name, and by prefix (MIG slices, renamed shared GPUs, other
#: vendors): none of them is an RDMA device, and none may be requested beside the whole-node
#: GPUs (``is_gpu_class``; the admission policy carries the same two lists)
GPU_CLASS_RESOURCES = (GPU_RESOURCE, "amd.com/gpu", "habana.ai/gaudi", "google.com/tpu")
GPU_CLASS_PREFIXES = ("nvidia.com/mig-", "nvidia.com/gpu.", "nvidia.com/gpu-", "amd.com/gpu-",
                      "amd.com/gpu.", "gpu.intel.com/", "aws.amazon.com/neuron")


def is_gpu_class(resource: str) -> bool:
    """An accelerator resource name (see GPU_CLASS_RESOURCES, GPU_CLASS_PREFIXES)."""
    return resource in GPU_CLASS_RESOURCES or resource.startswith(GPU_CLASS_PREFIXES)

# A Kubernetes quantity, as the API server's own pattern for resource.Quantity.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


class _Model(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected (the API
    server prunes them anyway; in ``pdscale render`` a typo must not pass silently)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
    )


# ---- enums (CamelCase values) -------------------------------------------------------------


class EngineKind(StrEnum):
    SGLANG = "SGLang"
    VLLM = "VLLM"


class TransferBackend(StrEnum):
    MOONCAKE = "Mooncake"
    NIXL = "NIXL"


class KVCacheDType(StrEnum):
    AUTO = "Auto"
    BF16 = "BF16"
    FP8E4M3 = "FP8E4M3"
    FP8E5M2 = "FP8E5M2"


class KVCacheLayout(StrEnum):
    AUTO = "Auto"
    NHD = "NHD"
    HND = "HND"


class DecodeAllocationPolicy(StrEnum):
    EARLY = "Early"
    PREFILL_COMPLETE = "PrefillComplete"


class RouterKind(StrEnum):
    SGLANG = "SGLang"
    VLLM = "VLLM"


class SGLangGateway(StrEnum):
    """Which SGLang router program runs in the router pod (docs/routers.md)."""

    #: ``python3 -m sglang_router.launch_router`` (sglang-router 0.3.2, in older SGLang images)
    SGLANG_ROUTER = "SGLangRouter"
    #: ``python3 -m smg launch`` (smg 1.13, the gateway that succeeded sglang-router; default)
    SMG = "SMG"


class RoutingPolicy(StrEnum):
    CACHE_AWARE = "CacheAware"
    POWER_OF_TWO = "PowerOfTwo"
    ROUND_ROBIN = "RoundRobin"
    RANDOM = "Random"


class PlannerMode(StrEnum):
    OFF = "Off"
    RECOMMEND = "Recommend"
    AUTO = "Auto"


class Seasonality(StrEnum):
    AUTO = "Auto"
    OFF = "Off"


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


# ---- small shared pieces --------------------------------------------------------------------


#: the longest string (characters) rendered as one argument or one environment value. The
#: kernel refuses an exec whose single argument or ``NAME=value`` passes MAX_ARG_STRLEN
#: (131,072 bytes with its NUL): a container rendered with one could never start. 32,000
#: characters are at most 128,000 bytes of UTF-8, with room for a variable's name.
MAX_EXEC_STRING_CHARS = 32_000
#: the longest environment variable name (characters)
MAX_ENV_NAME_CHARS = 1_024
#: one command-line argument
ExecString = Annotated[str, Field(max_length=MAX_EXEC_STRING_CHARS)]


class EnvVar(_Model):
    """A plain environment variable for the engine container."""

    name: str = Field(min_length=1, max_length=MAX_ENV_NAME_CHARS, description="Variable name.")
    value: str = Field(default="", max_length=MAX_EXEC_STRING_CHARS,
                       description="Variable value (at most 32,000 characters: one exec string).")


Quantity = str | int


class ResourceOverrides(_Model):
    """Extra or replacement container resources. The GPU count always equals
    placement.gpusPerNode and cannot be overridden here."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: 64, memory: 1500Gi."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource limits, e.g. memory: 1800Gi."
    )


class Toleration(_Model):
    """A pod toleration (same fields as core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: TolerationOperator = Field(
        default=TolerationOperator.EQUAL, description="Exists or Equal."
    )
    value: str | None = Field(default=None, description="Taint value for operator Equal.")
    effect: TaintEffect | None = Field(default=None, description="Taint effect; empty matches all.")
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated, in seconds."
    )


# ---- model ----------------------------------------------------------------------------------


class PVCSource(_Model):
    """Weights on a PersistentVolumeClaim in the PDCluster's namespace."""

    claim_name: str = Field(min_length=1, description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(default=True, description="Mount the claim read-only.")


class HostPathSource(_Model):
    """Weights already on each GPU node's local disk (pre-staged, fastest start)."""

    path: str = Field(pattern=r"^/", description="Absolute directory on the node.")


class WeightsSource(_Model):
    """Where the weights come from. Exactly one of pvc or hostPath."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.pvc) != has(self.hostPath)",
                    "message": "exactly one of pvc or hostPath must be set",
                    "fieldPath": ".pvc",
                }
            ]
        }
    )

    pvc: PVCSource | None = Field(default=None, description="A PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(default=None, description="A node directory.")
    mount_path: str = Field(
        default="/models", pattern=r"^/", description="Where the weights are mounted in the pod."
    )


class ModelSpec(_Model):
    """The model being served."""

    served_name: str = Field(
        min_length=1, max_length=MAX_EXEC_STRING_CHARS,
        description="Model name clients send in requests (--served-model-name)."
    )
    path: str = Field(
        min_length=1, max_length=MAX_EXEC_STRING_CHARS,
        # vLLM takes it as a positional argument: a leading "-" would be read as a flag
        pattern=r"^[^-]",
        description="Model path the engine loads (--model-path / vllm serve MODEL): a directory "
        "under weights.mountPath, or a hub id when no weights source is given; never starts "
        "with '-'.",
    )
    weights: WeightsSource | None = Field(
        default=None, description="Volume holding the weights; omit to download by hub id."
    )
    max_context_length_tokens: int = Field(
        default=131072,
        ge=1024,
        le=4194304,
        description="Longest prompt plus output the engines accept, in tokens (--context-length / "
        "--max-model-len). Also sizes the P/D transfer timeouts.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Pass --trust-remote-code (needed by some MoE checkpoints)."
    )


# ---- engine and parallelism -----------------------------------------------------------------


class EngineSpec(_Model):
    """The inference engine run by both roles."""

    kind: EngineKind = Field(description="SGLang or VLLM.")
    image: str = Field(min_length=1, description="Container image of the engine.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="HTTP port of the engine (API, /health, /metrics)."
    )
    extra_args: list[ExecString] = Field(
        default_factory=list,
        description="Extra command-line arguments for both roles. A decode batch cap here "
        "(SGLang --max-running-requests, vLLM --max-num-seqs) is read by the planner, which "
        "sizes decode instances to carry no more sequences than it.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for both roles.")


class RoleParallelism(_Model):
    """Parallel layout of one instance, over all its nodes (<role>.nodesPerInstance pods of
    one whole node each)."""

    tensor_parallel_size: int = Field(default=8, ge=1, le=64, description="TP size.")
    data_parallel_size: int = Field(default=1, ge=1, le=64, description="DP size.")
    expert_parallel_size: int = Field(
        default=1, ge=1, le=64, description="EP size for MoE experts; 1 disables EP."
    )
    data_parallel_attention: bool = Field(
        default=False,
        description="SGLang --enable-dp-attention: DP for attention, TP for the MoE/FFN layers.",
    )
    pipeline_parallel_size: int = Field(
        default=1, ge=1, le=64,
        description="PP size (SGLang --pp-size); 1 disables pipeline parallelism. Counts GPUs "
        "with TP (and DP): the whole layout must fill role.nodesPerInstance x "
        "placement.gpusPerNode GPUs.",
    )


class ParallelismSpec(_Model):
    """Parallel layout per role. Prefill TP may not exceed decode TP."""

    prefill: RoleParallelism = Field(default_factory=RoleParallelism, description="Prefill layout.")
    decode: RoleParallelism = Field(default_factory=RoleParallelism, description="Decode layout.")


class KVCacheSpec(_Model):
    """KV-cache settings shared by prefill and decode. One field each, so the two roles cannot
    disagree (a mismatch corrupts output silently)."""

    page_size_tokens: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="KV page (block) size in tokens; rendered explicitly on both roles.",
    )
    dtype: KVCacheDType = Field(
        default=KVCacheDType.AUTO, description="KV-cache dtype: Auto, BF16, FP8E4M3 or FP8E5M2."
    )
    layout: KVCacheLayout = Field(
        default=KVCacheLayout.AUTO,
        description="KV layout (vLLM VLLM_KV_CACHE_LAYOUT): Auto, NHD or HND. SGLang: Auto only.",
    )
    decode_allocation_policy: DecodeAllocationPolicy | None = Field(
        default=None,
        description="SGLang --disaggregation-decode-allocation-policy (Early or PrefillComplete), "
        "rendered on both roles. Unset: the engine default. Only recent SGLang has this flag.",
    )


class KVTransferSpec(_Model):
    """KV transfer between prefill and decode, and the timeouts that must cover the slowest
    prefill. Unset timeouts are derived from model.maxContextLengthTokens and
    conservativePrefillTokensPerSecond."""

    backend: TransferBackend = Field(
        default=TransferBackend.MOONCAKE, description="Mooncake (SGLang) or NIXL (SGLang, vLLM)."
    )
    ib_devices: str | None = Field(
        default=None, max_length=MAX_EXEC_STRING_CHARS,
        alias="ibDevices",
        description="RDMA devices, e.g. mlx5_0,mlx5_1 or a per-GPU JSON map "
        "(--disaggregation-ib-device / UCX_NET_DEVICES). Unset: auto-detect.",
    )
    bootstrap_port: int = Field(
        default=8998, ge=1, le=65535, description="SGLang bootstrap server port on prefill pods."
    )
    conservative_prefill_tokens_per_second: int = Field(
        default=2000,
        ge=1,
        description="A prefill speed every instance beats even on the longest prompt, in tokens "
        "per second; used only to derive timeouts.",
    )
    bootstrap_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds prefill waits for decode's KV indices "
        "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT). Unset: derived from the max context; "
        "shorter than the slowest prefill is rejected.",
    )
    waiting_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds decode waits for the KV after init "
        "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT). Unset: derived from the max context; "
        "shorter than the slowest prefill is rejected.",
    )
    heartbeat_interval_seconds: int = Field(
        default=5, ge=1, le=300,
        description="How often decode pings each prefill's bootstrap server, in seconds "
        "(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL)."
    )
    heartbeat_max_failures: int = Field(
        default=2, ge=1, le=100,
        description="Missed heartbeats before decode marks a prefill offline "
        "(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE)."
    )
    decoder_kv_blocks_ttl_seconds: int | None = Field(
        default=None,
        alias="decoderKVBlocksTTLSeconds",
        ge=1,
        description="Seconds prefill keeps KV blocks for decode to pull (vLLM NIXL "
        "decoder_kv_blocks_ttl). Unset: derived (at least 480); shorter than the longest decode "
        "wait is rejected.",
    )


# ---- placement and roles --------------------------------------------------------------------


class RDMASpec(_Model):
    """RDMA device-plugin resource requested by each engine pod."""

    resource_name: str = Field(
        default="rdma/ib", min_length=1, description="Extended resource name."
    )
    count: int = Field(default=1, ge=1, le=64, description="Units per pod.")


class PlacementSpec(_Model):
    """Where engine pods run: one pod per whole GPU node."""

    gpu_product: str = Field(
        default=DEFAULT_GPU_PRODUCT,
        min_length=1,
        description=f"Required value of the {GPU_PRODUCT_LABEL} node label.",
    )
    gpus_per_node: int = Field(
        default=8, ge=1, le=16, description="GPUs per node; each engine pod requests all of them."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels the engine pods require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        description=f"Extra tolerations; {GPU_RESOURCE} NoSchedule is always tolerated.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="A core/v1 Affinity for the engine pods, passed through."
    )
    rdma: RDMASpec | None = Field(
        default=None, description="RDMA resource per pod; unset requests none."
    )
    shared_memory_size: Quantity = Field(
        default="64Gi", description="Size limit of the /dev/shm memory volume."
    )
    pod_annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra annotations on engine pods (e.g. for a mesh, a scraper or the test "
        "bed's simulated warm-up). Keys the operator sets itself are refused.",
    )

    @field_validator("shared_memory_size")
    @classmethod
    def _quantity(cls, value: Quantity) -> Quantity:
        import re

        if not re.match(QUANTITY_PATTERN, str(value)):
            raise ValueError(f"{value!r} is not a Kubernetes quantity such as 64Gi")
        return value


#: the longest preStop drain (seconds); the drains the operator waits for are bounded by it
MAX_PRE_STOP_DRAIN_SECONDS = 3600
#: the most instances of one role the CRD admits; nothing the operator applies goes past it
MAX_ROLE_REPLICAS = 1024


class RoleSpec(_Model):
    """One role's fleet (prefill or decode)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must not exceed maxReplicas",
                    "fieldPath": ".minReplicas",
                },
                {
                    "rule": "self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas",
                    "message": "replicas must lie within [minReplicas, maxReplicas]",
                    "fieldPath": ".replicas",
                },
            ]
        }
    )

    replicas: int = Field(
        default=1, ge=0, le=MAX_ROLE_REPLICAS,
        description="Instances now (each nodesPerInstance nodes).",
    )
    min_replicas: int = Field(default=1, ge=0, le=MAX_ROLE_REPLICAS, description="Planner lower bound.")
    max_replicas: int = Field(default=16, ge=0, le=MAX_ROLE_REPLICAS, description="Planner upper bound.")
    resources: ResourceOverrides = Field(
        default_factory=ResourceOverrides, description="Extra container resources."
    )
    warmup_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Expected time from pod start to serving (weights, JIT, CUDA graphs), in "
        "seconds. Sizes the startup probe and tells the planner what a new instance costs.",
    )
    pre_stop_drain_seconds: int = Field(
        default=60,
        ge=0,
        le=MAX_PRE_STOP_DRAIN_SECONDS,
        description="Seconds the pod keeps serving after it is marked for deletion, so the "
        "router drops it first and in-flight requests finish (at most 3600: a planner drain "
        "or a deletion waits a bounded multiple of it).",
    )
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="Pod terminationGracePeriodSeconds; must exceed preStopDrainSeconds.",
    )
    extra_args: list[ExecString] = Field(
        default_factory=list,
        description="Extra arguments for this role only, after engine.extraArgs (the last "
        "occurrence of a flag wins). On decode, a batch cap (SGLang --max-running-requests for "
        "the instance, vLLM --max-num-seqs per DP rank) is read by the planner.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment, this role.")
    nodes_per_instance: int = Field(
        default=1, ge=1, le=MAX_NODES_PER_INSTANCE,
        description="Whole GPU nodes one instance spans. 1: a Deployment, one pod per "
        "instance. More: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, LWS >= v0.7.0 "
        "installed) whose groups are the instances, one pod per node; only the leader serves "
        "the router. The planner counts an instance as this many nodes.",
    )
    exclusive_topology_key: str | None = Field(
        default=None, min_length=1, max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="With nodesPerInstance > 1: a node label key (e.g. a rack or NVLink/IB "
        "domain label) whose value all nodes of one instance share, exclusively "
        "(LWS annotation leaderworkerset.sigs.k8s.io/exclusive-topology). Unset: no constraint.",
    )


class RouterAdmission(_Model):
    """smg's prefill admission (PD mode): each prefill worker takes at most
    ``prefillInflightPerWorker`` requests until its prefill answers; the rest wait at the router,
    oldest first, and one that waited ``queueTimeoutSeconds`` (or finds the queue full) is
    refused with 429. On by default in front of smg, every unset value derived from the profile
    and the TTFT target (operator/render/admission.py, docs/admission.md): under overload a client
    gets a fast 429 instead of a late answer, and the requests admitted meet their TTFT. The
    cap is per worker, so the admitted load follows the planner's prefill count."""

    enabled: bool = Field(
        default=True,
        description="false turns admission off: the router admits everything and requests "
        "beyond the prefill fleet wait in the engines' queues (late rather than refused).",
    )
    prefill_inflight_per_worker: int | None = Field(
        default=None, ge=1, le=4096,
        description="Requests a prefill worker holds at once (smg "
        "--prefill-max-inflight-requests-per-worker). Unset: the full prefill passes that fit "
        "in half the TTFT target at the profile's speed (status.derived).",
    )
    queue_size: int = Field(
        default=256, ge=0, le=100_000,
        description="Requests that may wait at the router for a prefill slot; 0 refuses at once "
        "(smg --prefill-queue-size).",
    )
    queue_timeout_seconds: int | None = Field(
        default=None, ge=1, le=3600,
        description="Longest wait at the router for a prefill slot before a 429 (smg "
        "--prefill-queue-timeout-secs, whole seconds). Unset: the TTFT target less the "
        "in-flight cap's passes, rounded down, at least 1 (status.derived).",
    )


class RouterSpec(_Model):
    """The P/D router in front of both roles. It starts with no workers; the operator keeps its
    worker list equal to the Ready, non-draining pods (SGLang: its /workers API; vLLM: its
    ZMQ service discovery)."""

    kind: RouterKind | None = Field(
        default=None, description="SGLang or VLLM router; unset follows engine.kind."
    )
    gateway: SGLangGateway = Field(
        default=SGLangGateway.SMG,
        description="SGLang router only: the program the image runs, SMG (default: the smg "
        "1.13 gateway, image ghcr.io/lightseekorg/smg:<smg>-sglang-v<sglang>; cache-aware PD "
        "prefill choice and prefill admission) or SGLangRouter (sglang-router 0.3.2, shipped "
        "in older SGLang images; picks PD prefills at random, no admission). Both are kept in "
        "step through the same /workers API.",
    )
    image: str = Field(min_length=1, description="Router container image.")
    replicas: int = Field(default=1, ge=0, le=64, description="Router pods.")
    port: int = Field(default=30000, ge=1, le=65535, description="Router HTTP port.")
    metrics_port: int = Field(default=29000, ge=1, le=65535, description="Router metrics port.")
    discovery_port: int = Field(
        default=30001, ge=1, le=65535,
        description="vLLM router only: port of its ZMQ service discovery, where the operator "
        "announces the Ready, non-draining pods (vllm-router has no worker API in PD mode).",
    )
    prefill_policy: RoutingPolicy = Field(
        default=RoutingPolicy.CACHE_AWARE, description="How a prefill worker is chosen."
    )
    decode_policy: RoutingPolicy = Field(
        default=RoutingPolicy.ROUND_ROBIN,
        description="How a decode worker is chosen. PowerOfTwo is refused: the router starts "
        "with no workers and rejects it below two.",
    )
    admission: RouterAdmission | None = Field(
        default=None,
        description="SMG only: shed at the router what waits too long for a prefill slot. "
        "Unset: on in front of smg with every value derived (status.derived); off in front of "
        "sglang-router and vllm-router, which have none. enabled: false turns it off.",
    )
    extra_args: list[ExecString] = Field(default_factory=list, description="Extra router arguments.")


class SLOSpec(_Model):
    """Latency targets the planner sizes for."""

    ttft_milliseconds: int = Field(
        default=2000, ge=1, description="Time-to-first-token target, in milliseconds."
    )
    tpot_milliseconds: int = Field(
        default=50, ge=1, description="Time-per-output-token target, in milliseconds."
    )
    percentile: int = Field(
        default=90, ge=50, le=99, description="Percentile at which both targets apply."
    )

    # The API speaks integer milliseconds; everything behind the spec speaks seconds. This is
    # the one place where the unit changes.
    @property
    def ttft_seconds(self) -> float:
        return self.ttft_milliseconds / 1000.0

    @property
    def tpot_seconds(self) -> float:
        return self.tpot_milliseconds / 1000.0


#: the key of a profile ConfigMap read when ``profileConfigMap.key`` is unset (what
#: ``kubectl create configmap NAME --from-file=profile.yaml`` writes)
PROFILE_CONFIGMAP_KEY = "profile.yaml"


class PoolRef(_Model):
    """The PDPool this PDCluster asks to plan in. Asking is not joining: the pool's author
    (the admin) decides who is a member, at what priority and guarantee, in the PDPool's
    ``members``; a PDCluster the pool does not list, or a pool of another namespace, is
    refused (condition PoolMember=False naming the field) and its planner holds."""

    name: str = Field(
        min_length=1, max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Name of the PDPool, in the PDCluster's namespace.",
    )
    namespace: str | None = Field(
        default=None, min_length=1, max_length=63,
        description="Unset or the PDCluster's own namespace: a pool of another namespace is "
        "refused (a tenant cannot claim another tenant's nodes).",
    )


class ProfileConfigMapRef(_Model):
    """A ConfigMap in the PDCluster's own namespace holding a profile YAML (what ``pdscale
    profile fit`` writes). Only the PDCluster's namespace: a tenant cannot point the operator
    at another tenant's objects, nor at a file."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Name of the ConfigMap, in the PDCluster's namespace.",
    )
    key: str = Field(
        default=PROFILE_CONFIGMAP_KEY,
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key of the ConfigMap's data holding the profile YAML (at most 256 KiB).",
    )


#: the most schedules one PlannerSpec may hold (bounds the CEL rules' cost at admission)
MAX_SCHEDULES = 16
#: a standard 5-field cron expression at admission: five fields of digits, names (MON, JAN),
#: ``*``, ``/``, ``,`` and ``-``; the operator parses it (planner/schedule.py: cronsim)
CRON_PATTERN = r"^[0-9A-Za-z*/,-]+( +[0-9A-Za-z*/,-]+){4}$"
#: an IANA time zone name's shape at admission (``UTC``, ``Europe/Paris``,
#: ``America/Argentina/Buenos_Aires``, ``Etc/GMT+5``); the operator checks that it exists
TIMEZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"


class PlannerSchedule(_Model):
    """A window of minimum instances, as KEDA's cron scaler states one: it opens at each
    start and closes at the next end (5-field cron expressions read in the timezone),
    and while it is open the planner keeps at least the minimums (it orders them one warm-up
    before the window opens). Outside its windows the load alone sizes the fleet."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.start != self.end",
                    "message": "start and end must differ (as in KEDA's cron scaler)",
                    "fieldPath": ".end",
                },
                {
                    "rule": "self.minPrefillReplicas > 0 || self.minDecodeReplicas > 0",
                    "message": "a schedule raises minPrefillReplicas or minDecodeReplicas above 0",
                    "fieldPath": ".minPrefillReplicas",
                },
            ]
        }
    )

    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Name of the window, quoted in decisions (\"scheduled floor "
        "'business-hours': prefill >= 6\"); unique in the list.",
    )
    start: str = Field(
        max_length=128, pattern=CRON_PATTERN,
        description="When the window opens: a 5-field cron expression (minute hour "
        "day-of-month month day-of-week, e.g. '0 9 * * 1-5'), in timezone.",
    )
    end: str = Field(
        max_length=128, pattern=CRON_PATTERN,
        description="When it closes: a 5-field cron expression (e.g. '0 18 * * 1-5'); "
        "must differ from start.",
    )
    timezone: str = Field(
        default="UTC", max_length=64, pattern=TIMEZONE_PATTERN,
        description="IANA time zone start and end are read in (e.g. 'Europe/Paris'); "
        "daylight-saving transitions as Debian's cron handles them.",
    )
    min_prefill_replicas: int = Field(
        default=0, ge=0, le=MAX_ROLE_REPLICAS,
        description="Prefill instances kept at least while the window is open (0: no "
        "floor); at most prefill.maxReplicas.",
    )
    min_decode_replicas: int = Field(
        default=0, ge=0, le=MAX_ROLE_REPLICAS,
        description="Decode instances kept at least while the window is open (0: no "
        "floor); at most decode.maxReplicas.",
    )

    @model_validator(mode="after")
    def _window(self) -> PlannerSchedule:
        if " ".join(self.start.split()) == " ".join(self.end.split()):
            raise ValueError("start and end must differ (as in KEDA's cron scaler)")
        if self.min_prefill_replicas == 0 and self.min_decode_replicas == 0:
            raise ValueError("a schedule raises minPrefillReplicas or minDecodeReplicas above 0")
        return self


class PlannerSpec(_Model):
    """The autoscaling planner (filled in by later work)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.profile) && has(self.profileConfigMap))",
                    "message": "name a profile either by profile or by profileConfigMap, not both",
                    "fieldPath": ".profileConfigMap",
                }
            ]
        }
    )

    mode: PlannerMode = Field(
        default=PlannerMode.OFF,
        description="Off, Recommend (decide and report only) or Auto (also apply replicas). "
        "Quote \"Off\" in YAML: a bare Off is read as the boolean false.",
    )
    interval_seconds: int = Field(default=60, ge=10, le=3600, description="Decision interval.")
    node_budget: int | None = Field(
        default=None, ge=1, description=(
            "Most nodes prefill plus decode may use together. When the load needs more, each "
            "role first gets the instances its load keeps fully busy, then the rest is shared "
            "in proportion to the margins each asks for; the decision says OVER BUDGET."
        ),
    )
    prometheus_url: str | None = Field(
        default=None,
        alias="prometheusURL", pattern=r"^https?://", description="Prometheus the planner queries."
    )
    stabilization_window_seconds: int | None = Field(
        default=None, ge=0, le=86400,
        description="Scale-down damping window (HPA's name), in seconds: a role keeps the "
        "most instances any interval in it needed. Unset: 300 plus the slower role's "
        "warmupSeconds (a released node is back no sooner than one warm-up after the load "
        "returns).",
    )
    load_percentile: int = Field(
        default=90, ge=0, le=99,
        description="Capacity is sized, and released, for this percentile of the load one lead "
        "ahead (the slower role's warmupSeconds plus intervalSeconds: when a node ordered now "
        "serves, or one released now could be back), learned from the load's own changes over "
        "that lead (a rise under way is carried to it, at most as far as this percentile of "
        "past rises). Decode covers half the risk (90 -> 95: a short decode fleet slows every "
        "running request). Higher buys attainment on rises with GPU-hours; 0 plans for the "
        "forecast alone. See docs/risk.md.",
    )
    seasonality: Seasonality = Field(
        default=Seasonality.AUTO,
        description="Auto: the forecast follows the time of day as the earlier days showed it "
        "(their daily profile, from up to 28 days of the planner's memory, seeded from "
        "Prometheus on the first plan), the level from the last minutes; across a midnight, a "
        "day-of-week factor where it forecast the memory's own past midnights better; with no "
        "earlier whole day known it is the plain forecast. Off: the plain forecast always. Quote \"Off\" in "
        "YAML. See docs/seasonality.md.",
    )
    profile: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Performance profile the planner sizes with: the name of a shipped "
        "profile (never a path); unset: profileConfigMap, or else the planner's default.",
    )
    profile_config_map: ProfileConfigMapRef | None = Field(
        default=None,
        alias="profileConfigMap",
        description="A profile of your own (pdscale profile fit) in a ConfigMap of this "
        "namespace, instead of a shipped one. While it is missing or invalid the planner holds "
        "and says why in status.planner.profile.",
    )
    pool: PoolRef | None = Field(
        default=None,
        description="Plan within a PDPool's joint grant instead of alone: its replica targets "
        "then come from the pool's plan each interval (nodeBudget stays its cap). The PDPool "
        "must list this PDCluster among its members; see docs/pools.md.",
    )
    schedules: list[PlannerSchedule] = Field(
        default_factory=list, max_length=MAX_SCHEDULES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Windows of minimum instances (KEDA's cron scaler): while one is open each "
        "role keeps at least its minimum, ordered one warm-up before the window opens. Where "
        "windows overlap, the highest minimum of each role holds. Decisions name the floor "
        "that binds. At most 16, names unique.",
    )

    @model_validator(mode="after")
    def _one_profile_source(self) -> PlannerSpec:
        if self.profile is not None and self.profile_config_map is not None:
            raise ValueError("name a profile either by profile or by profileConfigMap, not both")
        names = [s.name for s in self.schedules]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"schedules: names must be unique, {dup} repeated")
        return self


class PDClusterSpec(_Model):
    """A prefill/decode disaggregated deployment of one model on whole GPU nodes."""

    model_config = ConfigDict(protected_namespaces=())

    model: ModelSpec = Field(description="The model and its weights.")
    engine: EngineSpec = Field(description="The inference engine.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallel layout per role."
    )
    kv_cache: KVCacheSpec = Field(
        default_factory=KVCacheSpec, description="KV-cache settings shared by both roles."
    )
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, description="KV transfer and its timeouts."
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Node pinning for engine pods."
    )
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="The prefill fleet.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="The decode fleet.")
    router: RouterSpec = Field(description="The P/D router.")
    slo: SLOSpec = Field(default_factory=SLOSpec, description="Latency targets.")
    planner: PlannerSpec = Field(default_factory=PlannerSpec, description="The planner.")


def dump(spec: PDClusterSpec) -> dict[str, Any]:
    """The spec as the API server would store it: camelCase, defaults filled, unset optionals
    omitted."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)
