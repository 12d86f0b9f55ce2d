"""What the planner sees each interval, with unknown values explicit.

A metric that could not be read, or is older than allowed, is ``None`` and never ``0``: a
failed Prometheus query read as zero load is how other planners scale a busy fleet to nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class Reading:
    """One metric value and the time (seconds, same clock as ``now``) it was measured at."""

    value: float
    at_seconds: float

    def fresh(self, now_seconds: float, max_age_seconds: float) -> float | None:
        """The value, or ``None`` (unknown) when it is older than ``max_age_seconds``, or
        stamped more than that in the future (two clocks that far apart cannot date it), or
        stamped at a time that is not a finite number."""
        age = now_seconds - self.at_seconds
        return self.value if -max_age_seconds <= age <= max_age_seconds else None


def fresh(reading: Reading | None, now_seconds: float, max_age_seconds: float) -> float | None:
    """``reading``'s value where it was read and is fresh (:meth:`Reading.fresh`), else
    ``None`` (unknown)."""
    return None if reading is None else reading.fresh(now_seconds, max_age_seconds)


@dataclass(frozen=True)
class Warming:
    """An instance being started or switched: it will serve at ``ready_at_seconds``."""

    ready_at_seconds: float
    role_switch: bool = False


@dataclass(frozen=True)
class RoleState:
    """Instances of one role by state, plus that role's queue readings."""

    ready: int = 0
    warming: tuple[Warming, ...] = ()
    draining: int = 0
    #: ready instances that became ready recently (their first passes are not yet warm)
    recently_ready: int = 0
    queue_depth: Reading | None = None
    running_requests: Reading | None = None
    #: the running requests averaged over the interval (Prometheus ``avg_over_time`` of the
    #: scraped gauge): what the interval's latencies were measured at, where the reading above
    #: is the batch now (a snapshot that swung +-40% around the mean on Mooncake x6)
    running_requests_mean: Reading | None = None
    #: decode: the requests that decoded over the last scrape interval, by Little's law on the
    #: inter-token latency's sum (each streamed chunk adds the seconds since the request's
    #: previous one, so its rate is the number streaming). Unlike SGLang's running gauge it
    #: is never stale: that gauge is set only when a batch is logged, and an idle decode keeps
    #: showing its last busy batch for up to 30 s
    decoding_requests: Reading | None = None
    #: decode: the requests decoding averaged over the interval, by the same law over the
    #: whole window (``rate`` where the reading above takes ``irate``): the batch the
    #: interval's inter-token latencies ran at, read from the histogram that timed them and
    #: never stale (calibration's batch; the gauge's mean above lags a batch that changes)
    decoding_requests_mean: Reading | None = None

    @property
    def provisioned(self) -> int:
        """Instances that hold a node: ready, warming and draining (all of them cost)."""
        return self.ready + len(self.warming) + self.draining

    @property
    def committed(self) -> int:
        """Instances that serve now or will serve without a new command (ready + warming)."""
        return self.ready + len(self.warming)


@dataclass(frozen=True)
class Observation:
    """Everything measured about one interval; each reading may be missing.

    Rates in requests/s, lengths in tokens, latencies in seconds, ``prefix_hit_rate`` in [0, 1]
    as a share of prompt tokens."""

    now_seconds: float
    rate_rps: Reading | None = None
    #: highest arrival rate over a 5 s sub-window of the interval (model.PEAK_WINDOW_SECONDS)
    peak_rate_rps: Reading | None = None
    mean_input_tokens: Reading | None = None
    mean_output_tokens: Reading | None = None
    #: the output tokens decode streamed over the interval per prompt prefill finished, plus
    #: the first token (SGLang's and vLLM's inter-token histogram counts every later token as
    #: it streams): the response length of the requests entering decode, read while they still
    #: stream. ``mean_output_tokens`` counts a response only when it finishes, so a load whose
    #: responses turned longer shows no length at all until the first of them ends; this is
    #: what stands in then (solve.current_load). It trails a lengthening (a response still
    #: streaming has not streamed all of it) and leads a shortening (old long responses still
    #: stream), so it is a lower bound only where it matters, and unused otherwise
    streamed_output_tokens: Reading | None = None
    #: the prompts' mean squared length over their squared mean length (``Load``'s
    #: ``input_tokens_square_ratio``), read from the engines' prompt-length histogram
    #: (:func:`square_ratio_from_buckets`)
    input_tokens_square_ratio: Reading | None = None
    prefix_hit_rate: Reading | None = None
    ttft_p50_seconds: Reading | None = None
    #: the latencies at the SLO's percentile (``Slo.percentile``), which calibration compares
    #: with the targets
    ttft_at_percentile_seconds: Reading | None = None
    tpot_p50_seconds: Reading | None = None
    tpot_at_percentile_seconds: Reading | None = None
    #: the mean inter-token latency over the interval's tokens (the histogram's sum over its
    #: count: exact, where a quantile is interpolated within a bucket, 0.1-0.2 s wide in
    #: SGLang's). What calibration learns the decode's speed from (calibration.py)
    tpot_mean_seconds: Reading | None = None
    #: requests refused by the router or timed out before their first token, per second: the
    #: latency quantiles above cover served requests only, so calibration counts these as TTFT
    #: misses. None where the stack exports no such counter (the shipped Prometheus queries
    #: read none yet: sglang-router, smg and vllm-router reject nothing by default)
    rejected_rps: Reading | None = None
    #: mean seconds a prompt spends in prefill forward passes on a prefill instance, from the
    #: pass that takes it to the end of the pass that finishes it (queueing and the KV
    #: transfer excluded; a pass shared with other prompts counted whole): SGLang's
    #: per_stage_req_latency_seconds{stage="prefill_forward"}, vLLM's
    #: request_prefill_time_seconds. What calibration learns a faster prefill from where no
    #: busy time is read (below)
    prefill_forward_seconds: Reading | None = None
    #: seconds the prefill instances' GPUs were busy in forward passes per prompt they
    #: finished (SGLang's gpu_execution_seconds_total of its prefill passes over
    #: num_requests_total on prefill): a pass counts once however many prompts share it, so
    #: this is the prompts' mean compute, at any load. What calibration learns the prefill's
    #: speed from, both ways, where the engine exports it (vLLM exports no busy time)
    prefill_busy_seconds_per_request: Reading | None = None
    prefill: RoleState = field(default_factory=RoleState)
    decode: RoleState = field(default_factory=RoleState)

    def role(self, role: Role) -> RoleState:
        return self.prefill if role is Role.PREFILL else self.decode


# -- what a usable reading looks like ----------------------------------------------------------
# A reading outside these ranges is not a measurement of any fleet pdscale can run: it is a
# unit error, a counter reset read as a rate, a histogram with a broken bucket, or a corrupted
# answer. The planner holds on it (planner.solve) rather than sizing a fleet for it. Each bound
# is far above anything real, so that no real load is ever refused.

#: requests/s: the largest public LLM services answer on the order of 1e4-1e5 requests/s over
#: all their regions; a million per second into one PDCluster is not a load, it is an error
MAX_RATE_RPS = 1e6
#: tokens per request: the longest context windows offered are ~1e7 tokens
MAX_MEAN_TOKENS = 1e7
#: mean squared prompt over squared mean prompt is 1 + CV^2 (never below 1): the longest-tailed
#: public traces are near 3 (Mooncake conversation 2.7); a thousand is a broken histogram
MAX_SQUARE_RATIO = 1e3
#: a prefix hit rate is a share of prompt tokens; counters scraped a moment apart may put it a
#: little outside [0, 1] (clamped), further out the two counters do not belong together
HIT_RATE_SLACK = 0.05
#: seconds to the first token: a request waiting a day for it is lost, not slow (and
#: histogram_quantile never answers above the highest finite bucket bound, minutes at most)
MAX_TTFT_SECONDS = 86_400.0
#: seconds between tokens: ten minutes per token is a stalled engine or a unit error
MAX_TPOT_SECONDS = 600.0
#: requests queued or running in one role (the replay's prefill queue is seconds of work):
#: ten million is beyond the KV memory and the admission queues of any fleet
MAX_QUEUE = 1e7
#: instances of one role: the largest GPU clusters hold ~1e5 GPUs, an instance takes >= 1
MAX_INSTANCES = 100_000

#: reading name -> (lowest, highest) usable value
READING_BOUNDS: dict[str, tuple[float, float]] = {
    "rate_rps": (0.0, MAX_RATE_RPS),
    "peak_rate_rps": (0.0, MAX_RATE_RPS),
    "rejected_rps": (0.0, MAX_RATE_RPS),
    "mean_input_tokens": (0.0, MAX_MEAN_TOKENS),
    "mean_output_tokens": (0.0, MAX_MEAN_TOKENS),
    "streamed_output_tokens": (0.0, MAX_MEAN_TOKENS),
    "input_tokens_square_ratio": (1.0, MAX_SQUARE_RATIO),
    "prefix_hit_rate": (-HIT_RATE_SLACK, 1.0 + HIT_RATE_SLACK),
    "ttft_p50_seconds": (0.0, MAX_TTFT_SECONDS),
    "ttft_at_percentile_seconds": (0.0, MAX_TTFT_SECONDS),
    "tpot_p50_seconds": (0.0, MAX_TPOT_SECONDS),
    "tpot_at_percentile_seconds": (0.0, MAX_TPOT_SECONDS),
    "tpot_mean_seconds": (0.0, MAX_TPOT_SECONDS),
    "prefill_forward_seconds": (0.0, MAX_TTFT_SECONDS),
    "prefill_busy_seconds_per_request": (0.0, MAX_TTFT_SECONDS),
    "queue_depth": (0.0, MAX_QUEUE),
    "running_requests": (0.0, MAX_QUEUE),
    "running_requests_mean": (0.0, MAX_QUEUE),
    "decoding_requests": (0.0, MAX_QUEUE),
    "decoding_requests_mean": (0.0, MAX_QUEUE),
}


def _real(x: object) -> float | None:
    """``x`` as a float if it is a real number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _check_value(name: str, value: object) -> str | None:
    x = _real(value)
    if x is None:
        return f"{name} is not a number ({value!r})"
    if not math.isfinite(x):
        return f"{name} is not finite ({value!r})"
    lo, hi = READING_BOUNDS[name.rsplit(".", 1)[-1]]
    if x < lo:
        return f"{name} is below {lo:g} ({x:g})"
    if x > hi:
        return f"{name} is implausibly large ({x:g} > {hi:g})"
    return None


def _check_count(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} is not a whole count ({value!r})"
    if not 0 <= value <= MAX_INSTANCES:
        return f"{name} is outside [0, {MAX_INSTANCES}] ({value})"
    return None


def _check_role(role: Role, st: object) -> str | None:
    if not isinstance(st, RoleState):
        return f"{role} state is not a RoleState ({type(st).__name__})"
    for name in ("ready", "draining", "recently_ready"):
        why = _check_count(f"{role}.{name}", getattr(st, name))
        if why:
            return why
    if not isinstance(st.warming, tuple) or len(st.warming) > MAX_INSTANCES:
        return f"{role}.warming is not a tuple of at most {MAX_INSTANCES} warm-ups"
    for w in st.warming:
        at = _real(getattr(w, "ready_at_seconds", None)) if isinstance(w, Warming) else None
        if at is None or not math.isfinite(at):
            return f"{role}.warming has a warm-up with no finite ready time ({w!r})"
    return None


def unusable(obs: Observation, max_age_seconds: float) -> str | None:
    """Why the planner cannot use ``obs`` (None: it can). Readings that are missing or stale
    are unknown, which the planner handles (unknown load: hold; unknown latency: nothing
    learned); a reading that is fresh but negative, not finite, implausibly large, or
    inconsistent with another, or a fleet count that is not a count, is unusable: the whole
    observation is then distrusted (one broken answer says the source may be broken)."""
    if not isinstance(obs, Observation):
        return f"observation is not an Observation ({type(obs).__name__})"
    now = _real(obs.now_seconds)
    if now is None or not math.isfinite(now):
        return f"now_seconds is not a finite time ({obs.now_seconds!r})"
    values: dict[str, float] = {}
    sources = [(f.name, getattr(obs, f.name)) for f in fields(Observation) if f.name in READING_BOUNDS]
    for role in Role:
        st = obs.role(role)
        why = _check_role(role, st)
        if why:
            return why
        sources += [(f"{role}.queue_depth", st.queue_depth), (f"{role}.running_requests", st.running_requests),
                    (f"{role}.running_requests_mean", st.running_requests_mean),
                    (f"{role}.decoding_requests", st.decoding_requests),
                    (f"{role}.decoding_requests_mean", st.decoding_requests_mean)]
    for name, r in sources:
        if r is None:
            continue
        if not isinstance(r, Reading):
            return f"{name} is not a Reading ({type(r).__name__})"
        at = _real(r.at_seconds)
        if at is None or not math.isfinite(at) or abs(now - at) > max_age_seconds:
            continue  # stale, future or undated: unknown, not unusable
        why = _check_value(name, r.value)
        if why:
            return why
        values[name] = _real(r.value) or 0.0
    return _inconsistent(values)


def _inconsistent(v: dict[str, float]) -> str | None:
    """Readings that cannot all be true together."""
    if v.get("rate_rps", 0.0) > 0:
        for name in ("mean_input_tokens", "mean_output_tokens"):
            if v.get(name) == 0.0:
                return f"{name} is zero with a positive rate ({v['rate_rps']:g} req/s)"
    return None


#: SGLang's default prompt-length buckets (``TokenizerMetricsCollector``,
#: python/sglang/srt/metrics/collector.py): what the simulated engines and the replay bucket
#: prompts into, so that the spread they read is as coarse as the one production reads
SGLANG_PROMPT_TOKENS_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
    12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000,
    200000, 300000, 400000, 600000, 800000, 1000000, 1100000,
)  # fmt: skip


def square_ratio_from_buckets(cumulative: Sequence[tuple[float, float]]) -> float | None:
    """Mean squared value over squared mean value of a Prometheus histogram, from its
    cumulative bucket counts ``(upper bound, count)`` (``+Inf`` included, in any order).

    Each bucket's observations are taken as spread evenly over it (mean: its midpoint; mean
    square: midpoint^2 + width^2 / 12); the first bucket starts at 0, and the ``+Inf`` bucket
    counts at its lower bound (the prompt buckets of SGLang reach 1.1M tokens, vLLM's the
    context length, so it is empty in practice). Both moments come from the same buckets,
    so the ratio does not depend on where in a bucket the mean falls. None when the
    histogram is empty or its counts are not cumulative (a broken or reset series)."""
    rows = sorted((float(b), float(c)) for b, c in cumulative)
    lo, previous = 0.0, 0.0
    total = first = second = 0.0
    for bound, count in rows:
        n = count - previous
        if n < -1e-9 or not math.isfinite(count):
            return None
        if n > 0:
            if math.isinf(bound):
                mid, var = lo, 0.0
            else:
                mid, var = (lo + bound) / 2.0, (bound - lo) ** 2 / 12.0
            total += n
            first += n * mid
            second += n * (mid * mid + var)
        previous, lo = max(count, previous), bound if math.isfinite(bound) else lo
    if total <= 0 or first <= 0:
        return None
    mean = first / total
    return max(1.0, (second / total) / (mean * mean))
