"""The fleet as the operator sees it: pods per role, by state, and the ordered steps that move
it to the planner's target without dropping a request. Pure: pods in, actions out.

Every piece of actuation state lives on the pods themselves (the draining annotation and the
deletion cost), so the loop is level-based: an operator restarted mid-drain reads the same
pods and finishes the same drain.

The release order (control-plane article, rule 6) made concrete, for one instance leaving:

1. mark it draining (annotation) and give it the lowest pod-deletion-cost;
2. the router sync drops it from the router's worker list (draining pods are never workers);
3. wait until its engine reports no request in flight (or the drain timeout passes); a decode
   behind vllm-router also waits until no request held at a prefill can still be sent to it
   (``awaited_by_prefill``; the drain timeout passes this too); a prefill also waits until
   the KV it computed has left for its decodes (``handoff_wait``: SGLang without
   ``/v1/loads``, vLLM NIXL; the drain timeout passes this too);
4. lower the Deployment's replicas by one: the ReplicaSet removes the pod with the lowest
   deletion cost, which is exactly this one, because every other pod of the role is Ready
   (the ReplicaSet removes not-ready pods before looking at deletion costs, so a drain is not
   finished while another pod of the role is still warming up). With another drain of the
   role still going, the drained pod first gets a lower cost still (``mark_drained``) and the
   replicas drop on a later tick, once that cost is seen: between equal costs the ReplicaSet
   removes the newest pod, which may be the one still draining.

Warming pods are removed before any Ready pod is drained: they hold no request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdscale.operator.api.clock import epoch_seconds
from pdscale.operator.api.names import DELETION_COST_ANNOTATION, DRAINING_ANNOTATION
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.clients.routersync import WorkerSpec
from pdscale.operator.render import lws
from pdscale.planner.observe import Role, RoleState, Warming

#: deletion cost of a pod being drained: lower than any default (0) so the ReplicaSet picks it
DRAINING_DELETION_COST = -1000
#: deletion cost of a drained pod while another pod of its role still drains: lower still, so
#: the ReplicaSet removes the drained one and not the other
DRAINED_DELETION_COST = -2000
#: the start of a drain whose annotation cannot be read: long ago, so the drain has timed out
#: (see ``drain_started_at``)
DRAIN_START_UNREADABLE = -math.inf


@dataclass(frozen=True)
class PodView:
    """What the loop needs of one engine pod. Times in seconds on the operator's clock."""

    name: str
    role: str
    ip: str | None
    ready: bool
    created_at_seconds: float
    ready_since_seconds: float | None = None
    deleting: bool = False
    draining_since_seconds: float | None = None
    #: requests running or queued on the engine; None = unknown (engine did not answer)
    in_flight: int | None = None
    #: some router still lists this pod as a worker (or could not be asked)
    in_router: bool = False
    #: a decode that requests still at a prefill engine may be sent to (vllm-router picks the
    #: decode when a request arrives, and calls it once the prefill answers)
    awaited_by_prefill: bool = False
    #: why KV this idle prefill computed may still be on its way to a decode (None: nothing
    #: known to be); see drain.HandoffWaits
    handoff_wait: str | None = None
    #: its deletion cost is ``DRAINED_DELETION_COST``: the drain is over, the pod is next to go
    drained: bool = False
    #: an LWS group's leader: the group's index (LWS removes the highest first); None for a
    #: Deployment's pod
    group_index: int | None = None

    @property
    def draining(self) -> bool:
        return self.draining_since_seconds is not None

    @property
    def serving(self) -> bool:
        """Ready, not leaving: the router may send it work."""
        return self.ready and not self.draining and not self.deleting


def drain_started_at(annotation: object) -> float | None:
    """The drain's start (epoch seconds) from a pod's draining annotation; None: not draining.

    An annotation that is not a finite, non-negative number of seconds ("nan", "inf", "-inf",
    "-5", "soon") reads as a drain that started long ago and has timed out
    (``DRAIN_START_UNREADABLE``), never as one that never times out. Not as "started now":
    the annotation is the drain's only record, read afresh every tick, so "now" would be now
    at every tick, a drain without end unless the read rewrote the mark. A timed-out drain
    still waits for the router to let the pod go (rule 6) and for warming pods; only requests
    still in flight on a pod already out of the router may be cut, which is what the drain
    timeout accepts anyway. (A start ahead of the clock: ``drain_timed_out``.)"""
    if annotation is None or annotation == "":
        return None
    try:
        since = float(str(annotation))
    except ValueError:
        return DRAIN_START_UNREADABLE
    return since if math.isfinite(since) and since >= 0 else DRAIN_START_UNREADABLE


def drain_timed_out(since: float | None, now_seconds: float, timeout_seconds: float) -> bool:
    """A drain started at ``since`` has run its time out. A start more than a timeout ahead
    of this clock was not written by a clock near it: timed out as well (a start a little
    ahead waits at most two timeouts)."""
    if since is None:
        return False
    return now_seconds - since >= timeout_seconds or since - now_seconds > timeout_seconds


def pod_view(pod: Mapping[str, Any], role: str) -> PodView:
    """What the loop needs of one pod as the API lists it (a plain dict). A field the API
    has not filled yet reads as its absence: no IP yet, not Ready, no creation time (0, so a
    warming pod counts as due now), not deleting, not draining."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready_cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    ready = ready_cond is not None and ready_cond.get("status") == "True"
    annotations = meta.get("annotations") or {}
    draining = annotations.get(DRAINING_ANNOTATION)
    return PodView(
        name=str(meta.get("name", "")),
        role=role,
        ip=status.get("podIP") or None,
        ready=ready,
        created_at_seconds=epoch_seconds(meta.get("creationTimestamp")) or 0.0,
        ready_since_seconds=(epoch_seconds(ready_cond.get("lastTransitionTime"))
                             if ready and ready_cond is not None else None),
        deleting=meta.get("deletionTimestamp") is not None,
        draining_since_seconds=drain_started_at(draining),
        drained=draining is not None
        and annotations.get(DELETION_COST_ANNOTATION) == str(DRAINED_DELETION_COST),
        group_index=_group_index(meta),
    )


def _group_index(meta: Mapping[str, Any]) -> int | None:
    text = str((meta.get("labels") or {}).get(lws.LABEL_GROUP_INDEX, ""))
    return int(text) if text.isdigit() else None


def role_state(pods: Sequence[PodView], now_seconds: float, warmup_seconds: float, *,
               readings_seconds: float, ordered: int | None = None) -> RoleState:
    """Counts by state for the planner. A warming pod is expected to serve ``warmup_seconds``
    after its creation (and not before now: an overdue pod is about to be ready). A pod Ready
    within the metrics' window (``readings_seconds``) is recently ready: its first passes,
    cold, are in this interval's readings, which calibration then does not learn from (the
    replay counts them over the same span).

    ``ordered``: the replicas the role's child asks for (None: not known). Those its
    controller has not created a pod for yet are warming from now: ordered, not absent (read
    between a Deployment's scale-up and its ReplicaSet's pods, a first plan holding what it
    reads held a 1P2D at 1P1D)."""
    live = [p for p in pods if not p.deleting]
    unmade = 0 if ordered is None else max(0, ordered - len(live))
    warming = tuple(
        Warming(ready_at_seconds=max(now_seconds, p.created_at_seconds + warmup_seconds))
        for p in live
        if not p.ready and not p.draining
    ) + (Warming(ready_at_seconds=now_seconds + warmup_seconds),) * unmade
    ready = [p for p in live if p.serving]
    recent = sum(
        1 for p in ready
        if p.ready_since_seconds is not None
        and now_seconds - p.ready_since_seconds < readings_seconds
    )
    draining = sum(1 for p in pods if p.draining or p.deleting)
    return RoleState(ready=len(ready), warming=warming, draining=draining, recently_ready=recent)


@dataclass(frozen=True)
class RoleActions:
    """What to do for one role this tick, in this order."""

    role: str
    #: pods to un-mark (a drain cancelled because the target rose again)
    undrain: tuple[str, ...] = ()
    #: pods to mark draining (annotation + deletion cost), then drop from the router
    start_drain: tuple[str, ...] = ()
    #: drained pods to give the lowest deletion cost (``DRAINED_DELETION_COST``) before the
    #: replicas drop, because another pod of the role still drains
    mark_drained: tuple[str, ...] = ()
    #: drained pods the replicas change below removes (their deletion cost is already lowest)
    finish_drain: tuple[str, ...] = ()
    #: the Deployment's replicas after this tick (None = leave as is)
    replicas: int | None = None
    #: why anything is waiting (for status and Events)
    waiting: tuple[str, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return bool(self.undrain or self.start_drain or self.mark_drained or self.finish_drain
                    or self.replicas is not None)


def drain_hold(p: PodView, now_seconds: float, drain_timeout_seconds: float) -> str | None:
    """Why the draining pod ``p`` may not be removed yet, as far as it alone goes (None: it
    may), in the release order: out of the router (not even the drain timeout overrides
    that), no request that may still be sent to it, nothing in flight, no KV on its way to a
    decode; the drain timeout passes the last three."""
    if p.in_router:
        return f"{p.name} drains; still listed by the router"
    timed_out = drain_timed_out(p.draining_since_seconds, now_seconds, drain_timeout_seconds)
    if timed_out:
        return None
    if p.awaited_by_prefill:
        return f"{p.name} drains; requests queued at prefill may still be sent to it"
    if p.in_flight != 0:
        return f"{p.name} drains ({p.in_flight if p.in_flight is not None else 'unknown'} in flight)"
    if p.handoff_wait:
        return f"{p.name} drains; {p.handoff_wait}"
    return None


def removable_first(draining: Sequence[PodView], finish: list[str]
                    ) -> tuple[list[str], list[str], list[str]]:
    """(pods to remove now, pods to mark drained first, why waiting) for the drained pods
    ``finish`` among the ``draining`` ones. The ReplicaSet removes not-ready pods first, then
    the lowest deletion cost, then the newest: the pods removed must rank strictly below every
    pod still draining, or it may remove one of those instead. (A drain cancelled this tick
    keeps its cost until the ReplicaSet sees the patch, so it counts as still draining.)"""
    going = set(finish)
    still_draining = [p for p in draining if p.name not in going]
    if not finish or not still_draining:
        return finish, [], []
    unmarked = [p.name for p in draining if p.name in going and not p.drained]
    ahead = [p.name for p in still_draining if p.drained or not p.ready]
    if not unmarked and not ahead:
        return finish, [], []
    waiting = [f"{n} drained; waits until the ReplicaSet sees it is next to go" for n in unmarked]
    waiting += [f"{', '.join(finish)} drained; the ReplicaSet would remove {n} first" for n in ahead]
    return [], unmarked, waiting


def plan_role_actions(
    role: str,
    target: int,
    pods: Sequence[PodView],
    replicas: int,
    *,
    now_seconds: float,
    drain_timeout_seconds: float,
) -> RoleActions:
    """One level-based step of moving a role to ``target`` instances (ready + warming).

    ``replicas`` is the Deployment's current ``spec.replicas``; ``pods`` its pods.
    """
    live = [p for p in pods if not p.deleting]
    draining = sorted((p for p in live if p.draining), key=lambda p: p.draining_since_seconds or 0.0)
    active = [p for p in live if not p.draining]  # ready or warming, staying
    warming = [p for p in active if not p.ready]
    # Pods the ReplicaSet has yet to create count as warming: a scale while earlier new pods
    # are pending must not count them twice, nor forget them.
    not_yet_created = max(0, replicas - len(live))
    committed = len(active) + not_yet_created
    waiting: list[str] = []

    undrain: list[str] = []
    start: list[str] = []
    new_replicas = replicas
    if target > committed:
        # Cheapest first: a draining pod still holds its weights and is Ready.
        for p in reversed(draining):  # the most recently marked has drained least
            if committed >= target:
                break
            if p.ready:
                undrain.append(p.name)
                committed += 1
        new_replicas = replicas + (target - committed)
    elif target < committed:
        excess = committed - target
        # Pods not yet created, then warming pods, go first: they hold no request.
        cut = min(excess, not_yet_created + len(warming))
        excess -= cut
        if cut > not_yet_created and any(not p.ready for p in draining):
            # The ReplicaSet would remove that pod (lower cost) instead of a warming one: the
            # warming ones go once it is gone.
            cut = not_yet_created
            waiting.append("warming pods wait until the draining pods that are not Ready go")
        new_replicas -= cut
        # Then drain the least loaded Ready pods (unknown load counts as busy).
        ready = sorted((p for p in active if p.ready),
                       key=lambda p: (p.in_flight is None, p.in_flight or 0, p.name))
        start = [p.name for p in ready[:excess]]

    finish: list[str] = []
    undrained = set(undrain)
    staying_not_ready = [p for p in active if not p.ready]
    for p in draining:
        if p.name in undrained:
            continue
        hold = drain_hold(p, now_seconds, drain_timeout_seconds)
        if hold is None and (staying_not_ready or new_replicas > replicas):
            # The ReplicaSet would remove a not-ready pod instead of this one.
            hold = f"{p.name} drained; waits for warming pods to become Ready"
        if hold is not None:
            waiting.append(hold)
            continue
        finish.append(p.name)
    finish, mark, held = removable_first(draining, finish)
    waiting += held
    if finish:
        new_replicas -= len(finish)
    return RoleActions(
        role=role,
        undrain=tuple(undrain),
        start_drain=tuple(start),
        mark_drained=tuple(mark),
        finish_drain=tuple(finish),
        replicas=new_replicas if new_replicas != replicas else None,
        waiting=tuple(waiting),
    )


def plan_group_actions(
    role: str,
    target: int,
    leaders: Sequence[PodView],
    replicas: int,
    *,
    now_seconds: float,
    drain_timeout_seconds: float,
) -> RoleActions:
    """One level-based step of moving a role of LeaderWorkerSet groups to ``target`` instances.

    ``replicas`` is the LWS's ``spec.replicas`` (groups); ``leaders`` the groups' leaders
    (``lws.instances``), each with its ``group_index``. LWS keeps groups 0..replicas-1 and
    removes the highest indices first, whatever their load (StatefulSet order; no deletion
    cost), so this drains only from the top: the draining groups are always the highest
    indices, a drain cancelled goes lowest first (the rest stay on top), and the replicas drop
    only over the top groups that hold nothing (drained, still warming, or never created)."""
    by_index = {p.group_index: p for p in leaders
                if not p.deleting and p.group_index is not None and p.group_index < replicas}
    draining = sorted((i for i, p in by_index.items() if p.draining))
    committed = replicas - len(draining)  # a group not listed yet is warming
    undrain: list[str] = []
    start: list[str] = []
    cut: set[int] = set()
    waiting: list[str] = []
    new_replicas = replicas
    if target > committed:
        for i in draining:  # lowest first: the ones left draining stay on top
            if committed >= target:
                break
            undrain.append(by_index[i].name)
            committed += 1
        new_replicas = replicas + max(0, target - committed)
    elif target < committed:
        excess = committed - target
        for i in range(replicas - 1, -1, -1):
            if excess == 0:
                break
            p = by_index.get(i)
            if p is not None and p.draining:
                continue
            if p is None or not p.ready:
                cut.add(i)  # holds no request: goes without a drain
            else:
                start.append(p.name)
            excess -= 1
    finish: list[str] = []
    undrained = set(undrain)
    for i in range(replicas - 1, -1, -1):  # the top groups that hold nothing go
        p = by_index.get(i)
        if i in cut:
            new_replicas -= 1
            continue
        if p is None or not p.draining or p.name in undrained or p.name in start:
            break
        hold = drain_hold(p, now_seconds, drain_timeout_seconds)
        if hold is not None:
            waiting.append(hold)
            break
        finish.append(p.name)
        new_replicas -= 1
    return RoleActions(
        role=role,
        undrain=tuple(undrain),
        start_drain=tuple(start),
        finish_drain=tuple(finish),
        replicas=new_replicas if new_replicas != replicas else None,
        waiting=tuple(waiting),
    )


def router_workers(
    pods: Sequence[PodView], *, port: int, bootstrap_port: int | None
) -> frozenset[WorkerSpec]:
    """The router's worker list: exactly the Ready, non-draining, non-deleting pods."""
    return frozenset(
        WorkerSpec(
            url=f"http://{p.ip}:{port}",
            role=p.role,
            bootstrap_port=bootstrap_port if p.role == "prefill" else None,
        )
        for p in pods
        if p.serving and p.ip
    )


def fleet_built(spec: PDClusterSpec, pods: Mapping[Role, Sequence[PodView]],
                ordered: Mapping[Role, int | None]) -> bool:
    """Whether every role the spec keeps at least one of has its child (``ordered``: the
    replicas it asks for, None or absent when not read) or a pod that is not going: until
    then the reconcile has not created the fleet, and what a planner reads of it is not what
    it holds."""
    return all(ordered.get(role) is not None or any(not p.deleting for p in pods.get(role, ()))
               for role in Role if getattr(spec, role.value).min_replicas > 0)
