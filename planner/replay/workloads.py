"""Synthetic workloads: the global-scheduling article's multi-turn chat.

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

import random

from .traces import Trace

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
