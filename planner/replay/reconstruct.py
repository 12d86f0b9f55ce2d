"""A trace rebuilt from per-interval aggregates: what a what-if replays when all that was
recorded is what the planner reads (request rate, mean prompt and output lengths, prefix
hit rate per interval; ``planner/prometheus.py``).

The model, and why:

- arrivals: Poisson within each interval at its recorded rate (the planner's own load model,
  ``model.py``; a count drawn from Poisson(rate x seconds), times uniform in the interval);
- lengths: lognormal with the interval's recorded mean and a log-space spread ``sigma`` (the
  median is ``mean x exp(-sigma^2/2)``). Prompt and output lengths of chat and API traces are
  positive and right-skewed (Mooncake, Azure 2023/2024, ServeGen all fit a heavy right tail),
  and a lognormal is the two-parameter family with that shape whose mean is set exactly; the
  aggregates give the mean only, so ``sigma`` is an assumption and the caller varies it;
- prefix reuse: a request either continues a recent earlier one that arrived at least
  ``TURN_GAP_SECONDS`` before where there is one (a conversation's next turn resends it), sharing its leading ``block_tokens`` blocks for ``reuse`` (90%) of its prompt,
  or shares nothing; requests continue as long as the cached tokens of the interval so far,
  counted as the engine counts them (``min(blocks x block_tokens, prompt - 1)``), are short
  of the recorded hit rate x its prompt tokens (error diffusion), so the interval's hit rate
  over an unbounded cache is the recorded one up to about one request. All-or-most rather
  than every request a little: a cache-aware router sends a request to the instance holding
  its prefix only when the match is above its threshold (sglang-router: 30% of the prompt),
  so an even 30% on every request would be routed as if it had none.

What it does not hold: any structure beyond these means (no conversations, no bursts within an
interval, no correlation of prompt and output lengths), and the hit rate is the one an
unbounded cache would see; a simulated fleet's caches, routing and evictions decide what it
really finds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .traces import Trace, TraceError

#: tokens per prefix block of a rebuilt trace: the granularity of its hit rate (64: SGLang's
#: page in the demo spec and the article's block; Mooncake's 512 would round a 600-token
#: prompt's 30% hit to nothing)
BLOCK_TOKENS = 64
#: the share of its prompt a request that continues an earlier one finds cached: a chat's next
#: turn resends the whole conversation, so most of it (Mooncake's conversation trace: most
#: requests that hit at all hit most of their prompt); the rest of the requests find nothing
REUSE = 0.9
#: seconds between a conversation's turns at the least: the answer read and the next prompt
#: typed (a continued request that arrived a moment after its predecessor would find it
#: still queued, not cached)
TURN_GAP_SECONDS = 30.0
#: how many recent requests a shared prefix may come from (open conversations)
RECENT_REQUESTS = 256


@dataclass(frozen=True)
class IntervalAggregate:
    """What was recorded over one interval ``[start_seconds, start_seconds + seconds)``."""

    start_seconds: float
    seconds: float
    #: requests per second
    rate_rps: float
    #: mean prompt tokens per request (ignored when the rate is 0)
    mean_input_tokens: float
    #: mean output tokens per request (ignored when the rate is 0)
    mean_output_tokens: float
    #: cached prompt tokens / prompt tokens, in [0, 1]
    prefix_hit_rate: float
    #: mean squared prompt over squared mean prompt (>= 1), from the engines' prompt histogram;
    #: None: not recorded, the prompts' spread is ``length_sigma``'s
    input_tokens_square_ratio: float | None = None


def check_aggregates(intervals: Sequence[IntervalAggregate]) -> None:
    """Raise :class:`TraceError` naming the interval and field when the recording cannot be
    rebuilt: none at all, a value not finite or out of range, intervals out of order."""
    if not intervals:
        raise TraceError("no intervals recorded: nothing to rebuild a trace from")
    previous_end = -math.inf
    for i, a in enumerate(intervals):
        where = f"interval {i} (t={a.start_seconds:.0f})"
        for name in ("start_seconds", "seconds", "rate_rps", "mean_input_tokens",
                     "mean_output_tokens", "prefix_hit_rate"):
            value = getattr(a, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise TraceError(f"{where}: {name} is missing or not a number ({value!r})")
        if a.seconds <= 0:
            raise TraceError(f"{where}: seconds must be positive, got {a.seconds:g}")
        if a.rate_rps < 0:
            raise TraceError(f"{where}: rate_rps must be >= 0, got {a.rate_rps:g}")
        if a.rate_rps > 0 and (a.mean_input_tokens < 1 or a.mean_output_tokens < 1):
            raise TraceError(f"{where}: with requests arriving, mean_input_tokens and "
                             "mean_output_tokens must be at least 1")
        if not 0.0 <= a.prefix_hit_rate <= 1.0:
            raise TraceError(f"{where}: prefix_hit_rate must be in [0, 1], got {a.prefix_hit_rate:g}")
        square = a.input_tokens_square_ratio
        if square is not None and not (isinstance(square, int | float) and 1.0 <= square < math.inf):
            raise TraceError(f"{where}: input_tokens_square_ratio must be >= 1, got {square!r}")
        if a.start_seconds < previous_end - 1e-6:
            raise TraceError(f"{where}: starts before the previous interval ends")
        previous_end = a.start_seconds + a.seconds


def lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """``n`` integer lengths >= 1, lognormal with mean ``mean`` and log-space spread
    ``sigma`` (sigma 0: every length the mean, rounded)."""
    if sigma == 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    mu = math.log(mean) - sigma * sigma / 2.0
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(np.int64)


class _Prefixes:
    """Block ids for rebuilt requests, sharing leading blocks with recent requests."""

    def __init__(self, block_tokens: int, rng: np.random.Generator, reuse: float | None) -> None:
        self.block_tokens, self.rng, self.reuse = block_tokens, rng, reuse
        #: (arrival, blocks) of recent requests
        self.recent: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=RECENT_REQUESTS)
        self.next_id = 0
        #: cached tokens owed (rounding and shortfalls), carried to the next request
        self.owed = 0.0

    def blocks(self, at: float, input_tokens: int, hit_rate: float) -> tuple[int, ...]:
        b = self.block_tokens
        n_blocks = math.ceil(input_tokens / b)
        most = (input_tokens - 1) // b  # the engine caches at most prompt - 1 tokens
        want = hit_rate * input_tokens + self.owed
        if self.reuse is None:  # every request finds the interval's share
            k = min(most, max(0, math.floor(want / b + self.rng.random())))
        else:  # a request reuses ``reuse`` of its prompt, or nothing
            full = min(most, math.floor(self.reuse * input_tokens / b))
            k = min(most, max(full, math.floor(want / b))) if full and want >= full * b / 2 else 0
        shared: tuple[int, ...] = ()
        if k:
            # the earlier turn had its answer before the next was sent: prefer one that
            # arrived a turn's gap before (its prompt is in a cache by now), else any
            settled = [h for t, h in self.recent if len(h) >= k and t <= at - TURN_GAP_SECONDS]
            pool = (settled or [h for _, h in self.recent if len(h) >= k]
                    or [max((h for _, h in self.recent), key=len, default=())])
            if pool:
                shared = pool[int(self.rng.integers(len(pool)))][:k]
        self.owed = want - len(shared) * b
        fresh = tuple(range(self.next_id, self.next_id + n_blocks - len(shared)))
        self.next_id += len(fresh)
        h = shared + fresh
        self.recent.append((at, h))
        return h


def trace_from_aggregates(
    intervals: Sequence[IntervalAggregate],
    *,
    seed: int = 0,
    length_sigma: float = 1.0,
    block_tokens: int = BLOCK_TOKENS,
    max_input_tokens: int | None = None,
    reuse: float | None = REUSE,
    name: str = "reconstructed",
) -> Trace:
    """A :class:`Trace` whose per-interval rate, mean lengths and prefix hit rate are the
    recorded ones in expectation (see the module's docstring for the model).

    Parameters
    ----------
    intervals : the recording, in time order (:func:`check_aggregates` says what is wrong).
    seed : the random stream (numpy's PCG64): the same seed, the same trace.
    length_sigma : the lengths' log-space standard deviation (>= 0); 0 gives every request
        the mean, 1 a tail where the 99th percentile is about 6x the mean. Prompts of an
        interval with a recorded spread (``input_tokens_square_ratio``) take that one.
    block_tokens : tokens per prefix block.
    max_input_tokens : prompts longer are cut (the model's context; None: no cut).
    reuse : the share of its prompt a request that reuses a prefix finds cached; the others
        find nothing, and as many reuse as make the interval's hit rate. None: every request
        finds the interval's hit rate (a routing what-if: a cache-aware router then rarely
        sees a match above its threshold).

    Times start at the first interval's start. Example::

        >>> a = IntervalAggregate(0.0, 60.0, 2.0, 600.0, 300.0, 0.3)
        >>> len(trace_from_aggregates([a], seed=1)) > 0
        True
    """
    check_aggregates(intervals)
    if not (math.isfinite(length_sigma) and length_sigma >= 0):
        raise TraceError(f"length_sigma must be >= 0, got {length_sigma!r}")
    if block_tokens < 1:
        raise TraceError(f"block_tokens must be at least 1, got {block_tokens}")
    rng = np.random.default_rng(seed)
    if reuse is not None and not 0.0 < reuse <= 1.0:
        raise TraceError(f"reuse must be in (0, 1], got {reuse!r}")
    prefixes = _Prefixes(block_tokens, rng, reuse)
    arrivals: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[tuple[int, ...]] = []
    t0 = intervals[0].start_seconds
    for a in intervals:
        n = int(rng.poisson(a.rate_rps * a.seconds)) if a.rate_rps > 0 else 0
        if not n:
            continue
        times = np.sort(rng.uniform(a.start_seconds, a.start_seconds + a.seconds, n)) - t0
        # a lognormal's mean square over its squared mean is exp(sigma^2): the recorded
        # spread gives the prompts theirs
        square = a.input_tokens_square_ratio
        prompt_sigma = length_sigma if square is None else math.sqrt(math.log(square))
        prompt = lognormal_lengths(rng, a.mean_input_tokens, prompt_sigma, n)
        if max_input_tokens is not None:
            prompt = np.minimum(prompt, max_input_tokens)
        output = lognormal_lengths(rng, a.mean_output_tokens, length_sigma, n)
        # what an interval owes or is owed carries into the next up to one reusing request's
        # hit (an interval of a few requests keeps its hit rate; one without hits gets none)
        limit = (reuse or a.prefix_hit_rate) * a.mean_input_tokens if a.prefix_hit_rate else 0.0
        prefixes.owed = min(limit, max(-limit, prefixes.owed))
        for t, p, o in zip(times.tolist(), prompt.tolist(), output.tolist(), strict=True):
            arrivals.append(t)
            ins.append(p)
            outs.append(o)
            ids.append(prefixes.blocks(t, p, a.prefix_hit_rate))
    return Trace(name, arrivals, ins, outs, ids, block_tokens)
