"""The pool's joint grant (planner/pool.py): its rules, and the greedy against scipy's MILP."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.history import History
from pdscale.planner.pool import (
    MemberNeed,
    MemberProbe,
    admit_within,
    even_split,
    member_budgets,
    member_command,
    node_keys,
    solve_pool,
    trim_to_budget,
)


def m(name: str, need: tuple[int, int], *, prio: int = 0, g: int = 0, cur: tuple[int, int] = (0, 0),
      busy: tuple[float, float] = (0.0, 0.0), warm: tuple[float, float] = (300.0, 300.0),
      cap: int | None = None, draining: int = 0, target: tuple[int, int] | None = None) -> MemberNeed:
    return MemberNeed(name, priority=prio, guaranteed_nodes=g, need_nodes=need, busy_nodes=busy,
                      current_nodes=cur, warmup_seconds=warm, cap_nodes=cap, draining_nodes=draining,
                      target_nodes=target)


def grants(d) -> dict[str, int]:
    return {g.name: g.nodes for g in d.grants}


def test_everyone_fits_gets_its_need_and_the_rest_stays_free():
    d = solve_pool([m("a", (3, 5)), m("b", (2, 2))], pool_nodes=24)
    assert grants(d) == {"a": 8, "b": 4}
    assert d.free_nodes == 12
    assert "granted all 8 nodes needed" in d.grant("a").reason


def test_guarantees_come_before_a_higher_priority():
    # high needs the whole pool; low's guarantee of 6 is still honoured
    d = solve_pool([m("high", (10, 14), prio=100), m("low", (4, 8), prio=1, g=6)], pool_nodes=24)
    assert grants(d) == {"high": 18, "low": 6}
    assert "6 under its guarantee of 6" in d.grant("low").reason


def test_an_unneeded_guarantee_is_lent_and_reclaimed():
    # low guarantees 8 but needs 2: high borrows the other 6
    d = solve_pool([m("high", (10, 14), prio=100), m("low", (1, 1), prio=1, g=8)], pool_nodes=24)
    assert grants(d) == {"high": 22, "low": 2}
    # low's need returns: it takes its guarantee back from high (which drains)
    d2 = solve_pool([m("high", (10, 14), prio=100, cur=(10, 12)),
                     m("low", (4, 8), prio=1, g=8, cur=(1, 1))], pool_nodes=24)
    assert grants(d2) == {"high": 16, "low": 8}
    assert d2.grant("high").trimmed == 6
    assert "gives up 6 of the 22 it holds through drains" in d2.grant("high").reason
    # ... and low's gain waits for those drains: nothing is free now
    assert d2.grant("low").holdable == 2
    assert "6 of them wait for nodes to drain" in d2.grant("low").reason
    assert member_budgets(d2) == {"high": 16, "low": 2}


def test_priority_order_the_lowest_gives_up_first():
    members = [m("low", (6, 6), prio=1, cur=(6, 6)), m("mid", (5, 5), prio=50, cur=(5, 5)),
               m("high", (8, 8), prio=100, cur=(2, 2))]
    d = solve_pool(members, pool_nodes=24)
    assert grants(d) == {"low": 0, "mid": 8, "high": 16}
    d = solve_pool(members, pool_nodes=30)
    assert grants(d) == {"low": 4, "mid": 10, "high": 16}


def test_equal_priority_shares_busy_before_margin_and_by_filled_share():
    # both need 12; a's load keeps 10 busy, b's 4: a's fluid demand outranks b's margin
    d = solve_pool([m("a", (6, 6), busy=(5.0, 5.0)), m("b", (6, 6), busy=(2.0, 2.0))], pool_nodes=14)
    assert grants(d)["a"] >= 10 and grants(d)["b"] >= 4
    assert sum(grants(d).values()) == 14
    # equal shapes: the pool is split evenly
    d = solve_pool([m("a", (6, 6), busy=(4.0, 4.0)), m("b", (6, 6), busy=(4.0, 4.0))], pool_nodes=20)
    assert grants(d) == {"a": 10, "b": 10}


def test_never_more_than_the_pool_less_draining_nor_the_cap():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 6)
        pool = rng.randint(0, 60)
        gs = [rng.randint(0, pool // n) for _ in range(n)] if n else []
        members = [MemberNeed(f"m{i}", priority=rng.randint(0, 3), guaranteed_nodes=gs[i],
                              need_nodes=(need := (rng.randint(0, 20), rng.randint(0, 20))),
                              target_nodes=(need[0] + rng.randint(0, 3), need[1]),
                              busy_nodes=(rng.uniform(0, 10), rng.uniform(0, 10)),
                              current_nodes=(rng.randint(0, 10), rng.randint(0, 10)),
                              warmup_seconds=(300.0, 300.0),
                              cap_nodes=rng.choice([None, rng.randint(0, 30)]),
                              draining_nodes=rng.randint(0, 2))
                   for i in range(n)]
        d = solve_pool(members, pool_nodes=pool, horizon_seconds=1200.0)
        capacity = max(0, pool - sum(x.draining_nodes for x in members))
        assert sum(grants(d).values()) + d.free_nodes == capacity
        for x, g in zip(members, d.grants, strict=True):
            assert g.nodes <= x.wants
            assert x.cap_nodes is None or g.nodes <= x.cap_nodes
            assert g.guaranteed + g.busy + g.margin + g.held == g.nodes
        budgets = member_budgets(d, members)
        assert sum(budgets.values()) <= capacity
        # what is held after this interval's trims start, with every drain, fits the pool
        # (when the members held no more than it before)
        held = sum(x.current for x in members) + sum(x.draining_nodes for x in members)
        if held <= pool:
            after = sum(budgets.values()) + sum(g.trimmed for g in d.grants) \
                + sum(x.draining_nodes for x in members)
            assert after <= pool
        for x in members:
            assert x.cap_nodes is None or budgets[x.name] <= x.cap_nodes
        # a guarantee is honoured whenever the guarantees fit what is not draining
        if sum(min(x.guaranteed_nodes, x.need, x.cap_nodes if x.cap_nodes is not None else pool)
               for x in members) <= capacity:
            for x, g in zip(members, d.grants, strict=True):
                assert g.nodes >= min(x.guaranteed_nodes, x.need,
                                      x.cap_nodes if x.cap_nodes is not None else pool)


def test_draining_nodes_are_not_granted_and_guarantees_wait_by_priority():
    d = solve_pool([m("a", (4, 4), prio=10, g=8, draining=3), m("b", (4, 4), prio=1, g=8)],
                   pool_nodes=16)
    assert grants(d) == {"a": 8, "b": 5}
    assert "even the guarantees wait for drains" in d.grant("b").reason


def test_stable_when_needs_are_unchanged():
    """Fed its own grants back as the current allocation, with needs unchanged, nothing
    moves; and an equal-priority newcomer does not take a warm node it would value less than
    the holder after the cold start."""
    members = [m("a", (8, 8), prio=5, busy=(6.0, 6.0)), m("b", (6, 10), prio=5, busy=(5.0, 7.0)),
               m("c", (3, 9), prio=1, busy=(2.0, 6.0))]
    d = solve_pool(members, pool_nodes=30)
    for _ in range(5):
        fed = [MemberNeed(x.name, x.priority, x.guaranteed_nodes, x.need_nodes, x.busy_nodes,
                          current_nodes=(g.nodes, 0), warmup_seconds=x.warmup_seconds)
               for x, g in zip(members, d.grants, strict=True)]
        d2 = solve_pool(fed, pool_nodes=30)
        assert grants(d2) == grants(d)
        assert all(g.trimmed == 0 for g in d2.grants)
        d = d2


def test_the_cold_start_keeps_a_warm_node_where_equalising_would_move_it():
    # a holds all 10 nodes it needs (2 busy, 8 margin); b, same priority and shape, holds none.
    # With a free warm-up the pool of 10 is split 5/5. A warm-up of 90% of the horizon makes
    # b's new margin nodes worth less than a's kept ones: a keeps more.
    a = m("a", (5, 5), busy=(1.0, 1.0), cur=(5, 5), warm=(0.0, 0.0))
    b = m("b", (5, 5), busy=(1.0, 1.0), warm=(0.0, 0.0))
    assert grants(solve_pool([a, b], pool_nodes=10)) == {"a": 5, "b": 5}
    b_slow = m("b", (5, 5), busy=(1.0, 1.0), warm=(1620.0, 1620.0))
    g = grants(solve_pool([a, b_slow], pool_nodes=10, horizon_seconds=1800.0))
    assert g["a"] > 5 and g["b"] >= 2  # b's fluid demand still outranks a's margin


def test_nodes_a_scale_down_window_holds_yield_to_another_members_need():
    # a needs 8 but its window holds 12; b, same priority, needs 6 of a pool of 16
    a = MemberNeed("a", 0, 0, need_nodes=(4, 4), target_nodes=(8, 4), current_nodes=(8, 4),
                   warmup_seconds=(600.0, 600.0))
    b = m("b", (3, 3), warm=(600.0, 600.0))
    d = solve_pool([a, b], pool_nodes=16)
    assert grants(d) == {"a": 10, "b": 6}
    assert d.grant("a").held == 2
    assert "granted the 8 nodes needed, 2 of the 4 more its scale-down window holds" in d.grant("a").reason
    # with room, the window keeps them all
    assert grants(solve_pool([a, b], pool_nodes=18)) == {"a": 12, "b": 6}


def test_cold_start_is_the_short_roles_warmup():
    x = m("x", (6, 2), cur=(2, 2), warm=(100.0, 900.0))
    assert x.cold_start_seconds == 100.0
    y = m("y", (2, 6), cur=(2, 2), warm=(100.0, 900.0))
    assert y.cold_start_seconds == 900.0


@pytest.mark.parametrize("bad, message", [
    (dict(pool_nodes=-1), "pool_nodes must be >= 0"),
    (dict(pool_nodes=4, horizon_seconds=0.0), "horizon_seconds must be > 0"),
])
def test_validation_names_the_argument(bad, message):
    with pytest.raises(ValueError, match=message):
        solve_pool([m("a", (1, 1))], **bad)


def test_validation_of_members():
    with pytest.raises(ValueError, match="names must be unique"):
        solve_pool([m("a", (1, 1)), m("a", (1, 1))], pool_nodes=4)
    with pytest.raises(ValueError, match="guaranteed_nodes sum to 6, more than the pool's 5"):
        solve_pool([m("a", (1, 1), g=3), m("b", (1, 1), g=3)], pool_nodes=5)
    with pytest.raises(ValueError, match="member a: node counts must be >= 0"):
        solve_pool([m("a", (-1, 1))], pool_nodes=5)


def _milp_value(members: list[MemberNeed], pool: int, horizon: float,
                price: float = 0.0) -> tuple[float, float]:
    """The optimum of the integer programme (binary x per node, prefix-ordered, one capacity
    row) for a value strictly increasing in the key, and the greedy's value under it."""
    fair = even_split([x.name for x in members], pool)
    keyed = [node_keys(x, pool, horizon, fair_nodes=fair[x.name], surplus_price=price)
             for x in members]
    order = sorted({k for keys in keyed for k in keys})
    weight = {k: float(i + 1) for i, k in enumerate(order)}  # increasing in the key
    cols = [(i, j) for i, keys in enumerate(keyed) for j in range(len(keys))]
    if not cols:
        return 0.0, 0.0
    c = -np.array([weight[keyed[i][j]] for i, j in cols])
    rows, lo, hi = [np.ones(len(cols))], [-np.inf], [float(max(0, pool - sum(x.draining_nodes for x in members)))]
    for a, (i, j) in enumerate(cols):  # node j+1 only with node j
        if j > 0:
            r = np.zeros(len(cols))
            r[a], r[cols.index((i, j - 1))] = 1.0, -1.0
            rows.append(r)
            lo.append(-np.inf)
            hi.append(0.0)
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi),
               bounds=Bounds(0, 1), integrality=np.ones(len(cols)))
    assert res.success
    d = solve_pool(members, pool_nodes=pool, horizon_seconds=horizon, surplus_price=price)
    greedy = sum(weight[keyed[i][j]] for i, g in enumerate(d.grants) for j in range(g.nodes))
    return -float(res.fun), greedy


def _random_members(rng: random.Random, n: int, pool: int, *, need_max: int, busy_max: float) -> list:
    """n members with random needs, priorities, guarantees, fleets, loads and warm-ups (the
    same draws, in the same order, for every caller)."""
    return [m(f"m{i}", (p := rng.randint(0, need_max), rng.randint(0, need_max)), prio=rng.randint(0, 2),
              target=(p + rng.randint(0, 2), 0),
              g=rng.randint(0, pool // n), cur=(rng.randint(0, 5), rng.randint(0, 5)),
              busy=(rng.uniform(0, busy_max), rng.uniform(0, busy_max)),
              warm=(rng.uniform(0, 900), rng.uniform(0, 900)), draining=rng.randint(0, 1))
            for i in range(n)]


def test_greedy_is_the_milp_optimum():
    rng = random.Random(3)
    for _ in range(40):
        n = rng.randint(1, 4)
        pool = rng.randint(0, 24)
        members = _random_members(rng, n, pool, need_max=6, busy_max=5.0)
        best, greedy = _milp_value(members, pool, 1800.0)
        assert greedy == pytest.approx(best)


def test_ten_members_on_two_thousand_nodes_decide_in_milliseconds():
    rng = random.Random(11)
    members = [m(f"m{i}", (rng.randint(20, 200), rng.randint(20, 200)), prio=rng.randint(0, 3),
                 g=20, cur=(rng.randint(0, 150), rng.randint(0, 150)),
                 busy=(rng.uniform(10, 100), rng.uniform(10, 100))) for i in range(10)]
    t0 = time.perf_counter()
    d = solve_pool(members, pool_nodes=2000)
    elapsed = time.perf_counter() - t0
    assert sum(grants(d).values()) <= 2000
    assert elapsed < 1.0  # measured ~10 ms on a loaded 2-core box


def test_even_split():
    assert even_split(["a", "b", "c"], 24) == {"a": 8, "b": 8, "c": 8}
    assert even_split(["a", "b", "c"], 25) == {"a": 9, "b": 8, "c": 8}


def test_trim_cuts_the_role_above_the_planners_split_first():
    # the planner's proportional clamp cut 11P3D on 13 nodes to 11P2D; its split is 9P3D
    assert trim_to_budget((11, 3), 13, (9, 3)) == (10, 3)
    assert trim_to_budget((11, 3), 12, (9, 3)) == (9, 3)
    # below the split (planned for another budget): from the role with more room
    assert trim_to_budget((11, 3), 10, (9, 3), minimum=(1, 1)) == (7, 3)
    # groups: a decode instance of 2 nodes
    assert trim_to_budget((4, 4), 8, (2, 3), nodes_per_instance=(1, 2)) == (2, 3)
    # the minima win over the budget
    assert trim_to_budget((3, 3), 2, (1, 1), minimum=(2, 2)) == (2, 2)
    # within budget: unchanged
    assert trim_to_budget((5, 5), 12, (1, 1)) == (5, 5)


def test_an_addition_waits_for_the_drain_of_the_role_given_up():
    # 12P1D -> 11P2D on a budget of 13: the prefill drains while a new decode would need a
    # 14th node; the decode comes from the drained prefill (a role switch) ...
    assert admit_within((11, 2), (12, 1), 13) == ((11, 2), (0, 1))
    # ... or, where a decode instance spans 2 nodes and no switch is possible, waits
    assert admit_within((11, 2), (12, 1), 14, nodes_per_instance=(1, 2)) == ((11, 1), (0, 0))
    # with a switch the node is reused: admitted
    assert admit_within((11, 2), (12, 1), 13, switches=(0, 1)) == ((11, 2), (0, 1))
    # room in the budget: admitted
    assert admit_within((11, 2), (12, 1), 14) == ((11, 2), (0, 0))
    # removals only: unchanged, even above a budget a trim has lowered
    assert admit_within((8, 2), (12, 3), 10) == ((8, 2), (0, 0))
    # the larger addition is cut first
    assert admit_within((6, 6), (4, 3), 10) == ((6, 4), (0, 0))  # +2P+3D: D cut, then the tie


def test_a_grant_waiting_for_a_drain_is_remembered_as_asked(model):
    # `a` holds 2P2D and now asks 3P3D (a burst its scale-down window would then hold);
    # its guarantee of 6 takes 2 nodes back from `b`, which must drain first. Its grant is 6,
    # its budget now 4: the command adds nothing yet, but its planner's memory is what it
    # asked alone (3P3D), as on a static split, so next interval it still asks for them and
    # gets them once drained. Planned again within the 4 free nodes instead, its memory held
    # 2P2D, and a burst shorter than the drain was never served (replay: its attainment fell
    # below the static split's, 0.973 against 0.986)
    cfg = PlannerConfig(model=model, nodes=10)

    def decision(p: int, d: int) -> Decision:
        return Decision(at_seconds=0.0, prefill=p, decode=d, predicted_ttft_seconds=0.1,
                        predicted_tpot_seconds=0.01, cost_gpu_hours=0.0, explanation="",
                        desired=(p, d))

    def stepper(config: PlannerConfig, history: History) -> tuple[Decision, History]:
        want = decision(min(3, config.nodes // 2), min(3, config.nodes // 2))
        return want, History(decisions=(*history.decisions, want))

    alone, alone_history = stepper(cfg, History())
    need_a = m("a", (3, 3), g=6, cur=(2, 2), busy=(2.0, 2.0))
    need_b = m("b", (2, 2), cur=(3, 3), busy=(2.0, 2.0))
    pool = solve_pool([need_a, need_b], pool_nodes=10)
    assert grants(pool) == {"a": 6, "b": 4}
    assert member_budgets(pool, [need_a, need_b])["a"] == 4  # b's two nodes are draining
    command, memory, budget = member_command(MemberProbe(need_a, alone, alone_history), pool,
                                             config=cfg, history=History(), stepper=stepper)
    assert budget == 4 and (command.prefill, command.decode) == (2, 2)  # nothing added yet
    assert memory is alone_history and memory.decisions[-1].desired == (3, 3)


# -- the surplus price: a node beyond a member's fair share must be worth its node-hours -----

def test_surplus_beyond_the_fair_share_is_priced_out_and_left_idle():
    # a needs 16 of a pool of 20 whose fair share is 10 each; b needs 2: at price 0 a takes
    # 16 (the idle nodes b leaves); at 0.5 the nodes whose value falls below it stay idle
    a, b = m("a", (8, 8), busy=(3.0, 3.0)), m("b", (1, 1))
    assert grants(solve_pool([a, b], pool_nodes=20)) == {"a": 16, "b": 2}
    d = solve_pool([a, b], pool_nodes=20, surplus_price=0.5)
    # nodes 11, 12 of a: margin filled 4/10, 5/10, new (cold start 300 s of 1800): values
    # 0.6 * 5/6 = 0.5 (kept), 0.5 * 5/6 = 0.42 (priced out with the 4 after it)
    assert grants(d) == {"a": 11, "b": 2}
    assert d.grant("a").priced_out == 5 and d.grant("b").priced_out == 0
    assert "5 more not worth their node-hours beyond its fair share of 10" in d.grant("a").reason
    assert d.free_nodes == 7
    # the idle nodes are not handed to a as budget (its planner would take them back)
    assert member_budgets(d)["a"] == 11
    assert member_budgets(d)["b"] == 2 + d.idle_nodes_now // 2


def test_fluid_demand_and_guarantees_are_never_priced():
    # beyond the fair share but within the fluid demand (its queue would grow without bound)
    # or the guarantee: granted even at the highest price
    a = m("a", (8, 8), busy=(7.0, 7.0))
    d = solve_pool([a, m("b", (1, 1))], pool_nodes=20, surplus_price=1.0)
    assert grants(d)["a"] == 14
    g = m("g", (8, 8), g=13)
    d = solve_pool([g, m("b", (1, 1))], pool_nodes=20, surplus_price=1.0)
    assert grants(d)["g"] == 13


def test_a_kept_surplus_node_is_worth_more_than_a_new_one():
    # the cold start is priced as before: a surplus node the member holds costs no warm-up,
    # so at the same price it keeps nodes it would not be granted anew
    new = solve_pool([m("a", (8, 8), busy=(3.0, 3.0)), m("b", (1, 1))], pool_nodes=20,
                     surplus_price=0.55)
    kept = solve_pool([m("a", (8, 8), busy=(3.0, 3.0), cur=(6, 6)), m("b", (1, 1))],
                      pool_nodes=20, surplus_price=0.55)
    assert grants(new)["a"] == 10 and grants(kept)["a"] == 11


def test_priorities_still_decide_when_the_pool_is_full():
    # the price only leaves surplus idle; what is granted keeps the priority order: high's
    # need within its fair share comes before low's
    members = [m("low", (6, 6), prio=1, cur=(6, 6)), m("high", (8, 8), prio=100, busy=(2.0, 2.0))]
    d = solve_pool(members, pool_nodes=20, surplus_price=0.5)
    assert grants(d)["high"] >= 10
    assert sum(grants(d).values()) <= 20
    assert grants(d)["low"] == 20 - grants(d)["high"] or d.grant("low").priced_out > 0


def test_surplus_price_validation():
    with pytest.raises(ValueError, match="surplus_price"):
        solve_pool([m("a", (1, 1))], pool_nodes=4, surplus_price=1.5)


def test_greedy_is_the_milp_optimum_with_a_price():
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(1, 4)
        pool = rng.randint(0, 24)
        price = rng.choice([0.2, 0.5, 0.8])
        members = _random_members(rng, n, pool, need_max=8, busy_max=4.0)
        best, greedy = _milp_value(members, pool, 1800.0, price)
        assert greedy == pytest.approx(best)
        d = solve_pool(members, pool_nodes=pool, surplus_price=price)
        fair = even_split([x.name for x in members], pool)
        for x, gr in zip(members, d.grants, strict=True):
            # every node granted beyond the fair share, fluid demand and guarantee is worth
            # the price (its value, cold start priced, at least the price)
            free = max(fair[x.name], x.busy, min(x.guaranteed_nodes, x.need))
            keys = node_keys(x, pool, 1800.0)  # unpriced: the values as before
            assert all(keys[j][3] >= price for j in range(free, gr.nodes))


def test_price_zero_grants_as_before():
    # off by default: at price 0 no node is priced out, every member's keys are the
    # unpriced ones and the budgets keep their share of the idle nodes
    rng = random.Random(13)
    for _ in range(30):
        n = rng.randint(1, 4)
        pool = rng.randint(0, 30)
        members = [m(f"m{i}", (rng.randint(0, 10), rng.randint(0, 10)), prio=rng.randint(0, 2),
                     cur=(rng.randint(0, 6), rng.randint(0, 6)),
                     busy=(rng.uniform(0, 4), rng.uniform(0, 4))) for i in range(n)]
        fair = even_split([x.name for x in members], pool)
        for x in members:
            assert node_keys(x, pool, 1800.0, fair_nodes=fair[x.name]) == node_keys(x, pool, 1800.0)
        d = solve_pool(members, pool_nodes=pool)
        assert all(g.priced_out == 0 for g in d.grants)
        extra = d.idle_nodes_now // n
        assert member_budgets(d) == {g.name: g.holdable + extra for g in d.grants}
