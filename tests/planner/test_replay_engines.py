"""The replay's prefill instances batch as SGLang and vLLM do (planner/replay/prefill_batches.py):
one rule per test, each against the article's one-request-at-a-time model where they differ."""

from __future__ import annotations

import numpy as np
import pytest

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.replay.prefill_batches import ENGINES
from pdscale.planner.replay.simulate import SimConfig, SimResult, simulate
from pdscale.planner.replay.traces import Trace

BLOCK = 512


def one_instance(model: PerformanceModel, trace: Trace, engine: str, **kw: object) -> SimResult:
    cfg = SimConfig(router="least-queue", initial_prefill=1, prefill_only=True, engine=engine,
                    slo=Slo(ttft_seconds=60.0), **kw)  # type: ignore[arg-type]
    return simulate(trace, model, cfg)


def trace_of(arrivals: list[float], inputs: list[int], blocks: list[tuple[int, ...]]) -> Trace:
    return Trace("t", arrivals, inputs, [1] * len(inputs), blocks, BLOCK)


def test_engine_defaults_are_the_engines_own() -> None:
    # SGLang server_args: 8,192 below 160 GB of GPU memory (H100, H200); vLLM arg_utils: 8,192
    # for the API server on >= 70 GB GPUs
    assert ENGINES["sglang"] == 8192 and ENGINES["vllm"] == 8192 and ENGINES["article"] is None


def test_requests_of_one_pass_finish_together(model: PerformanceModel) -> None:
    # the first request starts a pass on the idle instance; the next three arrive during it
    # and are taken together by the next pass
    tr = trace_of([0.0, 0.001, 0.001, 0.001], [500, 1000, 2000, 3000], [(), (), (), ()])
    batched = one_instance(model, tr, "sglang")
    assert np.ptp(batched.ttft_seconds[1:]) == 0.0
    # two passes, each paying the pass overhead once: the first request's alone, then the
    # other three's together
    whole = (model.prefill_seconds(500) + model.prefill_pass_overhead_seconds()
             + sum(model.prefill_compute_seconds(n) for n in (1000, 2000, 3000)))
    assert batched.ttft_seconds[1] == pytest.approx(whole - 0.001)
    # the article's model: each finishes right after its own compute
    article = one_instance(model, tr, "article")
    assert article.ttft_seconds[1] == pytest.approx(
        model.prefill_seconds(500) + model.prefill_seconds(1000) - 0.001)
    assert np.all(np.diff(article.ttft_seconds[1:]) > 0)


def test_a_pass_stops_at_the_chunk_and_a_long_prompt_spans_passes(model: PerformanceModel) -> None:
    # 20,000 tokens in 8,192-token passes: 8,192 + 8,192 + 3,616, the short request filling
    # the third pass beside the long one's last chunk: both finish when it ends
    tr = trace_of([0.0, 0.001], [20000, 100], [(), ()])
    r = one_instance(model, tr, "sglang")
    assert r.ttft_seconds[0] == pytest.approx(r.ttft_seconds[1] + 0.001)
    # with a budget the size of the long prompt, the short one waits only one pass
    big = one_instance(model, tr, "sglang", prefill_chunk_tokens=20000)
    assert big.ttft_seconds[1] > big.ttft_seconds[0] - 0.001
    assert big.ttft_seconds[1] == pytest.approx(
        model.prefill_seconds(20000) + model.prefill_seconds(100) - 0.001)
    # three passes of one prompt cost what one pass of it costs plus two more pass overheads,
    # and the short prompt sharing the third pass pays none of its own
    extra = 2 * model.prefill_pass_overhead_seconds()
    assert r.ttft_seconds[0] == pytest.approx(
        model.prefill_seconds(20000) + model.prefill_compute_seconds(100) + extra)


def test_a_pass_pays_its_overhead_once_however_many_prompts_it_carries(model: PerformanceModel) -> None:
    # SGLang runs one forward per batch: eight 100-token prompts arriving while a pass runs
    # are computed by the next one, which costs one overhead plus their compute (charged per
    # prompt, the pass would take 8 overheads: 80 ms of the profile's 10 ms each)
    overhead = model.prefill_pass_overhead_seconds()
    assert overhead > 0
    tr = trace_of([0.0] + [0.001] * 8, [100] * 9, [()] * 9)
    r = one_instance(model, tr, "sglang")
    first = model.prefill_seconds(100)
    second = overhead + 8 * model.prefill_compute_seconds(100)
    assert r.ttft_seconds[0] == pytest.approx(first)
    assert r.ttft_seconds[1] == pytest.approx(first + second - 0.001)
    assert second < 8 * model.prefill_seconds(100) - 6 * overhead


def test_no_prefix_hit_within_one_pass(model: PerformanceModel) -> None:
    shared = tuple(range(4))  # 2,048 tokens of one prefix
    # a first, unrelated request runs a pass; two sharing a prefix arrive during it
    tr = trace_of([0.0, 0.001, 0.001, 30.0], [500, 2100, 2100, 2100], [(99,), shared, shared, shared])
    batched = one_instance(model, tr, "sglang")
    # those two are scheduled in one pass before either is computed: neither hits; the last,
    # scheduled after they were inserted, hits the four blocks
    assert batched.hit_tokens == 4 * BLOCK
    # the article credits the hit at routing, behind a prompt not yet computed
    article = one_instance(model, tr, "article")
    assert article.hit_tokens == 8 * BLOCK


def test_a_hit_needs_the_prefix_computed_not_only_routed(model: PerformanceModel) -> None:
    # a tiny budget: the second request is scheduled in a later pass, after the first is in
    # the cache, so it hits even though both arrived together
    shared = tuple(range(4))
    tr = trace_of([0.0, 0.001, 0.001], [500, 2100, 2100], [(99,), shared, shared])
    r = one_instance(model, tr, "sglang", prefill_chunk_tokens=2100)
    assert r.hit_tokens == 4 * BLOCK


def test_unknown_engine_is_refused(model: PerformanceModel) -> None:
    tr = trace_of([0.0], [10], [()])
    with pytest.raises(ValueError, match="engine must be one of"):
        one_instance(model, tr, "trt")


def test_the_deployed_stack_sheds_nothing_and_the_ideal_router_is_a_what_if(
    model: PerformanceModel,
) -> None:
    """The deployed stack routes as the default router does (smg's cache-aware PD prefill
    choice); it sheds nothing of its own: smg's prefill admission, on by default, comes from
    the PDCluster (pdscale/replay.py ``router_admission``, tests/planner/test_replay_cli.py), so
    a stack without it serves an overloaded fleet late; early rejection at the predicted TTFT is
    the named what-if ``ideal-router``."""
    from pdscale.planner.replay.run import STACKS, ReplaySetup

    assert ReplaySetup.__dataclass_fields__["early_rejection"].default is False
    assert ReplaySetup.__dataclass_fields__["router"].default == "random"
    assert ReplaySetup.__dataclass_fields__["decode_router"].default == "round-robin"
    assert STACKS["deployed"] == {"engine": "sglang", "router": "smg-cache-aware",
                                  "decode_router": "round-robin", "early_rejection": False}
    # 40 prompts of 8,000 tokens a second on one instance: far past what it computes
    n = 400
    tr = Trace("over", [i / 40 for i in range(n)], [8000] * n, [1] * n, [()] * n, BLOCK)
    runs = {}
    for name in ("deployed", "ideal-router"):
        s = STACKS[name]
        runs[name] = simulate(tr, model, SimConfig(
            router=s["router"], early_rejection=s["early_rejection"], engine=s["engine"],
            initial_prefill=1, prefill_only=True, slo=Slo(ttft_seconds=2.0)))
    assert not runs["deployed"].rejected.any()
    assert runs["ideal-router"].rejected.mean() > 0.5


def test_cache_aware_routing_follows_sglang_routers_thresholds() -> None:
    """sgl-router cache_aware: balance first (abs 64 and rel 1.5), then a prefix match above
    30% of the prompt, else the smallest tree."""
    from pdscale.planner.observe import Role
    from pdscale.planner.replay.fleet import Events, Fleet
    from pdscale.planner.replay.prefix_index import PrefixIndex
    from pdscale.planner.replay.routers import CacheAwareRouter

    fleet = Fleet(PrefixIndex(100), Events(), switch_seconds=30.0)
    for _ in range(3):
        fleet.add(Role.PREFILL, 0.0, 0.0)
    fleet.prefix.insert(0, (1, 2, 3))
    fleet.prefix.insert(1, (7, 8))
    router = CacheAwareRouter(fleet, BLOCK)
    # instance 1 matches 2 blocks of a 3-block prompt (67% > 30%): it takes the request
    assert router.choose(0.0, 3 * BLOCK, {1: 2}) == 1
    # 2 blocks of a 10-block prompt (20%): the smallest tree (instance 2, empty) takes it
    assert router.choose(0.0, 10 * BLOCK, {1: 2}) == 2
    # loads 100/40/90: 60 apart is within the absolute threshold, the match still wins
    fleet.inflight[:] = [100, 90, 40]
    assert router.choose(0.0, 3 * BLOCK, {1: 2}) == 1
    # 65 apart and 100 > 1.5 x 35: imbalanced, the least loaded takes it despite the match
    fleet.inflight[:] = [100, 90, 35]
    assert router.choose(0.0, 3 * BLOCK, {1: 2}) == 2


def test_the_forward_time_runs_from_the_pass_that_takes_a_prompt_to_the_one_that_finishes_it(
        model: PerformanceModel) -> None:
    """What the engines' prefill forward latency records (SGLang's per-stage prefill_forward,
    vLLM's request_prefill_time_seconds): queueing excluded, a shared pass counted whole. One
    prompt alone, then three that arrive during its pass and share the next one."""
    seen = []

    def watch(obs: object) -> tuple[int, ...]:
        seen.append(obs)
        return (1, 1)

    tr = trace_of([0.0, 0.001, 0.001, 0.001, 200.0], [4000, 500, 1000, 2000, 10],
                  [(), (), (), (), ()])
    cfg = SimConfig(router="least-queue", initial_prefill=1, prefill_only=True, engine="sglang",
                    slo=Slo(ttft_seconds=60.0), interval_seconds=100.0)
    simulate(tr, model, cfg, controller=watch)
    shared = model.prefill_pass_overhead_seconds() + sum(model.prefill_compute_seconds(n) for n in (500, 1000, 2000))
    alone = model.prefill_seconds(4000)
    forward = [o.prefill_forward_seconds for o in seen if o.prefill_forward_seconds is not None]
    assert forward[0].value == pytest.approx((alone + 3 * shared) / 4)


def test_recorded_routes_replace_both_routers_choices(model: PerformanceModel) -> None:
    # a fidelity check replays each request on the instances the live routers chose
    n = 8
    tr = Trace("t", [0.001 * k for k in range(n)], [4000] * n, [200] * n, [()] * n, BLOCK)

    def run(routes: tuple[tuple[int, int], ...] | None) -> SimResult:
        cfg = SimConfig(router="round-robin", decode_router="round-robin", initial_prefill=2,
                        initial_decode=2, slo=Slo(ttft_seconds=60.0), recorded_routes=routes)
        return simulate(tr, model, cfg)

    spread = run(None)
    assert np.array_equal(run(tuple((k % 2, k % 2) for k in range(n))).ttft_seconds, spread.ttft_seconds)
    piled = run(((0, 1),) * n)  # every prompt on one prefill, every sequence on one decode
    assert piled.ttft_seconds.max() > 1.5 * spread.ttft_seconds.max()
    assert np.nanmean(piled.tpot_seconds) > np.nanmean(spread.tpot_seconds)
    # a route not known (-1) leaves the choice to the router
    assert np.array_equal(run(((-1, -1),) * n).ttft_seconds, spread.ttft_seconds)
    with pytest.raises(ValueError, match="8 requests"):
        run(((0, 0),) * 3)


def test_a_draining_prefill_is_released_when_its_last_response_ends(model: PerformanceModel) -> None:
    """pdscale stops a drained engine once it has nothing in flight, and SGLang's prefill holds
    a PD request until its KV transfer is done: a prefill drained mid-prompt holds its node
    until then, not until the router's estimate of its backlog (the one-prompt-at-a-time
    price, which a chunked prompt's passes exceed)."""
    ticks: list[float] = []

    def drain_at_second_tick(obs: object) -> tuple[int, ...]:
        ticks.append(0.0)
        return (1, 1) if len(ticks) == 1 else (0, 1)

    # a 20,000-token prompt spans three 8,192-token passes; the planner drains the only
    # prefill half a second in, and the next request finds none
    tr = Trace("t", [0.0, 0.6], [20000, 100], [2, 2], [(), ()], BLOCK)
    cfg = SimConfig(router="least-queue", initial_prefill=1, initial_decode=1, engine="sglang",
                    slo=Slo(ttft_seconds=60.0), interval_seconds=0.5)
    r = simulate(tr, model, cfg, controller=drain_at_second_tick)
    answered = r.ttft_seconds[0]  # its prefill's passes and its KV transfer
    assert answered > model.prefill_seconds(20000) + model.kv_transfer_seconds(20000)
    assert r.rejected[1]
    assert r.instance_seconds["draining"] == pytest.approx(answered - 0.5)
