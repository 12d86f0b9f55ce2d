"""Replay from Prometheus, pure parts: a live loop's decisions, exported through the operator's
own gauges and joined back, re-plan to the same decisions; a tighter TTFT target asks for more.

The "live loop" here is the operator's order of one planning tick (``planner_loop``: read at
``now``, join with the fleet's role states, ``step``, report through ``telemetry.Reporter``) on
a fleet that follows its decisions with a warm-up; the "scrape" reads the operator's registry
as Prometheus would, one sample per gauge child per scrape."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pdscale.operator.loop.planning import planner_config
from pdscale.operator.loop.telemetry import Reporter
from pdscale.planner.decision import Decision
from pdscale.planner.observe import Reading, RoleState, Warming
from pdscale.planner.prometheus import MetricsSnapshot, observation_from
from pdscale.planner.recording.from_prometheus import (
    DECISIONS_METRIC,
    INSTANCES_METRIC,
    PLAN_TIME_METRIC,
    RECOMMENDED_METRIC,
    WARMING_METRIC,
    replan,
)
from pdscale.planner.replay.recorded import (
    RecordedTick,
    grid_ticks,
    instance_hours,
    matches,
    recorded_ticks,
    tick_times,
)
from pdscale.planner.solve import History, step
from pdscale.replay import configure, read_spec

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_640_000.25  # a Unix time with a fraction, as the live loop's clock has


def test_tick_times_are_a_grid_from_start_including_the_end():
    assert tick_times(100.0, 130.0, 10.0) == [100.0, 110.0, 120.0, 130.0]
    assert tick_times(100.0, 129.0, 10.0) == [100.0, 110.0, 120.0]
    assert tick_times(5.0, 5.0, 10.0) == [5.0]
    with pytest.raises(ValueError, match="--end"):
        tick_times(10.0, 5.0, 1.0)
    with pytest.raises(ValueError, match="interval"):
        tick_times(0.0, 5.0, 0.0)


def test_instance_hours_hold_each_count_until_the_next_decision():
    # 3 instances for 10 s, 5 for 20 s, then 4 for the last interval (30 s) cut at the end
    hours = instance_hours([0.0, 10.0, 30.0], [(1, 2), (2, 3), (1, 3)], 30.0, end_seconds=45.0)
    assert hours == pytest.approx((3 * 10 + 5 * 20 + 4 * 15) / 3600)


def _spec():
    """The demo's PDCluster with a 30 s scale-down window (the default, 320 s, outlasts the
    24 ticks: the fleet must also shrink, so that draining instances are exported)."""
    spec = read_spec(str(ROOT / "examples" / "demo-sim.yaml"))
    return spec.model_copy(update={"planner": spec.planner.model_copy(
        update={"stabilization_window_seconds": 30})})


def _snapshot(t: float, rate: float, isl: float) -> MetricsSnapshot:
    """What Prometheus answered at ``t``: a load, its lengths, and queues that grow with it."""
    values = {"rate_rps": rate, "mean_input_tokens": isl, "mean_output_tokens": 300.0,
              "prefix_hit_rate": 0.3, "queue_depth_prefill": 0.0, "queue_depth_decode": 0.0,
              "running_requests_prefill": rate, "running_requests_decode": rate * 4}
    return MetricsSnapshot({k: Reading(v, t) for k, v in values.items()})


def _load(i: int) -> tuple[float, float]:
    """Three phases that change the load's shape at once, as the demo's do."""
    return [(0.4, 600.0), (0.25, 1000.0), (0.6, 400.0)][min(i // 8, 2)]


class _Fleet:
    """Pods that follow the decided counts: new ones warm up for ``warmup`` s, removed ones
    drain for one tick (what ``fleet.role_state`` counts)."""

    def __init__(self, warmup: float):
        self.warmup = warmup
        self.ready = {"prefill": 1, "decode": 2}
        self.warming: dict[str, list[float]] = {"prefill": [], "decode": []}
        self.draining = {"prefill": 0, "decode": 0}

    def state(self, role: str, now: float) -> RoleState:
        landed = [t for t in self.warming[role] if t <= now]
        self.ready[role] += len(landed)
        self.warming[role] = [t for t in self.warming[role] if t > now]
        return RoleState(ready=self.ready[role], draining=self.draining[role],
                         warming=tuple(Warming(t) for t in self.warming[role]),
                         recently_ready=len(landed))

    def move(self, role: str, target: int, now: float) -> None:
        self.draining[role] = 0
        have = self.ready[role] + len(self.warming[role])
        if target > have:
            self.warming[role] += [now + self.warmup] * (target - have)
        elif target < have:
            drop = have - target
            cancel = min(drop, len(self.warming[role]))
            self.warming[role] = self.warming[role][cancel:]
            self.ready[role] -= drop - cancel
            self.draining[role] = drop - cancel


class _NoKube:
    """The Reporter's API calls (status, Events) go nowhere; the gauges are what is read."""

    def __getattr__(self, name):
        return lambda *a, **k: {}


def _scrape(name: str, at: float, into: dict[str, list]) -> None:
    """One scrape of the operator's registry: each gauge child of this PDCluster, stamped ``at``."""
    wanted = (PLAN_TIME_METRIC, INSTANCES_METRIC, WARMING_METRIC, RECOMMENDED_METRIC, DECISIONS_METRIC)
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("pdcluster") == name:
                into.setdefault(sample.name, []).append((dict(sample.labels), [(at, sample.value)]))


def _live_run(name: str, ticks: int = 24):
    """The live loop over ``ticks`` intervals: decisions, the readings it planned on, and
    what the scrapes recorded (scraped 1 s after each decision and once between)."""
    spec = _spec()
    config = planner_config(spec)
    fleet = _Fleet(warmup=float(spec.prefill.warmup_seconds))
    report = Reporter(_NoKube())  # type: ignore[arg-type]
    body = {"metadata": {"namespace": "ns", "name": name, "uid": "u"}}
    history, previous = History(), None
    decisions: list[Decision] = []
    snapshots: list[MetricsSnapshot] = []
    scraped: dict[str, list] = {}
    for i in range(ticks):
        now = T0 + i * config.interval_seconds
        snap = _snapshot(now, *_load(i))
        obs = observation_from(snap, now, fleet.state("prefill", now), fleet.state("decode", now))
        decision, history = step(obs, config=config, history=history, now=now)
        report.decision(body, spec, decision, previous, snap, obs)
        fleet.move("prefill", decision.prefill, now)
        fleet.move("decode", decision.decode, now)
        _scrape(name, now + 1.0, scraped)
        _scrape(name, now + 6.0, scraped)
        previous = decision
        decisions.append(decision)
        snapshots.append(snap)
    return config, decisions, snapshots, scraped


def _recorded(scraped: dict[str, list]) -> list[RecordedTick]:
    return recorded_ticks(*(scraped.get(m, []) for m in
                            (PLAN_TIME_METRIC, INSTANCES_METRIC, WARMING_METRIC, RECOMMENDED_METRIC,
                             DECISIONS_METRIC)))


def test_replanning_the_exported_inputs_reproduces_every_live_decision_exactly():
    config, live, snapshots, scraped = _live_run("reproduce")
    ticks = _recorded(scraped)
    assert [t.at_seconds for t in ticks] == [d.at_seconds for d in live]
    # the fleet moved: warming and draining instances are part of what was exported
    assert any(t.prefill.warming or t.decode.warming for t in ticks)
    assert any(t.prefill.draining or t.decode.draining for t in ticks)
    assert len({(d.prefill, d.decode) for d in live}) >= 3
    replayed = replan(ticks, snapshots, config)
    assert replayed == live  # every field: counts, explanation, plan, predictions
    assert matches(replayed, ticks) == (len(live), len(live))
    # the scrape that shows a plan time shows that decision counted too
    assert [t.decided for t in ticks] == list(range(1, len(live) + 1))


def test_without_the_exported_role_states_the_replay_parts_from_the_live_decisions():
    # What the fleet gauges alone (ready counts) would give: nothing warming or draining.
    config, live, snapshots, scraped = _live_run("ready-only")
    ready_only = [RecordedTick(t.at_seconds, RoleState(ready=t.prefill.ready),
                               RoleState(ready=t.decode.ready), t.live) for t in _recorded(scraped)]
    replayed = replan(ready_only, snapshots, config)
    assert [(d.prefill, d.decode, d.explanation) for d in replayed] != [
        (d.prefill, d.decode, d.explanation) for d in live]


def test_a_tighter_ttft_target_asks_for_more_instances_on_the_same_readings():
    spec = _spec()
    _, live, snapshots, scraped = _live_run("what-if")
    ticks = _recorded(scraped)
    base = configure(spec, spec_source="test").config
    tight = configure(spec, spec_source="test", overrides={"--slo-ttft": 3.0}).config
    assert tight.slo.ttft_seconds == 3.0 and base.slo.ttft_seconds == 5.0
    replayed, whatif = replan(ticks, snapshots, base), replan(ticks, snapshots, tight)
    assert replayed == live
    times = [t.at_seconds for t in ticks]
    hours = {name: instance_hours(times, [(d.prefill, d.decode) for d in ds], base.interval_seconds)
             for name, ds in (("base", replayed), ("tight", whatif))}
    assert hours["tight"] > hours["base"]
    # prefill, which the TTFT target sizes: never fewer, more in some intervals
    assert all(w.prefill >= b.prefill for w, b in zip(whatif, replayed, strict=True))
    assert sum(d.prefill for d in whatif) > sum(d.prefill for d in replayed)


def test_a_what_if_interval_plans_on_its_own_grid_with_the_live_fleet_at_each_time():
    ticks = [RecordedTick(100.0, RoleState(ready=1, warming=(Warming(125.0),)), RoleState(ready=2), (2, 2)),
             RecordedTick(110.0, RoleState(ready=2), RoleState(ready=3), (2, 3))]
    grid = grid_ticks(tick_times(95.0, 125.0, 15.0), ticks)
    assert [t.at_seconds for t in grid] == [95.0, 110.0, 125.0]
    assert grid[0].prefill == RoleState()  # before any decision, and no ready counts recorded
    assert grid[1].prefill.ready == 2 and grid[2].decode.ready == 3
    assert all(t.live is None for t in grid)


def test_the_first_scrape_showing_a_plan_time_dates_its_role_states():
    sel = {"namespace": "ns", "pdcluster": "c"}
    plan = [(sel, [(11.0, 10.0), (12.0, 10.0), (21.0, 20.0)])]
    instances = [({**sel, "role": role, "state": state}, [(11.0, a), (12.0, 99.0), (21.0, b)])
                 for (role, state, a, b) in itertools.chain(
                     [("prefill", "ready", 1, 2), ("decode", "ready", 2, 2)],
                     [("prefill", "warming", 1, 0), ("decode", "draining", 0, 1)])]
    warming = [({**sel, "role": "prefill", "slot": "0"}, [(11.0, 15.0), (12.0, 14.0)])]
    recommended = [({**sel, "role": "prefill"}, [(11.0, 2.0), (21.0, 2.0)]),
                   ({**sel, "role": "decode"}, [(11.0, 2.0), (21.0, 1.0)])]
    first, second = recorded_ticks(plan, instances, warming, recommended)
    assert first == RecordedTick(10.0, RoleState(ready=1, warming=(Warming(25.0),)),
                                 RoleState(ready=2), (2, 2))
    assert second == RecordedTick(20.0, RoleState(ready=2), RoleState(ready=2, draining=1), (2, 1))


def test_readings_are_evaluated_at_the_time_asked_for_and_stamped_with_it():
    from pdscale.planner.prometheus import read_metrics

    class _Recording:
        def __init__(self):
            self.params = []

        def custom_query(self, query, params=None):
            self.params.append(params)
            at = float(params["time"]) if params else 999.0
            return [{"metric": {}, "value": [at, "2"]}]

    client = _Recording()
    snap = read_metrics(client, {"rate_rps": "sum(x)"}, T0, at_seconds=T0)
    assert client.params == [{"time": repr(T0)}]
    assert snap.readings["rate_rps"] == Reading(2.0, T0)
    read_metrics(client, {"rate_rps": "sum(x)"}, T0)  # no time: Prometheus's own now
    assert client.params[-1] is None


def test_without_recorded_decisions_the_ready_gauge_gives_ready_counts_only():
    ready = [({"role": "prefill"}, [(100.0, 2.0), (120.0, 3.0)]),
             ({"role": "decode"}, [(100.0, 4.0)])]
    grid = grid_ticks([95.0, 110.0, 125.0], [], ready)
    assert [(t.prefill, t.decode) for t in grid] == [
        (RoleState(), RoleState()), (RoleState(ready=2), RoleState(ready=4)),
        (RoleState(ready=3), RoleState(ready=4))]


def test_times_are_unix_seconds_or_rfc3339_with_a_zone():
    from pdscale.prometheus_replay import parse_time

    assert parse_time("1764640000.5", "--start") == 1764640000.5
    assert parse_time("2026-12-02T01:00:00Z", "--start") == 1796173200.0
    with pytest.raises(ValueError, match=r"--end: .* no time zone"):
        parse_time("2026-12-02T01:00:00", "--end")
    with pytest.raises(ValueError, match="--start: 'yesterday'"):
        parse_time("yesterday", "--start")


def test_decisions_not_scraped_are_named_as_gaps():
    from pdscale.planner.replay.recorded import missed_decisions

    ticks = [RecordedTick(t, RoleState(), RoleState()) for t in (0.0, 12.0, 24.5, 54.0, 66.0)]
    # no decisions counter: at 10 s intervals a plan comes at most a fast tick (5 s) late,
    # so 29.5 s hides two
    assert missed_decisions(ticks, 10.0) == [(24.5, 29.5)]
    assert missed_decisions(ticks, 30.0) == []


def test_the_decisions_counter_tells_a_late_plan_from_an_unscraped_one():
    from pdscale.planner.replay.recorded import missed_decisions

    def ticks(decided):
        return [RecordedTick(t, RoleState(), RoleState(), None, n)
                for t, n in zip((0.0, 10.0, 44.0, 54.0, 86.0), decided, strict=True)]

    # a plan 24 s late on a busy machine: the counter moved by one, nothing was missed
    assert missed_decisions(ticks([5, 6, 7, 8, 11]), 10.0) == [(54.0, 32.0)]
    # two decisions made within one scrape interval: missed although the gap is short
    assert missed_decisions(ticks([5, 7, 8, 9, 10]), 10.0) == [(0.0, 10.0)]
    # the operator restarted (counter reset): the gap's length decides
    assert missed_decisions(ticks([5, 6, 1, 2, 3]), 10.0) == [(10.0, 34.0)]


def test_gauges_scraped_through_a_service_monitor_are_found_under_exported_namespace():
    from pdscale.planner.recording.from_prometheus import read_recording

    class _Renamed:
        """A Prometheus whose target label 'namespace' (the operator's) displaced the gauges'."""

        def __init__(self):
            self.queries = []

        def custom_query(self, query, params=None):
            self.queries.append((query, params))
            if not query.startswith("pdscale_planner_last_plan_timestamp_seconds{exported_"):
                return []
            return [{"metric": {"exported_namespace": "ns", "namespace": "pdscale-system",
                                "pdcluster": "c"}, "values": [[11.0, "10.5"], [21.0, "20.5"]]}]

    client = _Renamed()
    ticks, ready, before = read_recording(client, "ns", "c", 5.0, 30.0)
    assert [t.at_seconds for t in ticks] == [10.5, 20.5] and not before and ready == []
    assert client.queries[0] == ('pdscale_planner_last_plan_timestamp_seconds{namespace="ns",'
                                 'pdcluster="c"}[25s]', {"time": "30.0"})


def test_the_replay_starts_with_the_rates_before_its_range_as_the_operator_does():
    # the operator's first plan reads the day of rates before it (the risk over the warm-up
    # is learned from them); the replay reads the same before its first tick, or says why not
    from pdscale.planner.recording.from_prometheus import _with_earlier_rates

    config = planner_config(_spec())
    step = config.interval_seconds
    assert 6000.0 % step == 0  # the first tick on the grid

    class Ranged:
        def __init__(self) -> None:
            self.asked: list[dict] = []

        def custom_query_range(self, query, *, start, end, step, timeout=None):
            self.asked.append({"query": query, "start": start, "end": end, "step": step})
            return [{"metric": {}, "values": [[end - step, "4.0"], [end, "5.0"]]}]

    ranged = Ranged()
    history, problem = _with_earlier_rates(ranged, "sglang", "demo", "ns", config, 6000.0)
    (asked,) = ranged.asked
    assert problem is None and asked["step"] == step and 'pdcluster="demo"' in asked["query"]
    assert asked["end"] - asked["start"] == (config.rise_history_intervals - 1) * step
    # the interval before the first tick; the point at the first tick is its own reading
    assert len(history.earlier_rates) == config.rise_history_intervals
    assert history.earlier_rates[-1] == 4.0 and 5.0 not in history.earlier_rates

    class Instant:  # no range queries: the range alone, and the report says so
        def custom_query(self, query, params=None):
            return []

    history, problem = _with_earlier_rates(Instant(), "sglang", "demo", "ns", config, 6000.0)
    assert history.earlier_rates == () and problem and "before --start were not read" in problem
