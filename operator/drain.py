"""Actuation in the drain-safe order of ``fleet``: mark pods draining, take them out of the
router, wait until their engines hold nothing (and, behind a router that picks the decode
before the prefill answers, until no request held at a prefill can still reach a decode),
then lower the replicas for the reconcile to apply. Every choice is ``fleet``'s; this module
reads the engines, writes the marks and tells the reporter.

Drain state lives on the pods (annotations), so a restarted operator finishes the same
drains; only the prefill-backlog waits live in memory (see ``PrefillWaits``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pdscale.planner.observe import Role

from . import names
from .checklist import minimum_transfer_timeout_seconds
from .clock import now_rfc3339
from .engine_probe import engine_in_flight, engine_vllm_totals
from .fleet import (
    DELETION_COST_ANNOTATION,
    DRAINING_ANNOTATION,
    DRAINING_DELETION_COST,
    PodView,
    plan_role_actions,
)
from .kube import Kube
from .pdcluster import PDClusterSpec
from .reconcile import reconcile_current
from .routersync import normalize_url
from .telemetry import Reporter
from .vllm_discovery import PrefillBacklog, PrefillCount
from .workerlist import WorkerList, desired_workers

log = logging.getLogger(__name__)

#: a drain ends this many preStop drains after it started, idle or not
DRAIN_TIMEOUT_FACTOR = 5


def drain_timeout_seconds(spec: PDClusterSpec, role: Role) -> float:
    return float(getattr(spec, role).pre_stop_drain_seconds) * DRAIN_TIMEOUT_FACTOR


def drain_marks(draining_since: float | None) -> dict[str, Any]:
    """The pod patch that marks a drain (since when; the lowest deletion cost, so the
    ReplicaSet removes this pod) or, with None, takes the marks away."""
    annotations: dict[str, str | None] = {
        DRAINING_ANNOTATION: None if draining_since is None else f"{draining_since:.3f}",
        DELETION_COST_ANNOTATION: None if draining_since is None else str(DRAINING_DELETION_COST),
    }
    return {"metadata": {"annotations": annotations}}


def with_engine_state(pods: Sequence[PodView], port: int, listed: set[str] | None,
                      in_flight: Callable[[str | None, int], int | None]) -> list[PodView]:
    """Draining pods with what their engine holds and whether a router still lists them
    (``listed`` None: unknown, so listed); the others as they are."""
    return [
        replace(p, in_flight=in_flight(p.ip, port),
                in_router=listed is None or normalize_url(f"http://{p.ip}:{port}") in listed)
        if p.draining else p
        for p in pods
    ]


@dataclass
class PrefillWaits:
    """Per draining decode (namespace, pod) that left a router which picks decodes before the
    prefill answers: the prefill requests it waits out (pure state, no I/O).

    Memory only: after a restart a backlog is taken again, later, which is safe (every
    request the first one would have waited for is done or still held then)."""

    backlogs: dict[tuple[str, str], PrefillBacklog] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def begin_tick(self) -> None:
        self.seen = set()

    def end_tick(self) -> None:
        """Forget the backlogs of decodes no tick asked about (drained, or un-drained)."""
        self.backlogs = {k: v for k, v in self.backlogs.items() if k in self.seen}

    def awaited(self, namespace: str, leaving: Sequence[PodView], serving_prefill: Sequence[str],
                counts: Mapping[str, PrefillCount | None], now: float,
                linger_seconds: float) -> set[str]:
        """Names of the ``leaving`` decodes that requests held at a prefill may still be sent
        to. ``counts``: each prefill pod's counters now (None: it did not answer);
        ``serving_prefill``: the prefills that could hold such a request."""
        awaited: set[str] = set()
        for pod in leaving:
            key = (namespace, pod.name)
            self.seen.add(key)
            backlog = self.backlogs.get(key)
            if backlog is None:
                taken = {name: counts.get(name) for name in serving_prefill}
                held = {n: c for n, c in taken.items() if c is not None}
                if len(held) < len(taken):
                    awaited.add(pod.name)  # a serving prefill did not answer: next tick
                    continue
                backlog = PrefillBacklog(held)
                log.info("decode %s/%s left the router; waits out %d requests held at prefill",
                         namespace, pod.name, backlog.waiting_on())
            followed = backlog.follow(counts, now)
            if followed.cleared_at is not None and backlog.cleared_at is None:
                log.info("decode %s/%s: the prefill requests it waited for are done", namespace, pod.name)
            self.backlogs[key] = followed
            if followed.pending(now, linger_seconds):
                awaited.add(pod.name)
        return awaited


class Drains:
    """Moves one PDCluster's fleet a step towards the planner's targets each tick."""

    def __init__(self, kube: Kube, report: Reporter, *,
                 in_flight: Callable[[str | None, int], int | None] = engine_in_flight,
                 vllm_totals: Callable[[str, int], dict[str, float] | None] = engine_vllm_totals):
        self.kube = kube
        self.report = report
        #: the engine probes (engine_probe), replaceable in tests
        self.in_flight = in_flight
        self.vllm_totals = vllm_totals
        self.prefill_waits = PrefillWaits()

    def move(self, body: dict[str, Any], spec: PDClusterSpec, pods: Mapping[Role, list[PodView]],
             workers: WorkerList, listed: set[str] | None, targets: Mapping[Role, int],
             now: float) -> None:
        """One level-based step of every role to its target (``fleet.plan_role_actions``)."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        deployments = {role: self.kube.get("Deployment", ns, names.child_name(name, role)) for role in Role}
        missing = [names.child_name(name, role) for role, d in deployments.items() if d is None]
        if missing:
            # The reconcile creates them; until then there are no replicas to move.
            log.info("planner %s/%s: Deployments %s not there yet; nothing to move", ns, name, missing)
            return
        replicas: dict[str, int] = {}
        waiting: list[str] = []
        leaving: set[str] = set()
        for role in Role:
            self.report.target(ns, name, role, targets[role])
            current = int(((deployments[role] or {}).get("spec") or {}).get("replicas") or 0)
            views = with_engine_state(pods[role], spec.engine.port, listed, self.in_flight)
            if role is Role.DECODE and workers.decode_picked_before_prefill:
                views = self._await_prefill(ns, spec, views, pods[Role.PREFILL], now)
            actions = plan_role_actions(role, targets[role], views, current, now_seconds=now,
                                        drain_timeout_seconds=drain_timeout_seconds(spec, role))
            for pod in actions.undrain:
                self.kube.patch_pod(ns, pod, drain_marks(None))
            if actions.start_drain:
                # Out of the router first: no one ever sees a draining pod listed.
                leaving |= set(actions.start_drain)
                workers.make_equal(desired_workers(spec, pods, frozenset(leaving)))
            for pod in actions.start_drain:
                self.kube.patch_pod(ns, pod, drain_marks(now))
                self.report.drain_started(body, role, pod)
            for pod in actions.finish_drain:
                self.report.drain_finished(body, role, pod)
            replicas[role] = current if actions.replicas is None else actions.replicas
            waiting += actions.waiting
        if self.report.progress(body, replicas, waiting):
            # The reconcile applies these to the Deployments (one writer, one field manager).
            reconcile_current(self.kube, ns, name, now_rfc3339())

    def _await_prefill(self, ns: str, spec: PDClusterSpec, decode: list[PodView],
                       prefill: Sequence[PodView], now: float) -> list[PodView]:
        """Marks each draining decode that has left the router but may still be sent
        requests held at a prefill engine (see vllm_discovery.PrefillBacklog)."""
        leaving = [p for p in decode if p.draining and not p.in_router]
        if not leaving:
            return decode
        counts: dict[str, PrefillCount | None] = {}
        for p in prefill:
            if p.ip:
                totals = self.vllm_totals(p.ip, spec.engine.port)
                counts[p.name] = None if totals is None else PrefillCount.from_totals(totals)
        serving = [p.name for p in prefill if p.ready and p.ip]
        awaited = self.prefill_waits.awaited(ns, leaving, serving, counts, now,
                                             minimum_transfer_timeout_seconds(spec))
        return [replace(p, awaited_by_prefill=True) if p.name in awaited else p for p in decode]
