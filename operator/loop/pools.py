"""The PDPools' loop: each tick, before the PDClusters' own ticks, every pool with a member
due plans all its members together and saves each member's command in its planner memory;
the member's tick then moves its fleet to it (drains and all) as to any decision. Level-based:
membership, the pool's size and every member's state are read afresh each tick; the only
state is the members' memories (and the pool's status, which says what was decided).

The choices are pure (``pool_planning``, ``pdscale.planner.pool``); this is read, plan,
save, report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from pdscale.operator.api import multinode
from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.pdcluster import GPU_PRODUCT_LABEL, PDClusterSpec, PlannerMode
from pdscale.operator.clients.kube import Kube
from pdscale.operator.reconciler.reconcile import Event, post_event
from pdscale.planner.decision import Decision
from pdscale.planner.history import History
from pdscale.planner.observe import Role

from .fleet import PodView
from .planning import plan_slot
from .pool_planning import (
    MemberInput,
    Membership,
    floor_nodes,
    memberships,
    plan_pool,
    pool_events,
    pool_status,
)
from .telemetry import POOL_GRANTED, POOL_NODES

log = logging.getLogger(__name__)


class _Planner(Protocol):
    """What the pool needs of the PDClusters' planner loop (``planner_loop.PlannerLoop``)."""

    kube: Kube

    def _remembered(self, body: dict[str, Any], spec: PDClusterSpec, now: float
                    ) -> tuple[History, float | None, str | None] | None: ...

    def _prepare(self, body: dict[str, Any], spec: PDClusterSpec,
                 pods: Mapping[Role, list[PodView]], now: float, *, force: bool = False,
                 ordered: Mapping[Role, int | None] | None = None
                 ) -> tuple[Any, Decision | None, float | None]: ...

    def _record(self, p: Any, decision: Decision, history: History
                ) -> tuple[Decision | None, float | None]: ...


#: a member's engine pods per role, and the replicas its Deployments ask for (None: not read)
PodsOf = Callable[[dict[str, Any]], tuple[Mapping[Role, list[PodView]], Mapping[Role, int | None]]]


class PoolLoop:
    def __init__(self, planner: _Planner):
        self.planner = planner

    @property
    def kube(self) -> Kube:
        return self.planner.kube

    def tick(self, bodies: Mapping[str, dict[str, Any]], pods_of: PodsOf, now: float) -> set[str]:
        """Plan every pool with a member due; the ``namespace/name`` of every member (their
        ticks then follow the pool's command, not their own plan)."""
        try:
            pools = self.kube.list_pdpools()
        except ApiException as exc:
            if exc.status != 404:
                raise
            # the PDPool CRD is not installed (an older chart): no pool, every PDCluster
            # naming one holds (its PoolMember condition says no such PDPool)
            pools = []
        found, _ = memberships(pools, bodies)
        members: set[str] = set()
        for ms in found:
            members |= {f"{b['metadata']['namespace']}/{b['metadata']['name']}" for b, _ in ms.members}
            try:
                self.plan(ms, pods_of, now)
            except ApiException as exc:
                log.warning("pool %s: not planned, HTTP %s %s", ms.pool_key, exc.status, exc.reason)
        return members

    def _due(self, ms: Membership, now: float) -> bool:
        for body, _ in ms.members:
            spec = PDClusterSpec.model_validate(body.get("spec") or {})
            remembered = self.planner._remembered(body, spec, now)
            last = None if remembered is None else remembered[1]
            if plan_slot(last, spec.planner.interval_seconds, now) is not None:
                return True
        return False

    def _size(self, ms: Membership) -> int:
        if ms.spec.nodes is not None:
            return ms.spec.nodes
        labels = {GPU_PRODUCT_LABEL: ms.spec.gpu_product, **ms.spec.node_selector}
        return len(self.kube.list_nodes(labels))

    def plan(self, ms: Membership, pods_of: PodsOf, now: float) -> None:
        """One pool: plan its members together when one is due; write its status and Events."""
        if not ms.members or not self._due(ms, now):
            self._report(ms, None, None, "no member is planning" if not ms.members else None)
            return
        size = self._size(ms)
        inputs, prepared, unplanned = [], {}, 0
        for body, entry in ms.members:
            spec = PDClusterSpec.model_validate(body.get("spec") or {})
            pods, ordered = pods_of(body)
            p = None
            if spec.planner.mode is not PlannerMode.OFF:
                p, _, _ = self.planner._prepare(body, spec, pods, now, force=True, ordered=ordered)
            if p is None:
                # not planned this time (planner Off, profile unusable, memory not ours):
                # the nodes it holds are not free
                unplanned += sum(max(len(pods[role]), ordered.get(role) or 0)
                                 * multinode.nodes_per_instance(spec, role.value) for role in Role)
                continue
            prepared[entry.name] = p
            inputs.append(MemberInput(entry.name, entry, p.obs, p.config, p.history,
                                      spec.planner.node_budget))
        available = max(0, size - unplanned)
        floors = sum(floor_nodes(m) for m in inputs)
        if not inputs or floors > available:
            self._report(ms, size, None, f"{size} nodes, {unplanned} held by members not planned: "
                         + ("no member to plan" if not inputs else
                            f"the members' guarantees and minReplicas ({floors} nodes) do not fit"))
            return
        decision, plans = plan_pool(inputs, pool_nodes=available,
                                    horizon_seconds=float(ms.spec.horizon_seconds), now=now,
                                    surplus_price=ms.spec.surplus_price_percent / 100.0)
        for name, plan in plans.items():
            self.planner._record(prepared[name], plan.command, plan.history)
        self._report(ms, size, decision, None)

    def _report(self, ms: Membership, size: int | None, decision: Any, problem: str | None) -> None:
        meta = ms.body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        previous = ms.body.get("status") or {}
        if decision is None and problem is None and size is None:
            # not due: the split stands; only membership may have changed
            size = previous.get("nodes")
        status = pool_status(ms, int(meta.get("generation") or 1), pool_nodes=size,
                             decision=decision, problem=problem, previous=previous,
                             now=now_rfc3339())
        if size is not None:
            POOL_NODES.labels(ns, name).set(size)
        if decision is not None:
            for g in decision.grants:
                POOL_GRANTED.labels(ns, name, g.name).set(g.nodes)
        if _differs(previous, status):
            self.kube.patch_status(ns, name, status, kind="PDPool")
        for kind, reason, message in pool_events(previous, decision, problem):
            post_event(self.kube, ms.body, Event(kind, reason, message), now_rfc3339())


def _differs(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    return any(previous.get(k) != v for k, v in status.items())
