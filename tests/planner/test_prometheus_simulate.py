"""Replay from Prometheus, simulated: a trace rebuilt from per-interval aggregates reproduces
them (rate, mean lengths, prefix hit rate), the same seed gives the same trace, a recording
that cannot be rebuilt is refused naming what is missing, and ``pdscale replay --prometheus
--simulate`` over a fake Prometheus reports the spec and a tighter what-if side by side."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_prometheus_replay import ROOT

from pdscale.main import main
from pdscale.planner import prometheus
from pdscale.planner.observe import Reading
from pdscale.planner.prometheus import MetricsSnapshot, render_queries
from pdscale.planner.recording.from_prometheus import aggregates_from
from pdscale.planner.replay.ensemble import mean_decided_instances
from pdscale.planner.replay.reconstruct import IntervalAggregate, trace_from_aggregates
from pdscale.planner.replay.traces import TraceError, donor_prefix_hits

#: three phases of a minute each, repeated: rate, mean prompt, mean output, hit rate
PHASES = [(2.0, 600.0, 300.0, 0.3), (5.0, 2000.0, 100.0, 0.6), (1.0, 300.0, 800.0, 0.0)]


def _recording(n: int = 60, seconds: float = 60.0) -> list[IntervalAggregate]:
    return [IntervalAggregate(k * seconds, seconds, *PHASES[k % 3]) for k in range(n)]


def test_a_long_rebuilt_trace_reproduces_the_recorded_rates_lengths_and_hit_rates():
    trace = trace_from_aggregates(_recording(), seed=3, length_sigma=1.0)
    a = np.asarray(trace.arrival_seconds)
    phase = (a // 60).astype(int) % 3
    ins, outs = np.asarray(trace.input_tokens), np.asarray(trace.output_tokens)
    hits = np.asarray(donor_prefix_hits(trace))
    for j, (rate, isl, osl, hit) in enumerate(PHASES):
        m = phase == j
        expected = rate * 20 * 60  # Poisson: within three standard deviations
        assert m.sum() == pytest.approx(expected, abs=3 * expected ** 0.5)
        # a lognormal of spread 1: the sample mean's standard error is mean x 1.31 / sqrt(n)
        se = 1.31 / m.sum() ** 0.5
        assert ins[m].mean() == pytest.approx(isl, rel=4 * se)
        assert outs[m].mean() == pytest.approx(osl, rel=4 * se)
        # cached tokens as the engine counts them, over an unbounded cache
        cached = np.minimum(hits[m] * trace.block_tokens, ins[m] - 1).sum()
        assert cached / ins[m].sum() == pytest.approx(hit, abs=0.01)
    # lognormal: the spread assumed shows in the tail (sigma 1: p99 about 6x the mean)
    assert np.percentile(outs[phase == 0], 99) > 3 * 300


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    one = trace_from_aggregates(_recording(6), seed=7, length_sigma=0.5)
    again = trace_from_aggregates(_recording(6), seed=7, length_sigma=0.5)
    other = trace_from_aggregates(_recording(6), seed=8, length_sigma=0.5)
    assert one == again
    assert one.arrival_seconds != other.arrival_seconds


def test_a_recorded_prompt_spread_shapes_the_prompts_and_leaves_the_outputs_to_the_sigma():
    spread = [IntervalAggregate(k * 60.0, 60.0, 20.0, 8000.0, 300.0, 0.0,
                                input_tokens_square_ratio=2.7) for k in range(10)]
    trace = trace_from_aggregates(spread, seed=4, length_sigma=0.0)
    ins = np.asarray(trace.input_tokens, dtype=float)
    assert ins.mean() == pytest.approx(8000, rel=0.1)
    # the square ratio's sample estimate is heavy-tailed itself: a loose band around 2.7
    assert 2.0 < (ins**2).mean() / ins.mean() ** 2 < 3.5
    assert set(trace.output_tokens) == {300}  # the sigma's, 0 here
    flat = trace_from_aggregates([IntervalAggregate(0.0, 60.0, 20.0, 8000.0, 300.0, 0.0, 1.0)],
                                 seed=4, length_sigma=1.0)
    assert set(flat.input_tokens) == {8000}  # a recorded spread of 1: every prompt the mean
    with pytest.raises(TraceError, match="input_tokens_square_ratio must be >= 1"):
        trace_from_aggregates([IntervalAggregate(0.0, 60.0, 1.0, 600.0, 300.0, 0.3, 0.5)])


def test_a_spread_of_zero_gives_every_request_the_mean():
    trace = trace_from_aggregates(_recording(3), seed=1, length_sigma=0.0)
    assert set(trace.output_tokens) == {300, 100, 800}


@pytest.mark.parametrize(("recording", "message"), [
    ([], "no intervals recorded"),
    ([IntervalAggregate(0.0, 10.0, float("nan"), 600.0, 300.0, 0.3)], "rate_rps is missing"),
    ([IntervalAggregate(0.0, 10.0, 1.0, 0.0, 300.0, 0.3)], "mean_input_tokens and mean_output"),
    ([IntervalAggregate(0.0, 10.0, 1.0, 600.0, 300.0, 1.5)], "prefix_hit_rate must be in"),
    ([IntervalAggregate(0.0, 10.0, 1.0, 600.0, 300.0, 0.3),
      IntervalAggregate(5.0, 10.0, 1.0, 600.0, 300.0, 0.3)], "interval 1 .* before the previous"),
])
def test_a_recording_that_cannot_be_rebuilt_is_refused_naming_what_is_wrong(recording, message):
    with pytest.raises(TraceError, match=message):
        trace_from_aggregates(recording)


def _snap(t: float, **values: float | None) -> MetricsSnapshot:
    return MetricsSnapshot({k: None if v is None else Reading(v, t) for k, v in values.items()})


def test_readings_become_intervals_with_each_gap_filled_and_named():
    full = {"rate_rps": 1.0, "mean_input_tokens": 600.0, "mean_output_tokens": 300.0,
            "prefix_hit_rate": 0.3}
    snaps = [_snap(10, **{**full, "rate_rps": None}),  # before the first scrape: left out
             _snap(20, **full),
             _snap(30, **{**full, "mean_input_tokens": 900.0}),
             _snap(40, **{**full, "mean_input_tokens": None}),  # a gap: the previous value
             _snap(50, rate_rps=0.0, mean_input_tokens=None, mean_output_tokens=None,
                   prefix_hit_rate=None)]  # no traffic: no mean needed, none missing
    aggregates, caveats = aggregates_from(snaps, [10, 20, 30, 40, 50], 10.0)
    assert [a.start_seconds for a in aggregates] == [10, 20, 30, 40]
    assert [a.mean_input_tokens for a in aggregates] == [600.0, 900.0, 900.0, 0.0]
    assert any("1 interval(s) at the range's ends" in c for c in caveats)
    assert any("mean_input_tokens unknown in 1 of 3" in c for c in caveats)
    with pytest.raises(TraceError, match="mean_output_tokens: unknown in every interval"):
        aggregates_from([_snap(10, **{**full, "mean_output_tokens": None})], [10], 10.0)
    with pytest.raises(TraceError, match="rate_rps: unknown at every time"):
        aggregates_from([_snap(10, **{**full, "rate_rps": None})], [10], 10.0)


def test_mean_decided_instances_weighs_each_count_by_how_long_it_stood():
    assert mean_decided_instances([0.0, 10.0], [(1, 2), (2, 3)], 30.0) == pytest.approx(
        (3 * 10 + 5 * 30) / 40)
    assert mean_decided_instances([], [], 10.0) is None


class _FakePrometheus:
    """The planner's queries for ``ns/demo`` answered from a load that doubles halfway, at any
    window; the operator's own gauges have no samples (no live decisions recorded)."""

    T0 = 1_764_640_000.0

    def __init__(self) -> None:
        self.names = {}
        for window in (10, 600, 601):
            for name, q in render_queries("sglang", namespace="ns", pdcluster="demo",
                                          window_seconds=window, percentile=0.9).items():
                self.names[self._key(q)] = name

    @staticmethod
    def _key(query: str) -> str:
        return re.sub(r"\[\d+s\]", "[w]", query)

    def custom_query(self, query, params=None):
        name = self.names.get(self._key(query))
        t = float((params or {})["time"])
        if name is None:
            return []  # the operator's gauges: not scraped here
        rate = 0.2 if t - self.T0 <= 300 else 0.4
        value = {"rate_rps": rate, "mean_input_tokens": 600.0, "mean_output_tokens": 300.0,
                 "prefix_hit_rate": 0.3, "ttft_at_percentile_seconds": 1.5,
                 "tpot_at_percentile_seconds": 0.03}.get(name, 0.0)
        return [{"metric": {}, "value": [t, repr(value)]}]


@pytest.mark.slow  # 20-50 s on two busy cores: out of make test-fast
def test_the_command_simulates_the_spec_and_a_tighter_what_if_side_by_side(monkeypatch, capsys,
                                                                          tmp_path):
    fake = _FakePrometheus()
    monkeypatch.setattr(prometheus, "prometheus_client", lambda url, timeout_seconds=10.0, **_: fake)
    monkeypatch.setenv("COLUMNS", "200")  # the table's headers on one line
    out = tmp_path / "sim.json"
    start, end = fake.T0, fake.T0 + 600
    code = main(["replay", "--prometheus", "http://fake", "--pdcluster", "ns/demo",
                 "--start", f"{start:.0f}", "--end", f"{end:.0f}",
                 "-f", str(ROOT / "examples" / "demo-sim.yaml"), "--slo-ttft", "1",
                 "--simulate", "--simulate-seeds", "2", "--length-sigmas", "0.5,1",
                 "--json", str(out)])
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert code == 0, err
    assert "simulated on 60 rebuilt intervals of 10 s: mean (min to max) over 4 traces" in " ".join(
        captured.out.split())
    assert "no conversation structure beyond the prefix hit rate" in err
    assert "simulate what-if: trace 4 of 4" in err
    report = json.loads(out.read_text())["simulate"]
    assert [(m["seed"], m["length_sigma"]) for m in report["spec"]["members"]] == [
        (0, 0.5), (0, 1.0), (1, 0.5), (1, 1.0)]
    assert report["live"]["ttft_at_percentile"] == 1.5
    assert report["live"]["mean_instances"] is None  # no live decisions recorded
    base, tight = report["spec"]["spread"], report["what-if"]["spread"]
    assert tight["mean_instances"]["mean"] > base["mean_instances"]["mean"]
    # on every rebuilt trace, not only on average
    assert report["what-if"]["minus_base"]["mean_instances"]["min"] > 0
    assert "what-if - spec, same traces" in captured.out
    assert 0 < base["gpu_hours"]["min"] <= base["gpu_hours"]["max"]
    assert base["prefix_hit_rate"]["max"] <= 0.31


def test_simulate_needs_a_range_from_prometheus(capsys):
    assert main(["replay", "--trace", "x.jsonl", "--policy", "pdscale", "--simulate"]) == 2
    assert "--simulate replays a range read with --prometheus" in capsys.readouterr().err
