"""How long a simulated engine takes: a pluggable timing model, in model seconds.

The engine divides these by its time compression; the planner's performance model is a timing
model as is (:func:`planner_timing`), so the simulated engines take exactly the time the
planner predicts, before queueing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class TimingModel(Protocol):
    """How long one instance takes, in model seconds (before time compression).

    The planner's :class:`pdscale.planner.model.PerformanceModel` satisfies this protocol as is
    (see :func:`planner_timing`)."""

    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        """Compute seconds for one prompt of ``input_tokens`` with ``cached_tokens`` cached."""
        ...

    def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
        """Seconds of one decode step for ``batch`` sequences of mean context (tokens)."""
        ...

    def kv_transfer_seconds(self, tokens: float) -> float:
        """Seconds to move the KV of ``tokens`` prompt tokens from prefill to decode."""
        ...


@dataclass(frozen=True)
class LinearTiming:
    """Default timing model: linear in uncached tokens, batch size and context.

    prefill = overhead + (input - cached) / prefill_tokens_per_second
    TPOT    = decode_step + batch * (per_sequence + mean_context * per_context_token)
    KV      = kv_setup + input / kv_tokens_per_second
    """

    #: uncached prompt tokens computed per second by one prefill instance
    prefill_tokens_per_second: float = 20_000.0
    #: fixed cost per prefill (scheduling, first-token sampling)
    prefill_overhead_seconds: float = 0.005
    #: TPOT at batch 1 and zero context
    decode_step_seconds: float = 0.015
    #: extra TPOT per running sequence
    decode_per_sequence_seconds: float = 0.0001
    #: extra TPOT per sequence per context token (attention reads)
    decode_per_context_token_seconds: float = 0.0
    #: fixed cost of one KV transfer (handshake)
    kv_setup_seconds: float = 0.002
    #: prompt tokens of KV moved per second
    kv_tokens_per_second: float = 2_000_000.0

    def prefill_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        uncached = max(input_tokens - min(max(cached_tokens, 0.0), input_tokens), 0.0)
        return self.prefill_overhead_seconds + uncached / self.prefill_tokens_per_second

    def tpot_seconds(self, batch: float, mean_context_tokens: float) -> float:
        per_seq = (
            self.decode_per_sequence_seconds
            + mean_context_tokens * self.decode_per_context_token_seconds
        )
        return self.decode_step_seconds + max(batch, 1.0) * per_seq

    def kv_transfer_seconds(self, tokens: float) -> float:
        return self.kv_setup_seconds + max(tokens, 0.0) / self.kv_tokens_per_second


def planner_timing(profile: str | None = None) -> TimingModel:
    """The planner's performance model for a shipped profile name or a YAML path (None = default).

    The planner's model already has the protocol's three methods with the same units, so the
    simulated engines take exactly the time the planner predicts (before queueing)."""
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import load_profile

    return PerformanceModel(load_profile(profile))
