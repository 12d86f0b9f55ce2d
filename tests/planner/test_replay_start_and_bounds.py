"""Where a replay starts, and the oracles that bound a planner without foresight.

A recording of a live run is replayed from the spec's replicas, where the operator started
(``run_policy(start_fleet=...)``, ``pdscale replay --start-from spec``). ``oracle:now`` knows
exactly the load of the interval that just ended (a perfect meter, no forecast),
``oracle:next`` the one beginning at the tick as well: the first sees a step one interval
after it happens, the second as it happens, the full oracle before it."""

from __future__ import annotations

import math

import pytest
from planner_replay_helpers import replay_setup

from pdscale.planner.model import Load
from pdscale.planner.replay.run import initial_fleet, interval_loads, rates_before, run_policy
from pdscale.planner.replay.traces import Trace

INTERVAL_SECONDS = 60.0
#: the replay ticks at the first arrival (1 s) plus whole intervals: the step falls on a tick
STEP_AT_SECONDS = 1201.0


def step_trace(low_rps: float = 1.0, high_rps: float = 6.0, seconds: float = 2400.0) -> Trace:
    """Evenly spaced requests of one shape, ``low_rps`` then ``high_rps`` from the step on."""
    arrivals, t = [], 1.0
    while t < seconds:
        arrivals.append(t)
        t += 1.0 / (low_rps if t < STEP_AT_SECONDS else high_rps)
    n = len(arrivals)
    return Trace(name="step", arrival_seconds=arrivals, input_tokens=[6000] * n,
                 output_tokens=[100] * n, hash_ids=[()] * n, block_tokens=512)


def first_rise(report: dict) -> float:
    """The first tick at which the provisioned fleet exceeds the start fleet."""
    start = report["initial_fleet"]["prefill"] + report["initial_fleet"]["decode"]
    for d in report["decisions"]:
        if d["provisioned_prefill"] + d["provisioned_decode"] > start:
            return float(d["t"])
    raise AssertionError("the fleet never grew")


def test_a_stated_start_is_where_every_dynamic_policy_starts_within_the_bounds() -> None:
    setup = replay_setup(step_trace(seconds=600.0), ttft_seconds=3.0, nodes=12)
    for policy in ("pdscale", "oracle", "oracle:now"):
        report = run_policy(setup, policy, start_fleet=(2, 3))
        assert report["initial_fleet"] == {"prefill": 2, "decode": 3,
                                           "sized_from": "stated (the spec's replicas)"}
        assert (report["decisions"][0]["provisioned_prefill"],
                report["decisions"][0]["provisioned_decode"]) == (2, 3)
    # outside the bounds, as the operator would scale it on its first tick
    report = run_policy(setup, "pdscale", start_fleet=(0, 40))
    assert (report["initial_fleet"]["prefill"], report["initial_fleet"]["decode"]) == (1, 12)
    # a static fleet is its own start
    assert run_policy(setup, "static:4P4D", start_fleet=(1, 1))["initial_fleet"] == {
        "prefill": 4, "decode": 4}


def test_a_start_over_budget_is_split_as_the_planner_splits_it() -> None:
    # a strict TTFT for long prompts asks prefill for nearly the whole budget in queueing
    # margin; the start fleet, like the planner, first covers decode's fluid demand
    n = 4000
    trace = Trace(name="flat", arrival_seconds=[1 + i / 8 for i in range(n)], input_tokens=[12000] * n,
                  output_tokens=[340] * n, hash_ids=[()] * n, block_tokens=512)
    setup = replay_setup(trace, ttft_seconds=1.0, nodes=10)
    busy_p, busy_d = setup.model.fluid_demand(interval_loads(trace, INTERVAL_SECONDS)[1], setup.slo)
    p, d = initial_fleet(setup)
    assert p + d == 10 and d >= math.ceil(busy_d) and p >= math.floor(busy_p)
    assert run_policy(setup, "pdscale")["initial_fleet"]["decode"] == d


def test_the_oracles_see_a_step_before_as_and_one_interval_after_it_happens() -> None:
    setup = replay_setup(step_trace(), ttft_seconds=3.0, nodes=40)
    rises = {p: first_rise(run_policy(setup, p, start_fleet=(1, 1)))
             for p in ("oracle", "oracle:next", "oracle:now")}
    assert rises["oracle"] < STEP_AT_SECONDS
    assert rises["oracle:next"] == pytest.approx(STEP_AT_SECONDS)
    assert rises["oracle:now"] == pytest.approx(STEP_AT_SECONDS + INTERVAL_SECONDS)


def test_a_stated_start_is_held_through_a_first_tick_that_saw_almost_nothing() -> None:
    # The operator's first tick comes before any engine was scraped and holds the spec's
    # replicas, which the scale-down window keeps; a replay from the spec must too, or a first
    # tick that sees a load one second old releases what the live loop kept
    setup = replay_setup(step_trace(low_rps=0.05, high_rps=0.5, seconds=900.0), ttft_seconds=3.0,
                         nodes=12, idle_before=True, tick_phase_seconds=30.0)
    idle = [Load(0.0, 0.0, 0.0, 0.0)] * 2  # as the demo's replay: the warm-up before the load
    report = run_policy(setup, "pdscale", start_fleet=(1, 4), history=idle)
    first = report["decisions"][0]
    assert (first["prefill"], first["decode"]) == (1, 4), report["explanations"][0]["why"]


def test_rates_before_a_trace_are_counted_per_interval_as_prometheus_answers_them() -> None:
    # the earlier rates a multi-day replay seeds the planner with: arrivals per interval at the
    # windows' rates, None before the first window
    windows = [(0.0, 2.0), (600.0, 8.0)]
    rates = rates_before(windows, until_seconds=1200.0, interval_seconds=60.0, intervals=30, seed=1)
    assert len(rates) == 30 and rates[:10] == [None] * 10
    first, second = rates[10:20], rates[20:]
    assert all(r is not None for r in first + second)
    assert 1.5 < sum(first) / 10 < 2.5 and 7.0 < sum(second) / 10 < 9.0  # type: ignore[arg-type]
    assert len(set(second)) > 1  # counted, not the window's mean
    assert rates == rates_before(windows, until_seconds=1200.0, interval_seconds=60.0, intervals=30, seed=1)


def test_earlier_rates_price_the_start_fleet_as_the_planner_prices_its_first_plan() -> None:
    # a calm day before the trace teaches that the load does not rise over a lead: the start
    # is sized without the prior's margin (a fresh install without history holds it)
    setup = replay_setup(step_trace(), nodes=64)
    history = interval_loads(step_trace(low_rps=20.0, seconds=600.0), setup.interval_seconds)
    assert initial_fleet(setup, history) == (8, 2)  # 20 req/s x 1.1
    assert initial_fleet(setup, history, [20.0] * 300) == (7, 2)  # 20 req/s
