"""Seasonality from history: the daily profile of earlier days, and the forecast with it.

What a user would notice: with less than one earlier whole day the planner decides exactly as
without seasonality; with earlier days it orders capacity for a rise that comes every day
before the rise shows in the last minutes; a quiet holiday, a missing day or gaps in the data
do not bend the profile; the memory stays bounded however long the planner runs."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from pdscale.operator.loop.planning import history_from_json, history_to_json
from pdscale.planner.config import PlannerConfig, build_config
from pdscale.planner.history import History
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import load_profile
from pdscale.planner.seasonal import MAX_DAYS, SeasonalMemory
from pdscale.planner.solve import step

DAY = 86400.0
DT = 60.0


def _shape(t: float) -> float:
    """A working day: 20 req/s until 08:00, 40 from 08:30 (a ramp between), 20 after 18:00."""
    h = (t % DAY) / 3600.0
    if h < 8 or h >= 18:
        return 20.0
    return 20.0 + 20.0 * min(1.0, 2.0 * (h - 8.0))


def _memory(days: int, rate=_shape, *, skip_day: int | None = None, level=None) -> SeasonalMemory:
    m = SeasonalMemory()
    for k in range(int(days * DAY / DT)):
        t = k * DT + DT
        d = int(t // DAY)
        if d == skip_day:
            continue
        m = m.record(t, rate(t) * (level(d) if level else 1.0))
    return m


def test_fewer_than_two_earlier_whole_days_no_profile():
    assert SeasonalMemory().profile(DAY) is None
    m = _memory(2)
    assert m.profile(DAY - 1) is None  # today only
    assert m.profile(DAY + 1) is None  # one earlier day: a shape seen once
    assert m.profile(2 * DAY + 1) is not None


def test_the_profile_counts_as_far_as_the_days_agree():
    same = _memory(5).profile(5 * DAY + 1)
    assert same is not None
    noon, night = 12 * 3600.0, 3 * 3600.0
    assert same.at([noon])[0] / same.at([night])[0] > 1.9  # the true ratio is 2
    # days of random shapes (each ten minutes 0.5-1.5x, independently): no pattern to learn
    rng = random.Random(7)
    noise = {b: rng.uniform(0.5, 1.5) for b in range(6 * 144)}
    random_days = _memory(6, rate=lambda t: 20.0 * noise[int(t // 600) % (6 * 144)])
    profile = random_days.profile(6 * DAY + 1)
    assert profile is None or max(abs(x - 1.0) for x in profile.index) < 0.15


def test_a_quiet_holiday_and_a_missing_day_do_not_bend_the_profile():
    normal = _memory(6).profile(6 * DAY + 1)
    # day 2 a holiday at a third of the level and flat; day 4 not recorded at all
    holiday = _memory(6, rate=lambda t: 7.0 if t // DAY == 2 else _shape(t), skip_day=4)
    odd = holiday.profile(6 * DAY + 1)
    assert normal is not None and odd is not None and odd.days == normal.days - 1
    for h in (3, 9, 12, 17, 20):
        assert odd.at([h * 3600.0])[0] == pytest.approx(normal.at([h * 3600.0])[0], rel=0.06)


def test_zero_buckets_are_gaps_not_an_idle_night():
    gappy = _memory(4, rate=lambda t: 0.0 if 12 <= (t % DAY) / 3600 < 13 else _shape(t))
    profile = gappy.profile(4 * DAY + 1)
    assert profile is not None
    assert profile.at([12.5 * 3600.0])[0] > 1.1  # interpolated from around noon, not zero


def test_the_memory_is_bounded_however_long_the_planner_runs():
    m = _memory(MAX_DAYS + 3)
    assert len(m.rates) == m.max_buckets == MAX_DAYS * 144
    assert m.start_seconds == pytest.approx(3 * DAY, abs=600)


def test_the_memory_survives_a_restart_and_a_bad_one_costs_only_itself():
    history = History(season=_memory(2))
    restored, _ = history_from_json(history_to_json(history, 0.0))
    assert restored.season.start_seconds == history.season.start_seconds
    assert restored.season.rates == pytest.approx(history.season.rates, abs=1e-4)  # 4 digits kept
    text = history_to_json(replace(history, loads=(None,)), 0.0).replace('"bucketSeconds":600.0', '"bucketSeconds":7')
    broken, _ = history_from_json(text)
    assert broken.season == SeasonalMemory() and broken.loads == (None,)


# -- the planner with it ----------------------------------------------------------------------
def _config(**kw) -> PlannerConfig:
    # a DeepSeek-class warm-up: capacity ordered now serves 11 intervals later
    cfg = build_config(model=PerformanceModel(load_profile()), slo=Slo(), interval_seconds=DT,
                       node_budget=400, warmup_seconds=600.0)
    return replace(cfg, **kw)


def _obs(now: float, rate: float) -> Observation:
    return Observation(now_seconds=now, rate_rps=Reading(rate, now),
                       mean_input_tokens=Reading(4000.0, now), mean_output_tokens=Reading(300.0, now),
                       prefix_hit_rate=Reading(0.3, now), prefill=RoleState(ready=6),
                       decode=RoleState(ready=6))


def _run(cfg: PlannerConfig, history: History, start: float, hours: float) -> list[tuple[int, int]]:
    out = []
    for k in range(int(hours * 3600 / DT)):
        now = start + k * DT
        d, history = step(_obs(now, _shape(now)), config=cfg, history=history, now=now)
        out.append((d.prefill, d.decode))
    return out


def test_less_than_a_day_of_history_plans_exactly_as_without_seasonality():
    on, off = _config(seasonality=True), _config(seasonality=False)
    start = 7.5 * 3600.0  # the first day's morning ramp: no earlier day
    assert _run(on, History(), start, 3) == _run(off, History(), start, 3)


def test_off_is_off_whatever_the_memory_holds():
    history = History(season=_memory(3))
    off = _config(seasonality=False)
    start = 3 * DAY + 7.5 * 3600.0
    assert _run(off, history, start, 2) == _run(off, History(), start, 2)


def test_with_earlier_days_the_morning_rise_is_ordered_before_it_shows():
    history = History(season=_memory(3))
    start = 3 * DAY + 7.0 * 3600.0
    # the hour before the ramp: the load is flat at 20 req/s, the days before rose at 08:00.
    # No prior margin: at this scale its 10% rounds the flat hour up to the fleet the rise
    # needs, seasonality or not (the prior is tested in test_lead_risk.py)
    on = _run(_config(seasonality=True, rise_prior=1.0), history, start, 1.0)
    off = _run(_config(seasonality=False, rise_prior=1.0), history, start, 1.0)
    assert off[-1] == off[0]  # nothing in the last minutes says a rise is coming
    assert sum(on[-1]) > sum(off[-1])  # the time of day does


def test_the_explanation_says_the_time_of_day_raised_the_forecast():
    history = History(season=_memory(3))
    cfg = _config(seasonality=True)
    now = 3 * DAY + 7.9 * 3600.0
    for k in range(10):
        t = now - (10 - k) * DT
        _, history = step(_obs(t, _shape(t)), config=cfg, history=history, now=t)
    d, _ = step(_obs(now, _shape(now)), config=cfg, history=history, now=now)
    assert "by the time of day over 3 earlier day(s)" in d.explanation


def test_the_index_is_continuous_across_midnight():
    profile = _memory(3, rate=lambda t: 10.0 + 5.0 * math.cos(2 * math.pi * t / DAY)).profile(3 * DAY + 1)
    assert profile is not None
    before, after = profile.at([DAY - 1.0, DAY + 1.0])
    assert before == pytest.approx(after, rel=1e-3)
