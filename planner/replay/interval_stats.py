"""What a planning interval observes: the simulator's stand-in for the metrics pipeline.

Between two controller calls the simulator counts arrivals, the lengths and cache hits of the
requests that finished, and the latencies of requests that got their first token; at the call
it adds the fleet's state now and hands the lot over as an :class:`~..observe.Observation`,
then starts counting anew.

Each count is taken when the real stack takes it (docs/replay.md): arrivals at the router,
which the live rate reads; prompts (their tokens, cache hits and length histogram) when the
prefill engine finishes the request, after its KV transfer; completions when decode finishes
it. SGLang's request and token counters move at a request's finish
(``observe_one_finished_request``), so in the live loop a new load's lengths show up a
TTFT (prompts) or a whole response (outputs) after its arrivals, and so they do here.

The planner reads counters through Prometheus, which holds them as of its last scrape: with
``counters_at_scrape`` an interval's counts are those scraped by the call, and what came after
the last scrape is counted in the next interval (a live loop's first tick, a second into its
load, sees no completion its engines made after the last scrape).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..model import PEAK_WINDOW_SECONDS
from ..observe import (
    SGLANG_PROMPT_TOKENS_BUCKETS,
    Observation,
    Reading,
    Role,
    RoleState,
    Warming,
    square_ratio_from_buckets,
)
from .fleet import DRAINING, READY, WARMING, Fleet

#: the counters' numbers and append-only lists: what a scrape takes a copy (or a length) of
_NUMBERS = ("arrivals", "prompts", "input_tokens", "hit_tokens", "responses", "output_tokens",
            "rejections", "prefill_busy_seconds")
_LISTS = ("ttft", "tpot", "tpot_tokens", "prefill_forward")


class IntervalStats:
    """Counters of the current interval (``span_seconds`` long), reset by :meth:`observe`."""

    def __init__(self, span_seconds: float, percentile: float, *,
                 measured_from_start: bool = False, counters_at_scrape: bool = False) -> None:
        self.span_seconds = span_seconds
        #: observe the counters as the last :meth:`scrape` saw them (Prometheus' view); False:
        #: as they stand at the call
        self.counters_at_scrape = counters_at_scrape
        #: the counters at the last scrape of this interval (None: no scrape since the call)
        self._scraped: dict[str, Any] | None = None
        #: the SLO's share of requests: the quantile of the latencies observed, as the live
        #: metrics reader asks Prometheus for it (prometheus.render_queries)
        self.percentile = percentile
        self.arrivals = 0
        #: prompts the prefill engines finished, their tokens and cached tokens
        self.prompts = 0
        self.input_tokens = 0
        #: finished prompts per length bucket (SGLang's default buckets, then +Inf), as the
        #: engines' prompt histogram counts them: the prompts' spread is read from these
        self.input_buckets = [0] * (len(SGLANG_PROMPT_TOKENS_BUCKETS) + 1)
        self.hit_tokens = 0
        #: responses decode finished, and their output tokens
        self.responses = 0
        self.output_tokens = 0
        #: requests rejected (by the router, or shed at decode) in this interval
        self.rejections = 0
        #: arrivals per PEAK_WINDOW_SECONDS window (index since the epoch) of this interval
        self.per_window: dict[int, int] = {}
        self.ttft: list[float] = []
        #: the TPOT of each request decoded in this interval, and its inter-token intervals
        #: (output tokens - 1): the engines' inter-token histogram counts every token once,
        #: so its quantile weighs a request by its tokens (``decoded``)
        self.tpot: list[float] = []
        self.tpot_tokens: list[int] = []
        #: seconds in forward passes of the prompts prefilled in this interval
        self.prefill_forward: list[float] = []
        #: seconds the prefill instances spent in passes that ended in this interval (SGLang
        #: adds each pass's GPU time to gpu_execution_seconds_total when it ends)
        self.prefill_busy_seconds = 0.0
        #: decode's running sequences summed over this interval's scrapes, and how many
        #: there were: the interval's mean batch, as Prometheus' avg_over_time of the gauge
        self.decode_running_scraped = 0
        self.scrapes = 0
        #: when the last observation was made (nan: none yet, so the first interval's load is
        #: unknown; -inf: the counters ran from the start, before which nothing arrived)
        self.last_observed = -math.inf if measured_from_start else math.nan

    def arrival(self, now: float) -> None:
        """A request reached the router at ``now``."""
        self.arrivals += 1
        w = int(now // PEAK_WINDOW_SECONDS)
        self.per_window[w] = self.per_window.get(w, 0) + 1

    def prompt_finished(self, input_tokens: int, hit_tokens: int) -> None:
        """The prefill engine finished a request of ``input_tokens``, ``hit_tokens`` cached."""
        self.prompts += 1
        self.input_tokens += input_tokens
        self.hit_tokens += hit_tokens
        self.input_buckets[bisect.bisect_left(SGLANG_PROMPT_TOKENS_BUCKETS, input_tokens)] += 1

    def response_finished(self, output_tokens: int) -> None:
        """Decode finished a request of ``output_tokens``."""
        self.responses += 1
        self.output_tokens += output_tokens

    def decoded(self, tpot_seconds: float, intervals: int) -> None:
        """A request finished decoding at ``tpot_seconds`` over ``intervals`` inter-token
        intervals (its output tokens - 1)."""
        self.tpot.append(tpot_seconds)
        self.tpot_tokens.append(intervals)

    def scrape(self, fleet: Fleet) -> None:
        """Prometheus scrapes the gauges (decode's running sequences on ready instances) and
        the counters."""
        self.decode_running_scraped += sum(
            len(fleet.running[i]) for i, r in enumerate(fleet.role)
            if r == Role.DECODE and fleet.state[i] == READY)
        self.scrapes += 1
        if self.counters_at_scrape:
            self._scraped = {
                **{k: getattr(self, k) for k in _NUMBERS},
                **{k: len(getattr(self, k)) for k in _LISTS},
                "input_buckets": list(self.input_buckets), "per_window": dict(self.per_window)}

    def _unscraped(self) -> dict[str, Any]:
        """Take what came after the last scrape out of the counters, and return it: the counters
        then hold what Prometheus has (nothing, with no scrape since the last call)."""
        snap = self._scraped or {
            **dict.fromkeys(_NUMBERS, 0), **dict.fromkeys(_LISTS, 0),
            "input_buckets": [0] * len(self.input_buckets), "per_window": {}}
        rest: dict[str, Any] = {}
        for k in _NUMBERS:
            rest[k] = getattr(self, k) - snap[k]
            setattr(self, k, snap[k])
        for k in _LISTS:
            xs = getattr(self, k)
            rest[k] = xs[snap[k]:]
            del xs[snap[k]:]
        rest["input_buckets"] = [a - b for a, b in zip(self.input_buckets, snap["input_buckets"], strict=True)]
        self.input_buckets = list(snap["input_buckets"])
        rest["per_window"] = {w: n - snap["per_window"].get(w, 0) for w, n in self.per_window.items()
                              if n > snap["per_window"].get(w, 0)}
        self.per_window = dict(snap["per_window"])
        return rest

    def observe(self, now: float, fleet: Fleet, waiting_decode: int, *,
                queued_prefill: int, gaps: tuple[float, float] | None = None,
                decode_running: int | None = None) -> Observation:
        """The interval ending ``now`` and the fleet at ``now``; ``queued_prefill`` requests
        wait for their prefill on ready instances, ``waiting_decode`` requests wait for any
        ready decode instance, ``decode_running`` run in ready decode batches (None: those
        running at ``now``); ``gaps``: the inter-token gaps streamed in the interval (their
        seconds and count, ``DecodeBatches.take_gaps``; None: the finished requests' TPOTs
        and the scraped batches stand in). Resets the counters (to what the last scrape has
        not seen yet, with ``counters_at_scrape``)."""
        rest = self._unscraped() if self.counters_at_scrape else None
        span = self.span_seconds
        n = self.arrivals
        # before a whole interval has been watched, the load is unknown, not zero
        measured = not math.isnan(self.last_observed)
        self.last_observed = now

        def load(v: float) -> Reading | None:
            return Reading(v, now) if measured else None

        def q(xs: list[float], p: float) -> Reading | None:
            return Reading(float(np.quantile(xs, p)), now) if xs else None

        def per_token(p: float) -> Reading | None:
            # as histogram_quantile over the inter-token histogram: the share p of tokens,
            # not of requests (a long output's steps outnumber a short one's)
            if not self.tpot:
                return None
            return Reading(float(np.quantile(self.tpot, p, weights=self.tpot_tokens,
                                             method="inverted_cdf")), now)

        obs = Observation(
            now_seconds=now,
            rate_rps=load(n / span),
            peak_rate_rps=load(max(self.per_window.values(), default=0) / PEAK_WINDOW_SECONDS),
            mean_input_tokens=load(self.input_tokens / self.prompts) if self.prompts else None,
            mean_output_tokens=load(self.output_tokens / self.responses) if self.responses else None,
            # the inter-token histogram's count over the prompts prefill finished, plus the
            # first token, as the live query reads it
            streamed_output_tokens=(load(1.0 + gaps[1] / self.prompts)
                                    if gaps is not None and self.prompts else None),
            input_tokens_square_ratio=self._square_ratio(load),
            prefix_hit_rate=load(self.hit_tokens / self.input_tokens) if self.input_tokens else None,
            ttft_p50_seconds=q(self.ttft, 0.5),
            ttft_at_percentile_seconds=q(self.ttft, self.percentile),
            tpot_p50_seconds=per_token(0.5),
            tpot_at_percentile_seconds=per_token(self.percentile),
            tpot_mean_seconds=self._mean_gap(now, gaps),
            rejected_rps=load(self.rejections / span),
            prefill_forward_seconds=(Reading(float(np.mean(self.prefill_forward)), now)
                                     if self.prefill_forward else None),
            prefill_busy_seconds_per_request=(Reading(self.prefill_busy_seconds / self.prompts, now)
                                              if self.prompts else None),
            prefill=role_state(fleet, Role.PREFILL, now, span, queued_prefill),
            decode=role_state(fleet, Role.DECODE, now, span, waiting_decode, running=decode_running,
                              running_mean=(Reading(self.decode_running_scraped / self.scrapes, now)
                                            if self.scrapes else None),
                              decoding_mean=None if gaps is None else load(gaps[0] / span)),
        )
        self.decode_running_scraped = self.scrapes = 0
        self.arrivals = self.rejections = 0
        self.prompts = self.input_tokens = self.hit_tokens = self.responses = self.output_tokens = 0
        self.ttft.clear()
        self.tpot.clear()
        self.tpot_tokens.clear()
        self.prefill_forward.clear()
        self.prefill_busy_seconds = 0.0
        self.per_window.clear()
        self.input_buckets = [0] * len(self.input_buckets)
        self._scraped = None
        if rest is not None:
            for k in _NUMBERS:
                setattr(self, k, rest[k])
            for k in _LISTS:
                getattr(self, k).extend(rest[k])
            self.input_buckets = rest["input_buckets"]
            self.per_window.update(rest["per_window"])
        return obs

    def _mean_gap(self, now: float, gaps: tuple[float, float] | None) -> Reading | None:
        """The inter-token histogram's sum over its count: the gaps streamed in the interval
        (None: none streamed), or without them the finished requests' TPOTs by their gaps."""
        if gaps is not None:
            return Reading(gaps[0] / gaps[1], now) if gaps[1] > 0 else None
        if sum(self.tpot_tokens) <= 0:
            return None
        return Reading(float(np.average(self.tpot, weights=self.tpot_tokens)), now)

    def _square_ratio(self, load: Callable[[float], Reading | None]) -> Reading | None:
        bounds = (*SGLANG_PROMPT_TOKENS_BUCKETS, math.inf)
        ratio = square_ratio_from_buckets(list(zip(bounds, itertools.accumulate(self.input_buckets),
                                                   strict=True)))
        return None if ratio is None else load(ratio)


def role_state(fleet: Fleet, role: Role, now: float, span_seconds: float, queued: int, *,
               running: int | None = None, running_mean: Reading | None = None,
               decoding_mean: Reading | None = None) -> RoleState:
    """``role``'s instances by state at ``now`` and its queue readings, in requests as the
    engines count them: ``queued`` requests wait (prefill: for their prefill on a ready
    instance, as SGLang's ``num_queue_reqs`` and vLLM's ``num_requests_waiting``; decode: for
    any ready decode instance); decode's running count is ``running`` (None: the sequences
    in ready batches now), ``running_mean`` their mean over the interval's scrapes."""
    ids = [i for i, r in enumerate(fleet.role) if r == role]
    ready = [i for i in ids if fleet.state[i] == READY]
    warming = tuple(Warming(fleet.ready_at[i], False) for i in ids if fleet.state[i] == WARMING)
    draining = sum(1 for i in ids if fleet.state[i] == DRAINING)
    recently = sum(1 for i in ready if now - fleet.ready_at[i] < span_seconds)
    if role == Role.PREFILL:
        return RoleState(len(ready), warming, draining, recently, Reading(float(queued), now), None)
    run = sum(len(fleet.running[i]) for i in ready) if running is None else running
    # the batches counted exactly at the last scrape (a live gauge set only when a batch is
    # logged can be older): they are also the requests decoding then (what the inter-token
    # latency's sum over the last scrape gives live); over the interval,
    # the gaps' seconds over its length (the sum's rate), else the scrapes' mean
    return RoleState(
        len(ready), warming, draining, recently,
        Reading(float(queued), now), Reading(float(run), now), running_mean,
        decoding_requests=Reading(float(run), now),
        decoding_requests_mean=running_mean if decoding_mean is None else decoding_mean,
    )
