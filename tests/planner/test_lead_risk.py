"""Capacity priced against the risk of the lead, and ramps ordered for where they will be
(issue 48, items 1 and 2)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from pdscale.planner.config import PlannerConfig, decode_quantile
from pdscale.planner.decision import Decision
from pdscale.planner.forecast import forecast, lead_ratios, ramp_projection
from pdscale.planner.model import Load, PerformanceModel, Slo
from pdscale.planner.needs import instances_needed
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import load_profile
from pdscale.planner.solve import History, lead_intervals, plan

MODEL = PerformanceModel(load_profile())
SLO = Slo(ttft_seconds=2.0, tpot_seconds=0.05)


def _obs(rate: float, p: int, d: int, now: float) -> Observation:
    return Observation(
        now_seconds=now, rate_rps=Reading(rate, now), mean_input_tokens=Reading(2000.0, now),
        mean_output_tokens=Reading(30.0, now), prefix_hit_rate=Reading(0.0, now),
        prefill=RoleState(ready=p), decode=RoleState(ready=d),
    )


def _history(rates: list[float], p: int = 4, d: int = 2) -> History:
    h = History()
    for k, r in enumerate(rates):
        h = h.record(Load(r, 2000.0, 30.0, 0.0), Decision(k * 60.0, p, d, 1.0, 0.03, 1.0, "", desired=(p, d)))
    return h


def _cfg(**kw: object) -> PlannerConfig:
    return PlannerConfig(model=MODEL, slo=SLO, nodes=500, interval_seconds=60.0, **kw)  # type: ignore[arg-type]


def test_the_lead_is_the_warm_up_plus_the_interval_it_is_ordered_in() -> None:
    warm = MODEL.profile.warmup.new_node_seconds
    assert lead_intervals(_cfg()) == math.ceil(warm / 60.0) + 1


def test_a_ramp_is_carried_to_the_lead_not_damped_after_four_intervals() -> None:
    # five intervals into a ramp of +8 req/s per interval: ordered for where it is 11
    # intervals on (the old damped trend stopped at 4 slopes: 140 + 8 * 3.6 = 169)
    ramp = [100.0] * 10 + [108.0, 116.0, 124.0, 132.0, 140.0]
    ahead = forecast(ramp, 15, method="trend", lead=11, cap=2.0)
    assert ahead is not None
    assert ahead[10] == ramp_projection(ramp, 15, lead=11, cap=2.0)[10] == 140.0 + 8.0 * 11
    assert ahead[-1] == ahead[10]  # held after the lead
    # bounded by the rises the load has shown over a lead
    assert max(ramp_projection(ramp, 15, lead=11, cap=1.2)) == 140.0 * 1.2
    # a step or a flat load is not a ramp
    assert ramp_projection([100.0] * 10 + [170.0] * 3, 15, lead=11, cap=2.0) == [170.0] * 15


def test_lead_ratios_are_the_load_changes_over_the_lead() -> None:
    xs = [10.0] * 5 + [20.0] * 5
    ratios = lead_ratios(xs, lead=2, window=1)
    # origins 0..7: load(t + 2) / load(t)
    assert list(ratios) == [1.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0]
    assert len(lead_ratios(xs, lead=2, window=1, stride=2)) == 4


def _rise_plan(history_rates: list[float], now_rate: float, quantile: float = 0.9) -> Decision:
    c = _cfg(rise_quantile=quantile, decode_rise_quantile=decode_quantile(quantile))
    h = _history(history_rates)
    return plan(_obs(now_rate, 12, 3, now=len(history_rates) * 60.0), config=c, history=h,
                now=len(history_rates) * 60.0)


def _prefill_for(rate: float) -> int:
    return instances_needed(_cfg(), Load(rate, 2000.0, 30.0, 0.0))[0]


def _ramps(cycles: int) -> list[float]:
    """Past days of ramps: 20 flat intervals, +8 req/s an interval for 10, 10 at the top."""
    one = [100.0] * 20 + [100.0 + 8.0 * k for k in range(1, 11)] + [180.0] * 10
    return one * cycles


def test_a_rise_under_way_is_ordered_for_where_it_will_be_a_lead_ahead() -> None:
    # a history of ramps like this one teaches how far a rise goes over a lead; four
    # intervals into a new one, the order covers the load a lead ahead (bounded by that
    # quantile), where the damped trend covered the recent max plus at most four slopes
    past = _ramps(8)
    lead = lead_intervals(_cfg())
    ratios = lead_ratios([*past, 100.0], lead=lead, window=5, stride=lead)
    bound = float(np.quantile(ratios, 0.9))
    assert bound > 1.3
    d = _rise_plan([*past, *([100.0] * 20), 108.0, 116.0, 124.0, 132.0], 140.0)
    lead_rate = min(140.0 + 8.0 * lead, 140.0 * bound)
    damped = 140.0 + 8.0 * 4
    assert _prefill_for(lead_rate) > _prefill_for(damped)
    assert max(p for p, _ in d.plan) >= _prefill_for(lead_rate)
    assert "a lead (11 intervals: warm-up + one) ahead" in d.explanation
    assert "p90 of 30 past leads" in d.explanation


def test_the_explanation_says_a_ramp_was_carried_to_the_lead() -> None:
    from pdscale.planner.explain import _risk_clauses
    from pdscale.planner.forecast import LeadRisk

    carried = LeadRisk(quantile=0.9, lead=11, samples=30, learned=True, bound=1.4, margin=1.1,
                       carried=True, base_rps=140.0, at_lead_rps=196.0)
    (text,) = _risk_clauses((carried, LeadRisk(quantile=0.95, lead=11)))
    assert text == ("prefill sized for 196.0 req/s a lead (11 intervals: warm-up + one) ahead, "
                    "recent max 140.0 (rising: the ramp carried to the lead, at most x1.40; p90 "
                    "of 30 past leads)")


def test_until_the_risk_is_learned_a_ramp_is_extrapolated_damped() -> None:
    # 14 intervals of history hold no lead to learn from: the damped trend with the prior's
    # margin, not a 2x guess (issue 48's nine-minute rise is over before capacity ordered for
    # it serves)
    d = _rise_plan([100.0] * 10 + [108.0, 116.0, 124.0, 132.0], 140.0)
    assert max(p for p, _ in d.plan) <= _prefill_for((140.0 + 8.0 * 4) * _cfg().rise_prior)
    assert "too few to learn the risk from" in d.explanation


def test_until_the_risk_is_learned_a_flat_load_is_held_with_the_prior_margin() -> None:
    # a fresh install (no history of rises in Prometheus) holds the prior's headroom over the
    # lead: issue 48's surge, which no causal planner sees coming, met 99.09% with it
    # (static:best's attainment) and 96.43% without
    flat, now = [100.0] * 14, 14 * 60.0

    def most_prefill(c: PlannerConfig) -> int:
        d = plan(_obs(100.0, 4, 2, now=now), config=c, history=_history(flat), now=now)
        return max(p for p, _ in d.plan)

    prior = _cfg().rise_prior
    assert prior > 1.0
    assert most_prefill(_cfg()) == _prefill_for(100.0 * prior) > _prefill_for(100.0)
    assert most_prefill(_cfg(rise_prior=1.0)) == _prefill_for(100.0)
    explained = plan(_obs(100.0, 4, 2, now=now), config=_cfg(), history=_history(flat), now=now)
    assert "held for a rise not yet learned (the prior)" in explained.explanation


def test_a_learned_quantile_bounds_how_far_a_ramp_is_carried() -> None:
    # a long history of mild swings (+-5% over a lead) teaches the bound; a new ramp is carried
    # no further than its quantile, not to the 2x prior
    rng = np.random.default_rng(0)
    mild = list(100.0 * (1.0 + 0.05 * rng.uniform(-1, 1, 200)))
    d = _rise_plan([*mild, 108.0, 116.0, 124.0, 132.0], 140.0)
    assert "p90 of 18 past leads" in d.explanation
    assert max(p for p, _ in d.plan) < _prefill_for(140.0 + 8.0 * 11)


def test_the_risk_quantile_is_a_trade_higher_never_buys_less() -> None:
    rng = np.random.default_rng(1)
    saw = list(100.0 * np.exp(0.25 * rng.standard_normal(300)))
    counts = [max(p for p, _ in _rise_plan(saw, 100.0, q).plan) for q in (0.0, 0.5, 0.9, 0.99)]
    assert counts == sorted(counts)
    assert counts[-1] > counts[0]


def test_decode_covers_half_the_risk() -> None:
    assert decode_quantile(0.9) == 0.95
    assert decode_quantile(0.8) == 0.9
    assert decode_quantile(0.0) == 0.0


def test_dominated_needs_both_less_attainment_and_more_gpu_hours() -> None:
    from pdscale.planner.replay.run import dominated

    best = {"slo_attainment": 0.9909, "gpu_hours": 106.9}
    # issue 48's surge row: 2.66 points behind on 20% more GPU-hours
    assert dominated({"slo_attainment": 0.9643, "gpu_hours": 128.8}, best)
    assert not dominated({"slo_attainment": 0.9643, "gpu_hours": 108.9}, best)  # within 2%
    assert not dominated({"slo_attainment": 0.9860, "gpu_hours": 200.0}, best)  # within 0.5 pp


def test_the_sweep_flag_reads_percentiles() -> None:
    import argparse

    import pytest

    from pdscale.replay import _percentiles

    assert _percentiles("0,75,90") == (0, 75, 90)
    with pytest.raises(argparse.ArgumentTypeError, match=r"\[0, 99\]"):
        _percentiles("100")


def test_rates_remembered_before_the_loads_teach_the_risk_from_the_first_plan() -> None:
    # a fresh install seeded with its service's last day from Prometheus (History.earlier_rates:
    # rates only, no lengths) prices the lead with what that day's rises were, not the prior;
    # each day ends with ten flat minutes, so that the recent max is 100 req/s in every plan
    rng = np.random.default_rng(0)
    calm = (*(float(x) for x in 100.0 * (1.0 - 0.05 * rng.uniform(0, 1, 300))), *[100.0] * 10)
    steps = (*([100.0] * 15 + [140.0] * 15) * 10, *[100.0] * 10)  # +40% within a lead, often
    flat, now = [100.0] * 3, 3 * 60.0

    def seeded(day: tuple[float, ...]) -> Decision:
        history = replace(_history(flat), earlier_rates=day)
        return plan(_obs(100.0, 4, 2, now=now), config=_cfg(), history=history, now=now)

    fresh = plan(_obs(100.0, 4, 2, now=now), config=_cfg(), history=_history(flat), now=now)
    assert "(the prior)" in fresh.explanation
    most = {name: max(p for p, _ in d.plan) for name, d in
            (("fresh", fresh), ("calm", seeded(calm)), ("steps", seeded(steps)))}
    # a day that never rose over a lead gives the prior's headroom back; one that rose 40%
    # holds more than it
    assert most["calm"] < most["fresh"] == _prefill_for(100.0 * _cfg().rise_prior)
    assert most["steps"] > most["fresh"]
    assert "p90 of" in seeded(steps).explanation
