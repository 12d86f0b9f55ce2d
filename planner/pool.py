"""One pool of nodes shared by several PDClusters: the joint grant per member, pure.

Each member's own planner says what it needs at its SLO (``need``: the nodes it would
command with no budget, and ``busy``: the nodes its load keeps fully busy, below which its
queue grows without bound). This module divides the pool's free nodes among the members and
says why; each member's planner then plans within its grant as within a ``nodeBudget``.

The rules, in order (the key of a node, compared lexicographically):

1. **Guarantees first.** A member's first ``min(guaranteed, need, cap)`` nodes come before
   any other member's others, higher priority first when even the guarantees do not fit
   (nodes still draining). A guarantee a member does not need is lent to the others; when
   its need returns, it takes them back through their drains (Kueue's nominal quota with
   borrowing and reclaim).
2. **Then by priority**: every node of a higher-priority member before any of a lower one
   (PriorityClass semantics: the lowest priority gives up nodes first).
3. **Within a priority, by marginal SLO value per node**: nodes up to the member's fluid
   demand (``busy``) before nodes of margin (queueing, bursts) up to its need, before nodes
   its scale-down window holds beyond its need (``target``); within each of those
   tiers the member furthest from its need first (value ``1 - filled share``), a node new to
   the member discounted by its cold start over the horizon (``1 - warmup / horizon``). A node
   moving from model A to model B pays B's cold start, so it moves only when B's value of a
   warm node after the cold start exceeds A's value of the node it keeps; with needs
   unchanged, every member keeps what it holds (no churn).
4. Never beyond a member's ``need`` (or ``target``) nor its cap (its ``nodeBudget``), never more in total
   than the pool less the nodes still draining.
5. **Surplus is priced** (``surplus_price``, 0 by default: off). Beyond a member's fair share
   (its even share of the pool), its fluid demand and its guarantee, a node is granted only
   while its value per node (the key's: its rank in the need, a new node's cold start priced)
   is at least the price; the first one below it ends the member's list, and the nodes it
   leaves stay idle (``Grant.priced_out``), not handed to its planner as budget. Idle nodes
   cost node-hours; a node whose value is below the price is not worth them.

The objective is separable with one capacity row, and each member's keys do not increase
with its node count (tiers, filled share and the cold-start discount only fall), so taking
the best keys one node at a time (a K-way merge) is the optimum of the integer programme that
maximises any value increasing in the key; ``tests/planner/test_pool.py`` checks it against
``scipy.optimize.milp``. It runs in O(pool x log members): 10 members over 2,000 nodes in
tens of milliseconds (bench/planner_bench.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from .config import PlannerConfig
from .decision import Decision
from .history import History
from .observe import Observation
from .solve import current_load

#: guarantee nodes, then the rest
_GUARANTEE, _REST = 1, 0
#: within the rest: nodes up to the fluid demand, then margin up to the need, then nodes the
#: member's scale-down window holds beyond its need
_BUSY, _MARGIN, _HOLD = 2, 1, 0


@dataclass(frozen=True)
class MemberNeed:
    """One member's state and need this interval, in nodes (an instance of ``k`` nodes counts
    ``k``). Per-role pairs are (prefill, decode)."""

    name: str
    #: higher wins (a PriorityClass value); members of equal priority share by value per node
    priority: int
    #: nodes the member gets before any other's non-guaranteed ones, while it needs them
    guaranteed_nodes: int
    #: the nodes its own planner says it needs with no budget, per role (the most it forecasts
    #: within one warm-up: ``Decision.lead_need``)
    need_nodes: tuple[int, int]
    #: the nodes its load keeps 100% busy (fluid demand), per role; fractional
    busy_nodes: tuple[float, float] = (0.0, 0.0)
    #: committed nodes now (ready + warming), per role
    current_nodes: tuple[int, int] = (0, 0)
    #: nodes still draining (they hold their node until the drain ends)
    draining_nodes: int = 0
    #: seconds a node new to this member takes to serve, per role (the profile's new node)
    warmup_seconds: tuple[float, float] = (0.0, 0.0)
    #: the member's own cap (its ``nodeBudget``); None: the pool
    cap_nodes: int | None = None
    #: what its planner commands with no budget, per role, where more than its need: the
    #: nodes its scale-down window holds against flapping (None: the need)
    target_nodes: tuple[int, int] | None = None

    @property
    def need(self) -> int:
        return int(sum(self.need_nodes))

    @property
    def wants(self) -> int:
        """The need, or the target where larger (nodes held by the scale-down window)."""
        return max(self.need, int(sum(self.target_nodes)) if self.target_nodes else 0)

    @property
    def current(self) -> int:
        return int(sum(self.current_nodes))

    @property
    def busy(self) -> int:
        """Whole nodes of fluid demand, at most the need."""
        return min(self.need, sum(math.ceil(b - 1e-9) for b in self.busy_nodes))

    @property
    def cold_start_seconds(self) -> float:
        """The warm-up of the role a new node would join: the one short of its need by the
        most nodes (decode on a tie); with no role short, the slower one."""
        short = [n - c for n, c in zip(self.need_nodes, self.current_nodes, strict=True)]
        if max(short) <= 0:
            return float(max(self.warmup_seconds))
        return float(self.warmup_seconds[0] if short[0] > short[1] else self.warmup_seconds[1])


@dataclass(frozen=True)
class Grant:
    """What one member was granted and why."""

    name: str
    #: nodes the member is granted (ready + warming): where the pool is going
    nodes: int
    need: int
    current: int
    #: of ``nodes``: under the guarantee, up to the fluid demand, of margin
    guaranteed: int
    busy: int
    margin: int
    reason: str
    #: of ``nodes``: held by its scale-down window beyond its need
    held: int = 0
    #: nodes it may hold this interval: its grant, but a gain only as far as nodes are free
    #: now (the rest waits for the nodes other members give up to drain: a pod started
    #: earlier would be Pending for want of a node)
    holdable: int = -1
    #: nodes it wanted beyond its fair share that were not worth the pool's surplus price
    priced_out: int = 0

    def __post_init__(self) -> None:
        if self.holdable < 0:
            object.__setattr__(self, "holdable", self.nodes)

    @property
    def trimmed(self) -> int:
        """Nodes the member must give up (through its drains)."""
        return max(0, self.current - self.nodes)


@dataclass(frozen=True)
class PoolDecision:
    """The pool's split for one interval."""

    pool_nodes: int
    draining_nodes: int
    grants: tuple[Grant, ...]
    #: nodes no member needs (free for the next interval's needs)
    free_nodes: int
    explanation: str
    #: nodes free now (neither held nor draining) that no grant takes this interval
    idle_nodes_now: int = 0

    def grant(self, name: str) -> Grant:
        for g in self.grants:
            if g.name == name:
                return g
        raise KeyError(name)


def _check(members: Sequence[MemberNeed], pool_nodes: int, horizon_seconds: float) -> None:
    if pool_nodes < 0:
        raise ValueError(f"pool_nodes must be >= 0, got {pool_nodes}")
    if not horizon_seconds > 0:
        raise ValueError(f"horizon_seconds must be > 0, got {horizon_seconds}")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"members: names must be unique, got {names}")
    for m in members:
        if m.guaranteed_nodes < 0 or m.draining_nodes < 0 or min(m.need_nodes) < 0 \
                or min(m.current_nodes) < 0:
            raise ValueError(f"member {m.name}: node counts must be >= 0")
        if m.cap_nodes is not None and m.cap_nodes < 0:
            raise ValueError(f"member {m.name}: cap_nodes must be >= 0")
    guaranteed = sum(m.guaranteed_nodes for m in members)
    if guaranteed > pool_nodes:
        raise ValueError(f"members' guaranteed_nodes sum to {guaranteed}, more than the pool's "
                         f"{pool_nodes} nodes")


def _upper(m: MemberNeed, pool_nodes: int) -> int:
    cap = pool_nodes if m.cap_nodes is None else min(m.cap_nodes, pool_nodes)
    return max(0, min(m.wants, cap))


def node_keys(m: MemberNeed, pool_nodes: int, horizon_seconds: float, *,
              fair_nodes: int | None = None,
              surplus_price: float = 0.0) -> list[tuple[int, int, int, float, int]]:
    """The key of each node the member could be granted, its 1st node first: (guarantee?,
    priority, tier, value, kept?). Non-increasing (see the module docstring).

    Beyond ``fair_nodes`` (its fair share) and its fluid demand, a node is surplus: the list
    ends at the first whose value is below ``surplus_price`` (it is not worth a node-hour)."""
    upper = _upper(m, pool_nodes)
    need = min(m.need, upper)
    guaranteed = min(m.guaranteed_nodes, need)
    busy = min(m.busy, need)
    discount = max(0.0, 1.0 - m.cold_start_seconds / horizon_seconds)
    free_up_to = max(busy, guaranteed, upper if fair_nodes is None else fair_nodes)
    keys = []
    for j in range(1, upper + 1):
        kept = 1 if j <= m.current else 0
        # tier by position in the need; the value falls with the share of the tier filled
        if j <= busy:
            tier, filled = _BUSY, (j - 1) / busy
        elif j <= need:
            tier, filled = _MARGIN, (j - 1 - busy) / max(1, need - busy)
        else:
            tier, filled = _HOLD, (j - 1 - need) / max(1, upper - need)
        value = (1.0 - filled) * (1.0 if kept else discount)
        if j > free_up_to and value < surplus_price:
            break  # surplus not worth its node-hours; the later ones rank no higher
        keys.append((_GUARANTEE if j <= guaranteed else _REST, m.priority, tier, value, kept))
    return keys


def _merge(keyed: list[list[tuple[int, int, int, float, int]]]) -> Iterator[int]:
    """Member indices in the order their next node is granted (best key first; ties to the
    member listed first, so the result is deterministic)."""
    heap = [(_neg(keys[0]), i, 0) for i, keys in enumerate(keyed) if keys]
    heapq.heapify(heap)
    while heap:
        _, i, j = heapq.heappop(heap)
        yield i
        if j + 1 < len(keyed[i]):
            heapq.heappush(heap, (_neg(keyed[i][j + 1]), i, j + 1))


def _neg(key: tuple[int, int, int, float, int]) -> tuple[int, int, int, float, int]:
    return (-key[0], -key[1], -key[2], -key[3], -key[4])


def solve_pool(
    members: Sequence[MemberNeed], *, pool_nodes: int, horizon_seconds: float = 1800.0,
    surplus_price: float = 0.0,
) -> PoolDecision:
    """Grant each member nodes of the pool for the next interval (see the module docstring).

    ``horizon_seconds`` is how long a moved node is expected to serve its new member: its
    cold start costs ``warmup / horizon`` of its value. The nodes still draining (every
    member's ``draining_nodes``) are not free: the grants sum to at most ``pool_nodes`` less
    them.

    Examples
    --------
    >>> a = MemberNeed("chat", priority=100, guaranteed_nodes=4, need_nodes=(4, 12))
    >>> b = MemberNeed("docs", priority=10, guaranteed_nodes=4, need_nodes=(14, 2))
    >>> d = solve_pool([a, b], pool_nodes=24)
    >>> d.grant("chat").nodes, d.grant("docs").nodes
    (16, 8)
    """
    _check(members, pool_nodes, horizon_seconds)
    if not 0.0 <= surplus_price <= 1.0:
        raise ValueError(f"surplus_price must be within [0, 1], got {surplus_price}")
    draining = sum(m.draining_nodes for m in members)
    capacity = max(0, pool_nodes - draining)
    fair = even_split([m.name for m in members], pool_nodes)
    keyed = [node_keys(m, pool_nodes, horizon_seconds, fair_nodes=fair[m.name],
                       surplus_price=surplus_price) for m in members]
    taken = [0] * len(members)
    for n, i in enumerate(_merge(keyed)):
        if n >= capacity:
            break
        taken[i] += 1
    grants = tuple(_grant(m, t, keyed[i], pool_nodes, capacity, sum(taken), fair[m.name],
                          surplus_price)
                   for i, (m, t) in enumerate(zip(members, taken, strict=True)))
    # Gains start now only on nodes free now; the rest once the trimmed nodes have drained
    # (a later interval's grant), highest priority first
    free_now = max(0, capacity - sum(m.current for m in members))
    order = sorted(range(len(members)), key=lambda i: -members[i].priority)
    holdable = [g.nodes for g in grants]
    for i in order:
        gain = grants[i].nodes - members[i].current
        if gain > 0:
            now = min(gain, free_now)
            free_now -= now
            holdable[i] = members[i].current + now
    grants = tuple(g if h == g.nodes else replace(
        g, holdable=h, reason=f"{g.reason}; {g.nodes - h} of them wait for nodes to drain")
        for g, h in zip(grants, holdable, strict=True))
    free = capacity - sum(taken)
    short = [g.name for g, m in zip(grants, members, strict=True) if g.nodes < _upper(m, pool_nodes)]
    explanation = (f"pool {pool_nodes} nodes, {draining} draining: granted "
                   + ", ".join(f"{g.name} {g.nodes}/{g.need}" for g in grants)
                   + f"; {free} free"
                   + (f"; short: {', '.join(short)}" if short else ""))
    return PoolDecision(pool_nodes=pool_nodes, draining_nodes=draining, grants=grants,
                        free_nodes=free, explanation=explanation, idle_nodes_now=free_now)


def _grant(m: MemberNeed, taken: int, keys: list[tuple[int, int, int, float, int]],
           pool_nodes: int, capacity: int, granted_total: int, fair: int = 0,
           price: float = 0.0) -> Grant:
    mine = keys[:taken]
    guaranteed = sum(1 for k in mine if k[0] == _GUARANTEE)
    busy = sum(1 for k in mine if k[0] == _REST and k[2] == _BUSY)
    held = sum(1 for k in mine if k[0] == _REST and k[2] == _HOLD)
    margin = taken - guaranteed - busy - held
    upper = _upper(m, pool_nodes)
    priced = upper - len(keys) if taken == len(keys) else 0
    parts = []
    if taken >= m.wants:
        parts.append(f"granted all {m.wants} nodes wanted" if m.wants > m.need
                     else f"granted all {m.need} nodes needed")
    elif taken >= m.need:
        parts.append(f"granted the {m.need} nodes needed, {taken - m.need} of the "
                     f"{m.wants - m.need} more its scale-down window holds")
        if priced:
            parts.append(f"{priced} more not worth their node-hours beyond its fair share of "
                         f"{fair} (value per node below the pool's price {price:g})")
    else:
        parts.append(f"granted {taken} of {m.need} nodes needed")
        if upper < m.need:
            parts.append(f"capped at its nodeBudget {m.cap_nodes}")
        if priced:
            parts.append(f"{priced} more not worth their node-hours beyond its fair share of "
                         f"{fair} (value per node below the pool's price {price:g})")
        elif taken < upper:
            parts.append("the pool is full" + (
                " (even the guarantees wait for drains)" if granted_total >= capacity
                and guaranteed < min(m.guaranteed_nodes, upper) else
                ": members of higher priority or of more value per node hold the rest"))
    parts.append(f"priority {m.priority}, {guaranteed} under its guarantee of "
                 f"{m.guaranteed_nodes}, {busy} more to its fluid demand, {margin} of margin"
                 + (f", {held} held by its scale-down window" if held else ""))
    if taken < m.current:
        parts.append(f"gives up {m.current - taken} of the {m.current} it holds through drains")
    elif taken > m.current:
        parts.append(f"{taken - m.current} new, cold start {m.cold_start_seconds:g} s")
    return Grant(name=m.name, nodes=taken, need=m.need, current=m.current, guaranteed=guaranteed,
                 busy=busy, margin=margin, held=held, reason="; ".join(parts), priced_out=priced)


def member_budgets(decision: PoolDecision, members: Sequence[MemberNeed] = ()) -> dict[str, int]:
    """Each member's node budget for its own planner this interval: what it may hold now
    (``Grant.holdable``) plus an even share of the nodes free now that no grant takes (so
    that its programme, which plans the whole horizon within its budget, is not squeezed to
    exactly today's need). What the members then hold, with the nodes draining (those held
    now and those the trims start), never exceeds the pool; none exceeds its cap
    (``members``' ``cap_nodes``)."""
    n = len(decision.grants)
    extra = decision.idle_nodes_now // n if n else 0
    caps = {m.name: m.cap_nodes for m in members if m.cap_nodes is not None}
    # a member whose surplus was priced out gets none of the idle nodes (its planner would
    # take them: they are the nodes the price left idle)
    return {g.name: min(g.holdable + (0 if g.priced_out else extra),
                        caps.get(g.name, g.holdable + extra))
            for g in decision.grants}


def even_split(names: Sequence[str], pool_nodes: int) -> dict[str, int]:
    """The static split the pool is compared with: the pool's nodes in equal whole shares,
    the remainder to the members listed first."""
    n = len(names)
    base, rest = divmod(pool_nodes, n) if n else (0, 0)
    return {name: base + (1 if i < rest else 0) for i, name in enumerate(names)}


def trim_to_budget(target: tuple[int, int], budget_nodes: int, split: tuple[int, int], *,
                   nodes_per_instance: tuple[int, int] = (1, 1),
                   minimum: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """A member's (prefill, decode) target cut to ``budget_nodes``, one instance at a time:
    first from the role furthest above ``split`` (its planner's own split of that budget:
    ``Decision.desired`` when planned within it), then from the role with more nodes above its
    minimum; never below the minima. The planner's target is not cut in proportion: a role
    its scale-down window holds above its need would keep its surplus while the other role,
    at its need, lost an instance (11P3D cut to 11P2D on a budget of 13 where the split is
    9P3D)."""
    p, d = target
    kp, kd = nodes_per_instance
    while p * kp + d * kd > budget_nodes:
        above_p, above_d = (p - split[0]) * kp, (d - split[1]) * kd
        room_p, room_d = (p - minimum[0]) * kp, (d - minimum[1]) * kd
        if max(above_p, above_d) > 0:
            cut_prefill = above_p >= above_d
        elif max(room_p, room_d) > 0:
            cut_prefill = room_p >= room_d
        else:
            break  # the minima exceed the budget: they win, as in the planner's clamp
        can_p, can_d = p > minimum[0], d > minimum[1]
        if not (can_p or can_d):
            break  # the minima exceed the budget: they win, as in the planner's clamp
        if (cut_prefill and can_p) or not can_d:
            p -= 1
        else:
            d -= 1
    return p, d


def admit_within(target: tuple[int, int], current: tuple[int, int], budget_nodes: int, *,
                 nodes_per_instance: tuple[int, int] = (1, 1),
                 switches: tuple[int, int] = (0, 0),
                 role_switch: bool = True) -> tuple[tuple[int, int], tuple[int, int]]:
    """A member's target and switches with its additions cut so that what it holds once the
    command is applied (every instance kept, added or still draining out of a role: the
    larger of target and current per role, a switch counted once) stays within
    ``budget_nodes``, or within what it holds now if that is more. A node one role gives up
    is not free for the other until it has drained: added at once, it would hold a node the
    pool does not have (on a cluster, a pod Pending for want of a node). Where the roles'
    instances span the same nodes, such an addition becomes a role switch of the node given
    up (reused once drained); else it comes at a later interval, after the drain.

    ``role_switch=False``: the fleet cannot reuse a draining node for the other role (the
    operator scales each role's Deployment: the new pod is created at once, and would wait
    for the node): no switch is counted, an addition waits for the drain."""
    kp, kd = nodes_per_instance
    p, d = target
    sp, sd = switches if role_switch else (0, 0)
    same_shape = kp == kd and role_switch

    def held() -> int:
        switched = sp * kp if same_shape else 0
        switched += sd * kd if same_shape else 0
        return max(p, current[0]) * kp + max(d, current[1]) * kd - switched

    bound = max(budget_nodes, current[0] * kp + current[1] * kd)
    while held() > bound:
        grow_d = d > current[1] and (d - current[1]) * kd >= (p - current[0]) * kp
        if not grow_d and not p > current[0]:
            break
        # an addition beside a removal of the other role becomes a role switch (the node is
        # reused once drained: no more nodes held) where the shapes match; else it waits
        if same_shape and grow_d and current[0] - p > sd and d - current[1] > sd:
            sd += 1
        elif same_shape and not grow_d and current[1] - d > sp and p - current[0] > sp:
            sp += 1
        elif grow_d:
            d -= 1
            sd = min(sd, max(0, d - current[1]))
        else:
            p -= 1
            sp = min(sp, max(0, p - current[0]))
    return (p, d), (sp, sd)


#: one member's own planner run on a configuration and a memory (``solve.step`` on the
#: member's observation at the tick's time; the replay's oracle also passes its known future)
Stepper = Callable[[PlannerConfig, History], tuple[Decision, History]]


@dataclass(frozen=True)
class MemberProbe:
    """What a member states before the joint grant: its need, and what its planner would
    command alone within its cap (with the memory that plan leaves)."""

    need: MemberNeed
    alone: Decision
    alone_history: History


def member_need(name: str, obs: Observation, *, config: PlannerConfig, history: History,
                stepper: Stepper, priority: int, guaranteed_nodes: int,
                cap_nodes: int) -> MemberProbe:
    """A member's need for the joint grant (pure): its own planner's command with no budget
    but its cap (``cap_nodes``: its ``nodeBudget``, at most the pool), the nodes its load keeps
    fully busy (the model's fluid demand), and what it holds (ready and warming) and drains.

    The need is its command, the nodes its scale-down window holds included: stated apart,
    below the others' margin, those nodes moved between members and cost more than they saved
    (bench/pool_bench.py, equal priorities on 28 nodes: 0.927 attainment against 0.948)."""
    kp, kd = config.nodes_per_instance
    alone, alone_history = stepper(replace(config, nodes=cap_nodes), history)
    load = current_load(obs, config.max_age_seconds)
    fluid = config.model.fluid_demand(load, config.slo) if load is not None else (0.0, 0.0)
    busy = tuple(f if math.isfinite(f) else 0.0 for f in fluid)
    warm = config.model.profile.warmup.new_node_seconds
    need = MemberNeed(
        name, priority=priority, guaranteed_nodes=guaranteed_nodes,
        need_nodes=(alone.prefill * kp, alone.decode * kd),
        busy_nodes=(busy[0] * kp, busy[1] * kd),
        current_nodes=((obs.prefill.ready + len(obs.prefill.warming)) * kp,
                       (obs.decode.ready + len(obs.decode.warming)) * kd),
        draining_nodes=obs.prefill.draining * kp + obs.decode.draining * kd,
        warmup_seconds=(warm, warm), cap_nodes=cap_nodes)
    return MemberProbe(need=need, alone=alone, alone_history=alone_history)


def member_command(probe: MemberProbe, decision: PoolDecision, *, config: PlannerConfig,
                   history: History, stepper: Stepper,
                   role_switch: bool = True) -> tuple[Decision, History, int]:
    """A member's command within its grant (pure): (the command, the memory its planner
    leaves, its budget this interval in nodes).

    Its budget is ``member_budgets``'. Where what it would command alone fits its budget, or
    its guarantee as granted, that is the command (and its memory: guaranteed nodes still
    draining out of a borrower are added once free, and meanwhile its planner remembers
    asking for them, as on a static split); else its planner plans again within the budget
    (from its memory before the probe) for its own split of it, and the command is what it
    wanted alone, trimmed toward that split (``trim_to_budget``). Either way its additions are
    cut to what it may hold now (``admit_within``: a node another member or role gives up is
    not free until drained). The command's explanation ends with the grant's reason; the
    memory's last decision is the planner's own (the command is the pool's cut of it)."""
    name = probe.need.name
    kp, kd = config.nodes_per_instance
    budget = member_budgets(decision, [probe.need])[name]
    grant = decision.grant(name)
    current = probe.need.current_nodes
    now = (current[0] // kp, current[1] // kd)
    alone = probe.alone
    # What it would command alone fits its guarantee (and its grant): that is its plan, and
    # its memory, even where nodes of the guarantee are not free yet (lent, and draining out
    # of a borrower): its additions wait for them below, and its scale-down window holds
    # what it asked for, as on a static split. Not beyond the guarantee: a member that
    # remembered every borrowing it asked for held the others' nodes for its whole window
    # (replay, two members offset in time on 12 nodes: 0.828 against 0.879 attainment)
    reclaim = min(grant.nodes, probe.need.guaranteed_nodes)
    if alone.prefill * kp + alone.decode * kd <= max(budget, reclaim):
        base, memory = alone, probe.alone_history
        (p, d), (sp, sd) = admit_within(
            (alone.prefill, alone.decode), now, budget, nodes_per_instance=(kp, kd),
            switches=(alone.switch_to_prefill, alone.switch_to_decode), role_switch=role_switch)
    else:
        within, memory = stepper(replace(config, nodes=budget + probe.need.draining_nodes),
                                 history)
        base = within
        p, d = trim_to_budget((alone.prefill, alone.decode), max(budget, 0), within.desired,
                              nodes_per_instance=(kp, kd),
                              minimum=(config.min_prefill, config.min_decode))
        (p, d), (sp, sd) = admit_within((p, d), now, budget, nodes_per_instance=(kp, kd),
                                        role_switch=role_switch)
    command = replace(base, prefill=p, decode=d, switch_to_prefill=sp, switch_to_decode=sd,
                      explanation=f"{base.explanation}; pool: {grant.reason}")
    return command, memory, budget
