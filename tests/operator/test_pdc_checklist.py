"""Every rule of the P/D checklist rejects with the field path and the reason."""

from __future__ import annotations

import copy

import pytest

from pdscale.operator.render.checklist import SpecError, parse, validate
from pdscale.operator.render.derived import derive, minimum_transfer_timeout_seconds

SGLANG = {
    "model": {"servedName": "glm", "path": "/models/glm", "maxContextLengthTokens": 1048576,
              "weights": {"hostPath": {"path": "/raid/glm"}}},
    "engine": {"kind": "SGLang", "image": "sglang:1"},
    "parallelism": {
        "prefill": {"tensorParallelSize": 8, "dataParallelSize": 8, "expertParallelSize": 8,
                    "dataParallelAttention": True},
        "decode": {"tensorParallelSize": 8, "dataParallelSize": 8, "expertParallelSize": 8,
                   "dataParallelAttention": True},
    },
    "router": {"image": "router:1"},
}
VLLM = {
    "model": {"servedName": "llama", "path": "meta/llama"},
    "engine": {"kind": "VLLM", "image": "vllm:1"},
    "kvTransfer": {"backend": "NIXL"},
    "router": {"image": "router:1"},
}


def _with(base: dict, **paths) -> dict:
    """Copy of base with dotted paths set, e.g. _with(SGLANG, **{"prefill.replicas": 3})."""
    out = copy.deepcopy(base)
    for dotted, value in paths.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _problems(raw: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate(raw)
    return [str(p) for p in info.value.problems]


def test_the_samples_shapes_are_valid():
    validate(SGLANG)
    validate(VLLM)


# --- derived timeouts -------------------------------------------------------------------------

def test_timeouts_are_derived_from_max_context_and_prefill_speed():
    spec = parse(SGLANG)
    # 1,048,576 tokens / 2,000 tokens/s = 524.3 s, +50% = 786.4 -> 787 s.
    assert minimum_transfer_timeout_seconds(spec) == 787
    d = derive(spec)
    assert d.bootstrap_timeout_seconds == d.waiting_timeout_seconds == 787


def test_short_contexts_keep_the_engine_default_as_a_floor():
    d = derive(parse(_with(SGLANG, **{"model.maxContextLengthTokens": 32768})))
    assert d.bootstrap_timeout_seconds == 300
    assert derive(parse(VLLM)).decoder_kv_blocks_ttl_seconds == 480


def test_vllm_kv_blocks_ttl_grows_with_context():
    raw = _with(VLLM, **{"model.maxContextLengthTokens": 1048576})
    assert derive(parse(raw)).decoder_kv_blocks_ttl_seconds == 787


def test_an_override_that_is_long_enough_is_kept():
    raw = _with(SGLANG, **{"kvTransfer.bootstrapTimeoutSeconds": 1200})
    assert derive(parse(raw)).bootstrap_timeout_seconds == 1200


@pytest.mark.parametrize("field", ["bootstrapTimeoutSeconds", "waitingTimeoutSeconds"])
def test_too_short_sglang_timeout_is_rejected_with_the_minimum(field):
    assert _problems(_with(SGLANG, **{f"kvTransfer.{field}": 300})) == [
        f"spec.kvTransfer.{field}: 300 s is too short: the slowest prefill (1048576 tokens at "
        "2000 tokens/s plus 50% margin) needs at least 787 s"
    ]


def test_too_short_vllm_kv_blocks_ttl_is_rejected_with_the_minimum():
    raw = _with(VLLM, **{"model.maxContextLengthTokens": 1048576,
                         "kvTransfer.decoderKVBlocksTTLSeconds": 480})
    assert _problems(raw) == [
        "spec.kvTransfer.decoderKVBlocksTTLSeconds: 480 s is too short: prefill would free "
        "blocks while decode still waits; the slowest prefill (1048576 tokens at 2000 tokens/s "
        "plus 50% margin) needs at least 787 s"
    ]


def test_engine_specific_timeouts_on_the_wrong_engine_are_rejected():
    assert _problems(_with(VLLM, **{"kvTransfer.waitingTimeoutSeconds": 900})) == [
        "spec.kvTransfer.waitingTimeoutSeconds: applies to SGLang only; VLLM uses "
        "decoderKVBlocksTTLSeconds"
    ]
    assert _problems(_with(SGLANG, **{"kvTransfer.decoderKVBlocksTTLSeconds": 900})) == [
        "spec.kvTransfer.decoderKVBlocksTTLSeconds: applies to VLLM NIXL only"
    ]


# --- topology ---------------------------------------------------------------------------------

def test_tp_times_dp_must_fill_exactly_one_node():
    raw = _with(VLLM, **{"parallelism.decode": {"tensorParallelSize": 8, "dataParallelSize": 2}})
    assert _problems(raw) == [
        "spec.parallelism.decode: uses 16 GPUs (tensorParallelSize 8 x dataParallelSize 2) but "
        "placement.gpusPerNode is 8; one instance must occupy exactly one whole node"
    ]


def test_dp_attention_reuses_the_tp_gpus():
    raw = _with(SGLANG, **{"parallelism.decode.tensorParallelSize": 4,
                           "parallelism.decode.dataParallelSize": 4,
                           "parallelism.decode.expertParallelSize": 4,
                           "parallelism.prefill.tensorParallelSize": 4,
                           "parallelism.prefill.dataParallelSize": 4,
                           "parallelism.prefill.expertParallelSize": 4})
    assert "spec.parallelism.decode: uses 4 GPUs (tensorParallelSize 4 with DP-attention) but " \
        "placement.gpusPerNode is 8; one instance must occupy exactly one whole node" in _problems(raw)


def test_prefill_tp_larger_than_decode_tp_is_rejected():
    raw = _with(SGLANG, **{"placement.gpusPerNode": 8,
                           "parallelism.decode": {"tensorParallelSize": 4, "dataParallelSize": 2}})
    assert "spec.parallelism.prefill.tensorParallelSize: 8 exceeds parallelism.decode." \
        "tensorParallelSize 4; decode cannot take KV from a wider prefill" in _problems(raw)


def test_dp_attention_needs_dp_dividing_tp():
    raw = _with(SGLANG, **{"parallelism.decode.dataParallelSize": 3})
    assert _problems(raw) == [
        "spec.parallelism.decode.dataParallelSize: DP-attention needs dataParallelSize > 1 "
        "dividing tensorParallelSize 8; got 3"
    ]
    raw = _with(SGLANG, **{"parallelism.prefill.dataParallelSize": 1})
    assert _problems(raw) == [
        "spec.parallelism.prefill.dataParallelSize: DP-attention needs dataParallelSize > 1 "
        "dividing tensorParallelSize 8; got 1"
    ]


def test_sglang_ep_must_divide_tp():
    raw = _with(SGLANG, **{"parallelism.prefill.expertParallelSize": 3})
    assert _problems(raw) == [
        "spec.parallelism.prefill.expertParallelSize: SGLang expert parallelism must divide "
        "tensorParallelSize 8; got 3"
    ]


def test_vllm_has_no_dp_attention_and_ep_spans_tp_times_dp():
    raw = _with(VLLM, **{"parallelism.prefill.dataParallelAttention": True,
                         "parallelism.prefill.expertParallelSize": 4})
    assert _problems(raw) == [
        "spec.parallelism.prefill.dataParallelAttention: VLLM has no DP-attention switch; use "
        "dataParallelSize with expertParallelSize instead",
        "spec.parallelism.prefill.expertParallelSize: VLLM's --enable-expert-parallel spans "
        "tensorParallelSize x dataParallelSize = 8; expertParallelSize must be 1 or 8, got 4",
    ]


# --- engines, backends, shared KV settings ----------------------------------------------------

def test_unknown_engine_is_rejected_naming_the_field():
    assert _problems(_with(SGLANG, **{"engine.kind": "TensorRT"})) == [
        "spec.engine.kind: Input should be 'SGLang' or 'VLLM'"
    ]


def test_unknown_backend_is_rejected_naming_the_field():
    assert _problems(_with(SGLANG, **{"kvTransfer.backend": "NCCL"})) == [
        "spec.kvTransfer.backend: Input should be 'Mooncake' or 'NIXL'"
    ]


def test_vllm_with_mooncake_is_rejected():
    assert _problems(_with(VLLM, **{"kvTransfer.backend": "Mooncake"})) == [
        "spec.kvTransfer.backend: Mooncake is not supported with VLLM; use NIXL"
    ]


def test_router_must_pair_the_engine():
    assert _problems(_with(VLLM, **{"router.kind": "SGLang"})) == [
        "spec.router.kind: SGLang router cannot pair VLLM workers; use VLLM or leave it unset"
    ]


def test_allocation_policy_is_sglang_only_and_layout_is_vllm_only():
    assert _problems(_with(VLLM, **{"kvCache.decodeAllocationPolicy": "PrefillComplete"})) == [
        "spec.kvCache.decodeAllocationPolicy: is an SGLang setting; VLLM has no equivalent"
    ]
    assert _problems(_with(SGLANG, **{"kvCache.layout": "HND"})) == [
        "spec.kvCache.layout: SGLang has no KV layout setting; HND cannot be enforced, use Auto"
    ]


def test_page_size_dtype_layout_and_policy_exist_once_not_per_role():
    # Impossible by construction: a per-role page size is an unknown field.
    raw = _with(SGLANG, **{"prefill.pageSizeTokens": 32})
    assert _problems(raw) == ["spec.prefill.pageSizeTokens: unknown field"]


def test_bootstrap_port_must_not_collide_with_the_engine_port():
    assert _problems(_with(SGLANG, **{"kvTransfer.bootstrapPort": 8000})) == [
        "spec.kvTransfer.bootstrapPort: 8000 collides with engine.port"
    ]


# --- roles ------------------------------------------------------------------------------------

def test_min_above_max_is_rejected():
    raw = _with(SGLANG, **{"decode.minReplicas": 5, "decode.maxReplicas": 4, "decode.replicas": 4})
    assert _problems(raw) == ["spec.decode.minReplicas: 5 exceeds maxReplicas 4"]


def test_replicas_outside_bounds_are_rejected():
    raw = _with(SGLANG, **{"prefill.replicas": 20})
    assert _problems(raw) == [
        "spec.prefill.replicas: 20 is outside [minReplicas 1, maxReplicas 16]"
    ]


def test_grace_period_must_cover_the_drain():
    raw = _with(SGLANG, **{"decode.preStopDrainSeconds": 600,
                           "decode.terminationGracePeriodSeconds": 600})
    assert _problems(raw) == [
        "spec.decode.terminationGracePeriodSeconds: 600 s would kill the pod before it drains; "
        "needs at least 610 s (preStopDrainSeconds 600 + 10 s to shut down)"
    ]


def test_gpu_count_cannot_be_overridden_per_role():
    raw = _with(SGLANG, **{"prefill.resources": {"limits": {"nvidia.com/gpu": 4}}})
    assert _problems(raw) == [
        "spec.prefill.resources.limits: nvidia.com/gpu is set by placement.gpusPerNode "
        "(whole nodes); remove it here"
    ]


def test_negative_replicas_name_the_field():
    assert _problems(_with(SGLANG, **{"decode.replicas": -1})) == [
        "spec.decode.replicas: Input should be greater than or equal to 0"
    ]


# --- placement, model, planner ----------------------------------------------------------------

def test_node_selector_cannot_contradict_the_gpu_product():
    raw = _with(SGLANG, **{"placement.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}})
    assert _problems(raw) == [
        "spec.placement.nodeSelector.nvidia.com/gpu.product: 'NVIDIA-H100' contradicts "
        "placement.gpuProduct 'NVIDIA-H200'"
    ]


def test_model_path_must_be_on_the_weights_volume():
    raw = _with(SGLANG, **{"model.path": "/data/glm"})
    assert _problems(raw) == [
        "spec.model.path: '/data/glm' is not under weights.mountPath '/models'"
    ]


def test_weights_need_exactly_one_source():
    raw = _with(SGLANG, **{"model.weights": {"pvc": {"claimName": "w"},
                                              "hostPath": {"path": "/raid"}}})
    assert _problems(raw) == ["spec.model.weights: exactly one of pvc or hostPath must be set"]


def test_planner_on_without_a_prometheus_url_is_valid():
    # the operator's own Prometheus (the admin's, chart value operator.prometheusURL) serves
    # a spec that names none; with neither the planner holds and says so (test_tenant_policy)
    spec, _ = validate(_with(SGLANG, **{"planner.mode": "Recommend"}))
    assert spec.planner.prometheus_url is None


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_power_of_two_routing_is_refused_because_the_router_starts_empty(role):
    (problem,) = _problems(_with(SGLANG, **{f"router.{role}Policy": "PowerOfTwo"}))
    assert problem.startswith(f"spec.router.{role}Policy: PowerOfTwo is refused by the router")


def test_node_budget_must_hold_the_minimum_fleet():
    raw = _with(SGLANG, **{"planner.nodeBudget": 1})
    assert _problems(raw) == [
        "spec.planner.nodeBudget: 1 is below prefill.minReplicas + decode.minReplicas = 2"
    ]


def test_all_problems_are_reported_at_once():
    raw = _with(SGLANG, **{"decode.minReplicas": 9, "decode.maxReplicas": 2,
                           "kvTransfer.bootstrapTimeoutSeconds": 10})
    fields = [p.split(":")[0] for p in _problems(raw)]
    assert fields == ["spec.kvTransfer.bootstrapTimeoutSeconds", "spec.decode.minReplicas"]


def test_missing_required_fields_name_their_path():
    assert _problems({"engine": {"kind": "SGLang"}}) == [
        "spec.model: Field required",
        "spec.engine.image: Field required",
        "spec.router: Field required",
    ]


def test_pod_annotations_cannot_take_the_operators_keys():
    raw = _with(SGLANG, **{"placement.podAnnotations": {"sglang.ai/bootstrap-port": "1"}})
    assert _problems(raw) == [
        "spec.placement.podAnnotations: sglang.ai/bootstrap-port is set by the operator"
    ]
