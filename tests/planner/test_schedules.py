"""Scheduled floors (spec.planner.schedules, planner/schedule.py): when a window is open (KEDA's
cron scaler's rule, on the wall clock of its time zone), that the planner holds its minimums,
orders them a warm-up before the window opens, says so, and lets go when it closes."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pdscale.planner.config import PlannerConfig, build_config
from pdscale.planner.history import History
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import load_profile
from pdscale.planner.schedule import (
    ScheduledFloor,
    cron_problem,
    floor_at,
    floors_over,
    open_during,
    timezone_problem,
)
from pdscale.planner.solve import plan, step

PARIS = ZoneInfo("Europe/Paris")
BUSINESS = ScheduledFloor("business-hours", "0 9 * * 1-5", "0 18 * * 1-5", "Europe/Paris",
                          min_prefill=6, min_decode=3)


def paris(*args: int) -> float:
    """Unix seconds of a Paris wall-clock time (2026-12-07 is a Monday)."""
    return datetime(*args, tzinfo=PARIS).timestamp()  # type: ignore[misc]


# -- when a window is open -----------------------------------------------------------------------
@pytest.mark.parametrize(("when", "is_open"), [
    ((2026, 12, 7, 8, 59, 59), False),
    ((2026, 12, 7, 9, 0, 0), True),     # the start itself: [start, end)
    ((2026, 12, 7, 13, 0, 0), True),
    ((2026, 12, 7, 17, 59, 59), True),
    ((2026, 12, 7, 18, 0, 0), False),   # the end itself
    ((2026, 12, 12, 12, 0, 0), False),  # a Saturday
])
def test_a_window_is_open_from_its_start_until_its_next_end(when: tuple[int, ...], is_open: bool) -> None:
    assert open_during(BUSINESS, [paris(*when)]) == [is_open]


def test_the_time_zone_reads_the_window_on_its_own_wall_clock_across_daylight_saving() -> None:
    # New York leaves daylight saving on 2026-11-01: 09:00 there is 13:00 UTC before, 14:00 after
    ny = ScheduledFloor("ny", "0 9 * * *", "0 10 * * *", "America/New_York", min_prefill=1)
    utc = ZoneInfo("UTC")
    before = datetime(2026, 10, 30, 13, 30, tzinfo=utc).timestamp()
    after = datetime(2026, 11, 2, 13, 30, tzinfo=utc).timestamp()
    assert open_during(ny, [before, after]) == [True, False]
    assert open_during(ny, [after + 3600]) == [True]


def test_a_window_across_midnight_is_open_on_both_sides() -> None:
    night = ScheduledFloor("night", "0 22 * * *", "0 6 * * *", "UTC", min_decode=2)
    utc = ZoneInfo("UTC")
    times = [datetime(2026, 12, 7, h, 0, 1, tzinfo=utc).timestamp() for h in (21, 22, 23)]
    times += [datetime(2026, 12, 8, h, 0, 1, tzinfo=utc).timestamp() for h in (3, 6)]
    assert open_during(night, times) == [False, True, True, True, False]


def test_an_interval_counts_when_a_window_opens_within_it() -> None:
    t = paris(2026, 12, 7, 8, 59, 30)
    assert open_during(BUSINESS, [t]) == [False]
    assert open_during(BUSINESS, [t], 60.0) == [True]   # opens 30 s into the interval
    assert open_during(BUSINESS, [t], 30.0) == [False]  # [08:59:30, 09:00:00) ends at the start


def test_overlapping_windows_hold_the_highest_minimum_of_each_role() -> None:
    lunch = ScheduledFloor("lunch", "0 12 * * *", "0 14 * * *", "Europe/Paris", min_prefill=9)
    floors = floors_over([BUSINESS, lunch], [paris(2026, 12, 7, h) for h in (8, 10, 13)])
    assert floors.prefill == (0, 6, 9)
    assert floors.decode == (0, 3, 3)
    assert floors.names == ((), ("business-hours",), ("business-hours", "lunch"))
    assert floor_at([BUSINESS, lunch], paris(2026, 12, 7, 13))[:2] == (9, 3)


@pytest.mark.parametrize(("expr", "says"), [
    ("0 9 * *", "has 4 field(s); a cron expression here has 5"),
    ("0 0 9 * * 1", "has 6 field(s)"),
    ("@daily", "has 1 field(s)"),
    ("61 9 * * *", "is not a valid cron expression (Bad minute)"),
    ("0 25 * * *", "Bad hour"),
    ("0 9 31 2 *", "Bad day-of-month"),
    ("0 9 * * MONDAY", "is not a valid cron expression"),
])
def test_a_bad_cron_expression_is_refused_saying_why(expr: str, says: str) -> None:
    why = cron_problem(expr)
    assert why is not None and says in why, why


def test_good_cron_expressions_and_time_zones_pass() -> None:
    for expr in ("0 9 * * 1-5", "*/15 8-18 * * MON-FRI", "30 6 1,15 JAN-JUN *", "0 0 L * *"):
        assert cron_problem(expr) is None, expr
    for tz in ("UTC", "Europe/Paris", "America/Argentina/Buenos_Aires", "Etc/GMT+5"):
        assert timezone_problem(tz) is None, tz


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "Europe/Pariss", "../etc/passwd", ""])
def test_an_unknown_time_zone_is_refused(tz: str) -> None:
    why = timezone_problem(tz)
    assert why is not None and "IANA" in why


def test_a_floor_is_checked_when_made_naming_its_field() -> None:
    with pytest.raises(ValueError, match=r"'x'.start: .*Bad minute"):
        ScheduledFloor("x", "99 9 * * *", "0 18 * * *")
    with pytest.raises(ValueError, match=r"'x'.timezone: .*not an IANA"):
        ScheduledFloor("x", "0 9 * * *", "0 18 * * *", "Nowhere/Town")
    with pytest.raises(ValueError, match="start and end must differ"):
        ScheduledFloor("x", "0 9 * * *", "0  9 * * *")
    with pytest.raises(ValueError, match=r"min_decode must be an integer >= 0"):
        ScheduledFloor("x", "0 9 * * *", "0 18 * * *", min_decode=-1)


def test_the_configuration_refuses_a_floor_above_the_role_s_max() -> None:
    model = PerformanceModel(load_profile())
    with pytest.raises(ValueError, match=r"schedules\['business-hours'\].min_prefill \(6\) exceeds max_prefill \(4\)"):
        PlannerConfig(model=model, max_prefill=4, schedules=(BUSINESS,))


# -- the planner honours them ------------------------------------------------------------------
MONDAY_0850 = paris(2026, 12, 7, 8, 50)


def configured(**kw: object) -> PlannerConfig:
    """60 s intervals, a 600 s warm-up (a node ordered at 08:50 serves from 09:00), the
    business-hours floor, and the planner's time 0 at Monday 08:50 in Paris."""
    cfg = build_config(model=PerformanceModel(load_profile()), slo=Slo(), interval_seconds=60.0,
                       node_budget=64, warmup_seconds=600.0, schedules=(BUSINESS,))
    return replace(cfg, clock_origin_unix_seconds=MONDAY_0850, **kw)  # type: ignore[arg-type]


def light(now: float, p: int = 2, d: int = 2) -> Observation:
    """A light load (its need is below the floor) on a ready fleet of p prefill, d decode."""
    def r(x: float) -> Reading:
        return Reading(x, now)
    return Observation(now_seconds=now, rate_rps=r(1.0), mean_input_tokens=r(1000.0),
                       mean_output_tokens=r(100.0), prefix_hit_rate=r(0.5),
                       prefill=RoleState(ready=p), decode=RoleState(ready=d))


def test_the_floor_s_capacity_is_ordered_one_warm_up_before_the_window_opens() -> None:
    cfg = configured()
    early = plan(light(-60.0), config=cfg, now=-60.0)  # 08:49: a node ordered now idles a minute
    assert (early.prefill, early.decode) == (2, 2), early.explanation
    assert "scheduled floor 'business-hours': prefill >= 6, decode >= 3 from interval +11" in early.explanation
    due = plan(light(0.0), config=cfg, now=0.0)  # 08:50: ordered now, it serves at 09:00
    assert (due.prefill, due.decode) == (6, 3), due.explanation
    assert ("scheduled floor 'business-hours': prefill >= 6, decode >= 3 from interval +10 "
            "(its capacity ordered a warm-up ahead)") in due.explanation


def test_inside_the_window_the_floor_holds_and_the_decision_says_so() -> None:
    cfg = configured()
    now = 3 * 3600.0  # 11:50
    d = plan(light(now), config=cfg, now=now)
    assert (d.prefill, d.decode) == (6, 3)
    assert "scheduled floor 'business-hours': prefill >= 6, decode >= 3" in d.explanation
    # the floor is no load: the scale-down window does not remember it
    assert d.desired[0] < 6 and d.lead_need[0] < 6


def test_a_need_above_the_floor_is_planned_for_and_the_floor_goes_unmentioned() -> None:
    cfg = configured()
    now = 3 * 3600.0
    obs = replace(light(now, 8, 4), rate_rps=Reading(60.0, now), mean_input_tokens=Reading(6000.0, now))
    d = plan(obs, config=cfg, now=now)
    assert d.prefill > 6 and "scheduled floor" not in d.explanation


def test_when_the_window_closes_the_fleet_follows_the_load_again() -> None:
    cfg = configured()
    history = History()
    # 17:50 .. 18:05 on the same light load, run as the operator runs it
    start = 9 * 3600.0
    targets = []
    for k in range(16):
        now = start + 60.0 * k
        decision, history = step(light(now, 6, 3), config=cfg, history=history, now=now)
        targets.append((decision.prefill, decision.decode))
    assert targets[:10] == [(6, 3)] * 10  # until 18:00
    assert targets[11][0] < 6, targets  # a minute after it closes, the floor is gone


def test_a_hold_inside_a_window_keeps_the_floor() -> None:
    cfg = configured()
    now = 3 * 3600.0
    blind = Observation(now_seconds=now, prefill=RoleState(ready=2), decode=RoleState(ready=2))
    d, _ = step(blind, config=cfg, history=History(), now=now)
    assert d.held and (d.prefill, d.decode) == (6, 3)
    assert d.desired == (2, 2)  # the floor is not remembered as a need
    assert "raised to 6P3D by scheduled floor 'business-hours': prefill >= 6, decode >= 3" in d.explanation
    outside = Observation(now_seconds=-3600.0, prefill=RoleState(ready=2), decode=RoleState(ready=2))
    d, _ = step(outside, config=cfg, history=History(), now=-3600.0)
    assert d.held and (d.prefill, d.decode) == (2, 2)


def test_without_schedules_nothing_changes() -> None:
    cfg = configured()
    bare = replace(cfg, schedules=())
    now = 3 * 3600.0
    assert plan(light(now), config=bare, now=now).prefill < 6


# -- the replay reads them on the trace's clock --------------------------------------------------
def test_the_replay_holds_a_window_on_the_trace_s_clock_after_its_history_split() -> None:
    from planner_replay_helpers import replay_setup

    from pdscale.planner.replay.run import run_policy, with_history
    from pdscale.planner.replay.traces import Trace

    # 40 minutes of a light, flat load; its first second is Monday 08:40 in Paris, and a
    # window 09:10-09:20 asks for 5 prefill (the load needs 1-2)
    n = 40 * 60 * 2
    trace = Trace("flat", [0.5 * i for i in range(n)], [1000] * n, [100] * n, [()] * n, 512)
    window = ScheduledFloor("ten-past", "10 9 * * 1", "20 9 * * 1", "Europe/Paris", min_prefill=5)
    setup = replay_setup(trace)
    setup = replace(setup, planner=replace(setup.planner, schedules=(window,),
                                           clock_origin_unix_seconds=paris(2026, 12, 7, 8, 40)))
    scored, history = with_history(setup)
    # the scored window's clock restarts after the history: its origin moves with it
    split = scored.planner.clock_origin_unix_seconds - setup.planner.clock_origin_unix_seconds
    assert split == setup.model.profile.warmup.new_node_seconds
    report = run_policy(scored, "pdscale", history=history)
    at = {round(x["t"]): x["prefill"] for x in report["decisions"]}
    origin = scored.planner.clock_origin_unix_seconds
    opens, closes = paris(2026, 12, 7, 9, 10) - origin, paris(2026, 12, 7, 9, 20) - origin
    inside = [p for t, p in at.items() if opens <= t < closes]
    before = [p for t, p in at.items() if t < opens - setup.model.profile.warmup.new_node_seconds - 60]
    assert inside and min(inside) >= 5, at
    assert before and max(before) < 5, at
    assert any("scheduled floor 'ten-past': prefill >= 5" in e["why"] for e in report["explanations"])


def test_replay_s_trace_start_sets_the_clock_the_schedules_are_read_on() -> None:
    from pdscale.replay import _on_trace_clock, configure, default_spec

    configured = configure(default_spec(), spec_source="test")
    assert _on_trace_clock(configured, None).config.clock_origin_unix_seconds == 0.0
    moved = _on_trace_clock(configured, "2026-12-07T08:40:00+01:00")
    assert moved.config.clock_origin_unix_seconds == paris(2026, 12, 7, 8, 40)
    assert _on_trace_clock(configured, "1796629200").config.clock_origin_unix_seconds == 1796629200.0
    with pytest.raises(ValueError, match="--trace-start: 'monday' is neither Unix seconds nor an RFC 3339"):
        _on_trace_clock(configured, "monday")


def test_replay_reports_the_schedules_as_the_spec_writes_them() -> None:
    import json

    from pdscale.operator.api.pdcluster import PlannerSchedule
    from pdscale.replay import configure, default_spec

    spec = default_spec()
    window = PlannerSchedule(name="launch", start="0 9 * * 1", end="0 10 * * 1", min_prefill_replicas=3)
    spec = spec.model_copy(update={"planner": spec.planner.model_copy(update={"schedules": [window]})})
    configured = configure(spec, spec_source="file s.yaml")
    row = configured.as_json()["planner.schedules"]
    assert row["value"] == [{"name": "launch", "start": "0 9 * * 1", "end": "0 10 * * 1",
                             "timezone": "UTC", "minPrefillReplicas": 3, "minDecodeReplicas": 0}]
    json.dumps(configured.as_json())  # the report's JSON takes it
    assert configured.config.schedules[0].min_prefill == 3


def test_replay_simulate_reads_the_schedules_from_the_range_s_first_interval() -> None:
    from pdscale.prometheus_simulate import on_clock
    from pdscale.replay import configure, default_spec

    configured = configure(default_spec(), spec_source="test")
    moved = on_clock(configured, 1796629200.0)
    assert moved.config.clock_origin_unix_seconds == 1796629200.0
    assert moved.spec is configured.spec and configured.config.clock_origin_unix_seconds == 0.0
