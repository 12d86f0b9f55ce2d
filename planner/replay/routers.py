"""The router's choice of a prefill instance, one class per routing policy.

Each router reads the fleet's live lists (the ready prefill ids, ascending, and when each
instance's FIFO runs empty) and the request's prefix hits per instance
(:meth:`.prefix_index.PrefixIndex.hits`), and returns the instance id. None of them rejects:
early rejection is decided after the choice, on the chosen instance's predicted TTFT.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from ..model import PerformanceModel
from .fleet import Fleet

ROUTERS = ("random", "round-robin", "power-of-two", "least-queue", "cache-aware",
           "article-cache-aware", "predicted-ttft")


class Router(Protocol):
    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        """The ready prefill instance for a request of ``input_tokens`` arriving at ``now``
        whose leading blocks cached per instance are ``hits``; among ``ready`` when given (the
        instances a router's admission lets take one more), else among all ready ones."""
        ...


class RandomRouter:
    """Uniform over the ready instances."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.ready = fleet.ready_prefill
        self.rng = rng

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        ready = ready or self.ready
        return ready[self.rng.randrange(len(ready))]


class RoundRobinRouter:
    """sglang-router's (and smg's, vllm-router's) ``round_robin``: a counter over the healthy
    workers, ``count % len(healthy)`` (sgl-router ``src/policies/round_robin.rs``); the
    list shifts under the counter as workers come and go, as the router's does."""

    def __init__(self, fleet: Fleet) -> None:
        self.ready = fleet.ready_prefill
        self.count = 0

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        ready = ready or self.ready
        self.count += 1
        return ready[(self.count - 1) % len(ready)]


class PowerOfTwoRouter:
    """``power_of_two``: two distinct workers drawn at random, the less loaded one (the first
    of a tie) takes it (sgl-router ``src/policies/power_of_two.rs``); the load is the router's
    count of its requests there in flight end to end (as for cache-aware)."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.ready = fleet.ready_prefill
        self.load = fleet.inflight
        self.rng = rng

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        ready = ready or self.ready
        if len(ready) == 1:
            return ready[0]
        a, b = self.rng.sample(ready, 2)
        return a if self.load[a] <= self.load[b] else b


class LeastQueueRouter:
    """The instance whose queue runs empty first."""

    def __init__(self, fleet: Fleet) -> None:
        self.ready = fleet.ready_prefill
        self.busy = fleet.busy

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        return min(ready or self.ready, key=self.busy.__getitem__)


class ArticleCacheAwareRouter:
    """The global-scheduling article's cache-aware router: the longest prefix hit, the shorter
    queue among equal hits; least queue without hits (no thresholds)."""

    def __init__(self, fleet: Fleet) -> None:
        self.ready = fleet.ready_prefill
        self.busy = fleet.busy

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        busy, ready = self.busy, ready or self.ready
        if hits:
            return max(ready, key=lambda j: (hits.get(j, 0), -busy[j]))
        return min(ready, key=busy.__getitem__)


class CacheAwareRouter:
    """sglang-router's (and smg's) ``cache_aware`` policy with its default thresholds.

    From sgl-router ``src/policies/cache_aware.rs`` (defaults in ``router_args.py``:
    ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5):
    when the loads are imbalanced (the most loaded instance has more than 64 requests beyond
    the least loaded, and more than 1.5 times its load) the least loaded instance takes the
    request; otherwise the instance with the longest prefix match takes it if the match
    covers more than 30% of the prompt, else the instance whose prefix tree is smallest.

    The router's load of a worker is its requests in flight end to end (its load guard in
    ``pd_router.rs`` is held until the response ends, decode included), as
    ``Fleet.inflight`` counts them. One approximation: its approximate radix tree is read as
    the instances' own caches (a conversation's next turn arrives after the last
    reply, by when both agree). Ties go to the shorter queue."""

    def __init__(
        self,
        fleet: Fleet,
        block_tokens: int = 512,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        self.ready = fleet.ready_prefill
        self.busy = fleet.busy
        self.load = fleet.inflight
        self.caches = fleet.prefix.caches
        self.block_tokens = block_tokens
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.balance_rel = balance_rel_threshold

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        busy, load, ready = self.busy, self.load, ready or self.ready
        lo = min(ready, key=lambda j: (load[j], busy[j]))
        hi = max(load[j] for j in ready)
        if hi - load[lo] > self.balance_abs and hi > load[lo] * self.balance_rel:
            return lo
        if hits:
            best = max(ready, key=lambda j: (hits.get(j, 0), -busy[j]))
            if hits.get(best, 0) * self.block_tokens > self.cache_threshold * input_tokens:
                return best
        caches = self.caches
        return min(ready, key=lambda j: (len(caches[j]), busy[j]))


class PredictedTtftRouter:
    """The lowest predicted TTFT = queueing + compute of the uncached part (ties: lower id)."""

    def __init__(
        self, fleet: Fleet, prefill_seconds: Callable[[float, float], float], block_tokens: int
    ) -> None:
        self.ready = fleet.ready_prefill
        self.busy = fleet.busy
        self.prefill_seconds = prefill_seconds
        self.block_tokens = block_tokens

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None) -> int:
        busy, block, prefill_seconds = self.busy, self.block_tokens, self.prefill_seconds
        # among instances without a hit the least busy is the only candidate worth pricing
        ready = ready or self.ready
        i = ready[0]
        wait_i = max(busy[i] - now, 0.0)
        for j in ready:
            w = busy[j] - now
            if w < 0.0:
                w = 0.0
            if w < wait_i:
                i, wait_i = j, w
        best = wait_i + prefill_seconds(input_tokens, min(hits.get(i, 0) * block, input_tokens))
        for j, hb in hits.items():
            if j == i:
                continue
            c = max(busy[j] - now, 0.0) + prefill_seconds(input_tokens, min(hb * block, input_tokens))
            if c < best or (c == best and j < i):
                best, i = c, j
        return i


def make_router(
    name: str, fleet: Fleet, model: PerformanceModel, block_tokens: int, rng: random.Random
) -> Router:
    """The router called ``name`` (one of :data:`ROUTERS`) over ``fleet``."""
    if name == "random":
        return RandomRouter(fleet, rng)
    if name == "round-robin":
        return RoundRobinRouter(fleet)
    if name == "power-of-two":
        return PowerOfTwoRouter(fleet, rng)
    if name == "least-queue":
        return LeastQueueRouter(fleet)
    if name == "cache-aware":
        return CacheAwareRouter(fleet, block_tokens)
    if name == "article-cache-aware":
        return ArticleCacheAwareRouter(fleet)
    if name == "predicted-ttft":
        return PredictedTtftRouter(fleet, model.prefill_seconds, block_tokens)
    raise ValueError(f"router must be one of {ROUTERS}, got {name!r}")
