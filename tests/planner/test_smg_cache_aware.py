"""smg 1.13's cache-aware PD prefill choice (planner/replay/routers.py SmgCacheAwareRouter),
rule by rule on a tiny fleet, as read from the smg==1.13.0 source
(model_gateway/src/policies/cache_aware.rs), and the spec -> router mapping."""

from __future__ import annotations

import random
from pathlib import Path

from pdscale.operator.api.pdcluster import SGLangGateway
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Role
from pdscale.planner.replay.fleet import Events, Fleet
from pdscale.planner.replay.prefix_index import PrefixIndex
from pdscale.planner.replay.routers import ROUTERS, SmgCacheAwareRouter, make_router
from pdscale.replay import read_spec
from pdscale.replay_setup import routing

BLOCK = 64


def prefill_fleet(n: int) -> Fleet:
    fleet = Fleet(PrefixIndex(1000), Events(), switch_seconds=0.0)
    for _ in range(n):
        fleet.add(Role.PREFILL, 0.0, 0.0)
    return fleet


def smg(fleet: Fleet, seed: int = 1) -> SmgCacheAwareRouter:
    return SmgCacheAwareRouter(fleet, BLOCK, random.Random(seed))


def route(router: SmgCacheAwareRouter, blocks: tuple[int, ...], ready: list[int] | None = None) -> int:
    """Route a prompt of exactly ``blocks`` and hold it in prefill there (as the simulator
    does until the prefill answers); the engines' caches stay empty (nothing computed)."""
    i = router.choose(0.0, len(blocks) * BLOCK, {}, ready, blocks=blocks)
    router.load[i] += 1
    return i


def test_the_prefix_goes_in_at_routing_so_the_next_request_follows_before_any_prefill() -> None:
    shared = tuple(range(1, 9))
    for seed in range(20):
        fleet = prefill_fleet(2)
        router = smg(fleet, seed)
        first = route(router, (*shared, 100))
        # the first has not been computed: no engine caches a block, and it holds a prefill
        # slot, so the other instance is less loaded; smg's tree already has the prefix
        assert fleet.prefix.hits(shared, fleet.prefill_mask) == {}
        assert fleet.outstanding[first] == 1 and fleet.outstanding[1 - first] == 0
        assert route(router, (*shared, 200)) == first
        assert route(router, (*shared, 300)) == first
        # a prompt of its own is a miss: the least loaded takes it
        assert route(router, (500, 501, 502)) == 1 - first


def test_a_holder_over_the_count_pressure_gate_spills_to_the_least_loaded() -> None:
    shared = tuple(range(1, 11))
    fleet = prefill_fleet(3)
    router = smg(fleet)
    home = route(router, shared)
    others = [j for j in range(3) if j != home]
    # mean over the 3 candidates; the gate: load > 1.5 x mean AND load > mean + margin,
    # margin = min(64, max(ceil(2 sqrt(mean)), 4))
    fleet.outstanding[:] = [0, 0, 0]
    fleet.outstanding[home] = 9  # with 2 and 1 below: mean 4, 9 > 6 and 9 > 4 + 4: spills
    fleet.outstanding[others[0]] = 2
    fleet.outstanding[others[1]] = 1
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=shared) == others[1]
    # the spill target now holds the prefix too: the hot prefix replicates
    assert router.tree.hits(shared, fleet.prefill_mask) == {home: 10, others[1]: 10}

    fleet = prefill_fleet(3)
    router = smg(fleet)
    home = route(router, shared)
    fleet.outstanding[:] = [0, 0, 0]
    fleet.outstanding[home] = 6  # mean 2: 6 > 3 but not > 2 + 4 (the margin's floor)
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=shared) == home
    # end-to-end requests do not count: smg releases the prefill load at the prefill's answer
    fleet.inflight[home] = 500
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=shared) == home
    fleet.outstanding[home] = 7  # mean 7/3: 7 > 3.5 and 7 > 7/3 + 4: spills
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=shared) != home


def test_every_holder_over_the_gate_and_no_one_under_it_goes_to_the_least_loaded() -> None:
    shared = (1, 2, 3, 4)
    fleet = prefill_fleet(2)
    router = smg(fleet)
    home = route(router, shared)
    fleet.outstanding[home] = 40
    fleet.outstanding[1 - home] = 0  # mean 20: 40 > 30 and 40 > 20 + 9: spills
    assert router.choose(0.0, 4 * BLOCK, {}, blocks=shared) == 1 - home


def test_at_or_below_the_cache_threshold_the_least_loaded_takes_it_not_the_smallest_tree() -> None:
    fleet = prefill_fleet(2)
    router = smg(fleet)
    # a big tree on instance 0, nothing on 1
    for p in range(5):
        router.tree.insert(0, tuple(range(100 * p, 100 * p + 10)))
    router.tree.insert(1, (7000, 7001, 7002))
    fleet.outstanding[:] = [0, 2]
    # 3 of 10 blocks match on 1: a ratio of exactly 0.3 is not above it -> least loaded (0);
    # sgl-router's source rule sends such a miss to the smallest tree
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=(7000, 7001, 7002, *range(8000, 8007))) == 0
    # 4 of 10 blocks: above the threshold, the holder keeps it though it is busier
    router.tree.insert(1, (7000, 7001, 7002, 7003))
    assert router.choose(0.0, 10 * BLOCK, {}, blocks=(7000, 7001, 7002, 7003, *range(9000, 9006))) == 1
    # the ratio is over the prompt's tokens: the same 4 blocks of a 40-block prompt miss
    assert router.choose(0.0, 40 * BLOCK, {}, blocks=(7000, 7001, 7002, 7003, *range(9100, 9136))) == 0


def test_a_deepest_holder_at_its_admission_cap_is_a_miss_not_the_shallower_holder() -> None:
    fleet = prefill_fleet(3)
    router = smg(fleet)
    router.tree.insert(0, tuple(range(1, 11)))
    router.tree.insert(1, tuple(range(1, 6)))
    fleet.outstanding[:] = [4, 3, 1]
    # 0 (10 blocks) is at its cap, so smg leaves it out of the candidates before the policy;
    # the deepest match still is 0's, none of its holders is a candidate: least loaded of 1, 2
    assert router.choose(0.0, 10 * BLOCK, {}, [1, 2], blocks=tuple(range(1, 11))) == 2


def test_equal_loads_draw_uniformly_and_the_tree_budget_evicts_leaves_first() -> None:
    fleet = prefill_fleet(3)
    router = smg(fleet, seed=3)
    picks = {router.choose(0.0, BLOCK, {}, blocks=(1000 + k,)) for k in range(60)}
    assert picks == {0, 1, 2}  # not the first index every time
    fleet = prefill_fleet(1)
    router = SmgCacheAwareRouter(fleet, BLOCK, random.Random(1), max_tree_chars=4 * BLOCK * 4)
    router.tree.insert(0, (1, 2, 3))
    router.tree.insert(0, (1, 2, 4))  # 4 entries fit; a fifth evicts the oldest leaf, 3
    router.tree.insert(0, (1, 2, 4, 5))
    assert router.tree.hits((1, 2, 3), fleet.prefill_mask) == {0: 2}
    assert router.tree.hits((1, 2, 4, 5), fleet.prefill_mask) == {0: 4}
    # a prompt longer than the budget keeps its head: the deepest blocks go first
    router.tree.insert(0, (20, 21, 22, 23, 24, 25))
    assert router.tree.hits((20, 21, 22, 23, 24, 25), fleet.prefill_mask) == {0: 4}


def test_a_replay_keeps_each_prefix_on_one_prefill(model: PerformanceModel) -> None:
    from pdscale.planner.replay.simulate import SimConfig, _Replay
    from pdscale.planner.replay.traces import Trace

    # two conversations' prefixes interleaved, 5 ms apart: every prefill is still running
    # when the next request of its prefix arrives
    n = 40
    blocks = [(1, 2, 3, 4, 5, 6, 7, 8, 1000 + i) if i % 2 else (11, 12, 13, 14, 15, 16, 17, 18, 2000 + i)
              for i in range(n)]
    tr = Trace("t", [0.005 * i for i in range(n)], [9 * 512] * n, [10] * n, blocks, 512)
    cfg = SimConfig(router="smg-cache-aware", initial_prefill=2, initial_decode=2,
                    engine="sglang", slo=Slo(ttft_seconds=60.0), decode_router="round-robin")
    replay = _Replay(tr, model, cfg, None)
    picks: dict[int, set[int]] = {0: set(), 1: set()}
    choose = replay.router.choose

    def spy(now, n_in, hits, ready=None, *, blocks=()):  # type: ignore[no-untyped-def]
        i = choose(now, n_in, hits, ready, blocks=blocks)
        picks[blocks[0] == 1].add(i)
        return i

    replay.router.choose = spy  # type: ignore[method-assign]
    result = replay.run(None)
    assert not result.rejected.any()
    assert len(picks[0]) == 1 and len(picks[1]) == 1
    assert result.hit_tokens > 0


def test_routing_picks_smgs_rule_for_smg_and_random_for_sglang_router() -> None:
    assert "smg-cache-aware" in ROUTERS
    spec = read_spec(str(Path(__file__).resolve().parents[2] / "bench" / "policy_bench_pdcluster.yaml"))
    assert spec.router.prefill_policy.value == "CacheAware"
    # the default gateway (router.gateway unset) is smg, with its own cache-aware rule
    assert routing(spec) == {"router": "smg-cache-aware", "decode_router": "round-robin"}
    old = spec.model_copy(update={"router": spec.router.model_copy(
        update={"gateway": SGLangGateway.SGLANG_ROUTER})})
    assert routing(old)["router"] == "random"  # sglang-router 0.3.2: no PD prefill tree
    s = spec.model_copy(update={"router": spec.router.model_copy(update={"gateway": SGLangGateway.SMG})})
    assert routing(s) == {"router": "smg-cache-aware", "decode_router": "round-robin"}
    fleet = prefill_fleet(2)
    assert isinstance(make_router(routing(s)["router"], fleet, None, BLOCK, random.Random(1)),  # type: ignore[arg-type]
                      SmgCacheAwareRouter)
