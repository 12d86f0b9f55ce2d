"""Moving a role of LeaderWorkerSet groups (``fleet.plan_group_actions``): LWS keeps groups
0..replicas-1 and removes the highest indices first whatever their load, so the drain goes to
the top groups, a cancelled drain goes lowest first, and the replicas drop only over top groups
that hold nothing. Pure: views in, actions out."""

from __future__ import annotations

from pdscale.operator.loop.fleet import PodView, plan_group_actions, plan_role_actions

NOW = 1_800_000_000.0
TIMEOUT = 600.0


def leader(index: int, *, ready: bool = True, in_flight: int | None = 0,
           draining: float | None = None, in_router: bool = False) -> PodView:
    return PodView(name=f"decode-{index}", role="decode", ip=f"10.0.0.{index + 1}", ready=ready,
                   created_at_seconds=NOW - 3600, draining_since_seconds=draining,
                   in_flight=in_flight, in_router=in_router, group_index=index)


def step(target: int, leaders: list[PodView], replicas: int):
    return plan_group_actions("decode", target, leaders, replicas, now_seconds=NOW,
                              drain_timeout_seconds=TIMEOUT)


def test_a_scale_down_drains_the_highest_groups_whatever_their_load():
    # group 0 is idle and group 2 busy: a Deployment's drain would take group 0, LWS removes 2
    groups = [leader(0, in_flight=0), leader(1, in_flight=3), leader(2, in_flight=9)]
    actions = step(1, groups, 3)
    assert actions.start_drain == ("decode-2", "decode-1")
    assert actions.replicas is None  # nothing drained yet
    deployment_like = plan_role_actions("decode", 1, groups, 3, now_seconds=NOW,
                                        drain_timeout_seconds=TIMEOUT)
    assert deployment_like.start_drain == ("decode-0", "decode-1")  # why groups need their own


def test_the_replicas_drop_only_over_drained_top_groups():
    # group 2 has drained, group 1 still serves a request: LWS may remove group 2 only
    groups = [leader(0), leader(1, draining=NOW - 5, in_flight=1), leader(2, draining=NOW - 5)]
    actions = step(1, groups, 3)
    assert (actions.finish_drain, actions.replicas) == (("decode-2",), 2)
    assert any("decode-1" in w for w in actions.waiting)
    # the other way round: the top one still holds a request, so nothing goes, not even 1
    groups = [leader(0), leader(1, draining=NOW - 5), leader(2, draining=NOW - 5, in_flight=2)]
    actions = step(1, groups, 3)
    assert (actions.finish_drain, actions.replicas) == ((), None)
    assert any("decode-2" in w for w in actions.waiting)


def test_a_group_still_listed_by_the_router_is_not_removed():
    groups = [leader(0), leader(1, draining=NOW - 5, in_router=True)]
    assert step(1, groups, 2).replicas is None


def test_warming_and_uncreated_top_groups_go_without_a_drain():
    # replicas 4: group 3 not listed yet, group 2 warming, groups 0-1 serving; target 2
    groups = [leader(0), leader(1), leader(2, ready=False)]
    actions = step(2, groups, 4)
    assert (actions.start_drain, actions.replicas) == ((), 2)
    # a warming group below a serving one is not cut: LWS would remove the serving one
    groups = [leader(0), leader(1, ready=False), leader(2)]
    actions = step(2, groups, 3)
    assert (actions.start_drain, actions.replicas) == (("decode-2",), None)


def test_a_rise_cancels_the_lowest_drain_first_and_the_rest_stay_on_top():
    groups = [leader(0), leader(1, draining=NOW - 5, in_flight=2),
              leader(2, draining=NOW - 5, in_flight=2)]
    actions = step(2, groups, 3)
    assert (actions.undrain, actions.replicas) == (("decode-1",), None)
    # more than the draining groups give back: new groups above them
    actions = step(4, groups, 3)
    assert (actions.undrain, actions.replicas) == (("decode-1", "decode-2"), 4)


def test_a_scale_up_adds_groups_and_a_steady_target_changes_nothing():
    assert step(3, [leader(0)], 1).replicas == 3
    assert not step(2, [leader(0), leader(1)], 2).changes


def test_a_timed_out_drain_goes_even_with_a_request_in_flight():
    groups = [leader(0), leader(1, draining=NOW - TIMEOUT - 1, in_flight=4)]
    assert step(1, groups, 2).replicas == 1


def test_the_nodes_per_instance_gauge_follows_the_roles():
    from prometheus_client import REGISTRY

    from pdscale.operator.loop.telemetry import Reporter
    from pdscale.planner.observe import Role

    Reporter(kube=None).ready("ns", "groups", {Role.PREFILL: [], Role.DECODE: [leader(0)]},
                              {Role.PREFILL: 1, Role.DECODE: 4})
    value = REGISTRY.get_sample_value("pdscale_nodes_per_instance",
                                      {"namespace": "ns", "pdcluster": "groups", "role": "decode"})
    assert value == 4
