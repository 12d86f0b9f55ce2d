"""A fleet that is not what the planner's profile says: the replay keeps the two apart
(``ReplaySetup.fleet_model``, ``pdscale replay --fleet-speed``), and the planner's calibration
makes a fleet faster than its profile cheaper than it was without it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from planner_replay_helpers import replay_setup

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import ProfileError, scaled_profile
from pdscale.planner.replay.run import run_policy
from pdscale.planner.replay.traces import Trace, read_mooncake, synthesize_from_rates
from pdscale.replay import ConfigurationError, fleet_model, parse_fleet_speed

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")


@pytest.fixture(scope="module")
def steady_trace() -> Trace:
    # 40 minutes at a constant 10 req/s: long enough for a warm-up (10 min) and a few
    # intervals of learning after it
    return synthesize_from_rates([(0.0, 10.0), (2400.0, 0.0)], read_mooncake(MOONCAKE), seed=5)


def test_fleet_speed_reads_both_roles_or_each() -> None:
    assert parse_fleet_speed("0.8") == (0.8, 0.8)
    assert parse_fleet_speed("decode=1.25") == (1.0, 1.25)
    assert parse_fleet_speed("prefill=0.8,decode=1.25") == (0.8, 1.25)
    for bad in ("fast", "gpu=2", "0", "prefill=-1"):
        with pytest.raises(ConfigurationError, match="--fleet-speed"):
            parse_fleet_speed(bad)


def test_a_scaled_profile_takes_speed_times_less_compute(model: PerformanceModel) -> None:
    fast = PerformanceModel(scaled_profile(model.profile, prefill_speed=1.25, decode_speed=0.8))
    assert fast.prefill_seconds(8000, 2000) == pytest.approx(model.prefill_seconds(8000, 2000) / 1.25)
    assert fast.tpot_seconds(64, 3000) == pytest.approx(model.tpot_seconds(64, 3000) / 0.8)
    # capacities and warm-ups are the hardware's, not its speed
    assert fast.profile.decode.kv_capacity_tokens == model.profile.decode.kv_capacity_tokens
    assert fast.profile.warmup == model.profile.warmup
    with pytest.raises(ProfileError):
        scaled_profile(model.profile, prefill_speed=0.0)


def test_the_fleet_runs_its_own_model_and_the_planner_its_belief(steady_trace: Trace) -> None:
    setup = replay_setup(steady_trace, ttft_seconds=15.0)
    assert fleet_model(setup.planner) is None  # no flag: the fleet is the planner's belief
    slow = fleet_model(setup.planner, speed="prefill=0.5")
    assert slow is not None
    wrong = replace(setup, fleet_model=slow)
    assert wrong.model is setup.planner.model and wrong.fleet is slow
    same_fleet = run_policy(setup, "static:6P6D")
    slow_fleet = run_policy(wrong, "static:6P6D")
    # the same fixed fleet, twice as slow at prefill: later first tokens
    assert slow_fleet["ttft_p50"] > 1.5 * same_fleet["ttft_p50"]
    assert slow_fleet["fleet_profile"] != slow_fleet["planner_profile"] == same_fleet["fleet_profile"]


@pytest.mark.slow  # 20-50 s on two busy cores: out of make test-fast
def test_a_fleet_faster_than_its_profile_costs_fewer_gpu_hours_with_calibration(
        steady_trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same replay with the compute factors' learning switched off is what the planner
    did before: it sized for the profile and kept the fleet it did not need. With it, the
    fleet costs about what the planner that knows the fleet spends, and meets what it meets."""
    import pdscale.planner.solve as solve

    setup = replay_setup(steady_trace, ttft_seconds=15.0)
    truth = fleet_model(setup.planner, speed="1.25")
    fast = replace(setup, fleet_model=truth)
    learned = run_policy(fast, "pdscale")
    knows = run_policy(replace(fast, planner=replace(setup.planner, model=truth)), "pdscale")
    monkeypatch.setattr(solve, "learn_compute", lambda cal, _samples: cal)
    before = run_policy(fast, "pdscale")
    figures = (learned["gpu_hours"], knows["gpu_hours"], before["gpu_hours"],
               learned["slo_attainment"], knows["slo_attainment"])
    # (the prefill's GPU busy time learns its speed both ways: 15% cheaper here; learned from
    # its forward time, only ever a ceiling, it was 1.5%)
    assert learned["gpu_hours"] < 0.9 * before["gpu_hours"], figures
    assert learned["gpu_hours"] < 1.15 * knows["gpu_hours"], figures
    # cheaper, not by missing more than the planner that knows the fleet (within half a point)
    assert learned["slo_attainment"] >= knows["slo_attainment"] - 0.005, figures
    # and the decisions say what was learned
    assert any("fleet speed vs profile" in e["why"] for e in learned["explanations"])
