"""The engine's prefix cache: repeated prompt prefixes really are cheaper to prefill."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixCache:
    """LRU cache of prompt prefix blocks, so repeated prefixes really are cheaper.

    A block is identified by the hash of the whole prefix up to its end (as radix/paged caches
    do), so a block hits only if everything before it matched too."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if block_tokens <= 0 or capacity_tokens < 0:
            raise ValueError("block_tokens must be > 0 and capacity_tokens >= 0")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _keys(self, tokens: Sequence[str]) -> Iterable[int]:
        h = 0
        for start in range(0, len(tokens) - self.block_tokens + 1, self.block_tokens):
            h = hash((h, tuple(tokens[start : start + self.block_tokens])))
            yield h

    def match(self, tokens: Sequence[str]) -> int:
        """Cached tokens at the start of ``tokens`` (whole blocks); marks them recently used."""
        hit = 0
        for key in self._keys(tokens):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += self.block_tokens
        return hit

    def insert(self, tokens: Sequence[str]) -> None:
        """Cache every whole block of ``tokens``, evicting the least recently used."""
        for key in self._keys(tokens):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks) * self.block_tokens
