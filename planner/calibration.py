"""Learning how fast the fleet really is: the profile's compute corrections, both ways.

A profile is a measurement of other hardware, another engine version, another load; a real
fleet runs faster or slower by something like 25%. ``Calibration.prefill_factor`` and
``decode_factor`` (model.py) multiply every prefill compute time and every decode step the
model predicts; this module moves them, each interval, towards what the engines report for
the load they were given. Pure: a function of the observation and the last calibration.

Decode. TPOT is the model's TPOT at the batch each instance runs, so the interval's mean
inter-token latency over the predicted TPOT at the batch it ran at (sequences decoding /
ready instances) and the load's mean context is the factor, whether the fleet is short or
not. Measured on the
Mooncake trace x6 (bench/model_error_bench.py's fleets, with the median TPOT and the running
gauge's mean, which the replay reads as exactly as the mean and the requests decoding): the
per-interval ratio's median was 1.03 with the right profile, 1.28 on a fleet 25% slower (1.25
expected), 0.82 on one 25% faster (0.80), each interval within about +-15%. Live, only the
mean and the requests decoding are read exactly (``samples``).

Prefill. Its latency mixes queueing and compute, so it is learned from the GPUs instead:

- *busy time*, at any load, where the engine exports it (SGLang's
  ``gpu_execution_seconds_total`` of its prefill passes; vLLM has none): the seconds the
  prefill instances spent in forward passes per prompt they finished, over the profile's
  mean compute of the interval's prompts (``PerformanceModel.prefill_service_seconds``). A
  pass counts once however many prompts share it, so this is the prompts' compute: a sample
  both ways, on an idle fleet as on a saturated one, and the three readings below are not
  used. Measured on the deployed stack (bench/model_error_bench.py, bench/policy_bench.py)
  against the forward-time ceiling it replaces: a faster prefill costs 1.04x the GPU-hours of
  the planner that knows the fleet on Mooncake x6 as a first deployment (1.17x), both faster
  1.05x (1.18x); a slower prefill meets 96.4% as a first deployment (95.7%; the planner that
  knows the fleet 97.0%) and 97.2% once running (96.7%; knows 97.1%, the oracle 97.1%); on
  Azure, where short prompts never saturated prefill and a slower one was learned only as
  headroom, 91.8% running (90.8%; knows 93.5%). With the right profile: Mooncake -0.1 pp at
  1.4% fewer GPU-hours, ServeGen's day -0.1 pp at 2.7% fewer, Azure and the steady hour
  unchanged (its samples then stay within ``BUSY_DEADBAND``).

Where no busy time is read, three readings are used, each where it means something:

- *saturated*: when requests queue at prefill at the start and at the end of the interval
  (at least ``SATURATED_QUEUE_PER_INSTANCE`` per ready instance), every instance was busy
  throughout, and the requests completed (arrivals minus the queue's growth) are what the
  ready instances compute: factor = ready / (completed/s x predicted compute seconds per
  request, ``PerformanceModel.prefill_service_seconds``: the mean compute of the prompts,
  priced from their spread). This sees a slow fleet at once, rejected or queued requests
  included. Priced at the mean prompt's compute instead, it read long-tailed prompts as a
  slow fleet (attention is quadratic): on Mooncake x6 a fleet 25% slower read about 1.8.
- *idle*: when almost nothing queues, the latency readings cannot say how fast prefill is.
  The median TTFT over the compute of the mean prompt was tried: the median prompt is much
  shorter than the mean one, and at low load it read 0.55-1.1 per interval with the right
  profile (on a steady hour behind the ideal router the planner's prefill count wandered
  between 7 and 12). So an idle prefill only relaxes its factor towards 1, by ``RELAX_STEP``
  per interval, while its TTFT at the SLO percentile is under half the target with no more
  rejections than the SLO allows (a rejected or timed-out request is a TTFT miss).
- *forward time*, at any load: the engines' mean time a prompt spends in forward passes
  (SGLang's per-stage ``prefill_forward``, vLLM's ``request_prefill_time_seconds``; queueing
  and the KV transfer excluded) over the profile's mean compute for the interval's prompts.
  A pass shared with other prompts counts whole, so this reads the fleet slower than it is
  (on Mooncake x6 with the right profile the per-interval median was 1.18, 5% of intervals
  at or below 1.0): it is used only as a ceiling, lowering a factor above it and never
  raising one. That is how a fleet faster than its profile comes out cheaper without ever
  saturating: on Mooncake x6 a prefill 25% faster reached 0.80 within 20 minutes and cost
  1.10x the GPU-hours of the planner that knows the fleet (1.23x without). With the right
  profile it also corrects the model's own mean compute where that is high: on Mooncake
  lengths a prompt's cache hits concentrate on the long prompts (conversations), which the
  model's uniform hit rate does not see, and the bucketed spread reads 9-19% high per
  interval; behind the ideal router (passes mostly unshared) the forward time was 0.77-0.97
  of the prediction and the factor settled at 0.84 within 20 minutes (steady hour: 99.5%,
  prefill 14 -> 11). On the deployed stack: Mooncake x6 -0.14 pp with 2.4% fewer GPU-hours,
  ServeGen's day -0.14 pp with 6.7% fewer, Azure and the steady hour unchanged. (Measured
  while the replay counted prompts at their arrival, rejected ones included, as no engine
  does: behind the ideal router's early rejection that put the long prompts it rejected into
  the mean, and part of the 0.77-0.97 was that. Counted at their finish, as the engines
  count them, the steady hour's forward time reads 0.94-1.07 and the factor stays near 0.98.)

Either way: no sample from a role with instances that became ready within the interval
(their first passes are slow: JIT, graphs, cold caches, and Dynamo over-scales on exactly
this); each sample is clamped to ``FACTOR_BOUNDS``; a sample within ``DEADBAND`` of the
current factor moves nothing (the estimators' own bias is a few percent); otherwise the
factor moves ``WEIGHT`` of the way (an EWMA: 83% of a step change in 5 intervals), and by at
most ``MAX_STEP`` times per interval, so a broken reading cannot run it away.

A role's first samples are the exception: before them the planner knows only the profile, and
what it orders on a sample serves a warm-up later, so the k-th sample weighs 1/k (a running
mean of the samples, the first taken whole) until that falls below ``WEIGHT``. Measured on
Mooncake x6 against the EWMA from the first sample (deployed stack, bench/model_error_bench.py
fleets, with lengths counted at a request's finish as the engines count them): a decode 25%
slower was learned in one interval instead of five, attainment +0.9 pp on a first deployment
(89.1% against 88.1%), both roles slower +0.9 pp, a running planner within 0.2 pp (there the
first orders are held down by the first interval's outputs, the short ones, which finish
first); the right fleet, the faster ones, Azure, ServeGen and the steady hour unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .model import Calibration, Load, PerformanceModel, Slo
from .observe import Observation, Reading, fresh

#: a factor outside this range is a broken metric, not a slow or fast engine
FACTOR_BOUNDS = (0.5, 2.0)
#: fewer sequences decoding than this on average over the interval (the whole fleet mostly
#: idle: the demo's long documents, 4 tokens out, decoded 0.01-0.13) say nothing of the
#: decode's speed: a mean over a handful of requests' gaps read 1.23 there
MIN_DECODING = 1.0
#: a decode sample is taken only where Poisson batches would put the mean over tokens at most
#: this far above TPOT at the mean batch. A load that changed within the interval, and round
#: robin's batches (a sequence never moves, so an instance that took a burst keeps it), spread
#: the batches wider than Poisson: replaying the demo's recordings on a fleet at the profile's
#: exact speed, chat filling two decodes (4.1 sequences each, Poisson 4.3% above) read 12% slow
#: and was learned as speed (x0.89, as the live loop learned x0.84-0.91). 2.8x Poisson's
#: spread must stay inside the dead band: 6% / 2.8 (the demo's instance from 6 sequences; the
#: 8xH200 profile's decode at 2k-token contexts always, at 8k from about 5 sequences; on the
#: benchmarks it moved ServeGen's GPU-hours by 0.07% and nothing else)
SPREAD_GATE = 0.02
#: EWMA weight of one interval's sample
WEIGHT = 0.3
#: samples this close (relative) to the current factor leave it alone
DEADBAND = 0.06
#: the same for the prefill's busy-time sample, wider: with the right profile its per-interval
#: spread is +-5% around 0.97-0.98 (p10-p90 0.92-1.02 on the steady hour, Mooncake lengths;
#: the bucketed prompt spread and the uniform hit rate price each interval's prompts a little
#: off), and a factor that chased that spread moved counts at instance boundaries: the steady
#: hour behind the ideal router re-added a node it had removed minutes before
BUSY_DEADBAND = 0.10
#: the factor changes by at most this ratio per interval
MAX_STEP = 1.25
#: prefill counts as saturated with at least this many queued requests per ready instance at
#: both ends of the interval. sglang-router's cache-aware policy follows prefix matches until
#: the busiest instance has 64 more requests than the idlest (router_args.py): below that a
#: queue may sit on a few hot instances while others idle, and the throughput reads as if the
#: fleet were slow (measured on Mooncake x6 at 2 per instance: the right profile read 1.6-1.9x
#: slow and bought 14% more GPU-hours for nothing)
SATURATED_QUEUE_PER_INSTANCE = 64.0
#: prefill counts as idle with at most this many queued requests per ready instance
IDLE_QUEUE_PER_INSTANCE = 0.25
#: an idle prefill whose TTFT at the percentile is below this share of its target relaxes its
#: factor towards 1 by this share per interval (as the headroom decays, model.py)
RELAX_BELOW = 0.5
RELAX_STEP = 0.02


@dataclass(frozen=True)
class ComputeSamples:
    """One interval's observed/predicted compute ratios (None: nothing learned)."""

    prefill: float | None
    decode: float | None
    #: how the prefill factor moves: "both" towards ``prefill``, or "relax": a factor above 1
    #: steps ``RELAX_STEP`` towards 1 (``prefill`` is then None)
    prefill_direction: str
    #: the prompts' forward time over their predicted compute: a ceiling the prefill factor
    #: moves down to when it is below it, never a reason to raise it (module docstring)
    prefill_ceiling: float | None = None
    #: how far ``prefill`` must be from the factor to move it
    prefill_deadband: float = DEADBAND


def samples(
    obs: Observation, load: Load | None, previous_queue: Reading | None, *, slo: Slo,
    model: PerformanceModel, max_age_seconds: float,
) -> ComputeSamples:
    """This interval's compute ratios against the profile (``model`` without calibration)."""
    now = obs.now_seconds

    def get(r: Reading | None) -> float | None:
        return fresh(r, now, max_age_seconds)

    raw = PerformanceModel(model.profile)
    decode = None
    d = obs.decode
    # The interval's mean inter-token latency at the batch it ran at, both from the histogram
    # that timed the tokens (its sum over its count, and its sum's rate by Little's law): the
    # median interpolated within SGLang's 0.1-0.2 s bucket, and the running gauge, set only
    # when a batch is logged, lagged a batch that changed. On the demo's recording (a
    # Prometheus rerun of its run at 291fa1e) they read the decode 1.21x slow as chat filled
    # it and up to 2.7x fast once long documents had emptied it; these read 1.01 and
    # 1.00-1.02 there (a batch still filling reads slow on both: the gate below)
    running = get(d.decoding_requests_mean)
    tpot = get(obs.tpot_mean_seconds)
    if running is None or tpot is None:
        # a source without them: the gauge's mean (or now's) and the median
        running = get(d.running_requests_mean)
        if running is None:
            running = get(d.running_requests)
        tpot = get(obs.tpot_p50_seconds)
    if load is None or load.rate_rps <= 0:
        return ComputeSamples(None, None, "both")
    if not d.recently_ready and running is not None and running >= MIN_DECODING and d.ready and tpot:
        batch, context = running / d.ready, raw.decode_mean_context(load)
        predicted = raw.tpot_seconds(batch, context)
        # Where batches are small, the mean over tokens depends on how the sequences spread
        # over the instances as much as on their speed (tokens come from the busier batches):
        # spread at random (Poisson) it is above TPOT at the mean batch, spread evenly (round
        # robin, at a steady load) it is at it. Learned there, the spread reads as speed: on
        # the demo's run at e6c73b0 a chat still filling two decodes (1.1 sequences each)
        # read 1.22x slow, taken whole as the decode's first sample, and chat held 16
        # decodes where its replay held 9. So a sample is taken only where the two agree
        # well within the dead band (SPREAD_GATE)
        if predicted > 0 and raw.tpot_token_mean_seconds(batch, context) <= (1 + SPREAD_GATE) * predicted:
            decode = tpot / predicted
    prefill, direction = None, "both"
    p = obs.prefill
    if p.recently_ready or not p.ready:
        return ComputeSamples(None, decode, "both")
    service = raw.prefill_service_seconds(load)
    if service <= 0:
        return ComputeSamples(None, decode, "both")
    busy_per_request = get(obs.prefill_busy_seconds_per_request)
    if busy_per_request:
        # the GPUs' busy time per prompt is the prompts' compute, at any load: a sample both
        # ways, and the forward time's one-sided ceiling has nothing to add
        return ComputeSamples(busy_per_request / service, decode, "both",
                              prefill_deadband=BUSY_DEADBAND)
    forward = get(obs.prefill_forward_seconds)
    ceiling = forward / service if forward else None
    queue, before = get(p.queue_depth), previous_queue
    busy = SATURATED_QUEUE_PER_INSTANCE * p.ready
    if (queue is not None and before is not None and queue >= busy and before.value >= busy
            and 0 < now - before.at_seconds <= 2 * max_age_seconds):
        completed_rps = load.rate_rps - (queue - before.value) / (now - before.at_seconds)
        if completed_rps > 0:
            prefill = p.ready / (completed_rps * service)
    elif queue is not None and queue <= IDLE_QUEUE_PER_INSTANCE * p.ready:
        # Idle: nothing says how fast prefill is (see the module's docstring), but a TTFT at
        # the percentile under half its target with no excess rejections says the factor
        # is not needed as high: decay it towards the profile's 1, slowly
        ttft_tail = get(obs.ttft_at_percentile_seconds)
        if (ttft_tail is not None and ttft_tail < RELAX_BELOW * slo.ttft_seconds
                and not rejected_too_many(obs, slo, max_age_seconds)):
            direction = "relax"
    return ComputeSamples(prefill, decode, direction, ceiling)


def _move(factor: float, sample: float | None, *, direction: str = "both",
          weight: float = WEIGHT, deadband: float = DEADBAND) -> float:
    """``factor`` moved towards ``sample``: clamped, dead-banded, damped (``weight`` of the
    way), rate-limited; or, ``direction="relax"``, a ``RELAX_STEP`` towards 1."""
    if direction == "relax":
        # (a factor below 1 was learned from a saturated fleet: comfort is what it buys)
        return max(1.0, factor * (1.0 - RELAX_STEP)) if factor > 1.0 else factor
    if sample is None:
        return factor
    lo, hi = FACTOR_BOUNDS
    target = min(max(sample, lo), hi)
    if abs(target / factor - 1.0) <= deadband:
        return factor
    moved = factor + weight * (target - factor)
    moved = min(max(moved, factor / MAX_STEP), factor * MAX_STEP)
    return min(max(moved, lo), hi)


def _weight(taken: int) -> float:
    """The weight of a role's sample after ``taken`` others: a running mean of its samples
    while that weighs more than the EWMA's ``WEIGHT`` (module docstring)."""
    return max(WEIGHT, 1.0 / (max(taken, 0) + 1))


def learn_compute(cal: Calibration, s: ComputeSamples) -> Calibration:
    """``cal`` with its compute factors moved by this interval's samples."""
    taken_p, taken_d = cal.prefill_samples, cal.decode_samples
    prefill = _move(cal.prefill_factor, s.prefill, direction=s.prefill_direction,
                    weight=_weight(taken_p), deadband=s.prefill_deadband)
    taken_p += s.prefill is not None
    # the ceiling always by the EWMA, and not counted: it is read only where it is below the
    # factor, so its first readings are its low tail (taken whole, on the steady hour behind
    # the ideal router, the first set the factor at 0.80 where the EWMA settled at 0.84)
    if s.prefill_ceiling is not None and s.prefill_ceiling < prefill:
        prefill = _move(prefill, s.prefill_ceiling)
    decode = _move(cal.decode_factor, s.decode, weight=_weight(taken_d))
    taken_d += s.decode is not None
    if (prefill, decode, taken_p, taken_d) == (cal.prefill_factor, cal.decode_factor,
                                               cal.prefill_samples, cal.decode_samples):
        return cal
    moved = prefill != cal.prefill_factor or decode != cal.decode_factor
    return replace(cal, prefill_factor=prefill, decode_factor=decode,
                   samples=cal.samples + moved, prefill_samples=taken_p, decode_samples=taken_d)


def rejected_too_many(obs: Observation, slo: Slo, max_age_seconds: float) -> bool:
    """More requests refused or timed out (``rejected_rps``) than the SLO's share may miss:
    the TTFT at the percentile falls on a request that never got a first token, however good
    the served requests' quantile looks. False when the observation carries no such reading."""
    now = obs.now_seconds
    rejected = fresh(obs.rejected_rps, now, max_age_seconds)
    rate = fresh(obs.rate_rps, now, max_age_seconds)
    if not rejected or not rate or rate <= 0:
        return False
    return rejected / rate > 1.0 - slo.percentile
