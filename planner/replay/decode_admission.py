"""Where and when a prefilled request starts decoding: off, queue or shed.

A request goes to the ready decode instance running the fewest sequences and joins its
continuous batch; its TPOT is the model's TPOT at the batch it joins, itself included. A batch
full by the profile's cap or KV capacity makes it wait for the next finishing sequence.

- ``off``: nothing more; one sequence too many slows every running one (the TPOT cliff).
- ``queue``: the batch is capped where its TPOT meets the target (SGLang's
  ``--max-running-requests`` sized to the SLO): the request starts once enough running
  sequences have finished.
- ``shed``: as ``queue``, but a request whose wait alone would break the TTFT target is
  dropped instead, as an early rejection drops it at prefill.
"""

from __future__ import annotations

import heapq

from ..model import PerformanceModel, Slo
from .fleet import Fleet

DECODE_ADMISSIONS = ("off", "queue", "shed")


class DecodeAdmission:
    """Places prefilled requests into the fleet's decode batches (``Fleet.running``)."""

    def __init__(self, fleet: Fleet, model: PerformanceModel, mode: str, slo: Slo) -> None:
        if mode not in DECODE_ADMISSIONS:
            raise ValueError(f"decode_admission must be one of {DECODE_ADMISSIONS}, got {mode!r}")
        self.fleet = fleet
        self.model = model
        self.capped = mode != "off"
        self.shed = mode == "shed"
        self.slo_ttft = slo.ttft_seconds
        self.slo_tpot = slo.tpot_seconds
        self.max_batch = model.profile.decode.max_batch
        self.kv_capacity_tokens = model.profile.decode.kv_capacity_tokens

    def least_loaded(self, now: float) -> int:
        """The ready decode instance running the fewest sequences at ``now`` (the lowest id of
        a tie); finished sequences leave their heaps on the way."""
        running, ctx_sum = self.fleet.running, self.fleet.ctx_sum
        best = -1
        best_n = 1 << 60
        for i in self.fleet.ready_decode:
            h = running[i]
            while h and h[0][0] <= now:
                _, c = heapq.heappop(h)
                ctx_sum[i] -= c
            if len(h) < best_n:
                best, best_n = i, len(h)
        return best

    def place(
        self, now: float, arrival: float, input_tokens: int, output_tokens: int
    ) -> tuple[float, float] | None:
        """Start a request whose KV arrived at ``now``: (decode start, TPOT), or None if shed.

        Needs a ready decode instance. The request's context is its prompt plus half its
        output (its mean over the decode)."""
        i = self.least_loaded(now)
        h = self.fleet.running[i]
        ctx_sum = self.fleet.ctx_sum
        tpot_seconds = self.model.tpot_seconds
        ctx = input_tokens + output_tokens / 2.0
        start = now
        cap = min(self.max_batch, int(self.kv_capacity_tokens // max(ctx, 1.0)))
        while len(h) >= max(cap, 1):
            f, c = heapq.heappop(h)
            ctx_sum[i] -= c
            start = max(start, f)
        b, ctx_total = len(h) + 1, ctx_sum[i] + ctx
        if self.capped and tpot_seconds(b, ctx_total / b) > self.slo_tpot:
            # start once enough of the running sequences (soonest first) have finished for
            # the batch, this one included, to meet the TPOT target; the others keep running
            # (they stay in the heap, so later arrivals see them)
            for f, c in sorted(h):
                b, ctx_total, start = b - 1, ctx_total - c, max(start, f)
                if tpot_seconds(b, ctx_total / b) <= self.slo_tpot:
                    break
            if self.shed and start - arrival > self.slo_ttft:
                return None
        ctx_sum[i] += ctx
        t_tok = tpot_seconds(b, ctx_total / b)
        heapq.heappush(h, (start + output_tokens * t_tok, ctx))
        return start, t_tok
