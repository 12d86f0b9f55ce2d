"""Seasonality from history, weekly: the day-of-week factor on top of the daily profile.

What a user would notice: with less than a week and a day of history nothing changes; a
weekend that is quieter all day is learned (and, where the memory's own past midnights
say so, used: the planner orders for Monday's level before Monday's first minutes); a
weekday whose level differs only through its peaks is not used in Auto, where the step at
midnight it would add did not happen; the decision names it."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from test_seasonal import _config, _obs

from pdscale.planner.history import History
from pdscale.planner.seasonal import MAX_DAYS, WEEKLY_MIN_DAYS, SeasonalMemory, weekday
from pdscale.planner.solve import step

DAY = 86400.0
B = 600.0
#: Unix day 4 (1970-01-05) was a Monday: day d is a weekend when (d + 3) % 7 >= 5
MONDAY = 4


def _daily(t: float) -> float:
    """A day's shape: 20 req/s at night, 40 from 09:00 to 18:00."""
    h = (t % DAY) / 3600.0
    return 40.0 if 9 <= h < 18 else 20.0


def _memory(days: int, rate) -> SeasonalMemory:
    """``days`` whole days of ten-minute buckets from Unix day 0, as a seed would give."""
    points = [((k + 1) * B, rate(k * B + B / 2)) for k in range(int(days * DAY / B))]
    return SeasonalMemory().with_earlier(points)


def _quiet_weekend(t: float) -> float:
    """A weekend at 0.6 of the working days' level, the whole day (the step at midnight)."""
    return _daily(t) * (0.6 if weekday(t) >= 5 else 1.0)


def _quiet_weekend_peaks(t: float) -> float:
    """A weekend whose peak is lower (30 instead of 40 req/s) and whose night is the same."""
    h = (t % DAY) / 3600.0
    if weekday(t) >= 5 and 9 <= h < 18:
        return 30.0
    return _daily(t)


def test_less_than_a_week_and_a_day_is_exactly_the_daily_profile():
    memory = _memory(WEEKLY_MIN_DAYS - 1, _quiet_weekend)
    now = (WEEKLY_MIN_DAYS - 1) * DAY + 1.0
    on, off = memory.profile(now, weekly="on"), memory.profile(now, weekly="off")
    assert on is not None and on == off
    assert on.weekly == (1.0,) * 7 and on.weeks == (0,) * 7


def test_a_quiet_weekend_is_learned_per_weekday_over_the_earlier_weeks():
    days = 16
    p = _memory(days, _quiet_weekend).profile(days * DAY + 1.0, weekly="on")
    assert p is not None
    sat, sun, mon = p.weekly[5], p.weekly[6], p.weekly[0]
    assert sat < 0.75 and sun < 0.75  # the truth is 0.6 against the working days' 1
    assert p.weekly[1] == pytest.approx(mon, rel=0.02)  # working days alike
    assert sat / mon == pytest.approx(0.6, abs=0.08)
    assert p.weeks[5] == 2 and sum(p.weeks) == days


def test_levels_without_a_weekday_pattern_give_no_factor_or_a_flat_one():
    rng = random.Random(7)
    levels = [rng.uniform(0.8, 1.25) for _ in range(21)]
    p = _memory(21, lambda t: _daily(t) * levels[int(t // DAY)]).profile(21 * DAY + 1.0, weekly="on")
    assert p is not None
    assert max(abs(math.log(f)) for f in p.weekly) < 0.08  # shrunk towards 1 (levels +-25%)


def test_auto_uses_the_factor_where_past_midnights_stepped_and_not_where_they_did_not():
    days = 22
    now = days * DAY + 1.0
    stepping = _memory(days, _quiet_weekend)
    assert stepping.profile(now, weekly="auto") == stepping.profile(now, weekly="on")
    assert stepping.profile(now, weekly="auto").weekly != (1.0,) * 7
    peaks = _memory(days, _quiet_weekend_peaks)
    learned = peaks.profile(now, weekly="on")
    assert learned is not None and learned.weekly[5] < 0.95  # the weekend's level is lower
    auto = peaks.profile(now, weekly="auto")
    assert auto is not None and auto.weekly == (1.0,) * 7  # but its midnights do not step


def test_the_weekly_factor_passes_to_the_next_day_only_around_midnight():
    days = 16
    p = _memory(days, _quiet_weekend).profile(days * DAY + 1.0, weekly="on")
    assert p is not None
    sunday = MONDAY - 1 + 14  # a Sunday, then a Monday
    assert weekday(sunday * DAY) == 6
    noon_sun, noon_mon = p.weekly_at([sunday * DAY + 43200.0, (sunday + 1) * DAY + 43200.0])
    assert noon_sun == pytest.approx(p.weekly[6]) and noon_mon == pytest.approx(p.weekly[0])
    before, mid, after = p.weekly_at([(sunday + 1) * DAY - B / 2, (sunday + 1) * DAY,
                                      (sunday + 1) * DAY + B / 2])
    assert before == pytest.approx(p.weekly[6]) and after == pytest.approx(p.weekly[0])
    assert mid == pytest.approx((p.weekly[6] + p.weekly[0]) / 2)
    assert np.all(np.diff(p.weekly_at(np.linspace(sunday * DAY, (sunday + 2) * DAY, 500))) >= -1e-12)


def test_the_memory_holds_four_weeks_of_buckets():
    assert MAX_DAYS == 28
    m = _memory(MAX_DAYS + 3, _quiet_weekend)
    assert len(m.rates) == m.max_buckets == 4032


def _sunday_evening(weekly: str, minutes: int = 45) -> tuple[list[tuple[int, int]], str]:
    """The planner from Sunday 23:10 to 23:54 with three weeks of a quiet weekend in its
    memory (the explanation of the last decision)."""
    monday = MONDAY + 21
    history = History(season=_memory(monday - 1, _quiet_weekend))
    cfg = _config(weekly_seasonality=weekly)
    start = monday * DAY - 50 * 60.0
    out, explanation = [], ""
    for k in range(minutes):
        now = start + k * 60.0
        d, history = step(_obs(now, _quiet_weekend(now - 30.0)), config=cfg, history=history, now=now)
        out.append((d.prefill, d.decode))
        explanation = d.explanation
    return out, explanation


def test_sunday_night_orders_for_monday_before_monday_shows_and_says_why():
    on, said = _sunday_evening("auto")
    off, _ = _sunday_evening("off")
    assert off[-1] == off[0]  # Sunday's last minutes are flat at 12 req/s
    assert on[:20] == off[:20]  # no midnight within the lead yet: the same decisions
    assert sum(on[-1]) > sum(off[-1])  # Monday's level is ordered a lead before midnight
    assert "for a Monday over 3 earlier week(s)" in said
