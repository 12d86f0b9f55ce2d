"""The replay's routing policies as sgl-router (and smg, vllm-router) implement them, for
prefill (planner/replay/routers.py) and decode (planner/replay/decode_batches.py), and the
mapping from a PDCluster's router policies to them."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from pdscale.operator.api.pdcluster import RoutingPolicy, SGLangGateway
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Role
from pdscale.planner.replay.decode_batches import DECODE_ROUTERS, DecodeBatches
from pdscale.planner.replay.fleet import Events, Fleet
from pdscale.planner.replay.prefix_index import PrefixIndex
from pdscale.planner.replay.routers import ROUTERS, make_router
from pdscale.replay import default_spec, read_spec
from pdscale.replay_setup import _ROUTING, routing


def fleet_of(role: Role, n: int) -> Fleet:
    fleet = Fleet(PrefixIndex(10), Events(), switch_seconds=0.0)
    for _ in range(n):
        fleet.add(role, 0.0, 0.0)
    return fleet


def test_prefill_round_robin_cycles_over_the_ready_list_as_it_is_now(model: PerformanceModel) -> None:
    fleet = fleet_of(Role.PREFILL, 3)
    rr = make_router("round-robin", fleet, model, 512, random.Random(1))
    assert [rr.choose(0.0, 100, {}) for _ in range(4)] == [0, 1, 2, 0]
    fleet.start_drain(1, 0.0, None)  # the counter goes on over the shorter list
    assert [rr.choose(0.0, 100, {}) for _ in range(3)] == [0, 2, 0]
    # among the instances an admission lets take one more, when given
    assert rr.choose(0.0, 100, {}, [2]) == 2


def test_power_of_two_takes_the_less_loaded_of_two_drawn(model: PerformanceModel) -> None:
    fleet = fleet_of(Role.PREFILL, 3)
    fleet.inflight[:] = [5, 0, 9]
    p2 = make_router("power-of-two", fleet, model, 512, random.Random(1))
    picks = Counter(p2.choose(0.0, 100, {}) for _ in range(3000))
    # 1 wins every draw it is in (2 of 3 pairs), 0 the pair {0, 2}, 2 never
    assert picks[2] == 0 and picks[1] == pytest.approx(2000, rel=0.1)
    assert picks[0] == pytest.approx(1000, rel=0.15)


def test_the_routers_load_is_a_workers_requests_in_flight_end_to_end(model: PerformanceModel) -> None:
    """sgl-router's worker load is held until the response ends (its load guard in
    pd_router.rs): a prefill instance whose requests have all left prefill but still decode
    counts them, and cache-aware balances on that."""
    from pdscale.planner.replay.simulate import SimConfig, _Replay
    from pdscale.planner.replay.traces import Trace

    n = 70  # short prompts with long outputs: out of prefill in a second, decoding for minutes
    tr = Trace("t", [0.001 * i for i in range(n)] + [9.0], [600] * n + [600], [2000] * (n + 1),
               [(1000 + i,) for i in range(n + 1)], 512)
    cfg = SimConfig(router="cache-aware", initial_prefill=2, initial_decode=4, engine="sglang",
                    slo=Slo(ttft_seconds=60.0), decode_router="round-robin", interval_seconds=5.0)
    seen: list[tuple[int, int]] = []

    def controller(obs):
        seen.append((sum(replay.fleet.outstanding), sum(replay.fleet.inflight)))
        return (2, 4)

    replay = _Replay(tr, model, cfg, controller)
    replay.run(None)
    assert seen[1] == (0, n)  # at 5 s: none in prefill, all in flight
    assert replay.fleet.inflight == [0] * len(replay.fleet.inflight)  # every response ended
    # the choice: cached on 0, but 0 has 70 in flight and 1 none (past both thresholds)
    prefix = tuple(range(1, 9))
    fleet = fleet_of(Role.PREFILL, 2)
    fleet.prefix.insert(0, prefix)
    ca = make_router("cache-aware", fleet, model, 512, random.Random(1))
    hits = fleet.prefix.hits((*prefix, 99), fleet.prefill_mask)
    fleet.inflight[:] = [70, 0]
    assert ca.choose(5.0, 4200, hits) == 1
    fleet.inflight[:] = [3, 0]
    assert ca.choose(5.0, 4200, hits) == 0


def decode_batches(model: PerformanceModel, n: int, router: str, blocks: list[tuple[int, ...]]) -> DecodeBatches:
    fleet = fleet_of(Role.DECODE, n)
    k = len(blocks)
    return DecodeBatches(fleet, fleet.events, model, "off", Slo(), input_tokens=[2048] * k,
                         output_tokens=[1000] * k, arrival_seconds=[0.0] * k,
                         on_start=lambda r, t: None, on_finish=lambda r, s, t: None,
                         on_shed=lambda r, t: None, router=router, rng=random.Random(2),
                         blocks=blocks, block_tokens=512)


def test_decode_routing_round_robin_ignores_load_and_least_loaded_follows_it(model) -> None:
    rr = decode_batches(model, 2, "round-robin", [(i,) for i in range(4)])
    for r in range(4):
        rr.place(r, 0.0)
    assert [len(b) for b in rr.fleet.running] == [2, 2]
    # round robin sends the next one to instance 0 even when instance 0 is the busier
    rr.fleet.running[1].clear()
    assert rr.choose(0) == 0
    least = decode_batches(model, 2, "least-loaded", [(i,) for i in range(4)])
    least.fleet.running[0].append((1e9, 99, 0.0))
    assert least.choose(0) == 1


def test_decode_cache_aware_keeps_a_conversation_on_its_instance(model) -> None:
    # two conversations of 4 blocks each, then their follow-up turns (same leading blocks)
    turns = [(1, 2, 3, 4), (11, 12, 13, 14), (1, 2, 3, 4, 5), (11, 12, 13, 14, 15)]
    ca = decode_batches(model, 2, "cache-aware", turns)
    first = [ca.choose(r) for r in range(2)]
    assert first[0] != first[1]  # no match: the smaller tree
    assert [ca.choose(r) for r in (2, 3)] == first
    with pytest.raises(ValueError, match="decode_router must be one of"):
        decode_batches(model, 2, "sticky", turns)


def test_every_policy_a_pdcluster_renders_has_a_replayed_router() -> None:
    for policy in RoutingPolicy:
        assert _ROUTING[policy.value] in ROUTERS and _ROUTING[policy.value] in DECODE_ROUTERS
    assert routing(default_spec()) == {"router": "smg-cache-aware", "decode_router": "round-robin"}
    spec = read_spec(str(Path(__file__).resolve().parents[2] / "bench" / "policy_bench_pdcluster.yaml"))
    # smg (the default gateway) follows the prefix by its own rule; sglang-router 0.3.2 picks
    # PD prefills at random under CacheAware (tests/loop/test_router_prefill_tree.py)
    assert routing(spec) == {"router": "smg-cache-aware", "decode_router": "round-robin"}
    old = spec.model_copy(update={"router": spec.router.model_copy(update={"gateway": SGLangGateway.SGLANG_ROUTER})})
    assert routing(old) == {"router": "random", "decode_router": "round-robin"}
    smg = spec.model_copy(update={"router": spec.router.model_copy(update={"gateway": SGLangGateway.SMG})})
    assert routing(smg) == {"router": "smg-cache-aware", "decode_router": "round-robin"}
    rr = spec.model_copy(update={"router": spec.router.model_copy(
        update={"prefill_policy": RoutingPolicy.ROUND_ROBIN})})
    assert routing(rr)["router"] == "round-robin"
