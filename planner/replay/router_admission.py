"""A router's prefill admission, as smg 1.13 does it in PD mode (``router.admission`` of a
PDCluster; docs/routers.md).

Each prefill instance holds at most ``inflight_per_instance`` requests until its prefill
answers; a request that finds every ready instance at its cap waits at the router, oldest
first, in a queue of ``queue_size``; one that finds the queue full, or waits longer than
``queue_timeout_seconds`` for a slot, is refused (smg answers 429). Observed against the
binary in ``tests/loop/test_smg_admission.py``. The router's own policy then chooses among
the instances under their cap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillAdmission:
    """smg's three flags (``--prefill-max-inflight-requests-per-worker``,
    ``--prefill-queue-size``, ``--prefill-queue-timeout-secs``)."""

    inflight_per_instance: int
    queue_size: int = 256
    queue_timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.inflight_per_instance < 1:
            raise ValueError(f"inflight_per_instance must be >= 1, got {self.inflight_per_instance}")
        if self.queue_size < 0 or self.queue_timeout_seconds <= 0:
            raise ValueError("queue_size must be >= 0 and queue_timeout_seconds > 0")


class AdmissionQueue:
    """The requests waiting at the router for a prefill slot: (request, arrival seconds),
    oldest first."""

    def __init__(self, admission: PrefillAdmission) -> None:
        self.admission = admission
        self.waiting: deque[tuple[int, float]] = deque()

    def open_instances(self, ready: list[int], outstanding: list[int]) -> list[int]:
        """The ready instances under their cap (in ``ready``'s order)."""
        cap = self.admission.inflight_per_instance
        return [i for i in ready if outstanding[i] < cap]

    def expire(self, now: float) -> list[int]:
        """Take out and return the requests that have waited past the timeout by ``now``."""
        timeout, out = self.admission.queue_timeout_seconds, []
        # at the deadline itself it has timed out: smg's queue checks ``elapsed >= timeout``
        # (``middleware/concurrency.rs``), and a tokio timeout fires at its deadline
        while self.waiting and now - self.waiting[0][1] >= timeout:
            out.append(self.waiting.popleft()[0])
        return out

    def offer(self, r: int, arrival: float) -> bool:
        """Queue request ``r``; False: the queue is full (refused at once)."""
        if len(self.waiting) >= self.admission.queue_size:
            return False
        self.waiting.append((r, arrival))
        return True
