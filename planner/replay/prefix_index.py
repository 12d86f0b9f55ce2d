"""The prefill instances' prefix caches, as the simulator keeps them.

A trace names each prompt's blocks by id; a block id stands for the whole prefix up to that
block's end (as radix and paged caches key it), so an instance's prefix hit is its longest run
of leading blocks in cache. Each instance has an LRU cache of block ids, and an inverted index
maps a block id to the bitmask of instances caching it: the hit of every instance comes out of
one walk over the prompt's blocks, intersecting masks, however many instances there are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """One LRU cache of block ids per instance id, plus block id -> bitmask of holders.

    Instance ids are the fleet's: every instance gets a cache, also decode instances (theirs
    stays empty), so ids index ``caches`` directly."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        #: per instance id: block id -> None, least recently used first
        self.caches: list[OrderedDict[int, None]] = []
        #: block id -> bitmask of the instances caching it (bit i = instance i)
        self.holders: dict[int, int] = {}

    def add_instance(self) -> None:
        """An empty cache for the next instance id."""
        self.caches.append(OrderedDict())

    def hits(self, blocks: Sequence[int], candidates: int) -> dict[int, int]:
        """Leading blocks of ``blocks`` each instance of the bitmask ``candidates`` has cached.

        An instance leaves the walk at the first block it lacks and keeps what it matched;
        instances that matched nothing are absent, except that an empty prompt gives every
        candidate a hit of 0 (routers treat "some entry" and "no entry" differently)."""
        holders = self.holders
        hits: dict[int, int] = {}
        cand = candidates
        k = 0
        for b in blocks:
            m = holders.get(b, 0) & cand
            if m != cand:
                if k:
                    dropped = cand & ~m
                    while dropped:
                        low = dropped & -dropped
                        hits[low.bit_length() - 1] = k
                        dropped ^= low
                cand = m
                if not cand:
                    break
            k += 1
        while cand:
            low = cand & -cand
            hits[low.bit_length() - 1] = k
            cand ^= low
        return hits

    def insert(self, i: int, blocks: Sequence[int]) -> None:
        """Instance ``i`` computed a prompt: touch its blocks in order, evict the coldest."""
        cache = self.caches[i]
        holders = self.holders
        bit = 1 << i
        for b in blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                holders[b] = holders.get(b, 0) | bit
        while len(cache) > self.capacity_blocks:
            b, _ = cache.popitem(last=False)
            self.release(b, bit)

    def release(self, b: int, bit: int) -> None:
        """Block ``b`` is no longer held by the instance of ``bit``."""
        m = self.holders.get(b, 0) & ~bit
        if m:
            self.holders[b] = m
        else:
            self.holders.pop(b, None)

    def drop(self, i: int) -> None:
        """Forget instance ``i``'s cache (it stopped serving prefill)."""
        bit = 1 << i
        for b in self.caches[i]:
            self.release(b, bit)
        self.caches[i].clear()
