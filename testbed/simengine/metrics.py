"""The engine's metrics registry (counters and latency histograms) and its text exposition.

Both dialects count the same things; each names them its own way when it renders
(:meth:`.dialect.Dialect.render_metrics`) through an :class:`Exposition`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pdscale.operator.render.engines import (
    SGLANG_DEFAULT_ITL_BUCKETS_SECONDS,
    SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS,
)
from pdscale.planner.observe import SGLANG_PROMPT_TOKENS_BUCKETS as _SGLANG_PROMPT_TOKENS_BUCKETS

# The engines' own default buckets (docs/conformance.md): tests see what production sees, and a
# quantile read from them is as coarse as it is in production. Bucket flags override them.
#: SGLang ``TokenizerMetricsCollector`` (python/sglang/srt/metrics/collector.py): one source
#: with the operator, which renders edges around the SLOs on top of them
SGLANG_TTFT_BUCKETS_SECONDS = SGLANG_DEFAULT_TTFT_BUCKETS_SECONDS
SGLANG_ITL_BUCKETS_SECONDS = SGLANG_DEFAULT_ITL_BUCKETS_SECONDS
#: the sim's own modelled-TPOT histogram: every 5 ms to 100 ms (an SLO's 50 ms is a bound),
#: then coarser
MODELLED_TPOT_BUCKETS_SECONDS = (*(round(0.005 * k, 3) for k in range(1, 21)), 0.15, 0.2, 0.3, 0.5,
                                 1.0, 2.0)
#: the sim's own modelled prefill-time histogram (queue and compute): fine around the TTFT
#: targets tests set (1-15 s are bounds), then coarser
MODELLED_PREFILL_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
                                    7.5, 10.0, 15.0, 20.0, 30.0, 60.0)
SGLANG_E2E_BUCKETS_SECONDS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
    2400,
)  # fmt: skip
#: vLLM V1 ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py)
VLLM_TTFT_BUCKETS_SECONDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL_BUCKETS_SECONDS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
#: prompt lengths, tokens: SGLang's defaults (one source with the replay, planner/observe.py);
#: vLLM's 1-2-5 series up to the context length (``build_1_2_5_buckets(max_model_len)``, here
#: a 128k context)
SGLANG_PROMPT_TOKENS_BUCKETS = tuple(float(b) for b in _SGLANG_PROMPT_TOKENS_BUCKETS)
VLLM_PROMPT_TOKENS_BUCKETS = tuple(
    float(m * 10**e) for e in range(6) for m in (1, 2, 5) if m * 10**e <= 131072
)
VLLM_E2E_BUCKETS_SECONDS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


#: the most cohorts (:func:`.wire.cohort_of`) each modelled histogram keeps apart; later
#: ones are counted with the requests that name none
MAX_COHORTS = 16


@dataclass
class Histogram:
    buckets: tuple[float, ...] = SGLANG_TTFT_BUCKETS_SECONDS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def observe_many(self, interval: float, n: int) -> None:
        """``n`` tokens delivered together after ``interval`` seconds: ``n`` observations of
        ``interval / n`` whose sum is ``interval`` (SGLang's observe_inter_token_latency)."""
        self.total += interval
        self.count += n
        for i, bound in enumerate(self.buckets):
            if interval / n <= bound:
                self.counts[i] += n
                break

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            cumulative += n
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass
class Metrics:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted_requests: int = 0
    #: requests answered in full (vLLM's request_success_total)
    finished_requests: int = 0
    #: prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries_total)
    cache_queries: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(SGLANG_TTFT_BUCKETS_SECONDS))
    itl: Histogram = field(default_factory=lambda: Histogram(SGLANG_ITL_BUCKETS_SECONDS))
    e2e: Histogram = field(default_factory=lambda: Histogram(SGLANG_E2E_BUCKETS_SECONDS))
    #: prompt lengths of finished requests (SGLang's prompt_tokens_histogram, vLLM's
    #: request_prompt_tokens), tokens
    prompt: Histogram = field(default_factory=lambda: Histogram(SGLANG_PROMPT_TOKENS_BUCKETS))
    #: seconds each prompt spent in forward passes on a prefill, from the pass that took it
    #: to the end of the pass that finished it (SGLang's per-stage prefill_forward, vLLM's
    #: request_prefill_time_seconds; the planner reads only their sum and count)
    prefill_forward: Histogram = field(default_factory=lambda: Histogram(SGLANG_TTFT_BUCKETS_SECONDS))
    #: not an engine metric: each finished request's TPOT had every decode step taken exactly
    #: its modelled length (``DecodeSequence.modelled_seconds``), seconds; fine buckets. One
    #: histogram per cohort (:func:`.wire.cohort_of`, "" for none), so a test can read the requests
    #: it sent in one phase apart from those still finishing
    modelled_tpot: dict[str, Histogram] = field(
        default_factory=lambda: {"": Histogram(MODELLED_TPOT_BUCKETS_SECONDS)})
    #: not an engine metric either: each prompt's time on a prefill, from its arrival in the
    #: queue to the end of the pass that finished it, had every pass taken exactly its
    #: modelled length (the pass in flight at its arrival counted whole: an upper bound of
    #: its wait). What its queue and compute are on an idle host; per cohort, as above
    modelled_prefill: dict[str, Histogram] = field(
        default_factory=lambda: {"": Histogram(MODELLED_PREFILL_BUCKETS_SECONDS)})
    #: seconds this engine spent in forward passes, each pass once however many requests it
    #: carries: prefill passes and decode steps (SGLang's gpu_execution_seconds_total,
    #: categories forward_extend and forward_decode). The passes' real length here, as a GPU
    #: timer's: a sim slowed by a busy machine reports the slower fleet it is
    busy_prefill_seconds: float = 0.0
    busy_decode_seconds: float = 0.0
    #: (prompt, cached) tokens of recent prefills, for the cache_hit_rate gauge
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=256))

    def observe_modelled_tpot(self, cohort: str, seconds: float) -> None:
        _observe(self.modelled_tpot, MODELLED_TPOT_BUCKETS_SECONDS, cohort, seconds)

    def observe_modelled_prefill(self, cohort: str, seconds: float) -> None:
        _observe(self.modelled_prefill, MODELLED_PREFILL_BUCKETS_SECONDS, cohort, seconds)

    def cache_hit_rate(self) -> float:
        prompt = sum(p for p, _ in self.recent)
        return sum(c for _, c in self.recent) / prompt if prompt else 0.0


def _observe(by_cohort: dict[str, Histogram], bounds: tuple[float, ...], cohort: str,
             seconds: float) -> None:
    if cohort not in by_cohort:
        if len(by_cohort) > MAX_COHORTS:  # "" and MAX_COHORTS named ones
            cohort = ""  # a client that names every request must not grow the exposition
        else:
            by_cohort[cohort] = Histogram(bounds)
    by_cohort[cohort].observe(seconds)


class Exposition:
    """Prometheus text exposition of one engine: samples under fixed labels, then the text."""

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.lines: list[str] = []

    def sample(
        self, name: str, kind: str, value: float, extra_labels: str = "", declare: bool = True
    ) -> None:
        """One sample; ``declare`` = False for a further sample of a declared metric."""
        if declare:
            self.lines.append(f"# TYPE {name} {kind}")
        self.lines.append(f"{name}{{{self.labels}{extra_labels}}} {value}")

    def histogram(self, name: str, hist: Histogram, extra_labels: str = "") -> None:
        self.lines.append(f"# TYPE {name} histogram")
        self.lines.extend(hist.lines(name, self.labels + extra_labels))

    def histograms_by(self, name: str, label: str, hists: dict[str, Histogram]) -> None:
        """One histogram per value of ``label`` ("" renders without it), declared once."""
        self.lines.append(f"# TYPE {name} histogram")
        for value, hist in sorted(hists.items()):
            extra = f',{label}="{value}"' if value else ""
            self.lines.extend(hist.lines(name, self.labels + extra))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
