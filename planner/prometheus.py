"""The metrics reader: PromQL for one PDCluster, and its answers turned into readings.

This is the planner's one door to the outside world (the operator is the other); the rest of
``planner/`` never imports an HTTP library. Rendering queries and interpreting answers are
pure functions; :func:`read_metrics` runs the queries through :class:`BoundedPrometheus`, the
only code that talks to Prometheus: whatever the server at the URL does (never answer, drip,
stream for ever), a query ends by its deadline and reads no more than its cap, and what a
status shows of a failure is a short fixed reason, never the answer's text.

Selection. Engines are scraped with three target labels, set by relabelling the pods' labels
(a PodMonitor, or the scrape config pdscale's demo writes): ``namespace``, ``pdcluster``
(``app.kubernetes.io/instance``) and ``role`` (``pdscale.io/role``: prefill or decode). The
same labels then select a PDCluster's pods for SGLang and vLLM alike. Every template can be
replaced per PDCluster (``spec.planner.metrics.queries``).

Unknown is never zero. An empty answer, NaN or infinity (a ratio of two zero rates), a query
error or an unreachable Prometheus make the reading ``None``, and the failure is recorded by
query name so that a condition can say which query failed and why.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .observe import Observation, Reading, RoleState, square_ratio_from_buckets

log = logging.getLogger(__name__)

#: Reading names, in the order they are queried. Per-role gauges end in ``_prefill``/``_decode``.
READINGS = (
    "rate_rps",
    "mean_input_tokens",
    "mean_output_tokens",
    "streamed_output_tokens",
    "input_tokens_square_ratio",
    "prefix_hit_rate",
    "ttft_p50_seconds",
    "ttft_at_percentile_seconds",
    "tpot_p50_seconds",
    "tpot_at_percentile_seconds",
    "tpot_mean_seconds",
    "queue_depth_prefill",
    "queue_depth_decode",
    "running_requests_prefill",
    "running_requests_decode",
    "running_requests_mean_prefill",
    "running_requests_mean_decode",
    "decoding_requests_decode",
    "decoding_requests_mean_decode",
    "rejected_rps",
    "prefill_forward_seconds",
    "prefill_busy_seconds_per_request",
)

# {sel} is the PDCluster selector, {role} is added per role, {window} is the rate window,
# {quantile} the SLO's percentile as a share (0.9 for ``slo.percentile: 90``).
# SGLang: requests are counted on the prefill side (each request prefills exactly once);
# output tokens and TPOT on the decode side; TTFT on the decode side, which in SGLang's PD
# mode receives the request at the same time as prefill, so its TTFT includes bootstrap,
# prefill and KV transfer.


def _sglang(names: str, role: str, *, stage: str | None = None, category: str | None = None) -> str:
    """A selector of SGLang's metric(s) ``names`` (a regex alternative) for one role (and one
    ``stage`` label of the per-stage latency), under both spellings of the prefix:
    ``sglang:`` (the Prometheus client's collector) and ``sglang_`` (where colons are not
    allowed in names, as some exporters rewrite them)."""
    extra = "" if stage is None else f',stage="{stage}"'
    extra += "" if category is None else f',category=~"{category}"'
    return f'{{{{__name__=~"sglang[:_]{names}",{{sel}},role="{role}"{extra}}}}}'


SGLANG_QUERIES: Mapping[str, str] = {
    # Arrivals at the router where it is scraped (role="router"); engines count a request
    # only when it completes, which under overload is the rate served, not the rate offered.
    "rate_rps": (
        'sum(rate(smg_http_requests_total{{{sel},role="router",method="POST",'
        'path=~"/generate|/v1/chat/completions|/v1/completions"}}[{window}]))'
        f' or sum(rate({_sglang("num_requests_total", "prefill")}[{{window}}]))'
    ),
    "mean_input_tokens": (
        f'sum(rate({_sglang("prompt_tokens_total", "prefill")}[{{window}}]))'
        f' / sum(rate({_sglang("num_requests_total", "prefill")}[{{window}}]))'
    ),
    "mean_output_tokens": (
        f'sum(rate({_sglang("generation_tokens_total", "decode")}[{{window}}]))'
        f' / sum(rate({_sglang("num_requests_total", "decode")}[{{window}}]))'
    ),
    # The tokens decode streamed per prompt prefill finished, plus the first: the inter-token
    # histogram's count grows by every token after the first as it streams (SGLang's
    # observe_inter_token_latency adds a chunk's tokens), while generation_tokens_total
    # grows by a whole response at its finish. What stands in for the output length when no
    # response finished (Observation.streamed_output_tokens)
    "streamed_output_tokens": (
        f'1 + sum(rate({_sglang("inter_token_latency_seconds_count", "decode")}[{{window}}]))'
        f' / sum(rate({_sglang("num_requests_total", "prefill")}[{{window}}]))'
    ),
    # The prompt-length histogram by bucket (one series per ``le``), read into the prompts'
    # spread by observe.square_ratio_from_buckets. SGLang observes it at finish, with
    # --enable-metrics in current releases (older ones need --collect-tokens-histogram in
    # the engine's extra args); without it the reading is unknown and the last one stands.
    "input_tokens_square_ratio": (
        "sum by (le) (rate("
        f'{_sglang("prompt_tokens_histogram_bucket", "prefill")}[{{window}}]))'
    ),
    "prefix_hit_rate": (
        f'sum(rate({_sglang("cached_tokens_total", "prefill")}[{{window}}]))'
        f' / sum(rate({_sglang("prompt_tokens_total", "prefill")}[{{window}}]))'
    ),
    "ttft_p50_seconds": (
        "histogram_quantile(0.5, sum by (le) (rate("
        f'{_sglang("time_to_first_token_seconds_bucket", "decode")}[{{window}}])))'
    ),
    "ttft_at_percentile_seconds": (
        "histogram_quantile({quantile}, sum by (le) (rate("
        f'{_sglang("time_to_first_token_seconds_bucket", "decode")}[{{window}}])))'
    ),
    "tpot_p50_seconds": (
        "histogram_quantile(0.5, sum by (le) (rate("
        f'{_sglang("inter_token_latency_seconds_bucket", "decode")}[{{window}}])))'
    ),
    "tpot_at_percentile_seconds": (
        "histogram_quantile({quantile}, sum by (le) (rate("
        f'{_sglang("inter_token_latency_seconds_bucket", "decode")}[{{window}}])))'
    ),
    "tpot_mean_seconds": (
        f'sum(rate({_sglang("inter_token_latency_seconds_sum", "decode")}[{{window}}]))'
        f' / sum(rate({_sglang("inter_token_latency_seconds_count", "decode")}[{{window}}]))'
    ),
    # Every queue a request waits in before its role works on it, summed in one selector (a
    # queue an engine version does not export adds nothing; none at all is unknown). Prefill:
    # the scheduler's waiting queue and the bootstrap queue (waiting for its decode peer), named
    # num_prefill_prealloc_queue_reqs before SGLang renamed it num_prefill_bootstrap_queue_reqs
    # (an engine exports one of the two); not the inflight queue, whose prefill is done and
    # whose KV is on its way. Decode: waiting, prealloc (KV memory) and transfer (KV arriving).
    # smg's prefill admission (router.admission) holds requests at the router before any
    # prefill engine sees them: they wait for prefill too (nothing where it is not on).
    "queue_depth_prefill": (
        f'sum({_sglang("(num_queue_reqs|num_prefill_prealloc_queue_reqs|num_prefill_bootstrap_queue_reqs)", "prefill")})'
        ' + (sum(smg_pd_prefill_admission_queued{{{sel},role="router"}}) or vector(0))'
    ),
    "queue_depth_decode": (
        f'sum({_sglang("(num_queue_reqs|num_decode_prealloc_queue_reqs|num_decode_transfer_queue_reqs)", "decode")})'
    ),
    "running_requests_prefill": f'sum({_sglang("num_running_reqs", "prefill")})',
    "running_requests_decode": f'sum({_sglang("num_running_reqs", "decode")})',
    # the same gauges averaged over the interval: the batch the interval's latencies ran at
    "running_requests_mean_prefill": f'sum(avg_over_time({_sglang("num_running_reqs", "prefill")}[{{window}}]))',
    "running_requests_mean_decode": f'sum(avg_over_time({_sglang("num_running_reqs", "decode")}[{{window}}]))',
    # Requests streaming on decode over the last scrape interval (irate: the window's last two
    # samples): each chunk adds the seconds since the request's previous chunk to the
    # inter-token histogram's sum, so its rate is the number decoding (Little's law). The
    # running gauge is set only when a batch is logged (every 40 decode steps, or 30 s when
    # idle): an idle decode shows its last batch.
    "decoding_requests_decode": f'sum(irate({_sglang("inter_token_latency_seconds_sum", "decode")}[{{window}}]))',
    # the same over the whole window: the batch the interval's inter-token latencies ran at
    "decoding_requests_mean_decode": f'sum(rate({_sglang("inter_token_latency_seconds_sum", "decode")}[{{window}}]))',
    # Requests the router refused (smg's prefill admission: queue full or timed out), which
    # the planner counts as TTFT misses. Zero where smg is not scraped but the engines are:
    # sglang-router refuses nothing (an smg whose metrics are not scraped goes unseen).
    "rejected_rps": (
        'sum(rate(smg_pd_prefill_admission_rejections_total{{{sel},role="router"}}[{window}]))'
        f' or 0 * sum(rate({_sglang("num_requests_total", "prefill")}[{{window}}]))'
    ),
    # The mean time a prompt spends in forward passes on a prefill (SGLang's per-stage
    # latency, with --enable-metrics; its stage prefill_forward runs from the pass that takes
    # the prompt to the end of the pass that finishes it in current releases, the last chunk
    # only in v0.5.6): how fast prefill computes, whatever the queue
    "prefill_forward_seconds": (
        f'sum(rate({_sglang("per_stage_req_latency_seconds_sum", "prefill", stage="prefill_forward")}[{{window}}]))'
        f' / sum(rate({_sglang("per_stage_req_latency_seconds_count", "prefill", stage="prefill_forward")}[{{window}}]))'
    ),
    # The prefill GPUs' busy seconds per prompt finished: SGLang's GPU execution time
    # (scheduler metrics, --enable-metrics) of its prefill passes, over the prompts prefill
    # finished. Each pass counts once, so unlike the forward time above it does not read shared
    # passes as slow compute. v0.5.23 names it forward_execution_seconds_total, category
    # extend (split_prefill for split passes), behind SGLANG_ENABLE_METRICS_DEVICE_TIMER=1,
    # which the operator sets; main in 2026 had gpu_execution_seconds_total, category
    # forward_extend (forward_prefill in some releases). An engine exports one of the two
    "prefill_busy_seconds_per_request": (
        f'sum(rate({_sglang("(gpu|forward)_execution_seconds_total", "prefill", category="forward_(extend|prefill)|extend|split_prefill")}[{{window}}]))'
        f' / sum(rate({_sglang("num_requests_total", "prefill")}[{{window}}]))'
    ),
}

# vLLM: the decode instance's TTFT misses the prefill time (the proxy sends to prefill first),
# so TTFT comes from the prefill side, whose first token is the one prefill produces; a
# router's TTFT is better where one is scraped (override ttft_* with it).
VLLM_QUERIES: Mapping[str, str] = {
    "rate_rps": 'sum(rate(vllm:request_success_total{{{sel},role="decode"}}[{window}]))',
    "mean_input_tokens": (
        'sum(rate(vllm:prompt_tokens_total{{{sel},role="prefill"}}[{window}]))'
        ' / sum(rate(vllm:request_success_total{{{sel},role="prefill"}}[{window}]))'
    ),
    "mean_output_tokens": (
        'sum(rate(vllm:generation_tokens_total{{{sel},role="decode"}}[{window}]))'
        ' / sum(rate(vllm:request_success_total{{{sel},role="decode"}}[{window}]))'
    ),
    # the tokens decode streamed per prompt prefill finished, plus the first (the inter-token
    # histogram counts every later token as it streams; request_success_total at finish)
    "streamed_output_tokens": (
        '1 + sum(rate(vllm:inter_token_latency_seconds_count{{{sel},role="decode"}}[{window}]))'
        ' / sum(rate(vllm:request_success_total{{{sel},role="prefill"}}[{window}]))'
    ),
    "input_tokens_square_ratio": (
        'sum by (le) (rate(vllm:request_prompt_tokens_bucket{{{sel},role="prefill"}}[{window}]))'
    ),
    "prefix_hit_rate": (
        'sum(rate(vllm:prefix_cache_hits_total{{{sel},role="prefill"}}[{window}]))'
        ' / sum(rate(vllm:prefix_cache_queries_total{{{sel},role="prefill"}}[{window}]))'
    ),
    "ttft_p50_seconds": (
        "histogram_quantile(0.5, sum by (le) (rate("
        'vllm:time_to_first_token_seconds_bucket{{{sel},role="prefill"}}[{window}])))'
    ),
    "ttft_at_percentile_seconds": (
        "histogram_quantile({quantile}, sum by (le) (rate("
        'vllm:time_to_first_token_seconds_bucket{{{sel},role="prefill"}}[{window}])))'
    ),
    "tpot_p50_seconds": (
        "histogram_quantile(0.5, sum by (le) (rate("
        'vllm:inter_token_latency_seconds_bucket{{{sel},role="decode"}}[{window}])))'
    ),
    "tpot_at_percentile_seconds": (
        "histogram_quantile({quantile}, sum by (le) (rate("
        'vllm:inter_token_latency_seconds_bucket{{{sel},role="decode"}}[{window}])))'
    ),
    "tpot_mean_seconds": (
        'sum(rate(vllm:inter_token_latency_seconds_sum{{{sel},role="decode"}}[{window}]))'
        ' / sum(rate(vllm:inter_token_latency_seconds_count{{{sel},role="decode"}}[{window}]))'
    ),
    "queue_depth_prefill": 'sum(vllm:num_requests_waiting{{{sel},role="prefill"}})',
    # a decode's requests waiting for room to run (reason="capacity"), where vLLM splits its
    # waiting gauge by reason: those deferred on their KV pull are no lack of decode capacity;
    # older vLLM has only the total
    "queue_depth_decode": (
        'sum(vllm:num_requests_waiting_by_reason{{{sel},role="decode",reason="capacity"}})'
        ' or sum(vllm:num_requests_waiting{{{sel},role="decode"}})'
    ),
    "running_requests_prefill": 'sum(vllm:num_requests_running{{{sel},role="prefill"}})',
    "running_requests_decode": 'sum(vllm:num_requests_running{{{sel},role="decode"}})',
    "running_requests_mean_prefill": 'sum(avg_over_time(vllm:num_requests_running{{{sel},role="prefill"}}[{window}]))',
    "running_requests_mean_decode": 'sum(avg_over_time(vllm:num_requests_running{{{sel},role="decode"}}[{window}]))',
    # the sum of every token's inter-token latency over the last scrape: requests decoding
    "decoding_requests_decode": 'sum(irate(vllm:inter_token_latency_seconds_sum{{{sel},role="decode"}}[{window}]))',
    "decoding_requests_mean_decode": 'sum(rate(vllm:inter_token_latency_seconds_sum{{{sel},role="decode"}}[{window}]))',
    # vllm-router refuses nothing: zero wherever the engines are scraped
    "rejected_rps": '0 * sum(rate(vllm:request_success_total{{{sel},role="decode"}}[{window}]))',
    # from the step that schedules the prompt to its first token, on the prefill side
    "prefill_forward_seconds": (
        'sum(rate(vllm:request_prefill_time_seconds_sum{{{sel},role="prefill"}}[{window}]))'
        ' / sum(rate(vllm:request_prefill_time_seconds_count{{{sel},role="prefill"}}[{window}]))'
    ),
}

ENGINE_QUERIES: Mapping[str, Mapping[str, str]] = {"sglang": SGLANG_QUERIES, "vllm": VLLM_QUERIES}
#: readings an engine exports nothing for: vLLM has no GPU busy-time counter (a user may still
#: give a query for one under ``queries``)
NOT_EXPORTED: Mapping[str, frozenset[str]] = {
    "sglang": frozenset(), "vllm": frozenset({"prefill_busy_seconds_per_request"})}


def rate_window_seconds(interval_seconds: float) -> int:
    """The window the planner's metrics are read over (the PromQL rate window): one planning
    interval, and at least 10 s so that a 1 s scrape gives a rate several samples. The live
    loop, the Prometheus replay and its what-if read with this one rule."""
    return max(int(interval_seconds), 10)


def render_queries(
    engine: str,
    *,
    namespace: str,
    pdcluster: str,
    window_seconds: int,
    percentile: float,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """PromQL for every reading of one PDCluster.

    Parameters
    ----------
    engine : ``"sglang"`` or ``"vllm"`` (case-insensitive).
    namespace, pdcluster : select the PDCluster's pods by the scrape labels.
    window_seconds : the rate window, normally the planner interval (at least 2 scrapes).
    percentile : the SLO's share of requests (``Slo.percentile``, in (0, 1)): the quantile of
        ``ttft_at_percentile_seconds`` and ``tpot_at_percentile_seconds``, the latencies the
        planner compares with the targets. Required: a quantile the user did not set would be
        one the SLO does not speak of.
    overrides : reading name -> template replacing the default; may use ``{sel}``,
        ``{window}`` and ``{quantile}``. An unknown reading name is an error (a typo would
        silently do nothing).
    """
    key = engine.lower()
    if key not in ENGINE_QUERIES:
        raise ValueError(f"engine: unknown engine {engine!r}; expected one of {sorted(ENGINE_QUERIES)}")
    if window_seconds < 1:
        raise ValueError(f"window_seconds: must be at least 1, got {window_seconds}")
    if not (isinstance(percentile, (int, float)) and 0.0 < percentile < 1.0):
        raise ValueError(f"percentile: must be a share in (0, 1) such as 0.9, got {percentile!r}")
    templates = dict(ENGINE_QUERIES[key])
    for name, template in (overrides or {}).items():
        if name not in READINGS:
            raise ValueError(
                f"queries.{name}: unknown reading; expected one of {', '.join(READINGS)}"
            )
        templates[name] = template
    sel = f'namespace="{namespace}",pdcluster="{pdcluster}"'
    rendered = {}
    for name, template in templates.items():
        try:
            rendered[name] = template.format(sel=sel, window=f"{window_seconds}s",
                                             quantile=f"{percentile:g}")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"queries.{name}: bad template ({exc}); use {{sel}}, {{window}} "
                             "and {quantile}") from None
    return rendered


#: a sample value as the HTTP API writes it: a decimal number string (Prometheus formats
#: floats without an exponent; compatible servers may add one). NaN and infinities are spelled
#: "NaN", "+Inf" and "-Inf" and are unknown, not numbers.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NOT_A_NUMBER = frozenset({"nan", "+inf", "-inf", "inf"})


def to_reading(
    result: Any, now_seconds: float, max_age_seconds: float | None = None
) -> tuple[Reading | None, str | None]:
    """Interpret one instant-query answer: the ``result`` of a vector (a list of
    ``{"metric": {...}, "value": [timestamp, "number"]}``) or of a scalar
    (``[timestamp, "number"]``), as the HTTP API documents them.

    The reading is stamped at the sample's timestamp, so the planner dates it by the time
    Prometheus evaluated it, not by when the answer arrived. Anything not exactly of that
    shape is unknown: a value that is not a finite decimal number string (a number, bytes, a
    string with other characters), a missing or non-numeric timestamp, more than one series,
    or (with ``max_age_seconds``) a sample older, or further in the future, than that.
    Returns the reading, or ``None`` with the reason it is unknown."""
    if not isinstance(result, list) or not result:
        return None, "no data"
    if _is_sample(result):
        sample = result  # a scalar answer
    elif len(result) > 1:
        return None, f"{len(result)} series (the query must aggregate to one)"
    else:
        series = result[0]
        if (not isinstance(series, dict) or not isinstance(series.get("metric", {}), dict)
                or not _is_sample(series.get("value"))):
            return None, "malformed answer (expected {'metric': {...}, 'value': [time, 'number']})"
        sample = series["value"]
    at, text = float(sample[0]), sample[1]
    if not math.isfinite(at):
        return None, f"malformed answer (sample time {sample[0]!r})"
    if text.strip().lower() in _NOT_A_NUMBER:
        return None, "not a number (no traffic in the window?)"
    if _DECIMAL.fullmatch(text) is None:
        return None, f"malformed answer (value {text[:40]!r} is not a decimal number)"
    value = float(text)
    if not math.isfinite(value):
        return None, f"not a number (value {text[:40]!r} overflows)"
    if max_age_seconds is not None and not -max_age_seconds <= now_seconds - at <= max_age_seconds:
        return None, f"stale (sample at {at:.0f}, {now_seconds - at:.0f} s before now; allowed {max_age_seconds:.0f} s)"
    return Reading(value, at), None


#: readings whose query answers one series per histogram bucket (``sum by (le)``)
BUCKET_READINGS = frozenset({"input_tokens_square_ratio"})


def to_square_ratio(
    result: Any, now_seconds: float, max_age_seconds: float | None = None
) -> tuple[Reading | None, str | None]:
    """Interpret a histogram's buckets (a vector of series labelled ``le``, as ``sum by (le)
    (rate(..._bucket[w]))`` answers) as its mean square over its squared mean
    (``observe.square_ratio_from_buckets``), stamped at the oldest sample. Every series must
    be a valid sample (:func:`to_reading`) with a numeric ``le``."""
    if not isinstance(result, list) or not result:
        return None, "no data"
    rows, oldest = [], math.inf
    for series in result:
        if not isinstance(series, dict) or not isinstance(series.get("metric"), dict):
            return None, "malformed answer (expected one series per bucket, labelled le)"
        bound = series["metric"].get("le")
        try:
            upper = float(bound)
        except (TypeError, ValueError):
            return None, f"malformed answer (bucket bound le={bound!r})"
        reading, reason = to_reading([series], now_seconds, max_age_seconds)
        if reading is None:
            return None, f"bucket le={bound}: {reason}"
        rows.append((upper, reading.value))
        oldest = min(oldest, reading.at_seconds)
    ratio = square_ratio_from_buckets(rows)
    if ratio is None:
        return None, "not a number (no prompts in the window, or buckets not cumulative)"
    return Reading(ratio, oldest), None


def _is_sample(x: object) -> bool:
    """``[timestamp, "value"]``: a two-element list of a real number and a string (a JSON
    answer has no tuples, but a client may hand one over)."""
    return (isinstance(x, (list, tuple)) and len(x) == 2
            and isinstance(x[0], (int, float)) and not isinstance(x[0], bool)
            and isinstance(x[1], str))


@dataclass(frozen=True)
class MetricsSnapshot:
    """Readings by name (``None`` = unknown) and, for each unknown one, why. ``source`` names
    where the Prometheus address came from (a spec field or an operator setting), so that a
    failure's one line can say what to check."""

    readings: Mapping[str, Reading | None]
    failures: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def unreachable(self) -> bool:
        return bool(self.failures) and all(
            reason.startswith("unreachable") for reason in self.failures.values()
        )

    def summary(self) -> str:
        """One short line for status: what is unknown and why, grouped by reason (each a short
        fixed phrase, never an answer's text), and what to check when nothing was read."""
        if not self.failures:
            return "all metrics read"
        total = len(self.readings)
        by_reason: dict[str, list[str]] = {}
        for name, reason in sorted(self.failures.items()):
            by_reason.setdefault(reason, []).append(name)
        if len(by_reason) == 1 and len(self.failures) == total:
            (reason,) = by_reason
            check = f"; check {self.source}" if self.source else ""
            if self.unreachable:
                return f"Prometheus {reason}: no metrics read, the planner holds{check}"
            return f"no metrics read ({reason}){check}"
        parts = []
        for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = ", ".join(names[:_NAMES_SHOWN])
            more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
            parts.append(f"{reason} ({shown}{more})")
        return f"{len(self.failures)} of {total} metrics unknown: {'; '.join(parts)}"


#: query names listed per reason in a summary (the operator's log has them all)
_NAMES_SHOWN = 4


class QueryClient(Protocol):
    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


class QueryError(Exception):
    """A query that got no usable answer. ``reason`` is a short fixed phrase for status
    (status class, timeout, too large, unreachable); ``detail`` (the start of an error body,
    the exception) is for the operator's log only: an answer's text never reaches a status a
    tenant reads, as it could be any internal page the URL points at."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


#: the most one PromQL query may take, from connecting to the answer's last byte (seconds)
QUERY_DEADLINE_SECONDS = 10.0
#: the largest answer the planner reads (bytes): its queries aggregate to one series, or one
#: per histogram bucket, a few KiB; a larger answer is refused as it streams, never buffered
MAX_ANSWER_BYTES = 1 << 20
#: the most one plan's metrics read may take, all queries together (seconds)
READ_BUDGET_SECONDS = 20.0
_READ_CHUNK = 64 * 1024


def read_metrics(
    client: QueryClient, queries: Mapping[str, str], now_seconds: float,
    max_age_seconds: float | None = None, *, at_seconds: float | None = None,
    budget_seconds: float | None = None, source: str = "",
) -> MetricsSnapshot:
    """Run every query; a failure makes that reading unknown, never zero.

    ``client`` is a :class:`BoundedPrometheus` (or anything with its ``custom_query``);
    readings carry their samples' timestamps, which the planner compares with its own clock
    (``Reading.fresh``). With ``max_age_seconds`` (the planner's), a sample that old is
    unknown here already, and the failure says it was stale; ``now_seconds`` is the caller's
    clock for that comparison.

    ``at_seconds`` evaluates every query at that time (Unix seconds; the HTTP API's ``time``)
    instead of whenever the request arrives: what a replay of a past interval reads, and what
    makes a live reading reproducible (the same query at the same time gives the same
    answer once every scrape up to that time is stored).

    Bounded: once a query finds Prometheus unreachable (no connection, or no whole answer by
    its deadline) or answering past the size cap, the rest are not sent, and with ``budget_seconds`` the queries together
    take no longer than that (each gets what is left; the rest are unknown)."""
    readings: dict[str, Reading | None] = {}
    failures: dict[str, str] = {}
    params = None if at_seconds is None else {"time": repr(float(at_seconds))}
    end = None if budget_seconds is None else time.monotonic() + budget_seconds
    given_up: str | None = None
    for name, query in queries.items():
        readings[name] = None
        if given_up is not None:
            failures[name] = given_up  # Prometheus did not answer the last query: not asked
            continue
        left = None if end is None else end - time.monotonic()
        spent = f"not read: the {budget_seconds or 0:g} s for all queries ran out"
        if left is not None and left <= 0:
            failures[name] = spent
            continue
        try:
            if left is not None:
                answer = client.custom_query(query, params, timeout=left)  # type: ignore[call-arg]
            else:
                answer = client.custom_query(query) if params is None else client.custom_query(query, params)
        except Exception as exc:  # any client's failure is an unknown reading, never a crash
            # cut short by what was left of the budget: the budget's doing, not the server's
            ran_out = end is not None and time.monotonic() >= end and left is not None and (
                left < getattr(client, "deadline_seconds", math.inf))
            failures[name] = spent if ran_out else _describe_error(exc)
            detail = exc.detail if isinstance(exc, QueryError) else f"{type(exc).__name__}: {exc}"
            log.warning("metrics query %s failed (%s): %s", name, failures[name], detail[:300])
            if failures[name].startswith(_GIVE_UP):
                given_up = failures[name]
            elif ran_out:
                given_up = spent
            continue
        interpret = to_square_ratio if name in BUCKET_READINGS else to_reading
        readings[name], reason = interpret(answer, now_seconds, max_age_seconds)
        if reason:
            failures[name] = reason
    return MetricsSnapshot(readings, failures, source)


#: failures after which the plan's other queries are not sent: the server is not answering,
#: or answers more than the planner reads (each further query would cost the cap again)
_GIVE_UP = ("unreachable", "query failed: answer over")


def _describe_error(exc: Exception) -> str:
    """A short fixed reason: the exception's class, never its text (a client's error message
    carries the answer's body)."""
    if isinstance(exc, QueryError):
        return exc.reason
    kind = type(exc).__name__
    if "Timeout" in kind:
        return "unreachable: no answer in time"
    if any(word in kind for word in ("Connection", "MaxRetry", "NewConnection")) or isinstance(exc, OSError):
        return "unreachable: cannot connect"
    return f"query failed ({kind})"


class BoundedPrometheus:
    """A Prometheus HTTP API client whose every query is bounded: one deadline over the whole
    exchange (connect, headers, body; a watchdog cuts the connection when it passes, so a
    server that drips a byte a second cannot hold it), and a cap on the answer's size (read in
    chunks and refused past the cap, never buffered whole). No retries and no redirects: the
    next interval tries again, and a redirect would lead the operator elsewhere than the URL
    the admin allowed. Errors are :class:`QueryError` with a fixed reason.

    ``custom_query`` answers as ``prometheus_api_client.PrometheusConnect``'s does (the
    ``data.result`` of ``/api/v1/query``)."""

    def __init__(self, url: str, *, deadline_seconds: float = QUERY_DEADLINE_SECONDS,
                 max_answer_bytes: int = MAX_ANSWER_BYTES):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: expected http(s)://host[:port][/path], got {url!r}")
        self.url = url
        self.deadline_seconds = deadline_seconds
        self.max_answer_bytes = max_answer_bytes
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/api/v1/query"
        #: certificates verified against the system's CAs, as PrometheusConnect did
        self._tls = ssl.create_default_context() if self._https else None

    def custom_query(self, query: str, params: dict[str, Any] | None = None,
                     timeout: float | None = None) -> Any:
        seconds = self.deadline_seconds if timeout is None else min(timeout, self.deadline_seconds)
        target = self._path + "?" + urllib.parse.urlencode({"query": query, **(params or {})})
        return self._result(target, seconds)

    def custom_query_range(self, query: str, *, start: float, end: float, step: float,
                           timeout: float | None = None) -> Any:
        """The ``data.result`` of ``/api/v1/query_range`` (a matrix), bounded as
        :meth:`custom_query` is."""
        seconds = self.deadline_seconds if timeout is None else min(timeout, self.deadline_seconds)
        path = self._path.removesuffix("/query") + "/query_range"
        target = path + "?" + urllib.parse.urlencode(
            {"query": query, "start": repr(float(start)), "end": repr(float(end)), "step": f"{step:g}"})
        return self._result(target, seconds)

    def _result(self, target: str, seconds: float) -> Any:
        """The ``data.result`` of ``GET target``, or a QueryError saying what was wrong."""
        status, body = self._exchange(target, seconds)
        if status != 200:
            raise QueryError(f"query failed: HTTP {status // 100}xx",
                             detail=f"HTTP {status}: {body[:160]!r}")
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            raise QueryError("query failed: the answer is not JSON") from None
        if (not isinstance(answer, dict) or answer.get("status") != "success"
                or not isinstance(answer.get("data"), dict)):
            raise QueryError("query failed: not a Prometheus answer")
        return answer["data"].get("result")

    def _exchange(self, target: str, seconds: float) -> tuple[int, bytes]:
        """(status, body) of ``GET target``, whole within ``seconds``; the body of an answer
        other than 200 is its first bytes only (for the log)."""
        timed_out = QueryError(f"unreachable: no whole answer within {seconds:.3g} s")
        if seconds <= 0:
            raise timed_out
        deadline = time.monotonic() + seconds
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(self._host, self._port, timeout=seconds, context=self._tls)
            if self._https else http.client.HTTPConnection(self._host, self._port, timeout=seconds))
        cut = threading.Event()
        watchdog = threading.Timer(seconds, _cut, (conn, cut))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("GET", target, headers={"Accept": "application/json",
                                                 "Connection": "close", "User-Agent": "pdscale"})
            response = conn.getresponse()
            if response.status != 200:
                return response.status, response.read(512)
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > self.max_answer_bytes:
                raise self._too_large()
            chunks, size = [], 0
            while chunk := response.read(_READ_CHUNK):
                size += len(chunk)
                if size > self.max_answer_bytes:
                    raise self._too_large()
                chunks.append(chunk)
            if cut.is_set() or time.monotonic() >= deadline:
                raise timed_out  # cut by the watchdog: what arrived may be short
            return 200, b"".join(chunks)
        except QueryError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cut.is_set() or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise timed_out from None
            if conn.sock is None:
                raise QueryError("unreachable: cannot connect", detail=repr(exc)) from None
            raise QueryError("unreachable: the connection broke", detail=repr(exc)) from None
        finally:
            watchdog.cancel()
            conn.close()

    def _too_large(self) -> QueryError:
        return QueryError(f"query failed: answer over {self.max_answer_bytes // 1024} KiB")


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The deadline passed: end the exchange (a blocked read returns at once)."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class RangeClient(Protocol):
    def custom_query_range(self, query: str, *, start: float, end: float, step: float,
                           timeout: float | None = None) -> Any: ...


def read_rate_history(client: RangeClient, query: str, *, now_seconds: float, span_seconds: float,
                      step_seconds: float) -> list[tuple[float, float]]:
    """The request rate over the last ``span_seconds``, one point per ``step_seconds`` (Unix
    time the step ends, rate over the query's window up to it): one range query of ``query``
    (the ``rate_rps`` reading), as far back as the server's retention holds (it answers what
    it has). What the seasonal memory is seeded with on a first plan (28 days in ten-minute
    steps, each the step's mean: ``seasonal.SeasonalMemory.with_earlier``), and the rates
    the risk over the lead is learned from (a day in planning intervals, :func:`rates_on_grid`).

    Bounded: at most ``span_seconds / step`` + 1 points (4,033 for 28 days of ten minutes,
    1,441 for a day of minutes; under Prometheus' 11,000 a series, about 120 kB), one query
    under the client's deadline and size cap. Steps without data are absent, never zero. Raises :class:`QueryError`
    (or the client's error) when there is no answer; an answer of more than one series is
    not the aggregate asked for and raises too."""
    end = math.floor(now_seconds / step_seconds) * step_seconds
    start = end - span_seconds + step_seconds
    result = client.custom_query_range(query, start=start, end=end, step=step_seconds)
    if not isinstance(result, list):
        raise QueryError("query failed: not a matrix answer")
    if len(result) > 1:
        raise QueryError(f"query failed: {len(result)} series (the query must aggregate to one)")
    points: list[tuple[float, float]] = []
    for series in result:
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(values, list):
            raise QueryError("query failed: not a matrix answer")
        for sample in values:
            if not _is_sample(sample) or _DECIMAL.fullmatch(sample[1]) is None:
                continue  # NaN (no traffic), infinities, anything malformed: unknown
            at, value = float(sample[0]), float(sample[1])
            if math.isfinite(at) and math.isfinite(value) and value >= 0 and start - 1 <= at <= end + 1:
                points.append((at, value))
    return points


def rates_on_grid(points: Sequence[tuple[float, float]], *, now_seconds: float,
                  step_seconds: float, intervals: int) -> tuple[float | None, ...]:
    """``points`` (Unix time, rate) as the rates of the ``intervals`` planning intervals
    before the one ending at ``now_seconds``, oldest first (None: no point there): each point
    goes to the interval ending nearest it. The interval ending now is the observation
    planned this tick, not history, so a point within half an interval of now is left out."""
    out: list[float | None] = [None] * intervals
    for at, rate in points:
        back = round((now_seconds - at) / step_seconds)
        if 1 <= back <= intervals:
            out[intervals - back] = rate
    return tuple(out)


def read_earlier_rates(client: RangeClient, query: str, *, now_seconds: float,
                       interval_seconds: float, intervals: int) -> tuple[float | None, ...]:
    """The rates of the ``intervals`` planning intervals before the one ending at
    ``now_seconds`` (:func:`read_rate_history` one point per interval, :func:`rates_on_grid`),
    or none when Prometheus holds no point of them: what a fresh memory's first plan, live
    (``planner_loop._seed_rates``) and replayed (``recording.from_prometheus``), learns the
    risk over the lead from. Raises as :func:`read_rate_history`."""
    points = read_rate_history(client, query, now_seconds=now_seconds,
                               span_seconds=intervals * interval_seconds, step_seconds=interval_seconds)
    if not points:
        return ()
    return rates_on_grid(points, now_seconds=now_seconds, step_seconds=interval_seconds,
                         intervals=intervals)


def prometheus_client(url: str, timeout_seconds: float = QUERY_DEADLINE_SECONDS,
                      max_answer_bytes: int = MAX_ANSWER_BYTES) -> BoundedPrometheus:
    """The planner's Prometheus client: each query whole within ``timeout_seconds`` and at
    most ``max_answer_bytes`` long (:class:`BoundedPrometheus`): a slow or hostile Prometheus
    must not stall the planning loop or fill the operator's memory."""
    return BoundedPrometheus(url, deadline_seconds=timeout_seconds, max_answer_bytes=max_answer_bytes)


def observation_from(
    snapshot: MetricsSnapshot, now_seconds: float, prefill: RoleState, decode: RoleState
) -> Observation:
    """Join the metrics with the instance states the operator counted from the pods."""
    r = snapshot.readings

    def role_state(state: RoleState, role: str) -> RoleState:
        return RoleState(
            ready=state.ready,
            warming=state.warming,
            draining=state.draining,
            recently_ready=state.recently_ready,
            queue_depth=r.get(f"queue_depth_{role}"),
            running_requests=r.get(f"running_requests_{role}"),
            running_requests_mean=r.get(f"running_requests_mean_{role}"),
            decoding_requests=r.get(f"decoding_requests_{role}"),
            decoding_requests_mean=r.get(f"decoding_requests_mean_{role}"),
        )

    return Observation(
        now_seconds=now_seconds,
        rate_rps=r.get("rate_rps"),
        mean_input_tokens=r.get("mean_input_tokens"),
        mean_output_tokens=r.get("mean_output_tokens"),
        streamed_output_tokens=r.get("streamed_output_tokens"),
        input_tokens_square_ratio=r.get("input_tokens_square_ratio"),
        prefix_hit_rate=r.get("prefix_hit_rate"),
        ttft_p50_seconds=r.get("ttft_p50_seconds"),
        ttft_at_percentile_seconds=r.get("ttft_at_percentile_seconds"),
        tpot_p50_seconds=r.get("tpot_p50_seconds"),
        tpot_at_percentile_seconds=r.get("tpot_at_percentile_seconds"),
        tpot_mean_seconds=r.get("tpot_mean_seconds"),
        rejected_rps=r.get("rejected_rps"),
        prefill_forward_seconds=r.get("prefill_forward_seconds"),
        prefill_busy_seconds_per_request=r.get("prefill_busy_seconds_per_request"),
        prefill=role_state(prefill, "prefill"),
        decode=role_state(decode, "decode"),
    )
