"""The planner's integer programme: the stabilisation floor, the variables and constraint
rows, the costs, the one solver call, and the solution read back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from .config import PlannerConfig
from .decision import Decision
from .history import History
from .model import Load
from .needs import _Needs
from .timing import _intervals, _Timing


# -- the stabilisation floor -----------------------------------------------------------------
def _scale_down_floor(
    cfg: PlannerConfig, history: History, load: Load, needs: _Needs, timing: _Timing,
    margins: tuple[float, float] = (1.0, 1.0),
) -> np.ndarray:
    """Per role, the fewest instances the first interval may keep (shape (2,)).

    HPA-style: scale down only to the highest recommendation of the window
    (``stabilization_seconds``). A recommendation for scale-down is the need at a cap lowered
    by the tolerance: the survivors must absorb the load with margin, or per-minute noise
    removes a node only to re-add it minutes later. The floor never exceeds the budget split,
    the nodes the budget leaves beyond the other role's need, the instances there are (it
    never forces a scale-up), or the role's maximum.

    ``margins``: per role, the margin the lead forecast priced the risk with. A recent load is
    held at what the planner orders for such a load (the load times the margin): held at the
    bare load, a need at an instance boundary is released and ordered again minutes later."""
    model = cfg.model
    window_n = cfg.stabilization_intervals
    tol = 1.0 - cfg.scale_down_tolerance
    recent = list(history.loads[-window_n:]) if window_n else []
    served = _served(cfg, history, len(recent))
    floor = np.array(needs.desired, dtype=float)
    for ld, had in [*zip(recent, served, strict=True), (load, None)]:
        if ld is None:
            continue
        hold = model.instances_needed_at(
            ld, cfg.slo, margins,
            prefill_utilization=cfg.prefill_utilization * tol,
            decode_utilization=cfg.decode_utilization * tol,
            ttft_queueing=True, service_cv=cfg.prefill_service_cv, queueing_margin=1.0 / tol,
            pooled_prefill=cfg.prefill_queue == "pooled",
        )
        floor = np.maximum(floor, _at_most(np.array(hold, dtype=float), had))
    if window_n > 0:
        for dec in history.decisions[-window_n:]:
            floor = np.maximum(floor, _at_most(np.array(dec.desired, dtype=float), _serving(cfg, dec)))
    # Hysteresis tied to the warm-up: keep what any decision of the last warm-up forecast it
    # would need within a warm-up. A node removed below that is one the forecast's own noise
    # (a recent-max moving by one interval) re-adds minutes later, paying a warm-up for a
    # node the fleet had; the new need must stay below it for a whole warm-up first.
    lead_n = _intervals(model.profile.warmup.new_node_seconds, cfg.interval_seconds)
    if lead_n > 0 and cfg.scale_down_hysteresis:
        for dec in history.decisions[-lead_n:]:
            floor = np.maximum(floor, _at_most(np.array(dec.lead_need, dtype=float), _serving(cfg, dec)))
    floor = np.where(needs.over[0], np.minimum(floor, needs.need[:, 0]), floor)  # budget split wins
    # The window guards against flapping; it is no claim on nodes the other role needs. When
    # a load's shape flips under the budget (the demo's long documents -> agents: 16 prefill
    # held by the window, decode needing 20 of 24 nodes), a held role keeps only what the
    # budget leaves beyond the other's need up to when a node ordered now would serve (and
    # never less than its own need): else the other role's additions wait out the window.
    lead = min(timing.new_node, needs.need.shape[1] - 1)
    other_need = needs.need[::-1, : lead + 1].max(axis=1)
    k = np.array(cfg.nodes_per_instance, dtype=float)  # nodes per instance of each role
    room = np.floor((cfg.nodes - timing.draining - other_need * k[::-1]) / k)
    floor = np.minimum(floor, np.maximum(needs.need[:, 0], room))
    floor = np.minimum(floor, timing.committed0)  # a floor never forces a scale-up
    # ... nor keeps a fleet above a maxReplicas the user has lowered under it
    capped: np.ndarray = np.minimum(floor, [cfg.max_prefill, cfg.max_decode])
    return capped


def _serving(cfg: PlannerConfig, dec: Decision) -> np.ndarray | None:
    """With ``scale_down_served_only``, what the fleet was serving in the interval ``dec``
    planned (its plan's first interval: ready plus the warm-ups landing in it); else None."""
    if not cfg.scale_down_served_only or not dec.plan:
        return None
    return np.array(dec.plan[0], dtype=float)


def _served(cfg: PlannerConfig, history: History, n: int) -> list[np.ndarray | None]:
    """:func:`_serving` for each of the last ``n`` remembered loads, from the decision
    recorded with it (aligned from the end; None for a load remembered without one, as a
    replay's seeded history)."""
    decisions = history.decisions
    out: list[np.ndarray | None] = []
    for i in range(n):
        j = len(decisions) - n + i
        out.append(_serving(cfg, decisions[j]) if j >= 0 else None)
    return out


def _at_most(need: np.ndarray, serving: np.ndarray | None) -> np.ndarray:
    return need if serving is None else np.minimum(need, serving)


# -- the programme ---------------------------------------------------------------------------
# Variables: for role r in (0, 1) and kind in (add, switch-in, remove, short), one per
# interval t, at index (r * 4 + kind) * H + t. Adds, switches and removals are integers;
# shortfalls are continuous.
_ADD, _SW, _REM, _SHORT = 0, 1, 2, 3


_KINDS = 4


def _cols(r: int, kind: int, H: int) -> slice:
    s = (r * _KINDS + kind) * H
    return slice(s, s + H)


def _before(w: int, H: int) -> np.ndarray:
    """[t, tau] = 1 if tau <= t - w: an action at tau has taken effect by t after w intervals."""
    out: np.ndarray = np.tril(np.ones((H, H)), -w) if w < H else np.zeros((H, H))
    return out


def _draining(w: int, H: int) -> np.ndarray:
    """[t, tau] = 1 if t - w < tau <= t: a removal at tau still holds its node while draining."""
    if w <= 0:
        return np.zeros((H, H))
    diff: np.ndarray = _before(0, H) - _before(w, H)
    return diff


def _serving_rows(r: int, H: int, timing: _Timing) -> np.ndarray:
    """(H, nv): change in role r's serving instances at each t (adds after the new-node
    warm-up, switches in after their drain and warm-up, minus removals and switches out)."""
    tri = _before(0, H)
    a = np.zeros((H, 2 * _KINDS * H))
    a[:, _cols(r, _ADD, H)] = _before(timing.new_node, H)
    a[:, _cols(r, _SW, H)] = _before(timing.switch_in[r], H)
    a[:, _cols(r, _REM, H)] = -tri
    a[:, _cols(1 - r, _SW, H)] = -tri  # switched away from r
    return a


def _committed_rows(r: int, H: int) -> np.ndarray:
    """(H, nv): change in role r's committed (ready + warming) instances at each t."""
    tri = _before(0, H)
    a = np.zeros((H, 2 * _KINDS * H))
    a[:, _cols(r, _ADD, H)] = tri
    a[:, _cols(r, _SW, H)] = tri
    a[:, _cols(r, _REM, H)] = -tri
    a[:, _cols(1 - r, _SW, H)] = -tri
    return a


@dataclass(frozen=True)
class _Program:
    """min c @ x  s.t.  lo <= A @ x <= hi,  0 <= x <= ub,  x integral where integrality is 1;
    plus the row blocks that read a solution back (each (H, nv), per role)."""

    c: np.ndarray
    A: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    ub: np.ndarray
    integrality: np.ndarray
    serving: tuple[np.ndarray, np.ndarray]
    committed: tuple[np.ndarray, np.ndarray]
    #: (H, nv): change in provisioned nodes (committed, plus removals while they drain)
    provisioned: np.ndarray
    #: shape (H,): nodes provisioned with no action (the fleet now, its draining nodes)
    base_provisioned: np.ndarray
    #: GPU-hours of one node (a one-node instance) for one interval
    gpu_hours: float


class _Rows:
    """Constraint rows lo <= a @ x <= hi, collected in order."""

    def __init__(self) -> None:
        self.a: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []

    def add(self, a: np.ndarray, lb: np.ndarray | float, ub: np.ndarray | float) -> None:
        self.a.append(a)
        self.lo.append(np.broadcast_to(np.asarray(lb, dtype=float), (a.shape[0],)))
        self.hi.append(np.broadcast_to(np.asarray(ub, dtype=float), (a.shape[0],)))


def _program(cfg: PlannerConfig, needs: _Needs, timing: _Timing, floor: np.ndarray) -> _Program:
    """The MILP over the horizon (see the module docstring): the rows of each role, the
    switch limits, the node budget, then the costs."""
    H = needs.need.shape[1]
    rows = _Rows()
    serving = (_serving_rows(0, H, timing), _serving_rows(1, H, timing))
    committed = (_committed_rows(0, H), _committed_rows(1, H))
    prov = np.zeros((H, 2 * _KINDS * H))  # in nodes: an instance of role r holds k[r]
    k = cfg.nodes_per_instance
    for r in (0, 1):
        _role_rows(rows, cfg, r, needs, timing, floor, serving[r], committed[r])
        prov += committed[r] * float(k[r])
        prov[:, _cols(r, _REM, H)] += _draining(timing.drain_intervals[r], H) * float(k[r])
    _switch_rows(rows, needs, timing, H, same_shape=k[0] == k[1])
    # node budget; existing draining nodes hold theirs for the longest drain
    old_drain = np.where(np.arange(H) < max(timing.drain_intervals), timing.draining, 0)
    base_prov = (timing.committed0 * np.array(k, dtype=float)).sum() + old_drain
    # never force removals to fit a budget that is already exceeded: cap at what exists
    budget = np.maximum(cfg.nodes - base_prov, np.minimum(0.0, 0.0 * base_prov))
    rows.add(prov, -np.inf, budget)
    # GPU-hours of one node for one interval (with groups, the profile's gpus_per_instance
    # is a node's GPUs: PlannerConfig.nodes_per_instance)
    gpu_h = cfg.model.profile.gpus_per_instance * timing.interval / 3600.0
    integrality = np.ones(2 * _KINDS * H)
    for r in (0, 1):
        integrality[_cols(r, _SHORT, H)] = 0
    return _Program(
        c=_costs(cfg, timing, prov, gpu_h, H),
        A=np.vstack(rows.a), lo=np.concatenate(rows.lo), hi=np.concatenate(rows.hi),
        ub=np.full(2 * _KINDS * H, np.inf), integrality=integrality,
        serving=serving, committed=committed, provisioned=prov, base_provisioned=base_prov,
        gpu_hours=gpu_h,
    )


def _role_rows(
    rows: _Rows, cfg: PlannerConfig, r: int, needs: _Needs, timing: _Timing, floor: np.ndarray,
    serving: np.ndarray, committed: np.ndarray,
) -> None:
    """Role r's rows: need met or short, no removal of what is not there, min/max on the
    committed instances, per-interval steps, and the stabilisation floor at t = 0."""
    H = serving.shape[0]
    inf = np.inf
    base_serving = timing.ready[r] + timing.landing[r]
    # serving + short >= need
    a = serving.copy()
    a[:, _cols(r, _SHORT, H)] = np.eye(H)
    rows.add(a, needs.need[r] - base_serving, inf)
    # serving >= 0 (cannot remove more than are there)
    rows.add(serving, -base_serving, inf)
    # min/max on committed
    lim = (cfg.min_prefill, cfg.max_prefill) if r == 0 else (cfg.min_decode, cfg.max_decode)
    # (a fleet outside bounds the user has just moved comes back in as fast as the step
    # limits allow)
    c0 = timing.committed0[r]
    low, ceiling = lim[0] - c0, lim[1] - c0
    if cfg.max_step_up is not None:
        low = np.minimum(low, cfg.max_step_up * np.arange(1, H + 1))
    if cfg.max_step_down is not None:
        ceiling = np.maximum(ceiling, -cfg.max_step_down * np.arange(1, H + 1))
    rows.add(committed, low, ceiling)
    # max steps per interval
    if cfg.max_step_up is not None:
        a = np.zeros_like(serving)
        a[:, _cols(r, _ADD, H)] = np.eye(H)
        a[:, _cols(r, _SW, H)] = np.eye(H)
        rows.add(a, -inf, cfg.max_step_up)
    if cfg.max_step_down is not None:
        a = np.zeros_like(serving)
        a[:, _cols(r, _REM, H)] = np.eye(H)
        a[:, _cols(1 - r, _SW, H)] = np.eye(H)
        rows.add(a, -inf, cfg.max_step_down)
    # stabilisation floor for the first interval
    rows.add(committed[:1], floor[r] - c0, inf)


def _switch_rows(rows: _Rows, needs: _Needs, timing: _Timing, H: int, same_shape: bool = True) -> None:
    """Switch only to fix a lasting imbalance: once new nodes could land, role r still lacks
    nodes that the other role has spare. A transient shortfall already covered by warming
    capacity is no reason to take a node out of service for drain + warm-up. Between roles
    whose instances span different node counts there is no switch (a group of one shape is
    no instance of the other): ``same_shape`` False forbids it."""
    late = min(timing.new_node, H - 1)
    need, committed0 = needs.need, timing.committed0
    for r in (0, 1):
        deficit = float(need[r, late:].max() - committed0[r])
        surplus = float(committed0[1 - r] - need[1 - r, late:].max())
        a = np.zeros((1, 2 * _KINDS * H))
        a[0, _cols(r, _SW, H)] = 1.0
        rows.add(a, -np.inf, max(0.0, min(deficit, surplus)) if same_shape else 0.0)


def _costs(cfg: PlannerConfig, timing: _Timing, prov: np.ndarray, gpu_h: float, H: int) -> np.ndarray:
    """c per variable, in GPU-hours: the provisioned nodes it adds over the horizon, the
    shortfall penalty, the idle time of a switch, and an epsilon on every action."""
    c = np.zeros(2 * _KINDS * H)
    # provisioned-node cost of each variable = column sum of the provisioned rows
    c += gpu_h * prov.sum(axis=0)
    penalty = cfg.shortfall_penalty * gpu_h  # an instance short for one interval vs idle ones
    k = cfg.nodes_per_instance  # a group's shortfall, switch and drain cost all its nodes
    for r in (0, 1):
        c[_cols(r, _SHORT, H)] = penalty * k[r]
        # epsilon on actions: on a tie, do nothing
        c[_cols(r, _ADD, H)] += 0.01 * gpu_h
        # A switched node serves neither role for drain + warm-up: price that idle time again
        # so that a switch is chosen for a lasting shift of the ratio (it saves a new node and
        # keeps the budget), not to chase per-minute noise
        c[_cols(r, _SW, H)] += cfg.role_switch_penalty * timing.switch_in[r] * gpu_h * k[r]
        c[_cols(r, _REM, H)] += 0.01 * gpu_h
        # a removed node still costs its drain: price the fraction of an interval
        frac = timing.drain_seconds[r] / timing.interval
        c[_cols(r, _REM, H)] += gpu_h * max(0.0, frac - timing.drain_intervals[r]) * k[r]
    return c


# -- the result ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Outcome:
    """A solution read back. Arrays of shape (2, H) per role, (H,) for nodes."""

    serve: np.ndarray
    comm: np.ndarray
    short: np.ndarray
    provisioned: np.ndarray
    cost_gpu_hours: float
    #: committed instances for the first interval: the decision
    target: tuple[int, int]
    #: nodes switched now into (prefill, decode)
    switched: tuple[int, int]


def _rounded(x: np.ndarray, H: int) -> np.ndarray:
    """The solver's actions as whole instances: adds and switches up, removals down (never
    fewer instances than the solution asked for); shortfalls stay continuous."""
    x = np.round(x, 6)
    for r in (0, 1):
        for kind in (_ADD, _SW):
            x[_cols(r, kind, H)] = np.ceil(x[_cols(r, kind, H)] - 1e-6)
        x[_cols(r, _REM, H)] = np.floor(x[_cols(r, _REM, H)] + 1e-6)
    return x


def _outcome(program: _Program, timing: _Timing, x: np.ndarray) -> _Outcome:
    """Round the solver's actions to whole instances (adds and switches up, removals down:
    never fewer than the solution asked for) and count what serves, what is committed, what
    is short and what is provisioned per interval."""
    H = timing.landing.shape[1]
    x = _rounded(x, H)
    serve = np.array([timing.ready[r] + timing.landing[r] + program.serving[r] @ x for r in (0, 1)])
    comm = np.array([timing.committed0[r] + program.committed[r] @ x for r in (0, 1)])
    provisioned = program.base_provisioned + program.provisioned @ x
    return _Outcome(
        serve=serve,
        comm=comm,
        short=np.array([x[_cols(r, _SHORT, H)] for r in (0, 1)]),
        provisioned=provisioned,
        cost_gpu_hours=float(program.gpu_hours * provisioned.sum()),
        target=(int(np.rint(comm[0, 0])), int(np.rint(comm[1, 0]))),
        switched=(int(x[_cols(0, _SW, H)][0]), int(x[_cols(1, _SW, H)][0])),
    )


def _solve(
    c: np.ndarray,
    A: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    ub: np.ndarray,
    integrality: np.ndarray,
    time_limit: float,
) -> tuple[np.ndarray | None, str]:
    """LP relaxation first: the constraint rows are cumulative sums over time (interval
    matrices), so the LP optimum is integral in practice and costs a few ms. Only when it is
    not, fall back to branch and bound under a time limit. When that finds no integral plan
    in time (a busy host: the limit is wall time), the relaxation rounded as ``_outcome``
    rounds it, but only if it keeps every row (the node budget first): rounding adds up can
    ask for more nodes than the budget holds, and no plan (the caller holds) is safer."""
    cons = LinearConstraint(A, lo, hi)
    bounds = Bounds(np.zeros(len(c)), ub)
    lp = milp(c, constraints=cons, bounds=bounds)
    if lp.x is None:
        return None, str(lp.message)
    xi = lp.x[integrality > 0]
    if np.all(np.abs(xi - np.round(xi)) < 1e-6):
        return lp.x, "lp"
    res = milp(c, constraints=cons, bounds=bounds, integrality=integrality,
               options={"time_limit": time_limit})
    if res.x is not None:
        return res.x, "milp"
    rounded = _rounded(lp.x, len(c) // (2 * _KINDS))
    ax = A @ rounded
    if np.all(ax >= lo - 1e-6) and np.all(ax <= hi + 1e-6):
        return lp.x, "lp-rounded"
    return None, f"no whole-instance plan within the solver's {time_limit:g} s ({res.message})"
