"""Performance model of one instance per role, and the instance counts a load needs.

Prefill (as in the global-scheduling article): predicted TTFT = queueing delay + uncached
prefill compute. The compute of a prompt of ``n`` tokens of which ``h`` are cached is

    compute = (u + (n**2 - h**2) / (2 L)) / R,     u = n - h

where ``R`` is the profile's tokens/s and ``L`` the length at which the per-token cost has
doubled (attention grows linearly with position). The profile's ``overhead`` is paid once per
forward pass, whatever the pass carries: SGLang's prefill scheduler runs one forward per batch
(``event_loop_normal_disagg_prefill``: ``get_new_batch_prefill`` then one ``run_batch``) and a
chunked prompt continues in the next batch, so a pass of k prompts costs ``overhead + sum of
their compute`` (the replay's :mod:`.replay.prefill_batches`), and a prompt alone in its pass
``overhead + compute`` (:meth:`PerformanceModel.prefill_seconds`). The sizing prices every
prompt as one alone in its pass (:meth:`PerformanceModel.prefill_service_seconds`), which
overstates a busy instance's cost by at most ``overhead`` per prompt: at the utilisation the
TTFT sizing runs prefill at, passes carry one or two prompts, not a full chunk; the online
calibration's busy-time sample (planner/calibration.py: GPU seconds per prompt) learns what
batching saves on the fleet as it runs. Decode:

    TPOT(b, c) = step + b * (per_sequence + c * per_context_token)

for a batch of ``b`` sequences of mean context ``c``. One decode instance at the TPOT target
serves the largest batch meeting it, limited by KV capacity and the engine's batch cap. A
request finds a varying batch, not the mean: where that batch is small, the SLO percentile
sets how far below it the mean must stay (:meth:`PerformanceModel.decode_sequences_at_percentile`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaincc
from scipy.stats import poisson

from .profile import Profile


@dataclass(frozen=True)
class Load:
    """The load of one planning interval (all means over the interval)."""

    rate_rps: float
    mean_input_tokens: float
    mean_output_tokens: float
    prefix_hit_rate: float = 0.0
    #: highest arrival rate over a ``PEAK_WINDOW_SECONDS`` sub-window of the interval (bursts
    #: the per-interval mean hides); None = unknown, size for the mean
    peak_rate_rps: float | None = None
    #: mean squared prompt length over the squared mean prompt length (1 + CV^2 of the prompt
    #: lengths; 1 = every prompt the mean length). Prefill's attention term grows with the
    #: square of the prompt, so the mean compute of long-tailed prompts is well above the
    #: compute of the mean prompt: 1.34-1.45x on the Mooncake conversation trace (ratio 2.7)
    input_tokens_square_ratio: float = 1.0


def scaled_load(load: Load, factor: float) -> Load:
    """``load`` with its arrival rates (mean and burst peak) times ``factor``: the load a
    margin sizes for."""
    if factor == 1.0:
        return load
    peak = None if load.peak_rate_rps is None else load.peak_rate_rps * factor
    return replace(load, rate_rps=load.rate_rps * factor, peak_rate_rps=peak)


#: the sub-window over which the peak arrival rate is measured (seconds). Measured on Azure
#: code x20 (TTFT SLO 2 s), whose bursts last a few seconds: sized from 10 s peaks even the
#: oracle met only 97.2% of requests, from 5 s peaks 99.3%; Mooncake and ServeGen (TTFT 15 s)
#: are unchanged.
PEAK_WINDOW_SECONDS = 5.0
#: a prompt-length square ratio within this of 1 is unread, not prompts of one length: float
#: error from averaging leaves 1 + 2e-16; a measured spread is above 1e-4 (CV 1%)
UNREAD_SPREAD = 1e-9


@dataclass(frozen=True)
class Slo:
    """Latency targets; a request meets the SLO when both hold."""

    ttft_seconds: float = 2.0
    tpot_seconds: float = 0.05
    #: the share of requests that must meet the targets (0.9 = p90 within target). The
    #: PDCluster's ``slo.percentile`` sets it (operator/loop/planning.py); this default is the CRD's
    #: (90), so that a caller that names none plans as an unconfigured PDCluster does
    percentile: float = 0.9


#: the busy floor's prior and ceiling (``Calibration.prefill_busy_floor``): at 1 the burst
#: peak's offered compute exceeds the ready instances, and a miss there is queueing whatever
#: the prompts
PREFILL_BUSY_FLOOR_PRIOR = 0.5
PREFILL_BUSY_FLOOR_MAX = 1.0


@dataclass(frozen=True)
class Calibration:
    """Observed/predicted correction factors (1.0 = the profile is right).

    ``prefill_factor`` multiplies prefill compute time, ``decode_factor`` multiplies TPOT.
    ``prefill_headroom``/``decode_headroom`` multiply the instances a role is sized for: they
    grow when the observed latency at the SLO percentile misses its target although the model said it would not
    (bursts and heavy tails the fluid model cannot see) and decay back when it is met easily."""

    prefill_factor: float = 1.0
    decode_factor: float = 1.0
    samples: int = 0
    prefill_headroom: float = 1.0
    decode_headroom: float = 1.0
    #: compute samples taken per role (calibration.py): the first ones weigh as a running mean
    prefill_samples: int = 0
    decode_samples: int = 0
    #: how busy prefill's ready instances must be at the burst peak for a TTFT miss to teach
    #: headroom (below it the miss is the long prompts' own, which more instances do not buy):
    #: ``PREFILL_BUSY_FLOOR_PRIOR`` until a raise proves futile (:func:`judge_prefill_raise`)
    prefill_busy_floor: float = PREFILL_BUSY_FLOOR_PRIOR
    #: the prefill raise under test (:func:`judge_prefill_raise`), 0 when none: the headroom
    #: before it, the ready instances and the highest busy share while it was taught, the
    #: TTFT-to-target ratios it was taught from and those seen since its capacity landed (sum,
    #: count; and the highest busy share since), and when it began (seconds)
    raise_from_headroom: float = 0.0
    raise_ready: int = 0
    raise_busy: float = 0.0
    raise_ratio_sum: float = 0.0
    raise_ratio_count: int = 0
    since_ratio_sum: float = 0.0
    since_ratio_count: int = 0
    since_busy: float = 0.0
    raise_at_seconds: float = 0.0


@dataclass(frozen=True)
class PerformanceModel:
    """A profile plus its online calibration; every method is pure."""

    profile: Profile
    calibration: Calibration = Calibration()

    # -- prefill ---------------------------------------------------------------------------
    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        """Seconds of a pass that computes one prompt of ``input_tokens`` with
        ``cached_tokens`` cached and nothing else: the pass's overhead plus the prompt's
        compute (:meth:`prefill_compute_seconds`)."""
        return self.prefill_pass_overhead_seconds() + self.prefill_compute_seconds(input_tokens, cached_tokens)

    def prefill_pass_overhead_seconds(self) -> float:
        """The fixed seconds of one prefill forward pass, paid once per pass however many
        prompts (or chunks of prompts) it carries."""
        return self.profile.prefill.overhead_seconds * self.calibration.prefill_factor

    def prefill_compute_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        """The compute seconds one prompt of ``input_tokens`` with ``cached_tokens`` cached
        adds to the pass that carries it (no pass overhead). A chunk of a prompt is priced as
        the prompt up to the chunk's end with what was computed before it cached, so that the
        chunks of a prompt add up to the whole prompt's compute."""
        p = self.profile.prefill
        n = max(input_tokens, 0.0)
        h = min(max(cached_tokens, 0.0), n)
        work = n - h
        if p.attention_doubling_tokens is not None:
            work += (n * n - h * h) / (2.0 * p.attention_doubling_tokens)
        return work / p.tokens_per_second * self.calibration.prefill_factor

    def prefill_service_seconds(self, load: Load) -> float:
        """Mean compute seconds of this load's prompts: the compute of the mean prompt plus the
        attention term's share of the prompts' spread (``input_tokens_square_ratio``), each
        prompt with the load's hit rate cached. Exact for the quadratic model: the mean of
        (n^2 - h^2) with h = hit x n is (1 - hit^2) x mean(n^2)."""
        n, hit = load.mean_input_tokens, load.prefix_hit_rate
        seconds = self.prefill_seconds(n, n * hit)
        doubling = self.profile.prefill.attention_doubling_tokens
        spread = max(load.input_tokens_square_ratio, 1.0) - 1.0
        if doubling is None or spread <= 0.0:
            return seconds
        extra = spread * (1.0 - hit * hit) * n * n / (2.0 * doubling)
        return seconds + extra / self.profile.prefill.tokens_per_second * self.calibration.prefill_factor

    def prefill_service_cv(self, load: Load, prior: float) -> float:
        """Coefficient of variation of this load's prefill compute: the prompts' measured spread
        (``input_tokens_square_ratio``) through the compute's elasticity at the mean prompt
        (the delta method: a prompt 1% longer computes e% longer), at most ``prior``. The
        prior stands where the spread is unknown (a ratio of exactly 1 is what an unread
        histogram leaves) and caps it: the configured 1.5 is what long-tailed traces were
        sized with, and reading their spread above it (Mooncake 1.61) bought 0.3-0.7 pp for
        7-10% more GPU-hours on Mooncake and the ramps and took the spike's peak from 1.10x to
        1.22x the oracle's. Where prompts are more uniform it is the measurement that counts:
        the demo's (0.29) asked 5 prefills for long documents where 1.5 asked 9."""
        spread = load.input_tokens_square_ratio - 1.0
        n = load.mean_input_tokens
        # an unread ratio (exactly 1) averaged with others comes back as 1 + 2e-16: read as a
        # measurement that is a spread of nothing, cv 0, and the TTFT need fell from 4 to 3
        # prefills as the load rose (tests/planner/test_solve.py's monotonicity property)
        if spread <= UNREAD_SPREAD or n <= 0.0:
            return prior
        step = 0.01 * n
        hit = load.prefix_hit_rate
        low, high = self.prefill_seconds(n - step, (n - step) * hit), self.prefill_seconds(n + step, (n + step) * hit)
        mean = self.prefill_seconds(n, n * hit)
        elasticity = (high - low) / (2.0 * step) * n / mean if mean > 0 else 1.0
        return min(prior, elasticity * math.sqrt(spread))

    def prefill_request_capacity_rps(self, load: Load) -> float:
        """Requests/s one prefill instance computes at 100% busy for this load's prompts."""
        s = self.prefill_service_seconds(load)
        return math.inf if s <= 0 else 1.0 / s

    # -- decode ----------------------------------------------------------------------------
    def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
        """TPOT in seconds for ``batch`` running sequences of mean context (tokens)."""
        d = self.profile.decode
        per_seq = d.per_sequence_seconds + mean_context_tokens * d.per_context_token_seconds
        return (d.step_seconds + max(batch, 1.0) * per_seq) * self.calibration.decode_factor

    def tpot_token_mean_seconds(self, mean_batch: float, mean_context_tokens: float) -> float:
        """The mean inter-token latency over the tokens decode instances produce when each
        runs a Poisson number of sequences of mean ``mean_batch`` (a request finds a Poisson
        number of others: ``decode_sequences_at_percentile``): an instance at batch b adds
        b / TPOT(b) tokens a second, so the mean is ``mean_batch`` / E[b / TPOT(b)]. Above
        TPOT at the mean batch where batches are small (tokens come from the busier batches,
        an idle instance adds none: the demo's instance at 0.7 sequences, 39 ms against
        TPOT(1)'s 30), the same where they are large (an 8xH200 decode at 150, within 0.2%)."""
        if mean_batch <= 0:
            return self.tpot_seconds(1.0, mean_context_tokens)
        spread = 10.0 * math.sqrt(mean_batch) + 10.0
        batches = np.arange(max(1, math.floor(mean_batch - spread)),
                            math.ceil(mean_batch + spread) + 1)
        # TPOT is affine in the batch from one sequence on: two points give every batch's
        one = self.tpot_seconds(1.0, mean_context_tokens)
        tpots = one + (batches - 1) * (self.tpot_seconds(2.0, mean_context_tokens) - one)
        tokens_per_second = float(np.sum(poisson.pmf(batches, mean_batch) * batches / tpots))
        return mean_batch / tokens_per_second

    def decode_batch_at_slo(self, tpot_slo_seconds: float, mean_context_tokens: float) -> int:
        """Largest batch per decode instance that meets the TPOT target, KV capacity and cap."""
        # a tiny epsilon keeps exact fits (150.0 computed as 149.999...) from losing a sequence
        return int(self.decode_batch_limit(tpot_slo_seconds, mean_context_tokens, 1e-9))

    def decode_batch_limit(self, tpot_slo_seconds: float, mean_context_tokens: float,
                            epsilon: float = 0.0) -> float:
        """The batch at which TPOT reaches the target (a real number: a batch averaged over a
        request's life need not be whole), within KV capacity and the batch cap; 0 when even
        one sequence misses."""
        d = self.profile.decode
        f = self.calibration.decode_factor
        per_seq = (d.per_sequence_seconds + mean_context_tokens * d.per_context_token_seconds) * f
        room = tpot_slo_seconds - d.step_seconds * f
        if room <= 0:
            return 0.0
        by_tpot = math.inf if per_seq <= 0 else room / per_seq
        by_kv = d.kv_capacity_tokens / max(mean_context_tokens, 1.0)
        return min(by_tpot + epsilon, by_kv, float(d.max_batch))

    def decode_sequences_at_percentile(self, slo: Slo, mean_context_tokens: float) -> float:
        """Mean sequences per decode instance at which a request at the SLO percentile still
        finds a batch that meets the TPOT target.

        The sequences on one instance come and go at random (Poisson arrivals, each staying
        its own output x TPOT): a request arriving finds a Poisson number of others, of mean
        the instance's mean batch ``m`` (PASTA), so it meets the target if it finds at most
        ``b - 1``, ``b`` the batch at which TPOT reaches the target (:meth:`decode_batch_limit`).
        ``m`` is the largest mean with P(N <= b - 1) >= percentile. ``b`` is a real number, not
        a whole batch: a request's TPOT averages the batch over its life, so a decode 10%
        slower than its profile, b = 1.77 rather than 2, keeps 0.42 per instance, not the 0.11
        a batch of one would (sized at the whole batch, the live demo's chat, its decode
        learned 9% slow, asked for 23 decodes and held its maximum of 16). Where ``b`` is
        large this sits near ``b`` (b = 160 at p99: m = 132, above the 0.8 utilisation cap), and where it is small
        it is far below: at the demo's b = 2 and p90, m = 0.53, not the cap's 1.6. On a
        steady 2 req/s of 40-token answers the cap's 3 decodes met both targets for 68% of
        requests in the replay, these 7 for 99.8% (tests/planner/test_decode_percentile.py).
        Exact for a random decode choice; cautious behind round robin, which spreads more
        evenly than Poisson (there 4 met 92% and 5 98.5%). 0 when no batch meets the target."""
        b = self.decode_batch_limit(slo.tpot_seconds, mean_context_tokens)
        return 0.0 if b < 1.0 else _poisson_mean_within(b - 1.0, slo.percentile)

    def decode_instances_at_percentile(self, load: Load, slo: Slo) -> float:
        """Decode instances (fractional) at :meth:`decode_sequences_at_percentile` per
        instance for ``load``'s decoded flow (rate x output tokens): by Little's law the flow
        keeps flow x TPOT sequences running, and at a mean batch ``m`` a request sees 1 + m.
        ``inf`` when no batch meets the target."""
        tokens_per_second = load.rate_rps * load.mean_output_tokens
        if tokens_per_second <= 0:
            return 0.0
        context = self.decode_mean_context(load)
        m = self.decode_sequences_at_percentile(slo, context)
        if m <= 0:
            return math.inf
        return tokens_per_second * self.tpot_seconds(1.0 + m, context) / m

    def decode_tokens_per_second_at_slo(self, tpot_slo_seconds: float, mean_context: float) -> float:
        """Output tokens/s of one decode instance running its largest SLO-meeting batch."""
        b = self.decode_batch_at_slo(tpot_slo_seconds, mean_context)
        if b <= 0:
            return 0.0
        return b / self.tpot_seconds(b, mean_context)

    # -- transfer --------------------------------------------------------------------------
    def kv_transfer_seconds(self, tokens: float) -> float:
        """Seconds to move the KV cache of ``tokens`` prompt tokens from prefill to decode."""
        k = self.profile.kv_transfer
        return k.setup_seconds + tokens * k.bytes_per_token / (k.gigabytes_per_second * 1e9)

    # -- sizing ----------------------------------------------------------------------------
    def decode_mean_context(self, load: Load) -> float:
        # a sequence's context grows from the prompt to prompt+output; the batch sees the mean
        return load.mean_input_tokens + load.mean_output_tokens / 2.0

    def instances_needed_at(self, load: Load, slo: Slo, margins: tuple[float, float],
                            **caps: Any) -> tuple[int, int]:
        """:meth:`instances_needed` (with ``caps``) of each role for ``load`` times that role's
        margin: what the planner orders for such a load. One solve when the margins agree."""
        if margins[0] == margins[1]:
            return self.instances_needed(scaled_load(load, margins[0]), slo, **caps)
        return (self.instances_needed(scaled_load(load, margins[0]), slo, **caps)[0],
                self.instances_needed(scaled_load(load, margins[1]), slo, **caps)[1])

    def fluid_demand(self, load: Load, slo: Slo) -> tuple[float, float]:
        """Instances of each role kept 100% busy by ``load`` (prefill, decode), fractional."""
        p = load.rate_rps / self.prefill_request_capacity_rps(load)
        tps = self.decode_tokens_per_second_at_slo(slo.tpot_seconds, self.decode_mean_context(load))
        demand_tokens = load.rate_rps * load.mean_output_tokens
        d = math.inf if tps <= 0 and demand_tokens > 0 else (demand_tokens / tps if tps > 0 else 0)
        return p, d

    def instances_needed(
        self,
        load: Load,
        slo: Slo,
        *,
        prefill_utilization: float = 1.0,
        decode_utilization: float = 1.0,
        ttft_queueing: bool = False,
        service_cv: float = 1.0,
        queueing_margin: float = 1.0,
        pooled_prefill: bool = True,
    ) -> tuple[int, int]:
        """Smallest (prefill, decode) counts keeping each role at or below the utilization cap.

        With caps of 1.0 this is the article's ``need()``: ceil(rate*isl*(1-hit)/P_CAP) and
        ceil(rate*osl/D_CAP). A cap below 1 leaves headroom for queueing within the interval.
        With ``ttft_queueing`` the prefill count is also at least the smallest M/G/c pool whose
        waiting time at the SLO percentile fits the TTFT target (see
        :meth:`prefill_instances_for_ttft`; ``pooled_prefill`` False: a router that picks
        prefill instances at random, each its own queue): a strict TTFT needs slack, a lenient
        one lets prefill run up to the cap. Decode is then also at least the instances that
        keep a request at the SLO percentile within the TPOT target
        (:meth:`decode_instances_at_percentile`), which binds where batches are small.
        """
        p, d = self.fluid_demand(load, slo)
        # round before ceil: 4.0000000001 from float error must stay 4
        np_ = math.ceil(round(p * self.calibration.prefill_headroom / prefill_utilization, 9))
        nd = math.ceil(round(d * self.calibration.decode_headroom / decode_utilization, 9))
        if ttft_queueing:
            # the cap is the margin where batches are large; where they are small, the percentile
            at_percentile = self.decode_instances_at_percentile(load, slo)
            if math.isfinite(at_percentile):
                nd = max(nd, math.ceil(round(at_percentile * self.calibration.decode_headroom, 9)))
        if ttft_queueing and load.peak_rate_rps and load.rate_rps > 0:
            # A burst must fit the batch capacity itself; the utilisation cap is the margin for
            # the mean load's random variation, not a second margin on top of the burst
            # (measured on Mooncake x5: the per-minute smallest decode fleet meeting TPOT for
            # 99% was 5.9 on average, 7 at most; cap times burst asked 6.8 and 9).
            burst = d * self._decode_burst_factor(load, slo) * self.calibration.decode_headroom
            nd = max(nd, math.ceil(round(burst, 9)))
        if ttft_queueing and load.rate_rps > 0:
            q = max(
                self.prefill_instances_for_ttft(load, slo, service_cv=self.prefill_service_cv(load, service_cv),
                                                pooled=pooled_prefill),
                self.prefill_instances_for_burst(load, slo),
            )
            np_ = max(np_, math.ceil(q * queueing_margin * self.calibration.prefill_headroom - 1e-9))
        return np_, nd

    def _decode_burst_factor(self, load: Load, slo: Slo) -> float:
        """How much of a sub-window burst reaches the decode batch.

        A request stays in decode for output_tokens x TPOT seconds; when that is shorter than
        the burst window the batch follows the peak rate, when longer it averages the burst
        out: effective rate = mean + (peak - mean) * min(1, window / residence)."""
        assert load.peak_rate_rps is not None
        residence = max(load.mean_output_tokens * slo.tpot_seconds, 1e-9)
        share = min(1.0, PEAK_WINDOW_SECONDS / residence)
        effective = load.rate_rps + max(0.0, load.peak_rate_rps - load.rate_rps) * share
        return effective / load.rate_rps

    def prefill_instances_for_burst(self, load: Load, slo: Slo) -> float:
        """Prefill instances that clear the interval's peak burst within the TTFT target.

        A burst at ``peak_rate_rps`` for ``PEAK_WINDOW_SECONDS`` (tau) brings work
        peak * tau * S; the last request of it must finish within its arrival + TTFT, so
        c * (tau + TTFT - S) >= peak * tau * S. Fractional; 0 when the peak is unknown."""
        if load.peak_rate_rps is None or load.peak_rate_rps <= 0:
            return 0.0
        n = load.mean_input_tokens
        service = self.prefill_service_seconds(load)
        tau = PEAK_WINDOW_SECONDS
        span = tau + slo.ttft_seconds - service - self.kv_transfer_seconds(n)
        if span <= 0:
            return math.inf
        return load.peak_rate_rps * tau * service / span

    def prefill_instances_for_ttft(self, load: Load, slo: Slo, *, service_cv: float = 1.0,
                                   pooled: bool = True) -> int:
        """Smallest prefill pool meeting the TTFT target at the SLO percentile.

        ``pooled``: a router that sends each request where it is served soonest makes the
        instances one M/G/c queue. The wait is Erlang C with the mean prefill compute as
        service time, scaled by the Kingman factor (1 + cv^2)/2 for non-exponential service;
        the wait budget is the TTFT target minus mean compute and KV transfer. Above 150 busy
        instances the square-root staffing rule c = a + 3 sqrt(a) (1 + cv^2)/2 replaces the
        exact search (it keeps the planner in milliseconds at 2,000 nodes).

        Not pooled: a router that picks an instance at random (sglang-router 0.3.2's PD
        prefill choice) gives each instance 1/c of the arrivals and its own queue, M/G/1: the
        wait is late with probability rho exp(-(1 - rho) budget / (service x Kingman)), which
        at the same utilisation is far above the pool's (no instance takes another's work)."""
        n = load.mean_input_tokens
        service = self.prefill_service_seconds(load)
        a = load.rate_rps * service
        if a <= 0:
            return 0
        kingman = (1.0 + service_cv**2) / 2.0
        if not pooled:
            return self._split_queues_for_ttft(a, service, kingman, slo, n)
        if a > 150:
            return math.ceil(a + 3.0 * math.sqrt(a) * kingman)
        budget = slo.ttft_seconds - service - self.kv_transfer_seconds(n)
        tail = 1.0 - slo.percentile
        c = math.floor(a) + 1
        # Erlang B by recurrence up to c, then C(c) from B(c); step c upward incrementally
        b = 1.0
        for k in range(1, c + 1):
            b = a * b / (k + a * b)
        while True:
            erlang_c = c * b / (c - a * (1.0 - b))
            if budget > 0:
                p_late = erlang_c * math.exp(-(c - a) * budget / (service * kingman))
                if p_late <= tail:
                    return c
            if c > 4 * a + 50:  # the target cannot be met by queueing alone (budget <= 0)
                return c
            c += 1
            b = a * b / (c + a * b)

    def _split_queues_for_ttft(self, a: float, service: float, kingman: float, slo: Slo,
                               n: float) -> int:
        """Smallest count of independent M/G/1 queues sharing offered load ``a`` whose wait
        meets the budget at the SLO percentile: the highest utilisation rho with
        rho exp(-(1 - rho) x) <= tail (increasing in rho: bisection), then ceil(a / rho)."""
        budget = slo.ttft_seconds - service - self.kv_transfer_seconds(n)
        tail = 1.0 - slo.percentile
        if budget <= 0:  # queueing cannot meet it: as the pool's search, give up at 4a + 50
            return math.ceil(4 * a + 50)
        x = budget / (service * kingman)
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2.0
            if mid * math.exp(-(1.0 - mid) * x) <= tail:
                lo = mid
            else:
                hi = mid
        if lo <= 0.0:
            return math.ceil(4 * a + 50)
        return max(math.floor(a) + 1, math.ceil(a / lo - 1e-9))

    def predicted_ttft_seconds(self, load: Load, prefill_instances: int, percentile: float) -> float:
        """TTFT at ``percentile`` with ``prefill_instances`` ready: M/M/c wait + compute + transfer.

        The queue is M/M/c (Erlang C) with service time = mean prefill compute; returns inf when
        the load exceeds capacity."""
        n = load.mean_input_tokens
        service = self.prefill_service_seconds(load)
        transfer = self.kv_transfer_seconds(n)
        if load.rate_rps <= 0:
            return service + transfer
        c = prefill_instances
        a = load.rate_rps * service  # offered load in instances
        if c <= 0 or a >= c:
            return math.inf
        wait_prob = _erlang_c(c, a)
        tail = 1.0 - percentile
        # P(W > w) = C * exp(-(c - a) w / service), solved for the tail share
        wait = 0.0 if wait_prob <= tail else service * math.log(wait_prob / tail) / (c - a)
        return wait + service + transfer

    def predicted_tpot_seconds(self, load: Load, decode_instances: int) -> float:
        """Mean TPOT with ``decode_instances`` sharing the load's concurrent sequences.

        Concurrency follows Little's law: rate * output_tokens * TPOT, solved for the fixed
        point TPOT = step + (concurrency/instances) * per_seq (closed form, linear model)."""
        if decode_instances <= 0:
            return math.inf if load.rate_rps > 0 else 0.0
        ctx = self.decode_mean_context(load)
        d = self.profile.decode
        f = self.calibration.decode_factor
        per_seq = (d.per_sequence_seconds + ctx * d.per_context_token_seconds) * f
        k = load.rate_rps * load.mean_output_tokens / decode_instances  # tokens/s per instance
        denom = 1.0 - k * per_seq
        if denom <= 0:
            return math.inf
        return d.step_seconds * f / denom


@functools.lru_cache(maxsize=4096)
def _poisson_mean_within(count: float, percentile: float) -> float:
    """The largest mean ``m`` of a Poisson count ``N`` with P(N <= count) >= percentile, at
    most count + 1 (the mean at which a percentile at or below half is met). A count between
    whole numbers takes the CDF's continuous extension, the regularised upper incomplete
    gamma Q(count + 1, m) (equal to P(N <= count) at whole counts), so the mean moves with
    the count instead of in steps."""
    def within(m: float) -> float:
        return float(gammaincc(count + 1.0, m))

    if within(count + 1.0) >= percentile:
        return count + 1.0
    return float(brentq(lambda m: within(m) - percentile, 1e-12, count + 1.0))


def _erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a`` (Erlang C), stable recurrence."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1.0 - b))


# -- online calibration -------------------------------------------------------------------

#: how fast calibration follows new evidence (EWMA weight of one sample)
CALIBRATION_WEIGHT = 0.2
#: a factor outside this range is a broken metric, not a slow engine
CALIBRATION_BOUNDS = (0.5, 3.0)


def calibrate(
    model: PerformanceModel,
    *,
    observed_tpot_seconds: float | None,
    decode_batch: float | None,
    decode_context_tokens: float | None,
    observed_prefill_seconds: float | None,
    prefill_input_tokens: float | None,
    prefill_cached_tokens: float | None,
    instances_warming_up: int,
) -> PerformanceModel:
    """Return ``model`` with its calibration moved towards observed/predicted.

    Samples are skipped (model returned unchanged) when any value is unknown or when an
    instance is still in its first minutes: a new instance's first passes run before JIT and
    graphs are warm and would make the fleet look slower than it is (Dynamo over-scales on
    exactly this). The factor moves by an EWMA and is clamped to ``CALIBRATION_BOUNDS``.
    """
    if instances_warming_up > 0:
        return model
    cal = model.calibration
    lo, hi = CALIBRATION_BOUNDS
    prefill_factor, decode_factor = cal.prefill_factor, cal.decode_factor
    used = False
    if None not in (observed_tpot_seconds, decode_batch, decode_context_tokens):
        assert observed_tpot_seconds is not None and decode_batch is not None
        assert decode_context_tokens is not None
        raw = PerformanceModel(model.profile).tpot_seconds(decode_batch, decode_context_tokens)
        if raw > 0 and observed_tpot_seconds > 0:
            ratio = min(max(observed_tpot_seconds / raw, lo), hi)
            decode_factor += CALIBRATION_WEIGHT * (ratio - decode_factor)
            used = True
    if None not in (observed_prefill_seconds, prefill_input_tokens, prefill_cached_tokens):
        assert observed_prefill_seconds is not None and prefill_input_tokens is not None
        assert prefill_cached_tokens is not None
        raw = PerformanceModel(model.profile).prefill_seconds(
            prefill_input_tokens, prefill_cached_tokens
        )
        if raw > 0 and observed_prefill_seconds > 0:
            ratio = min(max(observed_prefill_seconds / raw, lo), hi)
            prefill_factor += CALIBRATION_WEIGHT * (ratio - prefill_factor)
            used = True
    if not used:
        return model
    return replace(
        model,
        calibration=replace(
            cal, prefill_factor=prefill_factor, decode_factor=decode_factor, samples=cal.samples + 1
        ),
    )


#: headroom bounds: never size below the model, never more than double it
HEADROOM_BOUNDS = (1.0, 2.0)
#: growth per interval at a miss (scaled by how badly it missed) and decay when comfortably met
HEADROOM_STEP = 0.1
HEADROOM_DECAY = 0.01
#: decay only while the observed latency at the SLO percentile is below this share of the target
HEADROOM_RELAX_BELOW = 0.5


#: per interval, a learned floor moves this share of the way back to the prior: a workload
#: that changes is tested again (about a six-hour half-life at 60 s intervals)
PREFILL_BUSY_FLOOR_DECAY = 0.002
#: settled intervals after a raise's capacity lands that judge it, and the TTFT-to-target ratio
#: a reading is capped at (a refusal reads as infinitely late)
RAISE_JUDGED_OVER = 3
RAISE_RATIO_CAP = 3.0
#: the share of the taught miss over the target (ratio - 1) the raise's capacity must take away
RAISE_MUST_TAKE_AWAY = 0.25


def judge_prefill_raise(
    before: Calibration,
    after: Calibration,
    *,
    ttft_ratio: float | None,
    busy: float | None,
    ready: int,
    landed_and_settled: bool,
    now_seconds: float,
    expire_seconds: float,
) -> Calibration:
    """Keep a prefill headroom raise only if the capacity it bought served the misses.

    The headroom rises at a TTFT miss on a settled, busy fleet (:func:`calibrate_slo`); the
    capacity it orders serves a warm-up later. A miss that more prefills do not reduce (a
    long prompt's own compute, a request behind it on its instance, a router's affinity) then
    winds the headroom up raise after raise: on the 12 req/s surge's flat hour with Mooncake
    lengths, 16 to 25 fixed prefills meet 98.1% to 98.2%, yet the headroom went 1.24 -> 1.62
    and the fleet 17 -> 22. So a raise (``after`` above ``before``: a run of raises counts as
    one) is tested: once more instances are ready than when it was taught, on a settled
    fleet no busier than then, ``RAISE_JUDGED_OVER`` intervals' mean ratio is compared with
    the mean it was taught from. If the capacity did not take away at least a quarter of the
    excess over the target (``RAISE_MUST_TAKE_AWAY``; half judged ServeGen's small prefill
    fleets, 6-24 instances whose ratio moves by 0.1 from one interval to the next, futile
    often enough to cost 0.34 pp), the raise is futile: the headroom goes back to where it was before, and
    the busy floor (``prefill_busy_floor``) rises above the busiest interval that taught it,
    so the same misses at that load teach nothing again. One that helped lowers the floor to
    its busy share. Untested after ``expire_seconds`` (the load moved on), it is kept. The
    floor drifts back to its prior (``PREFILL_BUSY_FLOOR_DECAY``)."""
    lo = PREFILL_BUSY_FLOOR_PRIOR
    cal = replace(after, prefill_busy_floor=lo + (after.prefill_busy_floor - lo) * (1.0 - PREFILL_BUSY_FLOOR_DECAY))
    ratio = None if ttft_ratio is None else min(ttft_ratio, RAISE_RATIO_CAP)
    testing = cal.raise_from_headroom > 0.0
    if testing and now_seconds - cal.raise_at_seconds > expire_seconds:
        cal, testing = _raise_closed(cal), False
    if after.prefill_headroom > before.prefill_headroom and ratio is not None:
        if not testing:
            return replace(cal, raise_from_headroom=before.prefill_headroom, raise_ready=ready,
                           raise_busy=busy or 0.0, raise_ratio_sum=ratio, raise_ratio_count=1,
                           since_ratio_sum=0.0, since_ratio_count=0, since_busy=0.0,
                           raise_at_seconds=now_seconds)
        return replace(cal, raise_busy=max(cal.raise_busy, busy or 0.0),
                       raise_ratio_sum=cal.raise_ratio_sum + ratio,
                       raise_ratio_count=cal.raise_ratio_count + 1)
    if (ratio is None or busy is None or not testing or not landed_and_settled
            or ready <= cal.raise_ready or busy > cal.raise_busy):
        return cal  # no verdict from here: not larger, not settled, or busier than it taught
    cal = replace(cal, since_ratio_sum=cal.since_ratio_sum + ratio,
                  since_ratio_count=cal.since_ratio_count + 1, since_busy=max(cal.since_busy, busy))
    if cal.since_ratio_count < RAISE_JUDGED_OVER:
        return cal
    taught = cal.raise_ratio_sum / max(cal.raise_ratio_count, 1)
    since = cal.since_ratio_sum / cal.since_ratio_count
    if since > 1.0 + (taught - 1.0) * (1.0 - RAISE_MUST_TAKE_AWAY):  # futile
        # above the busiest interval that taught it, and above where the fleet will be once
        # the raise is given back (the same load on fewer instances), or the next miss there
        # orders the same capacity again
        given_back = cal.since_busy * cal.prefill_headroom / max(cal.raise_from_headroom, 1.0)
        floor = min(PREFILL_BUSY_FLOOR_MAX,
                    max(cal.prefill_busy_floor, 1.05 * max(cal.raise_busy, given_back)))
        return _raise_closed(replace(cal, prefill_headroom=min(cal.prefill_headroom, cal.raise_from_headroom),
                                     prefill_busy_floor=floor))
    floor = max(lo, min(cal.prefill_busy_floor, cal.raise_busy))
    return _raise_closed(replace(cal, prefill_busy_floor=floor))


def _raise_closed(cal: Calibration) -> Calibration:
    return replace(cal, raise_from_headroom=0.0, raise_ready=0, raise_busy=0.0, raise_ratio_sum=0.0,
                   raise_ratio_count=0, since_ratio_sum=0.0, since_ratio_count=0, since_busy=0.0,
                   raise_at_seconds=0.0)


def calibrate_slo(
    model: PerformanceModel,
    *,
    ttft_at_percentile_seconds: float | None,
    tpot_at_percentile_seconds: float | None,
    slo: Slo,
    prefill_settled: bool,
    decode_settled: bool,
    prefill_idle: bool = False,
) -> PerformanceModel:
    """Move each role's headroom from the observed latency at the SLO's percentile (the
    readings ``*_at_percentile_seconds``, quantile ``slo.percentile``) against its target.

    A miss (that quantile above target) raises the role's headroom by up to ``HEADROOM_STEP``
    x the relative miss; one below half the target lets it decay by ``HEADROOM_DECAY``. A
    role moves only when ``*_settled``: its fleet was, by the model, enough for the load (the
    caller decides: ``solve._taught_roles``); a miss on a fleet the model already calls short
    says nothing about the model. ``prefill_idle``: prefill's fleet was enough and warm but
    too idle for queueing to explain a miss; a miss then gives headroom back by
    ``HEADROOM_DECAY``, since idle instances did not prevent it and more would not either.
    Unknown readings change nothing."""
    cal = model.calibration
    lo, hi = HEADROOM_BOUNDS

    def step(h: float, observed: float | None, target: float) -> float:
        if observed is None or target <= 0:
            return h
        ratio = observed / target
        if ratio > 1.0:
            return min(hi, h * (1.0 + HEADROOM_STEP * min(ratio - 1.0 + 0.5, 2.0)))
        if ratio < HEADROOM_RELAX_BELOW:
            return max(lo, h * (1.0 - HEADROOM_DECAY))
        return h

    hp = cal.prefill_headroom
    if prefill_settled:
        hp = step(hp, ttft_at_percentile_seconds, slo.ttft_seconds)
    elif (prefill_idle and ttft_at_percentile_seconds is not None
          and ttft_at_percentile_seconds > slo.ttft_seconds):
        hp = max(lo, hp * (1.0 - HEADROOM_DECAY))
    hd = cal.decode_headroom
    if decode_settled:
        hd = step(hd, tpot_at_percentile_seconds, slo.tpot_seconds)
    if hp == cal.prefill_headroom and hd == cal.decode_headroom:
        return model
    return replace(model, calibration=replace(cal, prefill_headroom=hp, decode_headroom=hd))
