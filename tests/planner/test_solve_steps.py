"""The planner's steps one by one (needs._needs, _timing, _scale_down_floor, _program,
_outcome, the explanation's clauses): each is checked alone on a small case whose answer can
be worked out by hand; tests/planner/test_solve.py checks them together through plan()."""

from __future__ import annotations

import math

import numpy as np

from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.explain import _action_clauses
from pdscale.planner.history import History
from pdscale.planner.model import Load, PerformanceModel, scaled_load
from pdscale.planner.needs import _needs, prefill_share
from pdscale.planner.observe import Observation, RoleState, Warming
from pdscale.planner.profile import load_profile
from pdscale.planner.program import (
    _ADD,
    _REM,
    _cols,
    _Outcome,
    _outcome,
    _program,
    _scale_down_floor,
    _serving_rows,
    _solve,
)
from pdscale.planner.timing import _timing

MODEL = PerformanceModel(load_profile())
WARM = MODEL.profile.warmup.new_node_seconds
LOAD = Load(20.0, 4000.0, 400.0, 0.5)


def config(**kw: object) -> PlannerConfig:
    return PlannerConfig(model=MODEL, **kw)  # type: ignore[arg-type]


def fleet(p: int, d: int, *, warming_p: int = 0, draining: int = 0, now: float = 0.0) -> Observation:
    return Observation(
        now_seconds=now,
        prefill=RoleState(ready=p, warming=tuple(Warming(now + 150.0) for _ in range(warming_p)),
                          draining=draining),
        decode=RoleState(ready=d),
    )


def need_of(load: Load, cfg: PlannerConfig) -> tuple[int, int]:
    return MODEL.instances_needed(load, cfg.slo, prefill_utilization=cfg.prefill_utilization,
                                  decode_utilization=cfg.decode_utilization, ttft_queueing=True,
                                  service_cv=cfg.prefill_service_cv)


def test_needs_within_budget_are_the_model_s_at_least_the_minima() -> None:
    cfg = config(min_decode=50)
    n = _needs(cfg, fleet(2, 2), [LOAD] * 4, None)
    p, _ = need_of(LOAD, cfg)
    assert n.need.shape == (2, 4)
    assert n.desired == (p, 50)
    assert not n.over.any()


def test_needs_over_budget_are_split_in_proportion() -> None:
    big = Load(400.0, 12000.0, 400.0, 0.0)
    cfg = config(nodes=21)
    n = _needs(cfg, fleet(2, 2, draining=1), [big] * 3, None)
    p, d = need_of(big, cfg)
    assert n.over.all()
    assert (n.uncapped[:, 0] == (p, d)).all()
    # 20 nodes left by the one draining: prefill floor(20 p / (p + d)), decode the rest
    assert n.desired == (math.floor(20 * p / (p + d)), 20 - math.floor(20 * p / (p + d)))


def test_timing_counts_warm_ups_and_drains_in_whole_intervals() -> None:
    cfg = config(interval_seconds=60.0, decode_drain_seconds=130.0)
    t = _timing(cfg, fleet(3, 4, warming_p=2), 0.0, LOAD, 10)
    assert t.new_node == math.ceil(WARM / 60.0)
    assert t.drain_intervals[1] == 3  # 130 s: the third interval still drains
    assert (t.committed0 == (5, 4)).all() and (t.ready == (3, 4)).all()
    # the two warming prefill instances serve from interval ceil(150 / 60) = 3
    assert t.landing[0].tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 2, 2]
    assert not t.landing[1].any()


def test_the_floor_holds_the_window_s_highest_need_but_never_forces_a_scale_up() -> None:
    cfg = config(stabilization_window_seconds=600.0, max_decode=6)
    n = _needs(cfg, fleet(2, 2), [LOAD] * 4, None)
    earlier = Decision(0.0, 9, 9, 1.0, 0.03, 1.0, "", desired=(9, 9))
    history = History(decisions=(earlier,))
    floor = _scale_down_floor(cfg, history, LOAD, n, _timing(cfg, fleet(12, 8), 0.0, LOAD, 4))
    # prefill: held at the window's 9; decode: 9 capped by max_decode = 6
    assert floor.tolist() == [9.0, 6.0]
    # ... and never above what is there
    there = _timing(cfg, fleet(4, 3), 0.0, LOAD, 4)
    assert _scale_down_floor(cfg, history, LOAD, n, there).tolist() == [4.0, 3.0]


def test_served_only_the_window_forgets_a_need_the_fleet_was_never_serving() -> None:
    # Issue 48's surge: a rise's need (20 prefill) was seen while 13 served; the 7 ordered for
    # it land after the load fell back. The window and its hysteresis hold the 20 by default;
    # with scale_down_served_only they hold what served it (13), so the late ones can go.
    p, d = need_of(LOAD, config())
    big = Load(LOAD.rate_rps * 3, LOAD.mean_input_tokens, LOAD.mean_output_tokens, LOAD.prefix_hit_rate)
    bp, _ = need_of(big, config())
    assert bp > p + 1
    served = (p + 1, d)
    rise = Decision(0.0, bp, d, 1.0, 0.03, 1.0, "", plan=(served,) * 4, desired=(bp, d),
                    lead_need=(bp, d))
    history = History(loads=(big,), decisions=(rise,))
    obs = fleet(bp + 4, d)
    for flag, want in ((False, bp), (True, p + 1)):
        cfg = config(stabilization_window_seconds=600.0, scale_down_served_only=flag)
        n = _needs(cfg, obs, [LOAD] * 4, None)
        floor = _scale_down_floor(cfg, history, LOAD, n, _timing(cfg, obs, 0.0, LOAD, 4))
        assert floor[0] == want, flag
    # a need that was served stays remembered: the window is unchanged where the fleet had it
    met = Decision(0.0, bp, d, 1.0, 0.03, 1.0, "", plan=((bp, d),) * 4, desired=(bp, d),
                   lead_need=(bp, d))
    cfg = config(stabilization_window_seconds=600.0, scale_down_served_only=True)
    n = _needs(cfg, obs, [LOAD] * 4, None)
    floor = _scale_down_floor(cfg, History(loads=(big,), decisions=(met,)), LOAD, n,
                              _timing(cfg, obs, 0.0, LOAD, 4))
    assert floor[0] == bp
    # a load remembered without its decision (a replay's seeded history) is held in full
    seeded = History(loads=(big, LOAD), decisions=(rise,))
    floor = _scale_down_floor(cfg, seeded, LOAD, n, _timing(cfg, obs, 0.0, LOAD, 4))
    assert floor[0] >= bp


def test_the_floor_yields_the_budget_the_other_role_needs() -> None:
    # The load's shape flipped: the window would hold prefill at its earlier 10 above need,
    # but with those held decode's need would not fit the budget. Prefill keeps only what the
    # budget leaves beyond decode's need (3 spare nodes, one of them draining).
    p, d = need_of(LOAD, config())
    cfg = config(stabilization_window_seconds=600.0, nodes=p + d + 3)
    history = History(decisions=(Decision(0.0, p + 10, 1, 1.0, 0.03, 1.0, "", desired=(p + 10, 1)),))
    obs = fleet(p + 10, 1, draining=1)
    n = _needs(cfg, obs, [LOAD] * 4, None)
    assert not n.over.any()
    floor = _scale_down_floor(cfg, history, LOAD, n, _timing(cfg, obs, 0.0, LOAD, 4))
    assert floor.tolist() == [p + 2, 1.0]
    # with room for both, the window holds as before
    roomy = config(stabilization_window_seconds=600.0, nodes=p + d + 20)
    n = _needs(roomy, obs, [LOAD] * 4, None)
    floor = _scale_down_floor(roomy, history, LOAD, n, _timing(roomy, obs, 0.0, LOAD, 4))
    assert floor[0] == p + 10


def test_an_added_node_serves_after_its_warm_up() -> None:
    t = _timing(config(), fleet(1, 1), 0.0, LOAD, 6)
    H, w = 6, t.new_node
    x = np.zeros(8 * H)
    x[_cols(0, _ADD, H).start] = 1  # one prefill node ordered at t = 0
    serving = _serving_rows(0, H, t) @ x
    assert serving.tolist() == [0.0 if k < w else 1.0 for k in range(H)]


def test_the_programme_keeps_a_fleet_that_fits_and_buys_what_is_missing() -> None:
    cfg = config(stabilization_window_seconds=0.0, nodes=100)
    H = 20
    p, d = need_of(LOAD, cfg)
    obs = fleet(p, d + 2)
    n = _needs(cfg, obs, [LOAD] * H, None)
    t = _timing(cfg, obs, 0.0, LOAD, H)
    floor = _scale_down_floor(cfg, History(), LOAD, n, t)
    program = _program(cfg, n, t, floor)
    assert program.A.shape[1] == 8 * H and program.c.shape == (8 * H,)
    x, how = _solve(program.c, program.A, program.lo, program.hi, program.ub,
                    program.integrality, cfg.solver_time_limit_seconds)
    assert x is not None and how in ("lp", "milp", "lp-rounded")
    out = _outcome(program, t, x)
    # decode had two spare: both removed now (nothing to wait for); prefill kept as it is
    assert out.target == (p, d)
    assert x[_cols(1, _REM, H)][0] == 2
    assert not out.short.any()
    assert out.cost_gpu_hours > 0


def test_actions_are_said_per_role_and_none_as_no_change() -> None:
    t = _timing(config(), fleet(2, 2), 0.0, LOAD, 4)
    n = _needs(config(), fleet(2, 2), [LOAD] * 4, None)

    def said(target: tuple[int, int], switched: tuple[int, int] = (0, 0)) -> list[str]:
        counts = np.array([[target[0]] * 4, [target[1]] * 4], dtype=float)
        out = _Outcome(serve=counts, comm=counts, short=np.zeros((2, 4)),
                       provisioned=counts.sum(axis=0), cost_gpu_hours=0.0, target=target,
                       switched=switched)
        return _action_clauses(n, t, out)

    assert said((2, 2)) == ["no change"]
    assert said((3, 1), (1, 0)) == [
        "+1 prefill; -1 decode; switch 1 decode->prefill (cheaper than a new node)",
        f"new nodes serve after {t.new_node} interval(s) of warm-up",
    ]


def test_over_budget_the_fluid_demands_come_first_then_the_margins_in_proportion() -> None:
    need = np.array([[46.0, 46.0, 46.0], [8.0, 8.0, 8.0]])
    busy = np.array([[20.0, 20.0, 20.0], [7.0, 7.0, 7.0]])
    share = prefill_share(np.array([18.0, 27.0, 39.0]), need, busy)
    # 18 < 27 busy: in proportion to the fluid demands, both roles equally over-run
    assert share[0] == 18 * 20 / 27
    # exactly the fluid demands
    assert share[1] == 20
    # 12 nodes of margin left: prefill's margin is 26, decode's 1
    assert share[2] == 20 + 12 * 26 / 27
    # a fluid demand above the need (the need is at least the minimum, the demand a model's
    # fraction) counts as the need: prefill keeps 4 and has no margin, decode takes the rest
    assert prefill_share(np.array(10.0), np.array([[4.0], [8.0]]), np.array([[6.0], [5.0]]))[0] == 4


def test_the_window_holds_a_recent_load_at_the_margin_the_lead_was_priced_with() -> None:
    # The planner orders for a load times its lead margin (the prior, until the risk is
    # learned). Held at the bare load, a need at an instance boundary goes when the window
    # passes and is ordered again minutes later (the steady hour: 15 -> 12 -> 13 prefills).
    cfg = config(stabilization_window_seconds=600.0, scale_down_tolerance=0.0)
    margin = 1.5
    bare, with_margin = need_of(LOAD, cfg), need_of(scaled_load(LOAD, margin), cfg)
    assert with_margin[0] > bare[0] and with_margin[1] > bare[1]
    obs = fleet(with_margin[0] + 2, with_margin[1] + 2)
    quiet = Load(LOAD.rate_rps / 4, LOAD.mean_input_tokens, LOAD.mean_output_tokens, LOAD.prefix_hit_rate)
    n = _needs(cfg, obs, [quiet] * 4, None)
    history = History(loads=(LOAD,))
    t = _timing(cfg, obs, 0.0, quiet, 4)
    assert _scale_down_floor(cfg, history, quiet, n, t).tolist() == list(map(float, bare))
    held = _scale_down_floor(cfg, history, quiet, n, t, (margin, margin))
    assert held.tolist() == list(map(float, with_margin))
    # per role: a margin on decode alone holds decode alone
    assert _scale_down_floor(cfg, history, quiet, n, t, (1.0, margin)).tolist() == [bare[0], with_margin[1]]
