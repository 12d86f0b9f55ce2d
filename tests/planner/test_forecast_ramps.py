"""Forecast and scale-down on ramps, steps and steady load (issue 17 item 3)."""

from __future__ import annotations

import random

from pdscale.planner.forecast import bounded_trend, forecast, rise_margin, significant_slope


def noisy(xs: list[float], sd: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [x + rng.gauss(0.0, sd) for x in xs]


def test_trend_leads_a_ramp_by_a_bounded_amount() -> None:
    # three intervals into a ramp of +1 per interval: the forecast at a 10-interval lead is
    # well above the recent max (it leads), yet at most damping/(1-damping) = 4 slopes above
    ramp = [10.0] * 10 + [11.0, 12.0, 13.0]
    lead10 = forecast(ramp, 10, method="trend")
    flat = forecast(ramp, 10, method="recent-max")
    assert lead10 is not None and flat is not None
    assert lead10[-1] > flat[-1] + 2.0
    assert lead10[-1] <= 13.0 + 4.0 * 1.0 + 1e-9


def test_trend_stops_at_a_ramps_end() -> None:
    # the ramp ended two intervals ago: no extrapolation past it (no significant rise left in
    # the window), the forecast is the plateau
    series = [10.0] * 10 + [11.0, 12.0, 13.0, 14.0, 15.0, 15.0, 15.0, 15.0, 15.0]
    assert bounded_trend(series, 10) == [15.0] * 10


def test_trend_does_not_extrapolate_a_step_or_noise() -> None:
    step = [10.0] * 10 + [20.0, 20.0, 20.0]
    assert bounded_trend(step, 10) == [20.0] * 10  # a step is over once seen
    steady = noisy([12.0] * 60, 0.4, seed=1)
    # Poisson-like noise on a flat rate: the slope test keeps (almost) every window flat
    trending = sum(significant_slope(steady[k : k + 5]) > 0 for k in range(56))
    assert trending <= 6


def test_rise_margin_counts_one_step_once_with_independent_samples() -> None:
    # 30 flat intervals, then a 2x step held: overlapping origins see the step 10 times and
    # the margin goes to 2 for good; one warm-up apart, it is one sample of several
    series = [10.0] * 30 + [20.0] * 30
    overlapping = rise_margin(series, lead=10, window=5, min_samples=5, quantile=0.9)
    independent = rise_margin(series, lead=10, window=5, min_samples=4, quantile=0.9, stride=10)
    assert overlapping >= 1.9
    assert independent < overlapping
    # too few independent warm-ups: the prior
    assert rise_margin(series, lead=10, window=5, min_samples=10, stride=10, prior=1.1) == 1.1


def test_scale_down_keeps_what_the_last_warm_up_forecast_it_would_need() -> None:
    from pdscale.planner.config import PlannerConfig
    from pdscale.planner.decision import Decision
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.observe import Observation, Reading, RoleState
    from pdscale.planner.profile import load_profile
    from pdscale.planner.solve import History, plan

    model = PerformanceModel(load_profile())
    warmup_n = round(model.profile.warmup.new_node_seconds / 60.0)
    c = PlannerConfig(model=model, nodes=500, stabilization_window_seconds=0, forecast_method="last")
    ob = Observation(now_seconds=6000.0, rate_rps=Reading(5.0, 6000.0),
                     mean_input_tokens=Reading(8000.0, 6000.0), mean_output_tokens=Reading(300.0, 6000.0),
                     prefix_hit_rate=Reading(0.4, 6000.0), prefill=RoleState(ready=20),
                     decode=RoleState(ready=8))

    def history(age_intervals: int) -> History:
        # one decision that forecast 15P6D within a warm-up, then ones that forecast little
        old = Decision(0.0, 20, 8, 1, 0.03, 1, "", desired=(2, 1), lead_need=(15, 6))
        quiet = [Decision(0.0, 20, 8, 1, 0.03, 1, "", desired=(2, 1), lead_need=(2, 1))] * age_intervals
        return History(decisions=(old, *quiet))

    kept = plan(ob, config=c, history=history(warmup_n - 1), now=6000.0)
    assert (kept.prefill, kept.decode) == (15, 6)
    # a warm-up later the forecast has agreed for a whole warm-up: the nodes go
    gone = plan(ob, config=c, history=history(warmup_n), now=6000.0)
    assert gone.prefill < 15 and gone.decode < 6
    # without the hysteresis only the need now holds them
    off = plan(ob, config=replace_cfg(c), history=history(warmup_n - 1), now=6000.0)
    assert off.prefill < 15
    # every decision says what it forecast it would need within a warm-up
    assert kept.lead_need[0] >= kept.desired[0] and kept.lead_need[1] >= kept.desired[1]


def replace_cfg(c: object) -> object:
    from dataclasses import replace

    return replace(c, scale_down_hysteresis=False)  # type: ignore[type-var]


def test_lead_need_survives_the_operators_memory() -> None:
    """The operator keeps the planner's history as JSON: lead_need comes back a tuple the
    planner accepts, and a memory written before it existed reads as (0, 0)."""
    import json

    from pdscale.operator.loop.planning import history_from_json, history_to_json
    from pdscale.planner.decision import Decision
    from pdscale.planner.solve import History, _decision_ok

    d = Decision(0.0, 3, 2, 1.0, 0.03, 1.0, "", desired=(3, 2), lead_need=(5, 4))
    back, _ = history_from_json(history_to_json(History(decisions=(d,)), 0.0))
    assert back.decisions[0].lead_need == (5, 4) and _decision_ok(back.decisions[0])
    doc = json.loads(history_to_json(History(decisions=(d,)), 0.0))
    del doc["decisions"][0]["lead_need"]
    old, _ = history_from_json(json.dumps(doc))
    assert old.decisions[0].lead_need == (0, 0) and _decision_ok(old.decisions[0])
