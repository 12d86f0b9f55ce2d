"""Synthetic workloads: the global-scheduling article's multi-turn chat, and load shapes
(steady, ramp, step, spike) for measuring how a planner follows a change.

The article's routing experiment (seeds/pd-global-scheduling.zh.txt): 20 system prompts of
2,048 tokens, 400 conversations each opened with one of them, every request appends 300 new
tokens to a random conversation and sends the whole history; Poisson arrivals; 64-token
blocks. Token values only matter through block identity, so instead of hashing tokens we name
each block: the 32 blocks of a system prompt are shared by every conversation that starts
with it, every later block belongs to one conversation. The random draws are taken in the
article's order with Python's ``random`` and the same seed, so the workload is the article's
request for request (the draws for token values are made and discarded to keep the stream
aligned).
"""

from __future__ import annotations

import math
import random

from .traces import Trace, synthesize_from_rates

ARTICLE_BLOCK_TOKENS = 64
ARTICLE_SYSTEM_TOKENS = 2048
ARTICLE_SYSTEMS = 20
ARTICLE_CONVERSATIONS = 400
ARTICLE_TURN_TOKENS = 300


def multi_turn_chat(
    rate_rps: float,
    duration_seconds: float,
    *,
    seed: int = 0,
    output_tokens: int = 0,
) -> Trace:
    """The article's multi-turn workload as a :class:`Trace` with 64-token block ids.

    Parameters
    ----------
    rate_rps : Poisson arrival rate, requests/s.
    duration_seconds : arrivals are drawn until this time.
    seed : the article uses 0.
    output_tokens : output length given to every request (the article models prefill only).
    """
    rng = random.Random(seed)
    rand = rng.randrange
    for _ in range(ARTICLE_SYSTEMS * ARTICLE_SYSTEM_TOKENS):
        rand(10**6)  # system prompt token values
    systems = list(range(ARTICLE_SYSTEMS))
    conv_system = [rng.choice(systems) for _ in range(ARTICLE_CONVERSATIONS)]
    conv_tokens = [ARTICLE_SYSTEM_TOKENS] * ARTICLE_CONVERSATIONS
    sys_blocks = ARTICLE_SYSTEM_TOKENS // ARTICLE_BLOCK_TOKENS
    # block ids: system s block k -> s * sys_blocks + k; conversation c block k -> base + c*K + k
    conv_base = ARTICLE_SYSTEMS * sys_blocks
    stride = 1 << 20
    t = 0.0
    arrivals: list[float] = []
    ins: list[int] = []
    ids: list[tuple[int, ...]] = []
    while t < duration_seconds:
        t += rng.expovariate(rate_rps)
        c = rand(ARTICLE_CONVERSATIONS)
        for _ in range(ARTICLE_TURN_TOKENS):
            rand(10**6)  # the turn's token values
        conv_tokens[c] += ARTICLE_TURN_TOKENS
        n = conv_tokens[c]
        full = n // ARTICLE_BLOCK_TOKENS
        s = conv_system[c]
        blocks = [s * sys_blocks + k for k in range(min(full, sys_blocks))]
        blocks.extend(conv_base + c * stride + k for k in range(sys_blocks, full))
        arrivals.append(t)
        ins.append(n)
        ids.append(tuple(blocks))
    return Trace(
        f"article-chat@{rate_rps:g}rps",
        arrivals,
        ins,
        [output_tokens] * len(arrivals),
        ids,
        ARTICLE_BLOCK_TOKENS,
    )


# -- synthetic load shapes for measuring ramps and spikes ------------------------------------
#: the shapes :func:`shape_windows` draws (``pdscale replay --synthetic SHAPE``)
SHAPES = ("steady", "ramp", "step", "spike", "surge")
#: every shape but ``steady`` opens with this much load at the base rate: three 10-minute
#: warm-ups, so that the planner has a history and a start fleet at the base rate is the
#: right one (what a planner running before the trace would hold), never hindsight
SHAPE_LEAD_SECONDS = 1800.0
#: after the change, the load is held (or has decayed back) for this long
SHAPE_TAIL_SECONDS = 2400.0
#: rates are piecewise constant over windows this long: smooth enough that a 10-minute ramp
#: is a ramp, not a staircase of minutes
SHAPE_WINDOW_SECONDS = 10.0
#: ``surge`` (issue 48's one-hour conversation trace, which a fixed fleet served better than
#: the planner): flat for 12 minutes, +70% over the next nine, then at once back to 1.05x the
#: base for the rest of the hour. It has no 30-minute lead-in: like that trace, its first
#: warm-up is all the history a planner gets before the rise
SURGE_FLAT_SECONDS = 720.0
SURGE_RISE_SECONDS = 540.0
SURGE_PEAK = 1.7
SURGE_AFTER = 1.05


def shape_rate_rps(shape: str, t_seconds: float, base_rps: float) -> float:
    """The request rate of ``shape`` at ``t_seconds`` (base rate ``base_rps``).

    - ``steady``: ``base_rps`` for an hour.
    - ``ramp``: base, then +50% linearly over 10 minutes, then held at 1.5x.
    - ``step``: base, then 2x at once, held.
    - ``spike``: base, then 2.5x at once decaying back to base exponentially (time constant
      3 minutes, so it is within 5% of base after about 12 minutes).
    - ``surge``: base for 12 minutes, +70% linearly over 9, then 1.05x base for the rest of
      the hour (the ``SURGE_*`` constants; no lead-in).
    """
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    if shape == "steady":
        return base_rps
    if shape == "surge":
        rising = t_seconds - SURGE_FLAT_SECONDS
        if rising < 0:
            return base_rps
        if rising < SURGE_RISE_SECONDS:
            return base_rps * (1.0 + (SURGE_PEAK - 1.0) * rising / SURGE_RISE_SECONDS)
        return base_rps * SURGE_AFTER
    dt = t_seconds - SHAPE_LEAD_SECONDS
    if dt < 0:
        return base_rps
    if shape == "ramp":
        return base_rps * (1.0 + 0.5 * min(dt / 600.0, 1.0))
    if shape == "step":
        return 2.0 * base_rps
    return base_rps * (1.0 + 1.5 * math.exp(-dt / 180.0))


def shape_duration_seconds(shape: str) -> float:
    """How long a ``shape`` trace lasts: an hour steady or surging, else the lead-in plus the
    tail."""
    return 3600.0 if shape in ("steady", "surge") else SHAPE_LEAD_SECONDS + SHAPE_TAIL_SECONDS


def shape_windows(shape: str, base_rps: float) -> list[tuple[float, float]]:
    """``shape`` as (window start s, rate rps) windows, the form of a ServeGen rate series,
    closed by a zero-rate window at the end (so the last window has its length)."""
    n = round(shape_duration_seconds(shape) / SHAPE_WINDOW_SECONDS)
    w = SHAPE_WINDOW_SECONDS
    # the rate at each window's middle, so a ramp's windows average the ramp
    out = [(k * w, shape_rate_rps(shape, (k + 0.5) * w, base_rps)) for k in range(n)]
    return [*out, (n * w, 0.0)]


def synthetic_trace(shape: str, base_rps: float, lengths: Trace, *, seed: int = 0) -> Trace:
    """A ``shape`` trace at ``base_rps``: Poisson arrivals, each request's lengths and prefix
    blocks drawn from the donor ``lengths`` (as a rate series draws them, with its prefix
    blocks remapped: see :func:`.traces.synthesize_from_rates`)."""
    return synthesize_from_rates(shape_windows(shape, base_rps), lengths,
                                 name=f"synthetic-{shape}@{base_rps:g}rps+{lengths.name}-lengths",
                                 seed=seed)
