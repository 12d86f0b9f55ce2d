"""Engine renderers: the command line and environment of one role's engine container.

Every P/D-critical setting (page size, KV dtype, layout, allocation policy, transfer backend)
comes from a single spec field and is rendered explicitly on both roles, so the two sides
agree by construction instead of by each engine's defaults. Flag names: ../shared/docs/engines.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdscale.operator.api import multinode
from pdscale.operator.api.pdcluster import EngineKind, KVCacheDType, KVCacheLayout, PDClusterSpec
from pdscale.planner.profile import instance_batch_cap

from .derived import Derived

NIXL_SIDE_CHANNEL_PORT = 5600
# SGLang's source suggests 1800 s so DeepGEMM JIT can finish during warm-up.
SGLANG_MIN_WARMUP_TIMEOUT_SECONDS = 1800

_SGLANG_DTYPE = {
    KVCacheDType.AUTO: "auto",
    KVCacheDType.BF16: "bf16",
    KVCacheDType.FP8E4M3: "fp8_e4m3",
    KVCacheDType.FP8E5M2: "fp8_e5m2",
}
_VLLM_DTYPE = {
    KVCacheDType.AUTO: "auto",
    KVCacheDType.BF16: "bfloat16",
    KVCacheDType.FP8E4M3: "fp8_e4m3",
    KVCacheDType.FP8E5M2: "fp8_e5m2",
}
_ALLOCATION = {"Early": "early", "PrefillComplete": "prefill_complete"}


@dataclass
class EngineContainer:
    """What a role's engine container runs: command, args, env (core/v1 EnvVar dicts), extra
    named container ports and pod annotations."""

    command: list[str]
    args: list[str]
    env: list[dict[str, Any]]
    ports: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def _env(name: str, value: object) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def _user_env(spec: PDClusterSpec, role: str) -> list[dict[str, Any]]:
    role_spec = getattr(spec, role)
    return [_env(e.name, e.value) for e in (*spec.engine.env, *role_spec.env)]


def _user_args(spec: PDClusterSpec, role: str) -> list[str]:
    return [*spec.engine.extra_args, *getattr(spec, role).extra_args]


#: the flag that caps an engine's running batch, per engine kind
DECODE_BATCH_CAP_FLAG = {EngineKind.SGLANG: "--max-running-requests", EngineKind.VLLM: "--max-num-seqs"}


def decode_batch_cap(spec: PDClusterSpec) -> int | None:
    """Sequences one decode instance runs at most, as the tenant's extra arguments set it
    (None: not set, the engine's own limit). The planner sizes decode with it and the replay's
    engines queue behind it, as the real engines do: a cap below the batch the TPOT target
    allows makes each instance carry fewer sequences than the profile says.

    SGLang's ``--max-running-requests`` is the instance's over its DP ranks, vLLM's
    ``--max-num-seqs`` each rank's (``profile.instance_batch_cap``).

    The last occurrence wins, as in the engines' argument parsers; ``--flag=value`` is read
    too. Raises ValueError naming the field for a value that is not a whole number above 0."""
    if getattr(spec, "engine", None) is None:
        return None  # pdscale replay's spec of the CRD's defaults names no engine
    flag = DECODE_BATCH_CAP_FLAG[spec.engine.kind]
    found: tuple[str, str] | None = None
    for source, args in (("spec.engine.extraArgs", spec.engine.extra_args),
                         ("spec.decode.extraArgs", spec.decode.extra_args)):
        for i, arg in enumerate(args):
            if arg == flag:
                found = (source, args[i + 1] if i + 1 < len(args) else "")
            elif arg.startswith(flag + "="):
                found = (source, arg.partition("=")[2])
    if found is None:
        return None
    source, text = found
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{source}: {flag} needs a whole number above 0, got {text!r}")
    dp = spec.parallelism.decode.data_parallel_size
    cap = instance_batch_cap(flag, value, dp)
    if cap < 1:
        raise ValueError(f"{source}: {flag} {value} is below parallelism.decode.dataParallelSize "
                         f"{dp}; SGLang rounds it down to a multiple of its DP ranks, 0")
    return cap


#: SGLang's default histogram buckets, seconds (``TokenizerMetricsCollector``,
#: python/sglang/srt/metrics/collector.py): TTFT starts at 0.1 s and jumps 4 -> 6 s, inter-token latency 40 -> 60 ms, so a
#: percentile near a 5 s or 50 ms SLO is interpolated inside one wide bucket.
SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
SGLANG_DEFAULT_ITL_BUCKETS_SECONDS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
#: edges added around an SLO, as multiples of it: the SLO itself is an edge (the share of
#: requests within it is read exactly) and a percentile within +-50% of it is interpolated
#: inside a bucket at most 25% of the SLO wide
SLO_BUCKET_MULTIPLES = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5)


def slo_buckets(defaults: tuple[float, ...], slo_seconds: float) -> list[str]:
    """The engine's default buckets with edges around ``slo_seconds`` added, as flag values."""
    edges = {round(x, 6) for x in defaults} | {round(slo_seconds * m, 6) for m in SLO_BUCKET_MULTIPLES}
    return [f"{x:g}" for x in sorted(edges)]


def sglang(spec: PDClusterSpec, derived: Derived, role: str) -> EngineContainer:
    """`python3 -m sglang.launch_server` for one role of a PD deployment."""
    par = getattr(spec.parallelism, role)
    kvt = spec.kv_transfer
    args = [
        "--model-path", spec.model.path,
        "--served-model-name", spec.model.served_name,
        "--host", "0.0.0.0",
        "--port", str(spec.engine.port),
        "--context-length", str(spec.model.max_context_length_tokens),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", kvt.backend.value.lower(),
        "--disaggregation-bootstrap-port", str(kvt.bootstrap_port),
        "--tp-size", str(par.tensor_parallel_size),
        "--dp-size", str(par.data_parallel_size),
        "--ep-size", str(par.expert_parallel_size),
        "--page-size", str(spec.kv_cache.page_size_tokens),
        "--kv-cache-dtype", _SGLANG_DTYPE[spec.kv_cache.dtype],
        "--enable-metrics",
        # Without it only attention-TP rank 0 reports, and with DP-attention every metric
        # would look like it came from one rank.
        "--enable-metrics-for-all-schedulers",
        # The planner reads TTFT and TPOT percentiles from these histograms: edges at and
        # around the SLOs, or the defaults leave the SLO inside one wide bucket.
        "--bucket-time-to-first-token",
        *slo_buckets(SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS, spec.slo.ttft_seconds),
        "--bucket-inter-token-latency",
        *slo_buckets(SGLANG_DEFAULT_ITL_BUCKETS_SECONDS, spec.slo.tpot_seconds),
    ]
    if par.data_parallel_attention:
        args.append("--enable-dp-attention")
    args += multinode.sglang_args(spec, role)  # PP and several nodes; [] for one node
    if kvt.ib_devices:
        args += ["--disaggregation-ib-device", kvt.ib_devices]
    if spec.kv_cache.decode_allocation_policy is not None:
        args += [
            "--disaggregation-decode-allocation-policy",
            _ALLOCATION[spec.kv_cache.decode_allocation_policy.value],
        ]
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += _user_args(spec, role)
    warmup = max(SGLANG_MIN_WARMUP_TIMEOUT_SECONDS, getattr(spec, role).warmup_seconds)
    env = [
        _env("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", derived.bootstrap_timeout_seconds),
        _env("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", derived.waiting_timeout_seconds),
        _env("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", kvt.heartbeat_interval_seconds),
        _env("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", kvt.heartbeat_max_failures),
        _env("SGLANG_WARMUP_TIMEOUT", warmup),
        # v0.5.23 exports the GPU busy time the planner's prefill calibration reads
        # (sglang:forward_execution_seconds_total) only with its device timer on
        _env("SGLANG_ENABLE_METRICS_DEVICE_TIMER", 1),
        *_user_env(spec, role),
    ]
    ports = []
    annotations = {}
    if role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": kvt.bootstrap_port, "protocol": "TCP"})
        # The SGLang router's service discovery reads this key (hard-coded in the router).
        annotations["sglang.ai/bootstrap-port"] = str(kvt.bootstrap_port)
    return EngineContainer(
        command=["python3", "-m", "sglang.launch_server"],
        args=args,
        env=env,
        ports=ports,
        annotations=annotations,
    )


def vllm_kv_transfer_config(spec: PDClusterSpec, derived: Derived) -> dict[str, Any]:
    """The NIXL KVTransferConfig; identical on both roles (NIXL ignores kv_role, the router
    decides who is P and who is D)."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {
            "decoder_kv_blocks_ttl": derived.decoder_kv_blocks_ttl_seconds,
        },
    }


def vllm(spec: PDClusterSpec, derived: Derived, role: str) -> EngineContainer:
    """`vllm serve` for one role, with the NIXL connector."""
    par = getattr(spec.parallelism, role)
    args = [
        spec.model.path,
        "--served-model-name", spec.model.served_name,
        "--host", "0.0.0.0",
        "--port", str(spec.engine.port),
        "--max-model-len", str(spec.model.max_context_length_tokens),
        "--tensor-parallel-size", str(par.tensor_parallel_size),
        "--data-parallel-size", str(par.data_parallel_size),
        "--block-size", str(spec.kv_cache.page_size_tokens),
        "--kv-cache-dtype", _VLLM_DTYPE[spec.kv_cache.dtype],
        "--kv-transfer-config",
        json.dumps(vllm_kv_transfer_config(spec, derived), separators=(",", ":"), sort_keys=True),
    ]
    if par.expert_parallel_size > 1:
        args.append("--enable-expert-parallel")
    args += multinode.vllm_args(spec, role)  # PP and several nodes; [] for one node
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += _user_args(spec, role)
    env: list[dict[str, Any]] = [
        # NIXL's side channel defaults to localhost; the peer must reach this pod's IP.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        _env("VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_PORT),
    ]
    if spec.kv_cache.layout is not KVCacheLayout.AUTO:
        env.append(_env("VLLM_KV_CACHE_LAYOUT", spec.kv_cache.layout.value))
    if spec.kv_transfer.ib_devices:
        env.append(_env("UCX_NET_DEVICES", spec.kv_transfer.ib_devices))
    env += _user_env(spec, role)
    ports = [{"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}]
    return EngineContainer(command=["vllm", "serve"], args=args, env=env, ports=ports)


def render(spec: PDClusterSpec, derived: Derived, role: str) -> EngineContainer:
    if spec.engine.kind is EngineKind.SGLANG:
        return sglang(spec, derived, role)
    return vllm(spec, derived, role)


def operator_env_names(spec: PDClusterSpec, derived: Derived) -> frozenset[str]:
    """The environment variables the operator renders itself, on either role: a spec may not
    set them (the last of two equal names wins in a container, so the spec's would). Both
    dialects append the spec's variables last, after their own."""
    names: set[str] = set()
    for role in ("prefill", "decode"):
        env = render(spec, derived, role).env
        names.update(e["name"] for e in env[: len(env) - len(_user_env(spec, role))])
    return frozenset(names)
