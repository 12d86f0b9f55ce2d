"""The compute corrections learned from what the engines report (planner/calibration.py):
a slow fleet raises a role's factor, a fast one lowers it, noise does not move it, warm-up
outliers are skipped, and the factor stays within its bounds whatever the readings say."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from pdscale.planner.calibration import (
    BUSY_DEADBAND,
    DEADBAND,
    FACTOR_BOUNDS,
    learn_compute,
    samples,
)
from pdscale.planner.model import Calibration, Load, PerformanceModel, Slo
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import load_profile

SLO = Slo(ttft_seconds=15.0, tpot_seconds=0.05, percentile=0.99)
LOAD = Load(20.0, 8000.0, 300.0, 0.4)
AGE = 180.0


def _obs(model: PerformanceModel, t: float, *, decode_speed: float = 1.0, prefill_speed: float = 1.0,
         queue: float = 0.0, prefill_ready: int = 10, decode_ready: int = 8, running: float = 400.0,
         noise: float = 1.0, recently_ready: int = 0, ttft_tail: float = 3.0,
         forward: float | None = None, busy: float | None = None) -> Observation:
    """What the engines of a fleet ``*_speed`` times as fast as ``model``'s profile report."""
    r = lambda v: Reading(v, t)  # noqa: E731
    ctx = model.decode_mean_context(LOAD)
    tpot = model.tpot_seconds(running / decode_ready, ctx) / decode_speed * noise
    n = LOAD.mean_input_tokens
    ttft = (model.prefill_seconds(n, n * LOAD.prefix_hit_rate) / prefill_speed
            + model.kv_transfer_seconds(n)) * noise
    return Observation(
        now_seconds=t, rate_rps=r(LOAD.rate_rps), mean_input_tokens=r(n),
        mean_output_tokens=r(LOAD.mean_output_tokens), prefix_hit_rate=r(LOAD.prefix_hit_rate),
        ttft_p50_seconds=r(ttft), ttft_at_percentile_seconds=r(ttft_tail),
        tpot_p50_seconds=r(tpot), tpot_at_percentile_seconds=r(tpot * 1.2),
        prefill_forward_seconds=None if forward is None else r(forward),
        prefill_busy_seconds_per_request=None if busy is None else r(busy),
        prefill=RoleState(ready=prefill_ready, recently_ready=recently_ready, queue_depth=r(queue)),
        decode=RoleState(ready=decode_ready, recently_ready=recently_ready,
                         queue_depth=r(0.0), running_requests=r(running)),
    )


def _learn(model: PerformanceModel, intervals: int, **kw: float) -> Calibration:
    cal, previous = Calibration(), None
    for k in range(intervals):
        obs = _obs(model, 60.0 * (k + 1), **kw)
        s = samples(obs, LOAD, previous, slo=SLO, model=model, max_age_seconds=AGE)
        cal, previous = learn_compute(cal, s), obs.prefill.queue_depth
    return cal


def test_a_slow_decode_raises_its_factor_and_a_fast_one_lowers_it(model: PerformanceModel) -> None:
    slow = _learn(model, 8, decode_speed=0.8)
    fast = _learn(model, 8, decode_speed=1.25)
    assert slow.decode_factor == pytest.approx(1.25, rel=0.08)
    assert fast.decode_factor == pytest.approx(0.8, rel=0.08)
    # prefill reported as the profile says: untouched
    assert slow.prefill_factor == fast.prefill_factor == 1.0


def test_a_roles_first_samples_weigh_as_their_mean_and_later_ones_as_an_ewma(
        model: PerformanceModel) -> None:
    """A new planner knows nothing of its fleet beyond the profile: its first sample is the best
    estimate there is, and what it orders on it serves a warm-up later (an EWMA from the
    profile's 1.0 took five intervals to learn a decode 25% slower, each interval a
    warm-up's worth of short decode later). A learned factor moves by the EWMA's weight."""
    first = _learn(model, 1, decode_speed=0.8)
    assert first.decode_factor == pytest.approx(1.25, rel=0.01)
    assert first.decode_samples == 1 and first.prefill_samples == 0
    # the second sample weighs a half: a reading 1.5x slow after one 1.0x moves it halfway
    cal = Calibration(decode_samples=1)
    s = samples(_obs(model, 60.0, decode_speed=1 / 1.5), LOAD, None, slo=SLO, model=model,
                max_age_seconds=AGE)
    assert learn_compute(cal, s).decode_factor == pytest.approx(1.25, rel=0.01)
    # a factor learned from many samples moves by WEIGHT (0.3) of the way, as before
    learned = Calibration(decode_factor=1.0, decode_samples=40)
    assert learn_compute(learned, s).decode_factor == pytest.approx(1.15, rel=0.01)
    # a count no planner writes weighs as a first sample: the weight never exceeds 1
    assert learn_compute(replace(learned, decode_samples=-7), s).decode_factor == pytest.approx(1.25)


def test_the_decode_sample_is_taken_at_the_intervals_mean_batch_not_the_batch_now(
    model: PerformanceModel,
) -> None:
    """The interval's TPOTs ran at its mean batch; the gauge at the tick is one moment of it.
    A fleet exactly as its profile, its batch 400 on average and 200 at the tick: read at the
    snapshot the sample says 'slow', at the mean it says 'as the profile'."""
    obs = _obs(model, 60.0, running=400.0)
    snapshot_only = replace(obs, decode=replace(obs.decode, running_requests=Reading(200.0, 60.0)))
    with_mean = replace(snapshot_only, decode=replace(snapshot_only.decode,
                                                      running_requests_mean=Reading(400.0, 60.0)))
    kw = dict(slo=SLO, model=model, max_age_seconds=AGE)
    assert samples(snapshot_only, LOAD, None, **kw).decode > 1.0 + DEADBAND
    assert samples(with_mean, LOAD, None, **kw).decode == pytest.approx(1.0)


def test_an_idle_prefill_relaxes_a_raised_factor_only_while_the_slo_is_comfortable(
        model: PerformanceModel) -> None:
    """Idle latencies cannot tell prefill's speed (the median prompt is not the mean one): a
    factor raised by a saturated interval relaxes towards 1, slowly, while the TTFT at the
    percentile is under half its target with no excess rejections; nothing else moves it."""
    def idle(start: float, intervals: int = 10, rejected: float = 0.0, **kw: float) -> float:
        cal, previous = Calibration(prefill_factor=start), None
        for k in range(intervals):
            t = 60.0 * (k + 1)
            obs = replace(_obs(model, t, **kw), rejected_rps=Reading(rejected, t))
            s = samples(obs, LOAD, previous, slo=SLO, model=model, max_age_seconds=AGE)
            cal, previous = learn_compute(cal, s), obs.prefill.queue_depth
        return cal.prefill_factor

    relaxed = idle(1.5)
    assert 1.0 < relaxed < 1.5 * 0.99**10
    assert idle(1.5, intervals=200) == 1.0  # towards the profile, never past it
    # a fast fleet's readings do not cut below the profile; a learned factor below 1 stays
    assert idle(1.0, prefill_speed=1.25) == 1.0
    assert idle(0.8) == 0.8
    # near the target, or with more rejections than the SLO's 1%, nothing relaxes
    assert idle(1.5, ttft_tail=10.0) == 1.5
    assert idle(1.5, rejected=0.05 * LOAD.rate_rps) == 1.5


def test_rejections_count_as_ttft_misses_for_the_headroom(model: PerformanceModel) -> None:
    """step(): served requests met the TTFT target, but 5% were rejected at a p99 SLO."""
    from pdscale.planner.config import PlannerConfig
    from pdscale.planner.decision import Decision
    from pdscale.planner.solve import History, recalibrate

    cfg = PlannerConfig(model=model, slo=SLO)
    last = Decision(at_seconds=0.0, prefill=10, decode=8, predicted_ttft_seconds=1.0,
                    predicted_tpot_seconds=0.03, cost_gpu_hours=1.0, explanation="")
    history = History(decisions=(last,))
    obs = _obs(model, 60.0)
    assert recalibrate(obs, cfg, history).prefill_headroom == 1.0
    rejecting = replace(obs, rejected_rps=Reading(0.05 * LOAD.rate_rps, 60.0))
    assert recalibrate(rejecting, cfg, history).prefill_headroom > 1.0


def test_a_saturated_prefill_teaches_its_speed_from_what_it_completes(model: PerformanceModel) -> None:
    """Requests queue at both ends of the interval: the ready instances computed
    ready / service requests per second; the queue grew by the rest of the arrivals."""
    n = LOAD.mean_input_tokens
    service = model.prefill_seconds(n, n * LOAD.prefix_hit_rate)
    ready, slow = 5, 0.8
    completed = ready / (service / slow)  # what a fleet 25% slower computes per second
    grows = LOAD.rate_rps - completed
    assert grows > 0
    cal, previous = Calibration(), None
    for k in range(8):
        t = 60.0 * (k + 1)
        obs = _obs(model, t, prefill_ready=ready, queue=100.0 + grows * t)
        s = samples(obs, LOAD, previous, slo=SLO, model=model, max_age_seconds=AGE)
        cal, previous = learn_compute(cal, s), obs.prefill.queue_depth
    assert cal.prefill_factor == pytest.approx(1.25, rel=0.08)


def test_noise_around_the_profile_moves_nothing_much(model: PerformanceModel) -> None:
    rng = random.Random(7)
    cal, previous = Calibration(), None
    seen = []
    for k in range(200):
        obs = _obs(model, 60.0 * (k + 1), noise=rng.uniform(0.85, 1.15))
        s = samples(obs, LOAD, previous, slo=SLO, model=model, max_age_seconds=AGE)
        cal, previous = learn_compute(cal, s), obs.prefill.queue_depth
        seen.append(cal.decode_factor)
    assert max(abs(f - 1.0) for f in seen) < 0.12


def test_warm_up_outliers_teach_nothing(model: PerformanceModel) -> None:
    cal = _learn(model, 8, decode_speed=0.5, prefill_speed=2.0, recently_ready=1)
    assert (cal.prefill_factor, cal.decode_factor) == (1.0, 1.0)


def test_broken_readings_stay_bounded_and_move_slowly(model: PerformanceModel) -> None:
    one = _learn(model, 1, decode_speed=0.01)
    assert one.decode_factor <= 1.25  # one interval moves it at most MAX_STEP
    many = _learn(model, 50, decode_speed=0.01)
    # it stops at the bound, or within the dead band below it
    lo, hi = FACTOR_BOUNDS
    assert hi / (1 + DEADBAND) <= many.decode_factor <= hi
    assert lo <= _learn(model, 50, decode_speed=100.0).decode_factor <= lo * (1 + DEADBAND)


def test_a_prefill_faster_than_its_profile_is_learned_from_its_forward_time(
        model: PerformanceModel) -> None:
    """A prompt's forward time is its compute plus that of the prompts sharing its passes, so
    over the profile's mean compute it bounds the speed factor from above: below the factor it
    lowers it (a fleet faster than its profile comes out cheaper without ever saturating),
    above it it raises nothing (shared passes are no slow fleet)."""
    service = model.prefill_service_seconds(LOAD)
    fast = _learn(model, 12, forward=0.8 * service)
    assert fast.prefill_factor == pytest.approx(0.8, rel=0.08)
    assert _learn(model, 12, forward=1.3 * service).prefill_factor == 1.0
    # within the dead band of the factor: nothing moves
    assert _learn(model, 12, forward=(1.0 - DEADBAND / 2) * service).prefill_factor == 1.0
    # warming instances' first passes teach nothing
    assert _learn(model, 12, forward=0.8 * service, recently_ready=1).prefill_factor == 1.0
    # nor does a reading that is not a number of seconds
    assert _learn(model, 12, forward=0.0).prefill_factor == 1.0


def test_the_prefill_gpus_busy_time_per_prompt_teaches_its_speed_both_ways_at_any_load(
        model: PerformanceModel) -> None:
    """SGLang's GPU execution time counts a pass once, so per prompt finished it is the
    prompts' compute: a slower prefill is learned as well as a faster one, on an idle fleet
    (no queue to saturate), from the first sample; the forward time's one-sided ceiling has
    nothing to add then."""
    service = model.prefill_service_seconds(LOAD)
    assert _learn(model, 1, busy=1.25 * service).prefill_factor == pytest.approx(1.25, rel=0.01)
    assert _learn(model, 1, busy=0.8 * service).prefill_factor == pytest.approx(0.8, rel=0.01)
    # a fleet as its profile says: nothing moves; shared passes are no slow fleet here
    assert _learn(model, 12, busy=service, forward=1.3 * service).prefill_factor == 1.0
    # with the busy time read, a low forward time pulls nothing
    assert _learn(model, 12, busy=service, forward=0.8 * service).prefill_factor == 1.0
    # nor does an idle prefill relax a factor the busy time measures
    assert _learn(model, 12, busy=1.25 * service).prefill_factor == pytest.approx(1.25, rel=0.01)
    # a sample within the busy time's own per-interval spread moves nothing
    assert _learn(model, 12, busy=(1.0 - BUSY_DEADBAND * 0.9) * service).prefill_factor == 1.0
    assert _learn(model, 1, busy=(1.0 - BUSY_DEADBAND * 1.2) * service).prefill_factor < 1.0
    # warming instances' first passes teach nothing; a zero is not a reading
    assert _learn(model, 12, busy=2.0 * service, recently_ready=1).prefill_factor == 1.0
    assert _learn(model, 12, busy=0.0).prefill_factor == 1.0


def test_the_decode_is_read_from_the_histogram_that_timed_its_tokens(model: PerformanceModel) -> None:
    """Where the mean inter-token latency and the requests decoding over the interval are read
    (the histogram's sum over its count, and its sum's rate), they set the decode's sample:
    the median (interpolated within a wide bucket) and the running gauge (set only when a batch
    is logged, so it lags a batch that changes) do not. On the demo's run at 291fa1e the old
    pair read a decode of the profile's speed 1.21x slow as chat filled it."""
    right = _obs(model, 60.0, running=400.0)
    t = right.now_seconds
    ctx = model.decode_mean_context(LOAD)
    mean_tpot = model.tpot_seconds(400.0 / right.decode.ready, ctx)
    # a stale gauge (half the batch) and a median 20% high: the old pair reads it slow
    misleading = replace(
        right, tpot_p50_seconds=Reading(mean_tpot * 1.2, t),
        decode=replace(right.decode, running_requests=Reading(200.0, t),
                       running_requests_mean=Reading(200.0, t)))
    old = samples(misleading, LOAD, None, slo=SLO, model=model, max_age_seconds=AGE).decode
    assert old is not None and old > 1.2
    read = replace(misleading, tpot_mean_seconds=Reading(mean_tpot, t),
                   decode=replace(misleading.decode, decoding_requests_mean=Reading(400.0, t)))
    new = samples(read, LOAD, None, slo=SLO, model=model, max_age_seconds=AGE).decode
    assert new == pytest.approx(1.0, rel=1e-9)
    # and a decode 25% slower reads as such from them
    slow = replace(read, tpot_mean_seconds=Reading(mean_tpot * 1.25, t))
    assert samples(slow, LOAD, None, slo=SLO, model=model, max_age_seconds=AGE).decode == pytest.approx(1.25)


@pytest.mark.parametrize("mean_batch", [0.2, 0.7, 3.0, 50.0])
def test_the_mean_over_tokens_is_what_poisson_batches_give(mean_batch: float) -> None:
    """``tpot_token_mean_seconds`` against a count: instances at Poisson batches, each adding
    b / TPOT(b) tokens a second and b seconds of inter-token gaps (the histogram's count and
    sum). Where batches are small the mean is well above TPOT at the mean batch (an idle
    instance adds no token, a busier one adds more); where they are large the two agree."""
    demo = PerformanceModel(load_profile("demo-sim"))
    rng = np.random.default_rng(7)
    batches = rng.poisson(mean_batch, 200_000)
    busy = batches[batches > 0].astype(float)
    tpots = np.array([demo.tpot_seconds(b, 100.0) for b in busy])
    counted = busy.sum() / (busy / tpots).sum()  # gaps' seconds over tokens
    assert demo.tpot_token_mean_seconds(mean_batch, 100.0) == pytest.approx(counted, rel=0.01)
    at_mean = demo.tpot_seconds(mean_batch, 100.0)
    if mean_batch < 1:
        assert counted > 1.05 * at_mean
    if mean_batch >= 50:
        assert counted == pytest.approx(at_mean, rel=0.01)


def test_the_decode_is_learned_only_where_the_spread_of_its_sequences_does_not_matter(
        model: PerformanceModel) -> None:
    """The demo's instance (10 ms a step + 20 ms a sequence) at 1.1 sequences: a mean
    inter-token latency 1.22x TPOT at the mean batch is what Poisson batches of the profile's
    speed give (1.44x), so it says nothing of the speed and is not taken. At 4.1 sequences
    Poisson gives 1.04x, but the batches of a load that changed within the interval, or behind
    round robin, spread wider (a replayed chat ramp on a fleet at the profile's speed read
    1.12x): not taken either; at 10 each it is (a decode 22% slow). Under one sequence
    decoding on average, nothing is taken. An 8xH200 decode at
    these short contexts is learned at any batch."""
    demo = PerformanceModel(load_profile("demo-sim"))
    load = Load(2.0, 100.0, 40.0, 0.0)
    ctx = demo.decode_mean_context(load)

    def sample(m: PerformanceModel, decoding: float, ready: int, ratio: float) -> float | None:
        t = 60.0
        tpot = ratio * m.tpot_seconds(decoding / ready, ctx)
        obs = Observation(
            now_seconds=t, rate_rps=Reading(2.0, t), tpot_mean_seconds=Reading(tpot, t),
            tpot_p50_seconds=Reading(tpot, t),
            decode=RoleState(ready=ready, decoding_requests_mean=Reading(decoding, t)))
        return samples(obs, load, None, slo=SLO, model=m, max_age_seconds=AGE).decode

    assert sample(demo, 2.2, 2, 1.22) is None
    assert sample(demo, 8.3, 2, 1.12) is None
    assert sample(demo, 20.0, 2, 1.22) == pytest.approx(1.22)
    assert sample(demo, 0.5, 1, 1.22) is None
    assert sample(model, 2.2, 2, 1.22) == pytest.approx(1.22)
