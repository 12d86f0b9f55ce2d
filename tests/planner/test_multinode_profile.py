"""The shipped profile of a multi-node instance shape (prefill 2 nodes, decode 4 nodes per
instance) is the one-node profile scaled by the group's nodes, so that the planner and the
replay price one group as that many nodes' capacity, and GPU-hours as nodes x 8 x hours."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pdscale.operator.loop.planning import planner_config
from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
NODE = load_profile("deepseek-fp8-8xh200-sglang")
GROUP = load_profile("deepseek-fp8-8xh200-sglang-p2n-d4n")


def _bench():
    spec = importlib.util.spec_from_file_location("policy_bench", ROOT / "bench" / "policy_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("policy_bench", module)
    spec.loader.exec_module(module)
    return module


def test_the_group_profile_is_the_node_profile_times_its_nodes():
    assert GROUP.gpus_per_instance == NODE.gpus_per_instance == 8  # one node's GPUs
    assert GROUP.prefill.tokens_per_second == 2 * NODE.prefill.tokens_per_second
    assert GROUP.prefill.prefix_cache_tokens == 2 * NODE.prefill.prefix_cache_tokens
    assert GROUP.decode.kv_capacity_tokens == 4 * NODE.decode.kv_capacity_tokens
    assert GROUP.decode.max_batch == 4 * NODE.decode.max_batch
    for field in ("attention_doubling_tokens", "overhead_seconds", "block_tokens"):
        assert getattr(GROUP.prefill, field) == getattr(NODE.prefill, field), field
    assert GROUP.kv_transfer == NODE.kv_transfer and GROUP.warmup == NODE.warmup


def test_a_decode_group_streams_four_nodes_worth_at_the_tpot_target():
    node, group = PerformanceModel(NODE), PerformanceModel(GROUP)
    for context in (1_000.0, 3_000.0, 20_000.0):
        # a batch of 4B over the group's 4 nodes costs what B costs one node
        assert group.tpot_seconds(4 * 100, context) == pytest.approx(node.tpot_seconds(100, context))
        assert group.decode_tokens_per_second_at_slo(0.05, context) == pytest.approx(
            4 * node.decode_tokens_per_second_at_slo(0.05, context), rel=0.02)
    assert group.prefill_compute_seconds(8_000) == pytest.approx(node.prefill_compute_seconds(8_000) / 2)


def test_the_bench_shape_is_a_spec_the_checklist_accepts_with_its_profile():
    bench = _bench()
    from pdscale.replay import read_spec

    spec = bench.with_shape(read_spec(str(bench.PDCLUSTER)), (2, 4))
    assert (spec.prefill.nodes_per_instance, spec.decode.nodes_per_instance) == (2, 4)
    assert spec.parallelism.decode.tensor_parallel_size == 32
    config = planner_config(spec, bench.shape_profile((2, 4)))
    assert config.nodes_per_instance == (2, 4)
    assert config.model.profile.name == GROUP.name
    assert bench.shape_profile((1, 1)) is None
    with pytest.raises(SystemExit, match="no shipped profile"):
        bench.shape_profile((3, 3))


# -- a profile states its shape, and the planner holds a spec of another ------------------------
def _spec(nodes: tuple[int, int], profile: str | None):
    from pdscale.replay import read_spec

    bench = _bench()
    spec = bench.with_shape(read_spec(str(bench.PDCLUSTER)), nodes) if nodes != (1, 1) else \
        read_spec(str(bench.PDCLUSTER))
    return spec.model_copy(update={"planner": spec.planner.model_copy(update={"profile": profile})})


def test_a_one_node_profile_is_refused_for_groups_and_a_group_profile_for_one_node():
    from pdscale.planner.profile import ProfileError

    assert (NODE.nodes_per_instance.prefill, NODE.nodes_per_instance.decode) == (1, 1)
    assert (GROUP.nodes_per_instance.prefill, GROUP.nodes_per_instance.decode) == (2, 4)
    with pytest.raises(ProfileError, match=r"1 prefill / 1 decode nodes.*"
                                           r"spec.prefill.nodesPerInstance is 2 and "
                                           r"spec.decode.nodesPerInstance is 4"):
        planner_config(_spec((2, 4), None))  # the default profile, one node per instance
    with pytest.raises(ProfileError, match="2 prefill / 4 decode nodes"):
        planner_config(_spec((1, 1), GROUP.name))
    assert planner_config(_spec((2, 4), GROUP.name)).nodes_per_instance == (2, 4)
    # a profile that states no shape is not checked (demo-sim, a ConfigMap's without the key)
    assert planner_config(_spec((2, 4), "demo-sim")).nodes_per_instance == (2, 4)


def test_the_operator_holds_the_planner_with_the_shape_problem():
    from pdscale.operator.loop.profile_source import ProfileSources

    resolved = ProfileSources(kube=None).resolve("ns", _spec((2, 4), None))
    assert resolved.profile is None and "spec.decode.nodesPerInstance is 4" in resolved.problem
    assert ProfileSources(kube=None).resolve("ns", _spec((2, 4), GROUP.name)).profile == GROUP


@pytest.mark.parametrize("example", ["sglang-deepseek-multinode.yaml", "vllm-deepseek-multinode.yaml"])
def test_the_multinode_examples_plan_with_the_group_profile(example):
    import yaml

    from pdscale.operator.render.checklist import validate

    spec, _ = validate(yaml.safe_load((ROOT / "examples" / example).read_text())["spec"])
    assert planner_config(spec).model.profile.name == GROUP.name
