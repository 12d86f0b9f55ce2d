"""The planner loop: the order of one tick (read, plan, act, report). The parts are elsewhere:
every choice is made by pure functions (``planning``, ``fleet``, ``pdscale.planner``); the
routers' worker lists are ``workerlist``'s, the drains ``drain``'s, the memory
``planner_memory``'s, the metrics, status and Events ``telemetry``'s.

A fast tick (``PDSCALE_PLANNER_TICK_SECONDS``, default 5 s) moves drains along and keeps
actuation level-based; the planner itself runs once per ``spec.planner.intervalSeconds``.
Modes: Off does nothing; Recommend writes status, an Event and the gauges, and changes
nothing; Auto also moves the fleet to the decision, in the drain-safe order of ``fleet``.

Its memory (recent loads and decisions, the last planning time) lives in a ConfigMap owned by
the PDCluster, ``<name>-planner``, so an operator restart neither forgets the stabilization
window nor re-plans early; drain state lives on the pods.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sized
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from pdscale.operator.api import multinode, names, tenant_policy
from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.names import Owner
from pdscale.operator.api.pdcluster import PDClusterSpec, PlannerMode
from pdscale.operator.clients.kube import Kube
from pdscale.operator.clients.vllm_discovery import Announcer
from pdscale.operator.reconciler import conditions
from pdscale.operator.reconciler.reconcile import is_ours, reconcile_current
from pdscale.operator.reconciler.status import overdue_pods, profile_status
from pdscale.operator.render import lws
from pdscale.operator.render.builders import unready_allowance_seconds
from pdscale.operator.render.engines import NIXL_SIDE_CHANNEL_PORT
from pdscale.planner.config import PlannerConfig
from pdscale.planner.decision import Decision
from pdscale.planner.history import History
from pdscale.planner.observe import Observation, Role
from pdscale.planner.prometheus import (
    READ_BUDGET_SECONDS,
    MetricsSnapshot,
    observation_from,
    prometheus_client,
    rate_window_seconds,
    read_earlier_rates,
    read_metrics,
    read_rate_history,
    render_queries,
)
from pdscale.planner.solve import step

from .drain import Drains
from .fleet import PodView, fleet_built, pod_view, role_state
from .planner_memory import ForeignMemory, PlannerMemory, memory_problem
from .planning import (
    calibration_for_profile,
    clamp_decision,
    clamp_history,
    history_from_json,
    history_keep,
    history_to_json,
    metrics_source,
    plan_slot,
    planner_config,
    profile_identity,
    remembered_profile,
)
from .pools import PoolLoop
from .profile_source import ProfileSources, ResolvedProfile, report_profile
from .telemetry import HEARTBEATS, LOOP_ERRORS, Heartbeats, Reporter, stuck_after_seconds
from .workerlist import WorkerLists, desired_workers

log = logging.getLogger(__name__)
#: what a range read of the rate history makes of the answer (points, or rates on a grid)
_Read = TypeVar("_Read", bound=Sized)

TICK_SECONDS = float(os.environ.get("PDSCALE_PLANNER_TICK_SECONDS", "5"))
#: PDClusters ticked at once: a plan mostly waits on its Prometheus, so one tenant's slow
#: Prometheus holds one worker, not the loop
CONCURRENCY = int(os.environ.get("PDSCALE_PLANNER_CONCURRENCY", "8"))
#: the longest a tick waits for its PDClusters (seconds): one tick. One still planning then
#: goes on in its worker (its metrics read is bounded by READ_BUDGET_SECONDS) and is not
#: started again until it ends, while the next ticks plan the others on time: a slow
#: Prometheus delays only its own PDCluster. Far under the 60 s liveness bound
#: (telemetry.stuck_after_seconds).
TICK_DEADLINE_SECONDS = float(os.environ.get("PDSCALE_PLANNER_TICK_DEADLINE_SECONDS",
                                             str(TICK_SECONDS)))

#: every pod the operator manages, by (namespace, instance label, role label)
PodsByKey = dict[tuple[str, str, str], list[dict[str, Any]]]


def pods_by_key(pods: list[dict[str, Any]]) -> PodsByKey:
    """The one listing of a tick, grouped per PDCluster and role (pure). An instance of
    several nodes is its LWS group's leader, Ready only while its group is whole
    (``lws.instances``): the other pods of a group are left out, so that counts, drains and
    the router's worker list see whole instances only."""
    out: PodsByKey = {}
    for pod in lws.instances(pods):
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        key = (str(meta.get("namespace", "")), str(labels.get(names.LABEL_INSTANCE, "")),
               str(labels.get(names.LABEL_ROLE, "")))
        out.setdefault(key, []).append(pod)
    return out


def member_pods(ns: str, instance: str, listed_pods: PodsByKey) -> dict[Role, list[PodView]]:
    """One PDCluster's engine pods per role, from the tick's listing."""
    return {role: [pod_view(p, role) for p in listed_pods.get((ns, instance, role), [])]
            for role in Role}


def foreign_roles(ns: str, name: str, uid: str,
                  deployments: Mapping[tuple[str, str], dict[str, Any]]) -> frozenset[str]:
    """The roles whose Deployment (this PDCluster's child name) another object controls: their
    pods carry this PDCluster's labels but are not its own (labels say which base name a pod
    carries, the controller owner reference says whose it is), so the loop leaves them alone.
    A role without a Deployment yet keeps its pods (nothing to tell them by; the reconcile
    creates it)."""
    foreign = frozenset(role for role in ("prefill", "decode", "router")
                        if (d := deployments.get((ns, names.child_name(name, role)))) is not None
                        and not is_ours(d, uid))
    if foreign:
        log.warning("planner %s/%s: the Deployments of %s are controlled by another object; their "
                    "pods are left alone", ns, name, sorted(foreign))
    return foreign


def ordered_replicas(ns: str, name: str, uid: str,
                     deployments: Mapping[tuple[str, str], dict[str, Any]]) -> dict[Role, int | None]:
    """The replicas each engine role's Deployment asks for (None: none of ours listed, as
    before the reconcile creates it or for a role of LeaderWorkerSet groups): the pods its
    ReplicaSet has still to create are ordered, not absent (``fleet.role_state``)."""
    out: dict[Role, int | None] = {}
    for role in Role:
        d = deployments.get((ns, names.child_name(name, role)))
        replicas = None if d is None or not is_ours(d, uid) else (d.get("spec") or {}).get("replicas", 1)
        out[role] = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None
    return out


def owner_of(body: dict[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


@dataclass(frozen=True)
class _Prepared:
    """What one plan of one PDCluster starts from (``PlannerLoop._prepare``)."""

    body: dict[str, Any]
    spec: PDClusterSpec
    history: History
    slot: float
    previous: Decision | None
    resolved: ResolvedProfile
    identity: str
    config: PlannerConfig
    snapshot: MetricsSnapshot
    obs: Observation
    started: float


class PlannerLoop:
    """One per operator process. ``tick_all`` is called every TICK_SECONDS."""

    def __init__(self, kube: Kube, prometheus_url: str | None = None, *,
                 worker_lists: WorkerLists | None = None, drains: Drains | None = None):
        self.kube = kube
        #: the operator's own Prometheus (the chart's operator.prometheusURL): the admin's
        self.prometheus_url = prometheus_url or os.environ.get("PDSCALE_PROMETHEUS_URL") or None
        self.report = Reporter(kube)
        self.memory = PlannerMemory(kube)
        self.profiles = ProfileSources(kube)
        #: the vLLM announcer inside runs in its own thread (started by the kopf wiring)
        self.worker_lists = worker_lists or WorkerLists(Announcer(side_channel_port=NIXL_SIDE_CHANNEL_PORT))
        self.drains = drains or Drains(kube, self.report)
        #: each PDCluster's router addresses as its last finished tick saw them
        self.routers_of: dict[str, frozenset[str]] = {}
        #: PDClusters whose tick is still running (in a worker), and when each last finished
        self.running: set[str] = set()
        self.finished_at: dict[str, float] = {}
        #: PDClusters whose last tick outlasted a tick (a slow Prometheus): together they may
        #: hold at most half the workers, so that however many tenants point at a server that
        #: never answers, the others always find a worker
        self.slow: set[str] = set()
        self.slow_workers = max(1, CONCURRENCY // 2)
        #: the PDPools' joint plans (planned before their members' ticks)
        self.pools = PoolLoop(self)
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, CONCURRENCY), thread_name_prefix="planner")
        self.lock = threading.Lock()
        self.tick_deadline_seconds = TICK_DEADLINE_SECONDS
        #: PDClusters whose seasonal memory this process asked Prometheus for already (once
        #: a process, answered or not: a Prometheus that cannot answer is not asked every plan)
        self.season_asked: set[str] = set()
        #: the same for the rates of the last day's planning intervals (a fresh memory's)
        self.rates_asked: set[str] = set()

    @property
    def routers_seen(self) -> set[str]:
        with self.lock:
            return set().union(*self.routers_of.values())

    def tick_all(self) -> float | None:
        """One tick over every PDCluster, at most ``CONCURRENCY`` at once and for at most
        ``tick_deadline_seconds``; returns the seconds until the next plan falls due (None:
        none scheduled), so the loop wakes for it rather than up to a tick late.

        A PDCluster whose tick outlasts the deadline (its Prometheus is slow) keeps its worker
        until its bounded read ends and is skipped by the ticks in between: it delays neither
        the loop nor another PDCluster's plan (the tick returns early when one that finished
        falls due again, ``_wait``). Those waiting longest go first, and the slow ones
        together take at most ``slow_workers`` of the workers."""
        # One list of every pod we manage per tick, not three per PDCluster: with hundreds of
        # PDClusters the loop must cost the API server next to nothing.
        pods = pods_by_key(self.kube.list_pods(None, {names.LABEL_MANAGED_BY: names.MANAGER}))
        # and of their Deployments: whose the pods selected by label are
        deployments = {(d["metadata"].get("namespace", ""), d["metadata"].get("name", "")): d
                       for d in self.kube.list_deployments(None, {names.LABEL_MANAGED_BY: names.MANAGER})}
        started = time.monotonic()
        self.drains.begin_tick()
        bodies = {f"{b['metadata']['namespace']}/{b['metadata']['name']}": b
                  for b in self.kube.list_pdclusters() if not b["metadata"].get("deletionTimestamp")}
        # pools first: their members' ticks below move to the commands the pools saved
        members = self.pools.tick(
            bodies, lambda body: self._pods_of(body, pods, deployments), time.time())
        futures: dict[concurrent.futures.Future[float | None], str] = {}
        for key in sorted(bodies, key=lambda k: self.finished_at.get(k, 0.0)):
            with self.lock:
                if key in self.running:
                    log.info("planner tick of %s: the last one is still running (its "
                             "Prometheus is slow); not started again", key)
                    continue
                if key in self.slow and len(self.running & self.slow) >= self.slow_workers:
                    log.info("planner tick of %s: waits, %d slow PDClusters hold their share of "
                             "the workers", key, self.slow_workers)
                    continue
                self.running.add(key)
            futures[self.pool.submit(self._tick_one, key, bodies[key], pods,
                                     deployments, key in members)] = key
        done, late = self._wait(futures, started)
        for future in late:
            if future.cancel():  # never started (every worker busy): the next tick tries
                with self.lock:
                    self.running.discard(futures[future])
            else:
                log.warning("planner tick of %s: still running after %.0f s; the loop goes on",
                            futures[future], self.tick_deadline_seconds)
        dues = [due for f in done if (due := f.result()) is not None]
        with self.lock:  # PDClusters gone: their routers too
            self.routers_of = {k: v for k, v in self.routers_of.items() if k in bodies}
            self.slow &= set(bodies)
        self.worker_lists.keep_only(self.routers_seen)
        self.drains.end_tick()
        return min(dues) - time.time() if dues else None

    def _wait(self, futures: Mapping[concurrent.futures.Future[float | None], str], started: float
              ) -> tuple[set[concurrent.futures.Future[float | None]],
                         set[concurrent.futures.Future[float | None]]]:
        """Waits for the tick's PDClusters until all have finished, the deadline passes, or
        the next plan of one that finished falls due, whichever is first: a tick still
        reading a slow Prometheus then goes on in its worker, and the next tick starts on time
        for the plan that is due (waiting out the deadline had delayed it by up to a tick)."""
        deadline = started + self.tick_deadline_seconds
        done: set[concurrent.futures.Future[float | None]] = set()
        pending = set(futures)
        next_due: float | None = None
        while pending and (left := deadline - time.monotonic()) > 0:
            if next_due is not None:
                left = min(left, next_due - time.time())
                if left <= 0:
                    break
            finished, pending = concurrent.futures.wait(
                pending, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED)
            done |= finished
            dues = [due for f in finished if (due := f.result()) is not None]
            next_due = min(dues + ([] if next_due is None else [next_due]), default=None)
        return done, pending

    @staticmethod
    def _pods_of(body: dict[str, Any], listed: PodsByKey,
                 deployments: Mapping[tuple[str, str], dict[str, Any]]
                 ) -> tuple[dict[Role, list[PodView]], dict[Role, int | None]]:
        """One PDCluster's engine pods per role as its tick reads them (none of a role whose
        Deployment another object controls), and the replicas its Deployments ask for."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], str(meta.get("uid") or "")
        foreign = foreign_roles(ns, name, uid, deployments)
        return ({role: [] if role in foreign else views
                 for role, views in member_pods(ns, names.base_name(name), listed).items()},
                ordered_replicas(ns, name, uid, deployments))

    def _tick_one(self, key: str, body: dict[str, Any], pods: PodsByKey,
                  deployments: Mapping[tuple[str, str], dict[str, Any]],
                  pool_member: bool = False) -> float | None:
        """``tick`` in a worker: a failure is logged (one PDCluster's failure must not stop
        the others'), and the PDCluster is free to tick again when it ends."""
        started = time.monotonic()
        try:
            return self.tick(body, time.time(), pods, deployments, pool_member=pool_member)
        except ApiException as exc:
            log.warning("planner tick of %s failed: HTTP %s %s", key, exc.status, exc.reason)
        except Exception:
            log.exception("planner tick of %s failed", key)
        finally:
            with self.lock:
                self.running.discard(key)
                self.finished_at[key] = time.monotonic()
                if self.finished_at[key] - started > self.tick_deadline_seconds:
                    self.slow.add(key)
                else:
                    self.slow.discard(key)
        return None

    # ------------------------------------------------------------------------------------
    def tick(self, body: dict[str, Any], now: float, listed_pods: PodsByKey,
             deployments: Mapping[tuple[str, str], dict[str, Any]] | None = None, *,
             pool_member: bool = False) -> float | None:
        """Read, plan when due, act, report; returns when this PDCluster's next plan is due
        (None: not known, the next fast tick tries). ``deployments``: the tick's listing by
        (namespace, name); a role whose Deployment another PDCluster controls has no pods here.
        A PDCluster naming a pool does not plan alone: a member (``pool_member``) moves to
        the command its pool saved in its memory (``pools.PoolLoop``), one refused holds
        (its PoolMember condition says why)."""
        try:
            spec = PDClusterSpec.model_validate(body.get("spec") or {})
        except ValueError:
            return None  # reconcile reports SpecValid=False
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        instance = names.base_name(name)
        foreign = foreign_roles(ns, name, str(meta.get("uid") or ""), deployments or {})
        listed_pods = {k: ([] if k[:2] == (ns, instance) and k[2] in foreign else v)
                       for k, v in listed_pods.items()}
        # read
        pods = member_pods(ns, instance, listed_pods)
        workers = self.worker_lists.of(
            spec, [pod_view(p, "router") for p in listed_pods.get((ns, instance, "router"), [])])
        listed = workers.listed()
        mode = spec.planner.mode
        due = None
        if mode is not PlannerMode.OFF:
            self.report.ready(ns, name, pods, {role: multinode.nodes_per_instance(spec, role.value)
                                               for role in Role})
            # plan (and report the decision); a pool's member was planned by its pool
            if spec.planner.pool is None:
                decision, due = self._plan_if_due(
                    body, spec, pods, now,
                    ordered_replicas(ns, name, str(meta.get("uid") or ""), deployments or {}))
            elif pool_member:
                decision, due = self._in_force(body, spec, now)
            else:
                decision, due = None, None
            # act
            if mode is PlannerMode.AUTO and decision is not None:
                decision = clamp_decision(decision, spec)  # whatever its source
                targets = {Role.PREFILL: decision.prefill, Role.DECODE: decision.decode}
                self.drains.move(body, spec, pods, workers, listed, targets, now)
                pods = {role: [] if role in foreign else self._pods(ns, name, role) for role in Role}
        workers.make_equal(desired_workers(spec, pods))  # in every mode
        with self.lock:
            self.routers_of[f"{ns}/{name}"] = frozenset(workers.addresses)
        # report what no event marks
        self._report_overdue(body, spec, [p for role in Role
                                          for p in listed_pods.get((ns, instance, role), [])], now)
        return due

    def _report_overdue(self, body: dict[str, Any], spec: PDClusterSpec,
                        pods: list[dict[str, Any]], now: float) -> None:
        """The tick is the clock that notices a pod outstaying its warm-up allowance (no
        event marks that moment); the reconcile, sole writer of conditions, reports it."""
        allowance = {role: unready_allowance_seconds(spec, role) for role in Role}
        overdue = {p.name for p in overdue_pods(pods, allowance, now)}
        degraded = conditions.find((body.get("status") or {}).get("conditions"), conditions.DEGRADED)
        message = (degraded or {}).get("message", "")
        named = {n for p in pods if (n := pod_view(p, "").name) and n in message}
        if overdue != named:
            reconcile_current(self.kube, body["metadata"]["namespace"], body["metadata"]["name"],
                              now_rfc3339())

    def _plan_if_due(self, body: dict[str, Any], spec: PDClusterSpec,
                     pods: Mapping[Role, list[PodView]], now: float,
                     ordered: Mapping[Role, int | None] | None = None
                     ) -> tuple[Decision | None, float | None]:
        """The decision in force: a new one when the schedule's next plan is due
        (``planning.plan_slot``), else the last one remembered (None before the first); and
        when the next plan falls due (None: unknown, as after a failure to plan)."""
        prepared, decision, due = self._prepare(body, spec, pods, now, ordered=ordered)
        if prepared is None:
            return decision, due
        decision, history = step(prepared.obs, config=prepared.config, history=prepared.history,
                                 now=now)
        return self._record(prepared, decision, history)

    def _in_force(self, body: dict[str, Any], spec: PDClusterSpec, now: float
                  ) -> tuple[Decision | None, float | None]:
        """A pool member's decision in force: the last one its memory holds (its pool's
        command), and when its next plan falls due."""
        remembered = self._remembered(body, spec, now)
        if remembered is None:
            return None, None
        history, last_plan, _ = remembered
        decision = history.decisions[-1] if history.decisions else None
        return decision, None if last_plan is None else last_plan + spec.planner.interval_seconds

    def _remembered(self, body: dict[str, Any], spec: PDClusterSpec, now: float
                    ) -> tuple[History, float | None, str | None] | None:
        """(memory, its last plan's slot, the stored text) as the plan reads it; None when the
        memory's name is someone else's object (reported)."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            stored = self.memory.load(ns, name, meta.get("uid"))
        except ForeignMemory as foreign:
            # someone else's object of the memory's name: never read, written or adopted
            self.report.memory_foreign(body, str(foreign))
            return None
        problem = None if stored is None else memory_problem(stored, now)
        if problem is not None:
            # start from an empty memory: one stabilization window of caution, not a stop
            self.report.memory_ignored(body, problem)
            stored = None
        history, last_plan = history_from_json(stored)
        return clamp_history(history, spec), last_plan, stored  # held to today's bounds

    def _prepare(self, body: dict[str, Any], spec: PDClusterSpec,
                 pods: Mapping[Role, list[PodView]], now: float, *, force: bool = False,
                 ordered: Mapping[Role, int | None] | None = None
                 ) -> tuple[_Prepared | None, Decision | None, float | None]:
        """Everything a plan at ``now`` starts from (memory, profile, configuration, the
        metrics read into an observation), or (None, the decision in force, when the next
        plan falls due) when none is due (``force``: a pool plans its members together, due
        or not) or the profile cannot be used. ``ordered``: the replicas each role's child
        asks for (``ordered_replicas``; None: not read)."""
        remembered = self._remembered(body, spec, now)
        if remembered is None:
            return None, None, None
        history, last_plan, stored = remembered
        decision = history.decisions[-1] if history.decisions else None
        ordered = ordered or {}
        if decision is None and not fleet_built(spec, pods, ordered):
            # A first plan holds the counts it reads while the load is unknown, and the next
            # hold the last decision: read before the reconcile has created a role's child,
            # it would hold that role at nothing (a pool member read 1P0D on a busy host and
            # kept 1P1D of its 1P2D). The first plan waits for the fleet; the next tick asks.
            # The child's pods not made yet count as ordered (``fleet.role_state``).
            return None, None, None
        interval = spec.planner.interval_seconds
        slot = plan_slot(last_plan, interval, now)
        if slot is None and force:
            slot = now
        if slot is None:
            return None, decision, None if last_plan is None else last_plan + interval
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        # the profile first: one that cannot be used holds the planner (the decision in
        # force stays), says why, and is read again next tick
        resolved = self.profiles.resolve(ns, spec)
        if resolved.profile is None:
            report_profile(self.kube, body, profile_status(None, resolved.source, None,
                                                           resolved.problem), resolved)
            return None, decision, None
        # what was learned against another profile is not carried over to this one
        identity = profile_identity(resolved.profile)
        history, reset = calibration_for_profile(history, remembered_profile(stored), identity)
        if reset is not None:
            self.report.calibration_reset(body, reset)
        started = time.monotonic()
        config = planner_config(spec, resolved.profile)
        if config.seasonality and not history.season.seeded:
            history = self._seed_season(spec, ns, name, now, history)
        if not history.loads and not history.earlier_rates:
            history = self._seed_rates(spec, ns, name, now, history, config)
        snapshot = self._read_metrics(spec, ns, name, now, config.slo.percentile)
        window = rate_window_seconds(spec.planner.interval_seconds)
        obs = observation_from(
            snapshot, now,
            role_state(pods[Role.PREFILL], now, spec.prefill.warmup_seconds, readings_seconds=window,
                       ordered=ordered.get(Role.PREFILL)),
            role_state(pods[Role.DECODE], now, spec.decode.warmup_seconds, readings_seconds=window,
                       ordered=ordered.get(Role.DECODE)),
        )
        return _Prepared(body, spec, history, slot, decision, resolved, identity, config,
                         snapshot, obs, started), decision, None

    def _record(self, p: _Prepared, decision: Decision, history: History
                ) -> tuple[Decision | None, float | None]:
        """Save the memory, report the decision; (the decision in force, when the next plan
        falls due)."""
        body = p.body
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if not self.memory.save(owner_of(body), history_to_json(
                history, p.slot, history_keep(p.config), profile=p.identity,
                rates_keep=p.config.rise_history_intervals)):
            return p.previous, None  # another writer's newer memory stands; the next tick plans on it
        self.report.plan_seconds(ns, name, time.monotonic() - p.started)
        self.report.decision(body, p.spec, decision, p.previous, p.snapshot, p.obs)
        report_profile(self.kube, body, profile_status(p.resolved.profile, p.resolved.source,
                                                       history.calibration), p.resolved)
        return decision, p.slot + p.spec.planner.interval_seconds

    def _pods(self, ns: str, name: str, role: Role) -> list[PodView]:
        return [pod_view(p, role)
                for p in lws.instances(self.kube.list_pods(ns, names.selector_labels(name, role)))]

    def _seed_season(self, spec: PDClusterSpec, ns: str, name: str, now: float,
                     history: History) -> History:
        """``history`` with its seasonal memory seeded from Prometheus: the request rate of
        the last ``MAX_DAYS`` days in ten-minute steps, one range query (``read_rate_history``:
        at most 4,033 points, under the reader's deadline and size cap), so that a fresh
        install forecasts with the time of day from its first plan, not days later. Asked once
        a process; an answer, even an empty one (a new service), marks the memory seeded and
        is saved with it; a failure is logged and the plan goes on without (the live
        observations fill the memory in as they come)."""
        season = history.season
        points = self._rate_history(
            spec, ns, name, "seasonal history", self.season_asked, season.bucket_seconds,
            lambda client, query: read_rate_history(client, query, now_seconds=now,
                                                    span_seconds=season.max_days * 86400.0,
                                                    step_seconds=season.bucket_seconds))
        if points is None:
            return history
        return replace(history, season=season.with_earlier(points))

    def _seed_rates(self, spec: PDClusterSpec, ns: str, name: str, now: float,
                    history: History, config: PlannerConfig) -> History:
        """A fresh memory (no load remembered) with the request rates of the last
        ``rise_history_intervals`` planning intervals from Prometheus, read as the planner
        reads the rate each tick (one range query, at most 1,441 points for a day of
        minutes): what the risk over the lead is learned from (``History.earlier_rates``),
        so that a fresh install prices the next warm-up from the service's own last day, as
        the replay does, not from the prior margin for its first two hours. Asked once a
        process, as the seasonal history is; without an answer the plan goes on on the
        prior."""
        interval = spec.planner.interval_seconds
        earlier = self._rate_history(
            spec, ns, name, "rate history", self.rates_asked, rate_window_seconds(interval),
            lambda client, query: read_earlier_rates(client, query, now_seconds=now,
                                                     interval_seconds=interval,
                                                     intervals=config.rise_history_intervals))
        return replace(history, earlier_rates=earlier) if earlier else history

    def _rate_history(self, spec: PDClusterSpec, ns: str, name: str, what: str, asked: set[str],
                      window_seconds: float, read: Callable[[Any, str], _Read]) -> _Read | None:
        """What ``read`` makes of Prometheus and the PDCluster's ``rate_rps`` reading over
        ``window_seconds`` (a range query), once a process (``asked``); None when already
        asked or not read (logged: the plan goes on without)."""
        key = f"{ns}/{name}"
        if key in asked:
            return None
        asked.add(key)
        url, source, problem = metrics_source(spec, self.prometheus_url, tenant_policy.configured())
        if url is None:
            log.info("planner %s: %s not read (%s)", key, what, problem)
            return None
        query = render_queries(spec.engine.kind.value, namespace=ns, pdcluster=names.base_name(name),
                               window_seconds=int(window_seconds),
                               percentile=spec.slo.percentile / 100.0)["rate_rps"]
        try:
            points = read(prometheus_client(url), query)
        except Exception as exc:  # any failure: plan without, never stop the tick
            log.warning("planner %s: %s from %s not read (%s): the planner learns it from the "
                        "loads it sees", key, what, source, getattr(exc, "reason", type(exc).__name__))
            return None
        log.info("planner %s: %s seeded from %s: %d values", key, what, source, len(points))
        return points

    def _read_metrics(self, spec: PDClusterSpec, ns: str, name: str, now: float,
                      percentile: float) -> MetricsSnapshot:
        url, source, problem = metrics_source(spec, self.prometheus_url, tenant_policy.configured())
        queries = render_queries(spec.engine.kind.value, namespace=ns, pdcluster=names.base_name(name),
                                 window_seconds=rate_window_seconds(spec.planner.interval_seconds),
                                 percentile=percentile)
        if url is None:
            return MetricsSnapshot({q: None for q in queries}, {q: f"not read: {problem}" for q in queries})
        return read_metrics(prometheus_client(url), queries, now, at_seconds=now,
                            budget_seconds=READ_BUDGET_SECONDS, source=source)


#: the longest wait between retries of a failing loop tick (well under the stuck bound)
MAX_BACKOFF_SECONDS = float(os.environ.get("PDSCALE_LOOP_MAX_BACKOFF_SECONDS", "30"))


def backoff_seconds(interval_seconds: float, failures: int,
                    cap_seconds: float = MAX_BACKOFF_SECONDS) -> float:
    """The wait before the next tick: the interval, doubled per failure in a row, capped."""
    if failures <= 0:
        return interval_seconds
    return min(cap_seconds, max(interval_seconds, 1.0) * 2.0 ** failures)


#: the shortest sleep between ticks: a plan due now (or overdue) never spins the loop
MIN_SLEEP_SECONDS = 0.1


async def supervise(name: str, tick: Callable[[], Awaitable[float | None]], interval_seconds: float,
                    heartbeats: Heartbeats = HEARTBEATS, *,
                    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Run ``tick`` every ``interval_seconds`` for ever, or sooner when a tick returns the
    seconds until something falls due (the planner's next plan). Any failure (the API server
    restarting, a timeout, a bug) is logged with its exception, counted in
    ``pdscale_loop_errors_total{loop}`` and retried with capped exponential backoff; each
    finished tick, failed or not, is a heartbeat for the liveness probe."""
    bound = stuck_after_seconds(interval_seconds)
    failures = 0
    delay = interval_seconds
    heartbeats.beat(name, time.monotonic(), delay, bound)
    try:
        while True:
            await sleep(delay)
            try:
                sooner = await tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = backoff_seconds(interval_seconds, failures)
                LOOP_ERRORS.labels(name).inc()
                log.warning("%s loop: tick failed (%d in a row): %s: %s; retrying in %.1f s", name,
                            failures, type(exc).__name__, exc, delay, exc_info=exc)
            else:
                if failures:
                    log.info("%s loop: tick succeeded after %d failures", name, failures)
                failures = 0
                delay = interval_seconds if sooner is None else min(
                    interval_seconds, max(MIN_SLEEP_SECONDS, sooner))
            heartbeats.beat(name, time.monotonic(), delay, bound)
    finally:  # stopped on purpose (cancelled): not stuck
        heartbeats.forget(name)


async def run_forever(loop: PlannerLoop, heartbeats: Heartbeats = HEARTBEATS) -> None:
    await supervise("planner", lambda: asyncio.to_thread(loop.tick_all), TICK_SECONDS, heartbeats)
