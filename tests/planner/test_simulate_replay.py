from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Observation
from pdscale.planner.replay.run import ReplaySetup, run_policy
from pdscale.planner.replay.simulate import SimConfig, simulate
from pdscale.planner.replay.traces import Trace, read_mooncake, synthesize_from_rates

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")

REQUIRED = {
    "policy", "requests", "slo_attainment", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50",
    "tpot_p90", "tpot_p99", "rejected", "misses", "gpu_hours", "role_changes", "decisions",
}


@pytest.fixture(scope="module")
def donor() -> Trace:
    return read_mooncake(MOONCAKE)


def steady(donor: Trace, rate: float, seconds: float, seed: int = 3) -> Trace:
    return synthesize_from_rates([(0.0, rate), (seconds, 0.0)], donor, seed=seed)


def test_fixed_fleet_accounts_every_instance_second(model: PerformanceModel, donor: Trace) -> None:
    tr = steady(donor, 3.0, 600)
    r = simulate(tr, model, SimConfig(initial_prefill=3, initial_decode=2, slo=Slo(ttft_seconds=15)))
    span = r.end_seconds - tr.arrival_seconds[0]
    assert r.instance_seconds["ready"] == pytest.approx(5 * span)
    assert r.instance_seconds["warming"] == 0 and r.role_changes == 0
    assert 0.9 < r.attainment(Slo(ttft_seconds=15)) <= 1.0


def test_budget_is_never_exceeded_and_warm_up_is_paid(model: PerformanceModel, donor: Trace) -> None:
    tr = steady(donor, 3.0, 900)

    def greedy(_: Observation) -> tuple[int, int]:
        return 50, 50

    r = simulate(tr, model, SimConfig(initial_prefill=2, initial_decode=2, nodes=10), greedy)
    assert all(pp + pd <= 10 for _, _, _, pp, pd in r.ticks)
    # 6 new nodes warm for the profile's new-node time before serving
    assert r.instance_seconds["warming"] == pytest.approx(6 * model.profile.warmup.new_node_seconds)


def test_role_switch_drains_then_warms(model: PerformanceModel, donor: Trace) -> None:
    tr = steady(donor, 2.0, 1200)
    calls = []

    def switch_one(obs: Observation) -> tuple[int, int]:
        calls.append(obs)
        return (3, 1) if obs.now_seconds > 100 else (2, 2)

    r = simulate(tr, model, SimConfig(initial_prefill=2, initial_decode=2), switch_one)
    assert r.role_changes == 1
    assert r.instance_seconds["warming"] == pytest.approx(model.profile.warmup.role_switch_seconds)
    later = [o for o in calls if o.now_seconds > 100 + model.profile.warmup.role_switch_seconds + 120]
    assert later[-1].prefill.ready == 3 and later[-1].decode.ready == 1
    # the first observation has no measured interval: its load is unknown, not zero
    assert calls[0].rate_rps is None


def test_report_has_the_issue_fields(model: PerformanceModel, donor: Trace) -> None:
    setup = ReplaySetup(trace=steady(donor, 3.0, 600), model=model, slo=Slo(ttft_seconds=15), nodes=20)
    rep = run_policy(setup, "static:3P2D")
    assert set(rep) >= REQUIRED
    json.dumps(rep)
    assert rep["decisions"][0] == {
        "t": rep["decisions"][0]["t"], "prefill": 3, "decode": 2,
        "provisioned_prefill": 3, "provisioned_decode": 2,
    }
    with pytest.raises(ValueError, match="static:4P17D"):
        run_policy(setup, "static:lots")
    with pytest.raises(ValueError, match="policy must be one of"):
        run_policy(setup, "magic")


def conversation_at_6rps(donor: Trace, model: PerformanceModel, admission: str = "off") -> ReplaySetup:
    """Five minutes of conversation at 6 req/s: one decode (or one prefill) instance is short."""
    return ReplaySetup(trace=steady(donor, 6.0, 300), model=model,
                       slo=Slo(ttft_seconds=15, tpot_seconds=0.05), nodes=20,
                       early_rejection=True, decode_admission=admission)


def test_misses_are_counted_by_cause(model: PerformanceModel, donor: Trace) -> None:
    setup = conversation_at_6rps(donor, model)
    # one decode instance: batches past the TPOT target
    short_decode = run_policy(setup, "static:4P1D")
    m = short_decode["misses"]
    assert m["tpot_only"] + m["both"] > m["ttft_only"] + m["rejected"]
    # one prefill instance: the router rejects what it cannot serve in time
    short_prefill = run_policy(setup, "static:1P4D")
    m = short_prefill["misses"]
    assert m["rejected"] > m["tpot_only"] + m["both"]
    # the causes add up to the misses behind the attainment
    for rep in (short_decode, short_prefill):
        total = sum(rep["misses"].values())
        assert total == round(rep["requests"] * (1 - rep["slo_attainment"]))


def test_decode_admission_turns_the_tpot_cliff_into_a_queue_or_shed_excess(
    model: PerformanceModel, donor: Trace
) -> None:
    def replay(admission: str) -> dict:
        # one decode instance: short
        return run_policy(conversation_at_6rps(donor, model, admission), "static:4P1D")

    cliff, queue, shed = replay("off"), replay("queue"), replay("shed")
    assert cliff["misses"]["tpot_only"] > 0.5 * cliff["requests"]  # nearly every sequence slowed
    # capped, no admitted sequence runs past the target: the excess waits, or is dropped
    for capped in (queue, shed):
        assert capped["misses"]["tpot_only"] + capped["misses"]["both"] == 0
        assert capped["tpot_p99"] <= 0.05
    # a queue drops nothing more than the router did, and what waits misses its TTFT
    assert queue["rejected"] == cliff["rejected"]
    assert queue["misses"]["ttft_only"] > 0.5 * queue["requests"]
    assert queue["ttft_p99"] > 15
    # shedding keeps the wait within the target for everything it admits
    assert shed["rejected"] > cliff["rejected"]
    assert shed["misses"]["ttft_only"] < 0.01 * shed["requests"]
    assert shed["slo_attainment"] > max(cliff["slo_attainment"], queue["slo_attainment"])
    # a fleet with enough decode is not touched by either
    roomy = ReplaySetup(trace=steady(donor, 3.0, 300), model=model,
                        slo=Slo(ttft_seconds=15, tpot_seconds=0.05), nodes=20, early_rejection=True)
    base = run_policy(roomy, "static:4P4D")["misses"]
    for admission in ("queue", "shed"):
        assert run_policy(replace(roomy, decode_admission=admission), "static:4P4D")["misses"] == base
    with pytest.raises(ValueError, match="decode_admission must be one of"):
        run_policy(replace(roomy, decode_admission="yes"), "static:4P4D")


@pytest.mark.slow
def test_steady_hour_has_no_role_changes_and_meets_slo(model: PerformanceModel, donor: Trace) -> None:
    # the router runs predicted-TTFT with early rejection, as in the benchmark
    setup = ReplaySetup(trace=steady(donor, 12.0, 3600), model=model, slo=Slo(ttft_seconds=15),
                        nodes=64, early_rejection=True)
    rep = run_policy(setup, "pdscale")
    assert rep["role_changes"] == 0
    counts = {(d["prefill"], d["decode"]) for d in rep["decisions"]}
    assert len(counts) <= 3  # settles; no flapping between sizes
    assert rep["slo_attainment"] >= 0.99
