"""The prompts' spread (``Load.input_tokens_square_ratio``): prefill's attention term grows with
the square of the prompt, so a long-tailed load computes more than its mean prompt would. The
model prices the mean compute from the spread, the engines' prompt histogram gives it, the
replay reads it as production does, and the saturated calibration no longer mistakes the
tail for a slow fleet."""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pdscale.planner.calibration import learn_compute, samples
from pdscale.planner.model import Calibration, Load, PerformanceModel, Slo
from pdscale.planner.observe import (
    SGLANG_PROMPT_TOKENS_BUCKETS,
    Observation,
    Reading,
    RoleState,
    square_ratio_from_buckets,
)
from pdscale.planner.profile import shipped_profile
from pdscale.planner.prometheus import to_square_ratio
from pdscale.planner.replay.fleet import Events, Fleet
from pdscale.planner.replay.interval_stats import IntervalStats
from pdscale.planner.replay.prefix_index import PrefixIndex
from pdscale.planner.replay.run import interval_loads
from pdscale.planner.replay.traces import read_mooncake, synthesize_from_rates
from pdscale.planner.solve import current_load
from pdscale.testbed.simengine.metrics import VLLM_PROMPT_TOKENS_BUCKETS

TRACES = Path("/work/shared/traces")
SLO = Slo(ttft_seconds=15.0, tpot_seconds=0.05, percentile=0.99)


def _prompts(seed: int = 5, n: int = 4000) -> np.ndarray:
    """Long-tailed prompt lengths: lognormal, mean about 8,000 tokens, CV about 1.3."""
    return np.random.default_rng(seed).lognormal(math.log(5000), 1.0, n).round()


def _load(prompts: np.ndarray, rate: float = 20.0, hit: float = 0.3) -> Load:
    mean = float(prompts.mean())
    return Load(rate, mean, 300.0, hit,
                input_tokens_square_ratio=float((prompts**2).mean()) / mean**2)


def _bucketed(prompts: np.ndarray, bounds: tuple[float, ...]) -> list[tuple[float, float]]:
    counts = [0] * (len(bounds) + 1)
    for n in prompts:
        counts[bisect.bisect_left(bounds, n)] += 1
    return list(zip((*bounds, math.inf), itertools.accumulate(counts), strict=True))


def test_the_mean_compute_of_long_tailed_prompts_is_priced_from_their_spread(
    model: PerformanceModel,
) -> None:
    prompts = _prompts()
    load = _load(prompts)
    each = [model.prefill_seconds(n, n * load.prefix_hit_rate) for n in prompts]
    # exact for the quadratic model, each prompt with the load's share cached
    assert model.prefill_service_seconds(load) == pytest.approx(float(np.mean(each)), rel=1e-9)
    # and well above the compute of the mean prompt, which is what a spread of 1 prices
    n = load.mean_input_tokens
    flat = Load(load.rate_rps, n, 300.0, load.prefix_hit_rate)
    assert model.prefill_service_seconds(flat) == model.prefill_seconds(n, n * load.prefix_hit_rate)
    assert model.prefill_service_seconds(load) > 1.15 * model.prefill_service_seconds(flat)
    assert model.prefill_request_capacity_rps(load) < model.prefill_request_capacity_rps(flat)
    assert model.instances_needed(load, SLO, ttft_queueing=True)[0] > \
        model.instances_needed(flat, SLO, ttft_queueing=True)[0]


def _trace_prompts() -> dict[str, np.ndarray]:
    with (TRACES / "mooncake" / "conversation_trace.jsonl").open() as f:
        mooncake = np.array([json.loads(line)["input_length"] for line in f], dtype=float)
    with (TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv").open() as f:
        azure = np.array([float(r["ContextTokens"]) for r in csv.DictReader(f)])
    return {"mooncake": mooncake, "azure": azure}


@pytest.mark.parametrize(("bounds", "tolerance"), [
    # SGLang's buckets are fine to 30k; Mooncake's 63 prompts above 100k sit in a 100k-200k
    # bucket, read at its middle: the spread reads 10% high there (on the safe side)
    (SGLANG_PROMPT_TOKENS_BUCKETS, (0.0, 0.12)),
    # vLLM's 1-2-5 buckets are coarse, and their errors partly cancel
    (VLLM_PROMPT_TOKENS_BUCKETS, (-0.05, 0.05)),
])
def test_the_engines_prompt_histograms_give_the_spread_of_real_traces(
    bounds: tuple[float, ...], tolerance: tuple[float, float],
) -> None:
    for name, prompts in _trace_prompts().items():
        exact = float((prompts**2).mean()) / float(prompts.mean()) ** 2
        read = square_ratio_from_buckets(_bucketed(prompts, bounds))
        assert read is not None
        assert tolerance[0] <= read / exact - 1.0 <= tolerance[1], (name, exact, read)


def test_an_empty_or_broken_histogram_gives_no_spread() -> None:
    assert square_ratio_from_buckets([]) is None
    assert square_ratio_from_buckets([(100.0, 0.0), (math.inf, 0.0)]) is None
    # cumulative counts that fall: a reset or a mixed-up answer, not a histogram
    assert square_ratio_from_buckets([(100.0, 5.0), (1000.0, 2.0), (math.inf, 5.0)]) is None
    # one bucket: every prompt read at its middle, spread by its width only
    one = square_ratio_from_buckets([(1000.0, 0.0), (2000.0, 4.0), (math.inf, 4.0)])
    assert one == pytest.approx((1500**2 + 1000**2 / 12) / 1500**2)


def test_the_reader_turns_a_bucket_vector_into_the_spread() -> None:
    def series(le: str, value: str, at: float = 100.0) -> dict[str, object]:
        return {"metric": {"le": le}, "value": [at, value]}

    # per second: 3 prompts up to 1,000 tokens, 2 between 1,000 and 4,000
    answer = [series("1000.0", "3"), series("+Inf", "5"), series("4000.0", "5")]
    reading, reason = to_square_ratio(answer, 100.0, 60.0)
    assert reason is None and reading is not None
    mean = (3 * 500 + 2 * 2500) / 5
    square = (3 * (500**2 + 1000**2 / 12) + 2 * (2500**2 + 3000**2 / 12)) / 5
    assert reading.value == pytest.approx(square / mean**2)
    assert to_square_ratio([series("x", "3")], 100.0)[1] == "malformed answer (bucket bound le='x')"
    assert to_square_ratio([series("10", "NaN")], 100.0)[0] is None
    stale, why = to_square_ratio([series("10", "3", at=0.0)], 100.0, 60.0)
    assert stale is None and why is not None and "stale" in why
    assert to_square_ratio([], 100.0) == (None, "no data")


def test_the_replay_reads_the_spread_through_the_same_buckets() -> None:
    prompts = _prompts(n=600)
    stats = IntervalStats(60.0, 0.99)
    fleet = Fleet(PrefixIndex(100), Events(), switch_seconds=30.0)
    stats.observe(0.0, fleet, 0, queued_prefill=0)  # the first call only starts the clock
    for k, n in enumerate(prompts):
        stats.arrival(k * 0.1)
        stats.prompt_finished(int(n), 0)
    obs = stats.observe(60.0, fleet, 0, queued_prefill=0)
    assert obs.input_tokens_square_ratio is not None
    expected = square_ratio_from_buckets(_bucketed(prompts, SGLANG_PROMPT_TOKENS_BUCKETS))
    assert obs.input_tokens_square_ratio.value == pytest.approx(expected)
    # counting restarts with the interval: no prompts, no spread
    assert stats.observe(120.0, fleet, 0, queued_prefill=0).input_tokens_square_ratio is None


def test_an_unknown_spread_keeps_the_last_one_known() -> None:
    r = lambda v: Reading(v, 60.0)  # noqa: E731
    obs = Observation(now_seconds=60.0, rate_rps=r(10.0), mean_input_tokens=r(8000.0),
                      mean_output_tokens=r(300.0), input_tokens_square_ratio=r(2.5))
    assert current_load(obs, 120.0).input_tokens_square_ratio == 2.5
    blind = Observation(now_seconds=60.0, rate_rps=r(10.0), mean_input_tokens=r(8000.0),
                        mean_output_tokens=r(300.0))
    last = Load(10.0, 8000.0, 300.0, input_tokens_square_ratio=2.2)
    assert current_load(blind, 120.0, last_known=last).input_tokens_square_ratio == 2.2
    assert current_load(blind, 120.0).input_tokens_square_ratio == 1.0


def test_a_saturated_prefill_of_long_tailed_prompts_learns_its_speed_not_its_tail(
    model: PerformanceModel,
) -> None:
    """A fleet 25% slower than its profile, busy with long-tailed prompts: it completes ready /
    (mean compute / 0.8) requests per second. Priced at the mean prompt's compute it would
    read about 1.45x slow on these prompts; priced at their mean compute, 1.25x."""
    prompts = _prompts()
    load = _load(prompts)
    truth = float(np.mean([model.prefill_seconds(n, n * load.prefix_hit_rate) for n in prompts]))
    ready, speed = 5, 0.8
    grows = load.rate_rps - ready / (truth / speed)
    assert grows > 0
    cal, previous = Calibration(), None
    for k in range(10):
        t = 60.0 * (k + 1)
        r = lambda v, t=t: Reading(v, t)  # noqa: E731
        obs = Observation(
            now_seconds=t, rate_rps=r(load.rate_rps), mean_input_tokens=r(load.mean_input_tokens),
            mean_output_tokens=r(300.0), prefix_hit_rate=r(load.prefix_hit_rate),
            input_tokens_square_ratio=r(load.input_tokens_square_ratio),
            prefill=RoleState(ready=ready, queue_depth=r(400.0 + grows * t)),
        )
        s = samples(obs, load, previous, slo=SLO, model=model, max_age_seconds=180.0)
        cal, previous = learn_compute(cal, s), obs.prefill.queue_depth
    assert cal.prefill_factor == pytest.approx(1.25, rel=0.06)


def test_the_oracle_knows_each_intervals_true_spread() -> None:
    """The hindsight bounds size from the true load, spread included (their calibration,
    fed by the observed spread, would otherwise run against a load priced flat)."""
    donor = read_mooncake(TRACES / "mooncake" / "conversation_trace.jsonl")
    trace = synthesize_from_rates([(0.0, 5.0), (300.0, 0.0)], donor, seed=1)
    loads = interval_loads(trace, 60.0)
    prompts = np.asarray(trace.input_tokens, dtype=float)
    first = prompts[np.asarray(trace.arrival_seconds) - trace.arrival_seconds[0] < 60.0]
    assert loads[0].input_tokens_square_ratio == pytest.approx(
        float((first**2).mean()) / float(first.mean()) ** 2)
    assert all(ld.input_tokens_square_ratio > 1.5 for ld in loads)  # long-tailed, as the donor


def test_the_ttft_model_takes_the_compute_spread_from_the_measured_prompts(
    model: PerformanceModel,
) -> None:
    """Prefill's TTFT queueing model waits longer for a more variable compute. Its coefficient
    of variation comes from the prompts' measured spread through the compute's elasticity (the
    delta method): exact where the compute is linear in the prompt, first order under the
    attention term. The configured prior stands where no spread was read, and caps it."""
    rng = np.random.default_rng(5)

    def cv(m: PerformanceModel, prompts: np.ndarray, hit: float) -> tuple[float, float]:
        load = _load(prompts, hit=hit)
        each = np.array([m.prefill_seconds(n, n * hit) for n in prompts])
        return m.prefill_service_cv(load, prior=9.9), float(each.std() / each.mean())

    demo = PerformanceModel(shipped_profile("demo-sim"))
    # the demo's long documents: 600-token prompts, uniform within +-50%, a linear compute
    read, exact = cv(demo, rng.uniform(300, 900, 4000).round(), 0.2)
    assert read == pytest.approx(exact, rel=0.02)
    assert read < 0.35
    # moderate spread on the 8xH200 profile's quadratic compute
    read, exact = cv(model, rng.lognormal(math.log(5000), 0.5, 4000).round(), 0.3)
    assert read == pytest.approx(exact, rel=0.1)
    # a long tail under the attention term reads low (first order): 1.42 where it is 2.14
    read, exact = cv(model, _prompts(), 0.3)
    assert 1.4 < read < exact
    # nothing read: the prior; and the prior caps what is read (the tail above reads 1.42)
    assert model.prefill_service_cv(Load(1.0, 8000.0, 300.0, 0.3), prior=1.5) == 1.5
    assert model.prefill_service_cv(_load(_prompts(), hit=0.3), prior=1.2) == 1.2
    # the demo's prefill for long documents behind a random router: the prior's CV of 1.5
    # asked 9 instances where 5 met the TTFT target for 92% of them (a fixed fleet replayed
    # on a demo recording; 8 met 90.5%: the rest are prompts too long for 5 s on any fleet)
    slo = Slo(ttft_seconds=5.0, tpot_seconds=0.05, percentile=0.9)
    long_docs = _load(rng.uniform(300, 900, 4000).round(), rate=1.0, hit=0.2)
    sized = demo.instances_needed(long_docs, slo, ttft_queueing=True, service_cv=1.5, pooled_prefill=False)
    assert sized[0] == 5
    assert demo.prefill_instances_for_ttft(long_docs, slo, service_cv=1.5, pooled=False) == 9
