"""The prefill side of one bootstrap room (the engine keeps them; a dialect answers for them)."""

from __future__ import annotations

import asyncio
import time


class Room:
    """The prefill side of one bootstrap room: its decode's handshake, the prompt computed,
    the KV transferred (or the room failed)."""

    def __init__(self) -> None:
        self.decode_ready = asyncio.Event()  # SGLang: the decode has KV room and asked for it
        self.done = asyncio.Event()  # computed (or failed: then nobody may wait on it)
        self.transferred = asyncio.Event()  # the KV reached the decode (or the room failed)
        self.input_tokens = 0
        self.cached_tokens = 0
        self.owned = False  # a prefill request for this room arrived (else only a decode poll)
        self.failed = False  # refused, timed out or its lease expired: the decode half fails
        self.transferring = False
        self.created = time.monotonic()
        self.computed_at: float | None = None

    @property
    def collected(self) -> bool:
        return self.transferred.is_set()

    def fail(self) -> None:
        self.failed = True
        self.done.set()
        self.transferred.set()

    def holds_kv(self) -> bool:
        """Computed KV that has not reached its decode yet (SGLang's inflight queue, vLLM's
        pinned blocks)."""
        return self.owned and self.done.is_set() and not self.transferred.is_set()
