"""The planner with instances of several nodes (LeaderWorkerSet groups): the group is the
unit of the counts, its nodes are the unit of the budget and of the GPU-hours."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdscale.planner.config import PlannerConfig
from pdscale.planner.model import PerformanceModel
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import load_profile
from pdscale.planner.solve import plan

MODEL = PerformanceModel(load_profile())


def obs(rate: float, p: int, d: int, *, isl: float = 8000, osl: float = 300,
        hit: float = 0.4, now: float = 600.0) -> Observation:
    return Observation(
        now_seconds=now,
        rate_rps=Reading(rate, now),
        mean_input_tokens=Reading(isl, now),
        mean_output_tokens=Reading(osl, now),
        prefix_hit_rate=Reading(hit, now),
        prefill=RoleState(ready=p),
        decode=RoleState(ready=d),
    )


def cfg(**kw: object) -> PlannerConfig:
    return PlannerConfig(model=MODEL, **kw)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0, 300),
    kp=st.integers(1, 4),
    kd=st.integers(1, 8),
    p=st.integers(1, 6),
    d=st.integers(1, 6),
    nodes=st.integers(2, 80),
    isl=st.floats(200, 40000),
    osl=st.floats(10, 3000),
)
def test_groups_never_take_more_nodes_than_the_budget(rate, kp, kd, p, d, nodes, isl, osl):
    nodes = max(nodes, p * kp + d * kd)  # a running fleet within its budget
    c = cfg(nodes=nodes, nodes_per_instance=(kp, kd))
    dec = plan(obs(rate, p, d, isl=isl, osl=osl), config=c, now=600.0)
    assert dec.prefill * kp + dec.decode * kd <= nodes
    assert all(a * kp + b * kd <= nodes for a, b in dec.plan)
    assert dec.prefill >= 1 and dec.decode >= 1


def test_a_budget_of_24_nodes_holds_6_decode_instances_of_4_nodes():
    # decode-heavy (long answers at a high rate): far more decode than the budget holds
    load = obs(400.0, 1, 1, isl=1000, osl=3000, hit=0.5)
    grouped = plan(load, config=cfg(nodes=25, nodes_per_instance=(1, 4)), now=600.0)
    assert grouped.shortfall
    assert (grouped.prefill, grouped.decode) == (1, 6)  # 1 + 6 x 4 = 25 nodes
    # the same budget in one-node instances is 24 decode instances, not 6
    flat = plan(load, config=cfg(nodes=25), now=600.0)
    assert flat.decode == 24


def test_counts_are_instances_and_gpu_hours_are_per_node():
    # with room to spare the profile's per-instance capacity sizes the counts alike; each
    # instance of k nodes then costs k nodes' GPU-hours
    load = obs(40.0, 3, 3)
    one = plan(load, config=cfg(nodes=10_000), now=600.0)
    two = plan(load, config=cfg(nodes=10_000, nodes_per_instance=(2, 2)), now=600.0)
    assert (two.prefill, two.decode, two.plan) == (one.prefill, one.decode, one.plan)
    assert two.cost_gpu_hours == pytest.approx(2 * one.cost_gpu_hours)
    mixed = plan(load, config=cfg(nodes=10_000, nodes_per_instance=(2, 4)), now=600.0)
    assert (mixed.prefill, mixed.decode) == (one.prefill, one.decode)
    # prefill's nodes count twice, decode's four times
    assert 2 * one.cost_gpu_hours < mixed.cost_gpu_hours < 4 * one.cost_gpu_hours


def test_no_role_switch_between_groups_of_different_sizes():
    # long documents arrive: prefill needs far more, decode has spare instances, budget full
    load = obs(30.0, 3, 15, isl=16000, osl=300, hit=0.2)
    same = plan(load, config=cfg(nodes=36, forecast_method="last", nodes_per_instance=(2, 2)),
                now=600.0)
    assert same.switch_to_prefill > 0  # a 2-node decode group can become a 2-node prefill one
    mixed = plan(load, config=cfg(nodes=48, forecast_method="last", nodes_per_instance=(2, 3)),
                 now=600.0)
    assert mixed.switch_to_prefill == 0 and mixed.switch_to_decode == 0


# -- the replay's fleet --------------------------------------------------------------------------
def test_the_replay_fleet_spends_the_budget_in_nodes_and_charges_each_node():
    from pdscale.planner.observe import Role
    from pdscale.planner.replay.fleet import Events, Fleet, reconcile
    from pdscale.planner.replay.prefix_index import PrefixIndex

    fleet = Fleet(PrefixIndex(10), Events(), switch_seconds=30.0, nodes_per_instance=(2, 4))
    fleet.add(Role.PREFILL, 0.0, 0.0)
    fleet.add(Role.DECODE, 0.0, 0.0)
    assert fleet.provisioned_nodes() == 6
    # 24 nodes: 6 are held; room for 4 more decode groups of 4 (not 18 one-node instances)
    reconcile(fleet, 1, 50, 10.0, None, nodes=24, new_seconds=600.0)
    assert len(fleet.committed(Role.DECODE)) == 5 and fleet.provisioned_nodes() == 22
    # one more prefill, one less decode: no switch between groups of different sizes
    reconcile(fleet, 2, 4, 20.0, None, nodes=24, new_seconds=600.0)
    assert fleet.role_changes == 0
    # a ready decode group of 4 nodes for 100 s is 400 node-seconds
    for i in range(len(fleet.role)):
        fleet.account(i, 20.0)
    before = fleet.acc["ready"]
    fleet.account(1, 120.0)
    assert fleet.acc["ready"] - before == pytest.approx(400.0)


def test_a_solver_out_of_time_never_plans_beyond_the_budget():
    # A busy host: branch and bound (wall-time limited) finds no whole-instance plan in time,
    # and the relaxation rounded up asked for more nodes than the budget (seen under load as
    # a Hypothesis FlakyFailure of the test above). The planner holds instead, and says why.
    c = cfg(nodes=45, nodes_per_instance=(1, 7), solver_time_limit_seconds=1e-9)
    for rate in (229.65, 150.0, 60.0):
        dec = plan(obs(rate, 5, 2, isl=1000, osl=1271.7), config=c, now=600.0)
        assert dec.prefill + dec.decode * 7 <= 45, dec.explanation
        assert all(a + b * 7 <= 45 for a, b in dec.plan), (dec.plan, dec.explanation)
