"""The simulated fleet: instances warming, serving, draining and switching roles.

Every instance ever started keeps its id; its state moves WARMING -> READY -> DRAINING ->
STOPPED (a warm-up can also be cancelled straight to STOPPED), and the seconds it spends in
each state before STOPPED are what a node costs. :func:`reconcile` turns a controller's target
counts into these changes: role switches first (a node whose weights are resident saves the
budget and warm-up of a new one), then drains, then new nodes within the node budget.

The per-instance work (a prefill FIFO's end, a decode batch) lives here too, in parallel lists
indexed by instance id, because draining waits for it and the hot path reads it directly.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from ..observe import Role
from .prefix_index import PrefixIndex

WARMING, READY, DRAINING, STOPPED = 0, 1, 2, 3
#: the accounting key of each state but STOPPED (SimResult.instance_seconds)
STATE_KEYS = ("warming", "ready", "draining")


class Events:
    """The simulation's future as a heap of (time, kind, seq, payload).

    ``seq`` orders events of the same time and kind first-in first-out."""

    #: PASS: a prefill instance's batched pass ends (:mod:`.prefill_batches`); DECODE: a
    #: sequence of a decode batch finishes (:mod:`.decode_batches`)
    READY, ADMIT, RELEASE, PASS, DECODE = 0, 1, 2, 3, 4

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0

    def push(self, at: float, kind: int, payload: int) -> int:
        """Schedule an event; its sequence number (which tells a superseded event apart)."""
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, payload))
        return self.seq


class Fleet:
    """All instances by id, in parallel lists (hot-path friendly), and their accounting."""

    def __init__(self, prefix: PrefixIndex, events: Events, switch_seconds: float, *,
                 nodes_per_instance: tuple[int, int] = (1, 1),
                 prefill_busy_exact: bool = True) -> None:
        self.prefix = prefix
        self.events = events
        #: nodes one instance of each role holds (a group of several nodes counts them all in
        #: the accounting and the budget)
        self.nodes_per = {Role.PREFILL: nodes_per_instance[0], Role.DECODE: nodes_per_instance[1]}
        #: warm-up of an instance coming out of a role switch
        self.switch_seconds = switch_seconds
        self.role: list[Role] = []
        self.state: list[int] = []
        self.ready_at: list[float] = []
        self.since: list[float] = []  # start of the current accounting state
        self.switch_to: list[Role | None] = []  # the role a draining instance comes back as
        self.acc = dict.fromkeys(STATE_KEYS, 0.0)
        self.role_changes = 0
        # prefill work: when each instance's FIFO queue runs empty
        self.busy: list[float] = []
        # requests routed to each prefill instance whose prefill response has not ended (in
        # PD mode it ends after the KV transfer): what smg's prefill admission caps, and what
        # a draining prefill instance waits for before it is released
        self.outstanding: list[int] = []
        #: whether ``busy`` is when each prefill instance's work really ends (the article's
        #: one request at a time), not the router's estimate of it (batched passes)
        self.prefill_busy_exact = prefill_busy_exact
        # requests routed to each prefill instance that have not completed end to end: the
        # router's load of a worker (sgl-router's load guard is held until the response ends,
        # decode included)
        self.inflight: list[int] = []
        # decode work (:mod:`.decode_batches`): each instance's running batch, a heap of
        # (finishing step, request, context offset), and the requests waiting to join it
        self.running: list[list[tuple[float, int, float]]] = []
        self.decode_waiting: list[deque[int]] = []
        # requests the router has sent to each decode instance whose KV has not arrived: a
        # PD router dispatches a request to its prefill and its decode at once, so a decode
        # that drains meanwhile still takes them (its engine waits for what is in flight)
        self.decode_bound: list[int] = []
        # routable instances, ascending ids; the prefill ones also as a bitmask
        self.ready_prefill: list[int] = []
        self.prefill_mask = 0
        self.ready_decode: list[int] = []
        #: called with the time when a decode instance becomes ready (work may wait for one)
        self.on_decode_ready: Callable[[float], None] = lambda now: None

    # -- accounting and counts --------------------------------------------------------------
    def account(self, i: int, now: float) -> None:
        """Charge instance ``i`` its current state up to ``now``, once per node it holds."""
        s = self.state[i]
        if s == STOPPED:
            return
        self.acc[STATE_KEYS[s]] += max(0.0, now - self.since[i]) * self.nodes_per[self.role[i]]
        self.since[i] = now

    def committed(self, role: Role) -> list[int]:
        """Ids of ``role``'s instances that are, or will be, ready (no drain under way)."""
        return [
            i for i, r in enumerate(self.role)
            if r == role and self.state[i] in (WARMING, READY)
        ]

    def switching_to(self, role: Role) -> int:
        """Instances draining to come back as ``role``."""
        return sum(
            1 for i, s in enumerate(self.state) if s == DRAINING and self.switch_to[i] == role
        )

    def provisioned(self, role: Role | None = None) -> int:
        """Instances holding a node (any state but STOPPED), of ``role`` or of both."""
        return sum(
            1 for i, s in enumerate(self.state)
            if s != STOPPED and (role is None or self.role[i] == role)
        )

    def provisioned_nodes(self) -> int:
        """Nodes held by instances in any state but STOPPED."""
        return sum(self.nodes_per[self.role[i]] for i, s in enumerate(self.state) if s != STOPPED)

    # -- state changes ----------------------------------------------------------------------
    def add(self, role: Role, now: float, warm_seconds: float) -> int:
        """Start an instance of ``role`` that is ready after ``warm_seconds``; its id."""
        i = len(self.role)
        self.role.append(role)
        self.state.append(WARMING if warm_seconds > 0 else READY)
        self.ready_at.append(now + warm_seconds)
        self.since.append(now)
        self.switch_to.append(None)
        self.busy.append(now + warm_seconds)
        self.outstanding.append(0)
        self.inflight.append(0)
        self.prefix.add_instance()
        self.running.append([])
        self.decode_waiting.append(deque())
        self.decode_bound.append(0)
        if warm_seconds > 0:
            self.events.push(now + warm_seconds, Events.READY, i)
        else:
            self.make_ready(i, now)
        return i

    def make_ready(self, i: int, now: float) -> None:
        """Instance ``i`` finished warming up: route to it from ``now``."""
        self.account(i, now)
        self.state[i] = READY
        if self.role[i] == Role.PREFILL:
            self.busy[i] = max(self.busy[i], now)
            self.ready_prefill.append(i)
            self.ready_prefill.sort()
            self.prefill_mask |= 1 << i
        else:
            self.ready_decode.append(i)
            self.ready_decode.sort()
            self.on_decode_ready(now)

    def start_drain(self, i: int, now: float, switch: Role | None) -> None:
        """Stop routing to instance ``i``; release (or switch) it when its work is done."""
        self.account(i, now)
        if self.state[i] == WARMING:
            # cancelling a warm-up frees the node at once; the READY event is ignored later
            self.state[i] = STOPPED
            if switch is not None:
                self.add(switch, now, self.switch_seconds)
            return
        self.state[i] = DRAINING
        self.switch_to[i] = switch
        if self.role[i] == Role.PREFILL:
            self.ready_prefill.remove(i)
            self.prefill_mask &= ~(1 << i)
            self.prefix.drop(i)
            if self.outstanding[i]:
                return  # released when its last prefill response ends (the simulator's)
            # nothing in flight: batched passes are all done now, whatever the router
            # estimated; one request at a time, a prompt routed may still be computing
            done = max(self.busy[i], now) if self.prefill_busy_exact else now
        else:
            self.ready_decode.remove(i)
            if self.decode_holds_work(i):
                return  # its batch releases it when the last sequence finishes
            done = now
        self.events.push(done, Events.RELEASE, i)

    def decode_holds_work(self, i: int) -> bool:
        """Whether decode instance ``i`` still has requests: running, waiting, or sent to it
        with their KV still to come (a draining one is released once it has none)."""
        return bool(self.running[i] or self.decode_waiting[i] or self.decode_bound[i])

    def release(self, i: int, now: float) -> None:
        """Drained instance ``i`` frees its node, or comes back in its new role."""
        self.account(i, now)
        self.state[i] = STOPPED
        to = self.switch_to[i]
        if to is not None:
            self.add(to, now, self.switch_seconds)


def victims(fleet: Fleet, ids: list[int], k: int) -> list[int]:
    """The ``k`` of ``ids`` to remove: warm-ups first (nothing served yet, the latest first),
    then the least loaded ready ones."""

    def key(i: int) -> tuple[int, float]:
        if fleet.state[i] == WARMING:
            return (0, -fleet.ready_at[i])
        load = fleet.busy[i] if fleet.role[i] == Role.PREFILL else float(len(fleet.running[i]))
        return (1, load)

    return sorted(ids, key=key)[:k]


def reconcile(
    fleet: Fleet,
    target_prefill: int,
    target_decode: int,
    now: float,
    switches: tuple[int, int] | None,
    *,
    nodes: int,
    new_seconds: float,
) -> None:
    """Move the fleet toward the targets (counts of ready + warming instances per role).

    ``switches`` = (to prefill, to decode): how many changes the controller wants made by
    switching existing nodes; exactly those are made. None: the fleet switches as many as
    one role's excess and the other's shortfall allow (none between roles whose instances
    span different node counts). New instances take ``new_seconds`` to warm and never push
    the provisioned nodes past ``nodes``."""
    cp, cd = fleet.committed(Role.PREFILL), fleet.committed(Role.DECODE)
    # in-flight role switches will land as committed instances of their new role
    dp = target_prefill - (len(cp) + fleet.switching_to(Role.PREFILL))
    dd = target_decode - (len(cd) + fleet.switching_to(Role.DECODE))

    def switch(src: list[int], k: int, to: Role) -> None:
        for i in victims(fleet, src, k):
            fleet.start_drain(i, now, to)
            fleet.role_changes += 1

    # a role switch reuses a node (weights resident) and saves the budget a new node needs
    if switches is not None:
        k = min(switches[0], len(cd))
        switch(cd, k, Role.PREFILL)
        dp, dd = dp - k, dd + k
        k = min(switches[1], len(cp))
        switch(cp, k, Role.DECODE)
        dp, dd = dp + k, dd - k
    elif fleet.nodes_per[Role.PREFILL] != fleet.nodes_per[Role.DECODE]:
        pass  # a group of one shape is no instance of the other: no switch
    elif dp > 0 and dd < 0:
        k = min(dp, -dd)
        switch(cd, k, Role.PREFILL)
        dp, dd = dp - k, dd + k
    elif dd > 0 and dp < 0:
        k = min(dd, -dp)
        switch(cp, k, Role.DECODE)
        dp, dd = dp + k, dd - k
    if dp < 0:
        for i in victims(fleet, fleet.committed(Role.PREFILL), -dp):
            fleet.start_drain(i, now, None)
    if dd < 0:
        for i in victims(fleet, fleet.committed(Role.DECODE), -dd):
            fleet.start_drain(i, now, None)
    room = nodes - fleet.provisioned_nodes()
    kp, kd = fleet.nodes_per[Role.PREFILL], fleet.nodes_per[Role.DECODE]
    for _ in range(max(0, min(dp, room // kp))):
        fleet.add(Role.PREFILL, now, new_seconds)
        room -= kp
    for _ in range(max(0, min(dd, room // kd))):
        fleet.add(Role.DECODE, now, new_seconds)
