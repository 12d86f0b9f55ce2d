"""Settings derived from a spec: the transfer timeouts the engines are rendered with (seconds),
reported in status.derived. The checklist validates a spec; engines and builders render with
these; the drain waits as long as the slowest transfer may take."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pdscale.operator.api.pdcluster import PDClusterSpec

from . import router

# SGLang's own default for both transfer timeouts; we never derive anything shorter.
SGLANG_DEFAULT_TIMEOUT_SECONDS = 300
# vLLM NIXL's default decoder_kv_blocks_ttl; likewise a floor.
VLLM_DEFAULT_KV_BLOCKS_TTL_SECONDS = 480
# Headroom over the slowest prefill: queueing ahead of the long prompt, transfer time and a
# prefill speed that is itself an estimate.
TIMEOUT_MARGIN_PERCENT = 50


@dataclass(frozen=True)
class Derived:
    """Settings computed from the spec (seconds). Reported in status.derived."""

    slowest_prefill_seconds: int
    minimum_transfer_timeout_seconds: int
    bootstrap_timeout_seconds: int
    waiting_timeout_seconds: int
    decoder_kv_blocks_ttl_seconds: int
    #: the router's prefill admission (router.admission, derived where unset); None: off
    prefill_inflight_per_worker: int | None = None
    prefill_queue_size: int | None = None
    prefill_queue_timeout_seconds: int | None = None

    def as_status(self) -> dict[str, int]:
        from pydantic.alias_generators import to_camel

        return {to_camel(k): v for k, v in asdict(self).items() if v is not None}


def minimum_transfer_timeout_seconds(spec: PDClusterSpec) -> int:
    """Seconds the slowest prefill may take: the longest prompt (max context length, tokens)
    at the conservative prefill speed (tokens/s), plus TIMEOUT_MARGIN_PERCENT, rounded up."""
    slowest = spec.model.max_context_length_tokens / spec.kv_transfer.conservative_prefill_tokens_per_second
    return math.ceil(slowest * (100 + TIMEOUT_MARGIN_PERCENT) / 100)


def derive(spec: PDClusterSpec) -> Derived:
    """Derived timeouts: the user's value when given (validated separately), otherwise the
    larger of the engine's default and the computed minimum."""
    kvt = spec.kv_transfer
    minimum = minimum_transfer_timeout_seconds(spec)
    slowest = math.ceil(spec.model.max_context_length_tokens / kvt.conservative_prefill_tokens_per_second)
    floor = max(SGLANG_DEFAULT_TIMEOUT_SECONDS, minimum)
    adm = router.admission(spec)
    return Derived(
        slowest_prefill_seconds=slowest,
        minimum_transfer_timeout_seconds=minimum,
        bootstrap_timeout_seconds=kvt.bootstrap_timeout_seconds or floor,
        waiting_timeout_seconds=kvt.waiting_timeout_seconds or floor,
        decoder_kv_blocks_ttl_seconds=kvt.decoder_kv_blocks_ttl_seconds
        or max(VLLM_DEFAULT_KV_BLOCKS_TTL_SECONDS, minimum),
        prefill_inflight_per_worker=adm.prefill_inflight_per_worker if adm else None,
        prefill_queue_size=adm.queue_size if adm else None,
        prefill_queue_timeout_seconds=adm.queue_timeout_seconds if adm else None,
    )
