"""The planner holds, within the current bounds and saying why, on any reading it cannot use,
and ``step`` never raises: negative, non-finite, absurdly large or inconsistent readings, odd
fleet counts and odd history entries. A hold after a lowered max or budget is clamped to them.
The last test runs bench/planner_fuzz.py's seeded generator on 2,000 cases."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from planner_replay_helpers import bench_module

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.model import Calibration, Load, PerformanceModel
from pdscale.planner.observe import Observation, Reading, RoleState, Warming, unusable
from pdscale.planner.profile import load_profile
from pdscale.planner.solve import History, step

MODEL = PerformanceModel(load_profile())
NOW = 6000.0


def cfg(**kw: object) -> PlannerConfig:
    return PlannerConfig(model=MODEL, nodes=kw.pop("nodes", 64), horizon_intervals=5, **kw)  # type: ignore[arg-type]


def obs(p: int = 4, d: int = 4, **readings: float) -> Observation:
    base = {"rate_rps": 10.0, "mean_input_tokens": 4000.0, "mean_output_tokens": 300.0,
            "prefix_hit_rate": 0.3}
    values = {**base, **readings}
    return Observation(now_seconds=NOW, prefill=RoleState(ready=p), decode=RoleState(ready=d),
                       **{k: Reading(v, NOW - 5) for k, v in values.items()})


def held_history(p: int, d: int) -> History:
    return History().record(Load(10.0, 4000.0, 300.0, 0.3),
                            Decision(NOW - 60, p, d, 1.0, 0.03, 1.0, "", desired=(p, d)))


GARBAGE = [-1.0, -1e-9, 1e9, 1e300, math.nan, math.inf, -math.inf]
FIELDS = ["rate_rps", "peak_rate_rps", "mean_input_tokens", "mean_output_tokens",
          "streamed_output_tokens", "prefix_hit_rate", "ttft_p50_seconds", "ttft_at_percentile_seconds", "tpot_p50_seconds",
          "tpot_at_percentile_seconds"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", GARBAGE)
def test_a_garbage_reading_holds_and_says_which(field, value):
    if field == "prefix_hit_rate" and value == -1e-9:
        # within the slack of two counters scraped a moment apart: clamped to 0, not garbage
        dec, _ = step(obs(**{field: value}), config=cfg(), history=held_history(6, 5), now=NOW)
        assert not dec.held
        return
    dec, hist = step(obs(**{field: value}), config=cfg(), history=held_history(6, 5), now=NOW)
    assert dec.held and (dec.prefill, dec.decode) == (6, 5)
    assert dec.explanation.startswith(f"unusable reading: {field} ")
    # nothing learned, nothing remembered as a load
    assert hist.loads[-1] is None and hist.calibration is None


@pytest.mark.parametrize("value", GARBAGE)
def test_a_garbage_queue_reading_or_count_holds(value):
    o = obs()
    o = replace(o, decode=replace(o.decode, running_requests=Reading(value, NOW)))
    dec, _ = step(o, config=cfg(), history=History(), now=NOW)
    assert dec.held and "decode.running_requests" in dec.explanation


@pytest.mark.parametrize("state", [
    RoleState(ready=-1), RoleState(ready=10**9), RoleState(ready=2.5),  # type: ignore[arg-type]
    RoleState(ready=2, draining=-3), RoleState(ready=2, warming=(Warming(math.nan),)),
    RoleState(ready=2, warming=(Warming(math.inf),)),
])
def test_odd_fleet_counts_hold_within_bounds(state):
    dec, _ = step(replace(obs(), prefill=state), config=cfg(max_prefill=8), history=History(),
                  now=NOW)
    assert dec.held and "prefill." in dec.explanation
    assert 1 <= dec.prefill <= 8


def test_inconsistent_readings_hold():
    dec, _ = step(obs(mean_output_tokens=0.0), config=cfg(), history=History(), now=NOW)
    assert dec.held and "mean_output_tokens is zero with a positive rate" in dec.explanation
    # a zero length with a zero rate is an idle fleet, not a contradiction
    dec, _ = step(obs(rate_rps=0.0, mean_output_tokens=0.0), config=cfg(), history=History(), now=NOW)
    assert not dec.held


def test_stale_and_future_readings_are_unknown_not_unusable():
    o = obs()
    for at in (NOW - 1e4, NOW + 1e4, math.nan):
        stale = replace(o, rate_rps=Reading(-5.0, at))
        assert unusable(stale, 180.0) is None
        dec, _ = step(stale, config=cfg(), history=History(), now=NOW)
        assert dec.held and dec.explanation.startswith("load metrics unknown or stale")


def test_a_non_finite_clock_holds():
    dec, _ = step(replace(obs(), now_seconds=math.nan), config=cfg(), history=History(), now=NOW)
    assert dec.held and "now_seconds" in dec.explanation


def test_a_hold_after_a_lowered_max_or_budget_is_clamped_to_them():
    # previous decision 12P10D; the max and the budget were lowered since
    o = obs(rate_rps=math.nan)
    dec, _ = step(o, config=cfg(max_prefill=5), history=held_history(12, 10), now=NOW)
    assert dec.held and (dec.prefill, dec.decode) == (5, 10)
    assert "clamped to 5P10D by the prefill bounds [1, 5]" in dec.explanation
    dec, _ = step(o, config=cfg(nodes=11), history=held_history(12, 10), now=NOW)
    assert dec.held and dec.prefill + dec.decode == 11 and "node budget 11" in dec.explanation
    # in proportion to what each role has above its min
    assert (dec.prefill, dec.decode) == (6, 5)
    # a raised min likewise
    dec, _ = step(o, config=cfg(min_decode=12), history=held_history(12, 10), now=NOW)
    assert (dec.prefill, dec.decode) == (12, 12)


def test_a_planned_target_is_clamped_to_a_budget_lowered_under_the_fleet():
    # the MILP steps down one at a time (max_step_down); the target goes to the budget at
    # once, and the operator drains down to it
    dec, _ = step(obs(p=20, d=20), config=cfg(nodes=10, max_step_down=1), history=History(),
                  now=NOW)
    assert not dec.held and (dec.prefill, dec.decode) == (5, 5)
    assert "target 19P19D clamped to 5P5D by the node budget 10" in dec.explanation
    assert "scaled down through drains" in dec.explanation


def test_odd_history_entries_are_dropped_not_planned_on():
    hist = History(
        loads=(Load(math.nan, 4000.0, 300.0), Load(1e300, 1.0, 1.0), None,
               "x"),  # type: ignore[arg-type]
        decisions=(Decision(NOW - 60, -4, 10**9, 1.0, 0.03, 1.0, "", desired=(-4, 10**9)),),
        calibration=Calibration(prefill_headroom=math.nan),
    )
    dec, new = step(obs(), config=cfg(), history=hist, now=NOW)
    assert not dec.held and new.loads[:4] == (None, None, None, None)
    assert len(new.decisions) == 1 and new.decisions[0] is dec


def test_a_calibration_with_a_sample_count_no_planner_writes_is_forgotten():
    # the counts weigh the first samples (calibration._weight); a negative or fractional one
    # is an edited memory, and what it carries is not believed
    for count in (-3, 2.5):
        hist = replace(held_history(4, 4), calibration=Calibration(decode_factor=1.9,
                                                                   decode_samples=count))
        fresh = replace(hist, calibration=None)
        assert step(obs(), config=cfg(), history=hist, now=NOW)[1].calibration == \
            step(obs(), config=cfg(), history=fresh, now=NOW)[1].calibration


def test_a_calibration_with_a_raise_test_no_planner_writes_is_forgotten():
    # the busy floor's bounds, a test's counts and sums: an edited memory is not believed
    for edited in ({"prefill_busy_floor": 3.0}, {"prefill_busy_floor": 0.1},
                   {"raise_ready": 2.5}, {"since_ratio_sum": math.inf},
                   {"raise_from_headroom": 7.0}, {"since_busy": math.nan}):
        hist = replace(held_history(4, 4), calibration=Calibration(decode_factor=1.9, **edited))
        fresh = replace(hist, calibration=None)
        assert step(obs(), config=cfg(), history=hist, now=NOW)[1].calibration == \
            step(obs(), config=cfg(), history=fresh, now=NOW)[1].calibration, edited


def test_valid_histories_are_kept_as_they_are():
    hist = held_history(4, 4)
    _, new = step(obs(), config=cfg(), history=hist, now=NOW)
    assert new.loads[0] is hist.loads[0] and new.decisions[0] is hist.decisions[0]


# -- the fuzz --------------------------------------------------------------------------------
COUNT = 2000
SEED = 1


@pytest.mark.slow
def test_fuzz_no_exception_no_target_out_of_bounds_every_hold_says_why():
    fuzz = bench_module("planner_fuzz")
    outcomes = [fuzz.run_case(case) for case in fuzz.generate(COUNT, SEED)]
    summary = fuzz.summarise(outcomes, 0.0)
    assert summary["cases"] == COUNT
    assert summary["exceptions"] == 0, summary["examples"]
    assert summary["out_of_bounds"] == 0, summary["examples"]
    assert "no reason" not in summary["holds_by_reason"]
    # the generator reaches what it is for: holds of every kind, plans, and moved bounds
    assert summary["decisions"] > COUNT // 5 and summary["holds"] > COUNT // 5
    assert summary["bounds_moved_under_fleet"] > COUNT // 5
    for reason in ("not finite", "below N", "implausibly large", "not a whole count"):
        assert f"unusable reading: {reason}" in summary["holds_by_reason"]
