"""The live loop sizes from what is in the system now, not only from what has finished.

Rates and lengths are counted as requests finish: after a change of load shape they show the
need late. The sequences in the decode system show it at once (Little's law at the batch the
TPOT target allows), and the plan must take it within one tick, without moving in steady load.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pdscale.planner.config import PlannerConfig, build_config
from pdscale.planner.model import Load, PerformanceModel, Slo
from pdscale.planner.needs import _decode_need_from_sequences
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import shipped_profile
from pdscale.planner.solve import History, current_load, step

# the demo's instance: a decode runs 2 sequences at the 50 ms TPOT target
MODEL = PerformanceModel(shipped_profile("demo-sim"))
SLO = Slo(ttft_seconds=5.0, tpot_seconds=0.05, percentile=0.9)


def config(warmup_seconds: float = 20.0, **kw: object) -> PlannerConfig:
    c = build_config(model=MODEL, slo=SLO, interval_seconds=10.0, node_budget=24, warmup_seconds=warmup_seconds,
                     max_prefill=16, max_decode=16, stabilization_window_seconds=30.0,
                     decode_drain_seconds=10.0, count_prefill_backlog=True, length_window=3)
    return replace(c, **kw)  # type: ignore[arg-type]


def observe(now: float, *, rate: float, isl: float, osl: float, p: int, d: int,
            decode_running: float | None, decode_waiting: float | None = 0.0) -> Observation:
    def at(x: float | None) -> Reading | None:
        return None if x is None else Reading(x, now)

    return Observation(
        now_seconds=now, rate_rps=at(rate), mean_input_tokens=at(isl), mean_output_tokens=at(osl),
        prefix_hit_rate=at(0.5),
        prefill=RoleState(ready=p, queue_depth=at(0.0), running_requests=at(1.0)),
        decode=RoleState(ready=d, queue_depth=at(decode_waiting), running_requests=at(decode_running)),
    )


def test_the_sizing_batch_is_the_profile_s() -> None:
    # the arithmetic below rests on it: 10 ms + 20 ms per sequence fits 2 in 50 ms
    assert MODEL.decode_batch_at_slo(0.05, 300.0) == 2


def steady(c: PlannerConfig, intervals: int, *, rate: float, isl: float, osl: float, p: int,
           d: int) -> History:
    """A history of ``intervals`` calm intervals of this load (sequences at Little's law at
    half the TPOT target: a fleet that meets it)."""
    h = History()
    for k in range(intervals):
        o = observe(10.0 * k, rate=rate, isl=isl, osl=osl, p=p, d=d,
                    decode_running=rate * osl * 0.025)
        _, h = step(o, config=c, history=h, now=10.0 * k)
    return h


def test_decode_sequences_with_stale_lengths_are_sized_in_one_step() -> None:
    """Short answers turned into agents: lengths still say 10 tokens out (2 decodes for 2
    req/s), but 24 sequences run on the 3 decodes, 8 each at TPOT 10 + 8 x 20 = 170 ms. At the
    50 ms target the same arrivals would keep 24 x 50 / 170 = 7.06 running; the other 16.94 are
    a backlog that resides 24 / 2 = 12 s and decays over the 20 s warm-up to
    16.94 x e^(-20/12) = 3.20. One step asks for all of it: ceil(10.26 / (2 x 0.8)) = 7."""
    c = config()
    h = steady(c, 6, rate=2.0, isl=100.0, osl=10.0, p=2, d=3)
    o = observe(60.0, rate=2.0, isl=100.0, osl=10.0, p=2, d=3, decode_running=24.0)
    decision, _ = step(o, config=c, history=h, now=60.0)
    assert decision.decode == 7, decision.explanation
    assert "decode 7 for the sequences running now" in decision.explanation
    # the sequences made the difference: unread, the stale lengths keep 2
    unread = replace(o, decode=replace(o.decode, running_requests=None, queue_depth=None))
    without, _ = step(unread, config=c, history=h, now=60.0)
    assert without.decode == 2


def test_a_stale_running_gauge_is_bounded_by_the_sequences_that_decoded() -> None:
    """SGLang logs its running gauge every 40 decode steps, or every 30 s when idle: nine
    decodes, each busy a fraction of the time, each showing its last busy batch of 2, sum to
    18 where 3 requests decoded over the last scrape (the inter-token latency's sum says so).
    Sized from the gauge they are kept: ceil(18 / 1.6) = 12 decodes. Bounded by what decoded,
    the load model's need stands (3 decodes for 2 req/s x 40 tokens)."""
    c = config()
    h = steady(c, 6, rate=2.0, isl=100.0, osl=40.0, p=2, d=9)
    stale = observe(60.0, rate=2.0, isl=100.0, osl=40.0, p=2, d=9, decode_running=18.0)
    assert _decode_need_from_sequences(c, stale, Load(2.0, 100.0, 40.0)) == 12
    read = replace(stale, decode=replace(stale.decode, decoding_requests=Reading(3.0, 60.0)))
    assert _decode_need_from_sequences(c, read, Load(2.0, 100.0, 40.0)) == 2
    decision, _ = step(read, config=c, history=h, now=60.0)
    assert "for the sequences running now" not in decision.explanation
    # a rise the gauge shows counts as far as the last scrape has seen it
    rising = replace(stale, decode=replace(stale.decode, running_requests=Reading(24.0, 60.0),
                                           decoding_requests=Reading(14.0, 60.0)))
    assert _decode_need_from_sequences(c, rising, Load(2.0, 100.0, 40.0)) == math.ceil(14.0 / 1.6)
    # a stale mean bounds nothing
    old = replace(stale, decode=replace(stale.decode, decoding_requests=Reading(3.0, 60.0 - 1000.0)))
    assert _decode_need_from_sequences(c, old, Load(2.0, 100.0, 40.0)) == 12


def test_a_short_decode_s_backlog_is_not_bought_behind_a_long_warm_up() -> None:
    """The same 24 sequences behind a 600 s warm-up: the backlog has long drained when a node
    ordered now serves, so only the 7.06 the arrivals keep at the target count:
    ceil(7.06 / 1.6) = 5. Sequences at the target (6 on 3 decodes: TPOT 10 + 2 x 20 = 50 ms)
    are load, not backlog: ceil(6 / 1.6) = 4, whatever the warm-up."""
    c = config(warmup_seconds=600.0)
    h = steady(c, 6, rate=2.0, isl=100.0, osl=10.0, p=2, d=3)
    o = observe(60.0, rate=2.0, isl=100.0, osl=10.0, p=2, d=3, decode_running=24.0)
    decision, _ = step(o, config=c, history=h, now=60.0)
    assert "decode 5 for the sequences running now" in decision.explanation
    at_target = replace(o, decode=replace(o.decode, running_requests=Reading(6.0, 60.0)))
    for cfg in (c, config()):
        d, _ = step(at_target, config=cfg, history=steady(cfg, 6, rate=2.0, isl=100.0, osl=10.0, p=2, d=3),
                    now=60.0)
        assert "decode 4 for the sequences running now" in d.explanation


def test_the_sequences_need_is_held_by_the_scale_down_window_then_released() -> None:
    c = config()
    h = steady(c, 6, rate=2.0, isl=100.0, osl=10.0, p=2, d=3)
    busy = observe(60.0, rate=2.0, isl=100.0, osl=10.0, p=2, d=3, decode_running=24.0)
    first, h = step(busy, config=c, history=h, now=60.0)
    assert first.decode == 7
    decisions = []
    for k in range(1, 8):  # the backlog has cleared: the fleet is at 7 and calm
        now = 60.0 + 10.0 * k
        o = observe(now, rate=2.0, isl=100.0, osl=10.0, p=2, d=7, decode_running=2.0)
        d, h = step(o, config=c, history=h, now=now)
        decisions.append(d.decode)
    assert decisions[0] == 7  # held within the 30 s window
    assert decisions[-1] < 7  # and released after it


def test_the_decode_queues_are_prefill_s_backlog_not_decode_need() -> None:
    """Long documents queued at prefill wait in their decodes' transfer queue too: no decode
    is needed for them (4 tokens out each)."""
    c = config()
    h = steady(c, 6, rate=1.0, isl=600.0, osl=4.0, p=6, d=1)
    calm = observe(60.0, rate=1.0, isl=600.0, osl=4.0, p=6, d=1, decode_running=0.2)
    queued = replace(calm, decode=replace(calm.decode, queue_depth=Reading(16.0, 60.0)))
    a, _ = step(calm, config=c, history=h, now=60.0)
    b, _ = step(queued, config=c, history=h, now=60.0)
    assert a.decode == b.decode == 1


def test_unknown_or_stale_sequences_add_nothing() -> None:
    c = config()
    h = steady(c, 6, rate=2.0, isl=100.0, osl=40.0, p=2, d=3)
    base = observe(60.0, rate=2.0, isl=100.0, osl=40.0, p=2, d=3, decode_running=None,
                   decode_waiting=None)
    known, _ = step(base, config=c, history=h, now=60.0)
    stale = replace(base, decode=replace(base.decode, running_requests=Reading(24.0, 60.0 - 1000.0)))
    old, _ = step(stale, config=c, history=h, now=60.0)
    assert old.decode == known.decode


def test_steady_load_moves_nothing() -> None:
    """An hour of the same load on a fleet that meets it: the sequences at Little's law add
    nothing to the load model's need, so no count changes after the first tick."""
    c = config()
    h = History()
    counts = []
    p, d = 2, 3
    for k in range(360):
        now = 10.0 * k
        # Poisson-like wobble of what is in the system: +-50% around the mean
        wobble = 1.0 + 0.5 * ((k * 7919) % 11 - 5) / 5
        o = observe(now, rate=2.0, isl=100.0, osl=40.0, p=p, d=d,
                    decode_running=2.0 * 40.0 * 0.04 * wobble)
        decision, h = step(o, config=c, history=h, now=now)
        p, d = decision.prefill, decision.decode
        counts.append((p, d))
    assert len(set(counts[1:])) == 1, sorted(set(counts))


def test_load_model_need_still_wins_when_larger() -> None:
    c = config()
    load = Load(4.0, 100.0, 40.0, 0.5)
    o = observe(0.0, rate=load.rate_rps, isl=100.0, osl=40.0, p=2, d=2, decode_running=1.0)
    with_rule, _ = step(o, config=c, history=History(), now=0.0)
    unread = replace(o, decode=replace(o.decode, running_requests=None, queue_depth=None))
    without, _ = step(unread, config=c, history=History(), now=0.0)
    assert with_rule.decode == without.decode


def test_a_longer_load_shape_is_sized_at_once_noise_is_not() -> None:
    """Chat (100 tokens in) turned into long documents (600 in): the 3-interval window's mean
    would trail; one interval's lengths at 1.5x the window's or more are a new shape."""
    c = config()
    h = steady(c, 6, rate=1.0, isl=100.0, osl=40.0, p=1, d=3)
    long_docs = observe(60.0, rate=1.0, isl=600.0, osl=40.0, p=1, d=3, decode_running=1.0)
    jumped, _ = step(long_docs, config=c, history=h, now=60.0)
    # as if the window had held long documents all along
    settled = steady(c, 6, rate=1.0, isl=600.0, osl=40.0, p=1, d=3)
    known, _ = step(long_docs, config=c, history=settled, now=60.0)
    assert jumped.desired[0] == known.desired[0] > 1
    windowed, _ = step(long_docs, config=replace(c, length_jump_ratio=None), history=h, now=60.0)
    assert windowed.desired[0] < jumped.desired[0]
    # 1.3x is noise around the window: the window's mean sizes it
    noisy = observe(60.0, rate=1.0, isl=130.0, osl=40.0, p=1, d=3, decode_running=1.0)
    n, _ = step(noisy, config=c, history=h, now=60.0)
    n_windowed, _ = step(noisy, config=replace(c, length_jump_ratio=None), history=h, now=60.0)
    assert n.desired == n_windowed.desired


def test_a_busy_shape_of_cheap_requests_does_not_forecast_the_new_shape_at_its_rate() -> None:
    """Chat at 2.4 req/s of 100-token prompts turned into long documents at 1.0 req/s of
    600-token prompts: the rate forecast remembers 2.4 req/s for its window, which at 600
    tokens would be 2.4x the prefill work chat brought and long documents bring. A past
    interval whose requests brought at most 1 / ``length_jump_ratio`` of the new shape's work
    is counted at that work: prefill is sized as after a chat at the new shape's own rate."""
    c = config()
    long_docs = observe(60.0, rate=1.0, isl=600.0, osl=40.0, p=2, d=8, decode_running=1.0)
    after_busy_chat, _ = step(long_docs, config=c, now=60.0,
                              history=steady(c, 6, rate=2.4, isl=100.0, osl=40.0, p=2, d=8))
    after_calm_chat, _ = step(long_docs, config=c, now=60.0,
                              history=steady(c, 6, rate=1.0, isl=100.0, osl=40.0, p=2, d=8))
    assert after_busy_chat.desired[0] == after_calm_chat.desired[0]
    # decode's requests did not change shape: chat's 2.4 req/s of 40 tokens out still counts
    assert after_busy_chat.desired[1] > after_calm_chat.desired[1]


def test_a_decode_that_costs_nothing_per_step_is_never_short() -> None:
    """A profile whose decode steps take no time (a degenerate fit) has no TPOT above any
    target: the sequences count as they are, and the rule divides by no zero. (A profile
    file like it is refused at load, naming the fields; this one is built past validation.)"""
    free = MODEL.profile.model_copy(update={"decode": MODEL.profile.decode.model_copy(update={
        "step_seconds": 0.0, "per_sequence_seconds": 0.0, "per_context_token_seconds": 0.0})})
    c = replace(config(), model=PerformanceModel(free))
    o = observe(60.0, rate=2.0, isl=100.0, osl=40.0, p=2, d=3, decode_running=24.0)
    load = Load(2.0, 100.0, 40.0)
    batch = c.model.decode_batch_at_slo(SLO.tpot_seconds, c.model.decode_mean_context(load))
    assert _decode_need_from_sequences(c, o, load) == math.ceil(24.0 / (batch * c.decode_utilization))


def test_responses_that_turned_longer_are_sized_from_the_tokens_streamed() -> None:
    """Long documents (5 tokens out) turned into agents (80 out): for a while no response
    finishes, so no output length is counted, and the last known one is the old load's 5.
    Decode has streamed 40 tokens per request entering it meanwhile: the plan sizes for those,
    not for 5, and says so; what finished still wins when it is known."""
    c = config()
    h = steady(c, 6, rate=1.0, isl=600.0, osl=5.0, p=8, d=1)
    agents = replace(observe(60.0, rate=1.0, isl=300.0, osl=5.0, p=8, d=1, decode_running=None),
                     mean_output_tokens=None)
    stale, _ = step(agents, config=c, history=h, now=60.0)
    streamed = replace(agents, streamed_output_tokens=Reading(40.0, 60.0))
    decision, _ = step(streamed, config=c, history=h, now=60.0)
    # as if the 40 tokens had been counted at finish
    counted = replace(agents, mean_output_tokens=Reading(40.0, 60.0))
    known, _ = step(counted, config=c, history=h, now=60.0)
    assert stale.decode < decision.decode == known.decode, (stale.explanation, decision.explanation)
    assert "no response finished" in decision.explanation
    assert "no response finished" not in known.explanation
    # a response counted at finish is the length, whatever streamed
    both = replace(counted, streamed_output_tokens=Reading(400.0, 60.0))
    assert step(both, config=c, history=h, now=60.0)[0].decode == known.decode
    # fewer tokens streamed than the last known length: the last known one stands
    short = replace(agents, streamed_output_tokens=Reading(2.0, 60.0))
    assert step(short, config=c, history=h, now=60.0)[0].decode == stale.decode
    # nothing streamed yet (1: the first token alone, no decode ready) says nothing
    idle = replace(agents, streamed_output_tokens=Reading(1.0, 60.0))
    held = step(idle, config=c, history=h, now=60.0)[0]
    assert held.decode == stale.decode and "no response finished" not in held.explanation


def test_with_no_length_ever_known_only_tokens_streamed_stand_in() -> None:
    """A first interval: prompts finished, no response yet, nothing known before. Tokens
    streamed give the output length; the first token alone (nothing streamed) leaves the load
    unknown, as before, and the plan holds."""
    obs = replace(observe(10.0, rate=1.0, isl=300.0, osl=0.0, p=1, d=1, decode_running=None),
                  mean_output_tokens=None, streamed_output_tokens=Reading(30.0, 10.0))
    load = current_load(obs, 180.0)
    assert load is not None and load.mean_output_tokens == 30.0
    assert current_load(replace(obs, streamed_output_tokens=Reading(1.0, 10.0)), 180.0) is None
    assert current_load(replace(obs, streamed_output_tokens=None), 180.0) is None
