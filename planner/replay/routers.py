"""The router's choice of a prefill instance, one class per routing policy.

Each router reads the fleet's live lists (the ready prefill ids, ascending, and when each
instance's FIFO runs empty) and the request's prefix hits per instance
(:meth:`.prefix_index.PrefixIndex.hits`), and returns the instance id. None of them rejects:
early rejection is decided after the choice, on the chosen instance's predicted TTFT.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from ..model import PerformanceModel
from .fleet import Fleet
from .prefix_index import PrefixIndex

ROUTERS = ("random", "round-robin", "power-of-two", "least-queue", "cache-aware",
           "smg-cache-aware", "article-cache-aware", "predicted-ttft")


class Router(Protocol):
    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
        """The ready prefill instance for a request of ``input_tokens`` arriving at ``now``
        whose leading blocks cached per instance are ``hits``; among ``ready`` when given (the
        instances a router's admission lets take one more), else among all ready ones.
        ``blocks`` are the request's block ids, for a router that keeps its own tree."""
        ...


class RandomRouter:
    """Uniform over the ready instances."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.ready = fleet.ready_prefill
        self.rng = rng

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
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
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
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
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
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
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
        return min(ready or self.ready, key=self.busy.__getitem__)


class ArticleCacheAwareRouter:
    """The global-scheduling article's cache-aware router: the longest prefix hit, the shorter
    queue among equal hits; least queue without hits (no thresholds)."""

    def __init__(self, fleet: Fleet) -> None:
        self.ready = fleet.ready_prefill
        self.busy = fleet.busy

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
        busy, ready = self.busy, ready or self.ready
        if hits:
            return max(ready, key=lambda j: (hits.get(j, 0), -busy[j]))
        return min(ready, key=busy.__getitem__)


class CacheAwareRouter:
    """sglang-router's ``cache_aware`` policy with its default thresholds, as sgl-router's
    source has it (smg 1.13 changed the rule: :class:`SmgCacheAwareRouter`).

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
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
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


class _RouterTree(PrefixIndex):
    """smg's approximate radix tree in blocks: which leading blocks the router sent to each
    worker (not what the worker still caches). Its budget is tree-wide, shared by all workers
    (``evict_tenant_by_size`` in smg ``crates/kv_index/src/string_tree.rs``: least recently
    used leaves first, across tenants), so one LRU of (worker, block) entries here, a prompt's
    deepest block the oldest so that leaves go before their prefix. Up to smg 1.9 the budget
    was per worker (a tenant's leaves were evicted only while that tenant's own count was over
    it); smg made it one budget per model's tree in "enforce max_tree_size as a shared
    per-model tree budget" (#2137, after 1.9.0), and the pinned 1.13.0 says so in its own
    ``--max-tree-size`` help ("shared across all workers")."""

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self.lru: OrderedDict[tuple[int, int], None] = OrderedDict()

    def insert(self, i: int, blocks: Sequence[int]) -> None:
        lru, holders, bit = self.lru, self.holders, 1 << i
        for b in reversed(blocks):
            key = (i, b)
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                holders[b] = holders.get(b, 0) | bit
        while len(lru) > self.capacity_blocks:
            (j, b), _ = lru.popitem(last=False)
            self.release(b, 1 << j)


class SmgCacheAwareRouter:
    """smg 1.13's ``cache_aware`` prefill choice in PD mode (HTTP workers, string tree), read
    from the ``smg==1.13.0`` source (``model_gateway/src/policies/cache_aware.rs``:
    ``select_worker_scanned``, ``select_worker_with_text``, ``select_matched_candidate``,
    ``select_final_from_affinity``, ``over_count_pressure_gate``, ``absolute_margin``) with
    ``smg launch``'s defaults (``src/smg/router_args.py``: ``cache_threshold`` 0.3,
    ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5, ``max_tree_size`` 2**26).

    - The router keeps its own tree and inserts the request's prefix for the chosen worker
      when it routes it (``match_and_insert_with``: one descent matches, selects, inserts),
      so a second request of a prefix follows the first before its prefill ran.
    - Match ratio = the deepest match over the tree / the prompt. Above ``cache_threshold``
      the holders of that deepest match (healthy ones) are the affinity group; at or below
      it, or when no holder is routable, it is a miss.
    - Per-request count-pressure gate, no fleet-wide imbalance check (that one is KV-usage
      only in 1.13, off at its 1.0 defaults): a worker is over the gate when its load is
      above ``balance_rel_threshold`` x the mean load of the candidates AND above the mean
      plus a margin of min(``balance_abs_threshold``, max(ceil(2 sqrt(mean)), 4)).
      Holders under the gate take it; if every holder is over it, it spills to the workers
      under the gate (all of them if none is).
    - The final pick in each case (and a miss over all candidates) is LeastLoad's
      expected wait, read here as the fewest requests the router holds in prefill, ties
      drawn uniformly (``policies/least_load.rs``; see approximations).

    A worker's load is the router's requests there whose prefill has not answered: smg 1.13
    releases the prefill leg's load (its ``PrefillLoadGuard``) when the prefill response ends
    (``routers/http/pd_router.rs``), not at the end of the response as sgl-router did, so
    ``Fleet.outstanding``, what its prefill admission caps.

    Approximations: text characters are read as the trace's blocks (a match is whole
    blocks; ratio = matched blocks x ``block_tokens`` / prompt tokens); the tree budget
    (2**26 characters) is taken at 4 characters a token and enforced at every insert, not
    every 60 s; the expected wait is the router's held count (exact when no engine load
    report is fresh, "join-shortest-queue on live in-flight"; with reports smg prices
    queued and running tokens over throughput plus a KV barrier, which the replay does not
    poll); the overload veto on engine reports (8 waiting requests, 80% KV) is not modelled.
    """

    def __init__(
        self,
        fleet: Fleet,
        block_tokens: int,
        rng: random.Random,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_chars: int = 2**26,
        chars_per_token: int = 4,
    ) -> None:
        self.fleet = fleet
        self.ready = fleet.ready_prefill
        self.load = fleet.outstanding
        self.block_tokens = block_tokens
        self.rng = rng
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.balance_rel = balance_rel_threshold
        self.tree = _RouterTree(max(1, max_tree_chars // chars_per_token // block_tokens))

    def _least_loaded(self, among: list[int]) -> int:
        """LeastLoad's pick: the minimum, equal ones drawn uniformly (its reservoir draw over
        scores within 1e-6 of the minimum), not the first index."""
        load = self.load
        low = min(load[j] for j in among)
        tied = [j for j in among if load[j] == low]
        return tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]

    def _over_gate(self, j: int, mean: float) -> bool:
        margin = min(float(self.balance_abs), max(math.ceil(2.0 * math.sqrt(mean)), 4.0))
        load = self.load[j]
        return load > mean * self.balance_rel and load > mean + margin

    def choose(self, now: float, input_tokens: int, hits: dict[int, int],
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
        ready = ready or self.ready
        # the tree holds every registered worker; one at its admission cap is not a candidate
        # (smg filters the candidates before the policy runs, placement.rs select_pair), but
        # its deepest match still decides the ratio and the group
        matched = self.tree.hits(blocks, self.fleet.prefill_mask) if blocks else {}
        pick: int | None = None
        deepest = max(matched.values(), default=0)
        matched_tokens = min(deepest * self.block_tokens, input_tokens)
        if input_tokens > 0 and matched_tokens / input_tokens > self.cache_threshold:
            candidates = set(ready)
            holders = [j for j, k in matched.items() if k == deepest and j in candidates]
            if holders:
                mean = sum(self.load[j] for j in ready) / len(ready)
                safe = [j for j in holders if not self._over_gate(j, mean)]
                if safe:
                    pick = self._least_loaded(safe)
                else:
                    spill = [j for j in ready if not self._over_gate(j, mean)]
                    pick = self._least_loaded(spill or ready)
        if pick is None:
            pick = self._least_loaded(ready)
        if blocks:
            self.tree.insert(pick, blocks)
        return pick


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
               ready: list[int] | None = None, *, blocks: Sequence[int] = ()) -> int:
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
    if name == "smg-cache-aware":
        return SmgCacheAwareRouter(fleet, block_tokens, rng)
    if name == "article-cache-aware":
        return ArticleCacheAwareRouter(fleet)
    if name == "predicted-ttft":
        return PredictedTtftRouter(fleet, model.prefill_seconds, block_tokens)
    raise ValueError(f"router must be one of {ROUTERS}, got {name!r}")
