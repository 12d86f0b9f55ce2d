"""Actuation in the drain-safe order of ``fleet``: mark pods draining, take them out of the
router, wait until their engines hold nothing (and, behind a router that picks the decode
before the prefill answers, until no request held at a prefill can still reach a decode),
then lower the replicas for the reconcile to apply. A prefill, once idle, also waits until the
KV it computed has left for its decodes (``HandoffWaits``). Every choice is ``fleet``'s (or
the pure watches it is given); this module reads the engines, writes the marks and tells the
reporter.

Drain state lives on the pods (annotations), so a restarted operator finishes the same
drains; only the prefill-backlog and hand-off waits live in memory (``PrefillWaits``,
``HandoffWaits``): after a restart they start again, later, which only waits longer.

A deleted PDCluster is drained whole (``DeletionDrain``): the operator's finalizer holds the
deletion until every engine is out of the router and idle, or the drain timeout has passed.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from pdscale.operator.api import multinode, names
from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.names import DELETION_COST_ANNOTATION, DRAINING_ANNOTATION
from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION, EngineKind, PDClusterSpec
from pdscale.operator.clients.engine_probe import (
    EngineLoad,
    LoadSource,
    engine_in_flight,
    engine_load,
    engine_vllm_totals,
)
from pdscale.operator.clients.kube import Kube
from pdscale.operator.clients.routersync import normalize_url
from pdscale.operator.clients.vllm_discovery import (
    HANDOFF_GRACE_SECONDS,
    NIXL_KV_LEASE_SECONDS,
    KVPullWatch,
    PrefillBacklog,
    PrefillCount,
    decode_pulls_pending,
)
from pdscale.operator.reconciler.reconcile import is_ours, reconcile_current
from pdscale.operator.render import lws
from pdscale.operator.render.derived import minimum_transfer_timeout_seconds
from pdscale.planner.observe import Role

from .fleet import (
    DRAINED_DELETION_COST,
    DRAINING_DELETION_COST,
    PodView,
    plan_group_actions,
    plan_role_actions,
    pod_view,
)
from .telemetry import Reporter
from .workerlist import WorkerList, WorkerLists, desired_workers

log = logging.getLogger(__name__)

#: a drain ends this many preStop drains after it started, idle or not
DRAIN_TIMEOUT_FACTOR = 5
#: and never later than this (seconds): a deletion is held at most this long, whatever the
#: spec says (the spec's preStopDrainSeconds is capped too, at MAX_PRE_STOP_DRAIN_SECONDS)
MAX_DRAIN_TIMEOUT_SECONDS = 7200.0
#: engines probed at once, and the most one step's probes take together (seconds): each probe
#: has its own 2 s deadline (engine_probe), so 32 silent engines take 4 s, not 64; beyond the
#: bound an engine not yet answered is unknown (never idle), and asked again next tick
PROBE_CONCURRENCY = 16
PROBE_BOUND_SECONDS = 5.0

_T = TypeVar("_T")
_A = TypeVar("_A")


def probe_all(probe: Callable[[_A], _T | None], targets: Iterable[_A], *,
              bound_seconds: float = PROBE_BOUND_SECONDS,
              concurrency: int = PROBE_CONCURRENCY) -> dict[_A, _T | None]:
    """Each target's answer, asked concurrently (at most ``concurrency`` at once) and all
    within ``bound_seconds``: a target not answered by then, or whose probe raised, is None
    (unknown). The probes left running end on their own deadlines, in the background."""
    unique = list(dict.fromkeys(targets))
    if not unique:
        return {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(concurrency, len(unique)),
                                                 thread_name_prefix="probe")
    try:
        futures = {pool.submit(probe, t): t for t in unique}
        done, _ = concurrent.futures.wait(futures, timeout=bound_seconds)
        out: dict[_A, _T | None] = {}
        for future, target in futures.items():
            if future not in done:
                out[target] = None
            elif (exc := future.exception()) is not None:
                log.debug("probe of %s raised %s: unknown", target, exc)
                out[target] = None
            else:
                out[target] = future.result()
        return out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def drain_timeout_seconds(spec: PDClusterSpec, role: Role) -> float:
    return min(float(getattr(spec, role).pre_stop_drain_seconds) * DRAIN_TIMEOUT_FACTOR,
               MAX_DRAIN_TIMEOUT_SECONDS)


def drain_marks(draining_since: float | None) -> dict[str, Any]:
    """The pod patch that marks a drain (since when; the lowest deletion cost, so the
    ReplicaSet removes this pod) or, with None, takes the marks away."""
    annotations: dict[str, str | None] = {
        DRAINING_ANNOTATION: None if draining_since is None else f"{draining_since:.3f}",
        DELETION_COST_ANNOTATION: None if draining_since is None else str(DRAINING_DELETION_COST),
    }
    return {"metadata": {"annotations": annotations}}


def as_engine_load(answer: EngineLoad | int | None) -> EngineLoad | None:
    """A probe's answer as an ``EngineLoad``; a bare count (a probe that counts everything an
    engine holds, as a test's does) reads as one from SGLang's ``/v1/loads``."""
    if answer is None or isinstance(answer, EngineLoad):
        return answer
    return EngineLoad(answer, LoadSource.LOADS)


def with_engine_state(pods: Sequence[PodView], port: int, listed: set[str] | None,
                      in_flight: Callable[[str | None, int], EngineLoad | int | None]
                      ) -> list[PodView]:
    """Draining pods with what their engine holds (None: unknown) and whether a router
    still lists them (``listed`` None: unknown, so listed); the others as they are."""
    return [
        replace(p, in_flight=None if (load := as_engine_load(in_flight(p.ip, port))) is None
                else load.in_flight,
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


def get_load_wait_seconds(spec: PDClusterSpec) -> float:
    """How long an SGLang prefill without ``/v1/loads`` waits after ``/get_load`` reads 0,
    for the KV sends that count leaves out: the slowest prefill with its margin
    (``minimum_transfer_timeout_seconds``), since sending a prompt's KV never takes longer
    than computing it."""
    return float(minimum_transfer_timeout_seconds(spec))


@dataclass
class HandoffWaits:
    """Per draining prefill (namespace, pod) that is out of the router and holds nothing:
    since when, and what it still waits for before its KV has surely left for the decodes
    (pure state, no I/O; the decodes' counts come through a callable, asked only when needed).

    - SGLang with ``/v1/loads``: nothing; its count already holds the inflight queue.
    - SGLang with only ``/get_load`` (older engines): that count leaves the inflight queue
      out, so the prefill waits ``get_load_wait_seconds`` after it first read 0.
    - vLLM (NIXL): until no decode can still pull from it, or one lease (``KVPullWatch``).

    A prefill seen busy again is forgotten (``end_tick``): its wait starts again when idle."""

    watches: dict[tuple[str, str], KVPullWatch] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def begin_tick(self) -> None:
        self.seen = set()

    def end_tick(self) -> None:
        """Forget the prefills no tick asked about (drained, busy again, or un-drained)."""
        self.watches = {k: v for k, v in self.watches.items() if k in self.seen}

    def reason(self, namespace: str, pod: str, source: LoadSource, engine: EngineKind,
               pulls_pending: Callable[[], Mapping[str, float | None]], now: float, *,
               lease_seconds: float, get_load_wait_seconds: float) -> str | None:
        """Why the idle prefill ``pod`` (its count from ``source``) still waits, or None.
        ``pulls_pending``: each decode's ``decode_pulls_pending`` now (None: no answer)."""
        key = (namespace, pod)
        self.seen.add(key)
        watch = self.watches.get(key) or KVPullWatch(idle_since=now)
        waited = now - watch.idle_since
        if source is LoadSource.GET_LOAD:
            self.watches[key] = watch
            if waited >= get_load_wait_seconds:
                return None
            return (f"engine has no /v1/loads, and /get_load does not count KV still being sent "
                    f"to decodes: waits {get_load_wait_seconds:.0f} s after it read 0 "
                    f"({get_load_wait_seconds - waited:.0f} s left)")
        if engine is not EngineKind.VLLM:
            return None
        if watch.cleared_at is None and waited >= HANDOFF_GRACE_SECONDS:
            pending = pulls_pending()
            followed = watch.follow(pending, now)
            if followed.cleared_at is not None:
                log.info("prefill %s/%s: no decode waits on KV any more", namespace, pod)
        else:
            pending, followed = {}, watch
        self.watches[key] = followed
        if not followed.pending(now, lease_seconds):
            return None
        unknown = [name for name, n in pending.items() if n is None]
        held = round(sum(n for n in pending.values() if n is not None))
        seen = (f"{held} requests waiting at decodes" if pending else "decodes not read yet")
        if unknown:
            seen += f", {len(unknown)} decodes not answering"
        return (f"a decode may still pull its KV ({seen}); waits until none may, or one NIXL "
                f"lease ({lease_seconds:.0f} s) after it went idle")


class Drains:
    """Moves one PDCluster's fleet a step towards the planner's targets each tick."""

    def __init__(self, kube: Kube, report: Reporter, *,
                 in_flight: Callable[[str | None, int], EngineLoad | int | None] = engine_load,
                 vllm_totals: Callable[[str, int], dict[str, float] | None] = engine_vllm_totals,
                 kv_lease_seconds: float = NIXL_KV_LEASE_SECONDS):
        self.kube = kube
        self.report = report
        #: the engine probes (engine_probe), replaceable in tests
        self.in_flight = in_flight
        self.vllm_totals = vllm_totals
        #: vLLM NIXL's kv_lease_duration on the engines (seconds; see KVPullWatch)
        self.kv_lease_seconds = kv_lease_seconds
        self.prefill_waits = PrefillWaits()
        self.handoff_waits = HandoffWaits()

    def begin_tick(self) -> None:
        """Before a tick over every PDCluster (the waits forget what no tick asks about)."""
        self.prefill_waits.begin_tick()
        self.handoff_waits.begin_tick()

    def end_tick(self) -> None:
        self.prefill_waits.end_tick()
        self.handoff_waits.end_tick()

    def move(self, body: dict[str, Any], spec: PDClusterSpec, pods: Mapping[Role, list[PodView]],
             workers: WorkerList, listed: set[str] | None, targets: Mapping[Role, int],
             now: float) -> None:
        """One level-based step of every role to its target (``fleet.plan_role_actions``)."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        # A role of several nodes per instance is a LeaderWorkerSet of groups, the others
        # Deployments: the replicas to move are that child's
        kinds = {role: lws.KIND if multinode.is_group(spec, role.value) else "Deployment"
                 for role in Role}
        deployments = {role: self.kube.get(kinds[role], ns, names.child_name(name, role)) for role in Role}
        missing = [names.child_name(name, role) for role, d in deployments.items() if d is None]
        if missing:
            # The reconcile creates them; until then there are no replicas to move.
            log.info("planner %s/%s: %s not there yet; nothing to move", ns, name, missing)
            return
        foreign = [names.child_name(name, role) for role, d in deployments.items()
                   if d is not None and not is_ours(d, str(meta.get("uid") or ""))]
        if foreign:
            # Another object of that name (the reconcile reports the conflict): its pods are
            # not ours to drain, whatever labels they carry.
            log.warning("planner %s/%s: %s are not controlled by this PDCluster; "
                        "nothing is moved", ns, name, foreign)
            return
        replicas: dict[str, int] = {}
        waiting: list[str] = []
        leaving: set[str] = set()
        port = spec.engine.port
        # by IP, what each draining engine holds: every one asked at once, within one bound
        loads: dict[str | None, EngineLoad | None] = probe_all(
            lambda ip: as_engine_load(self.in_flight(ip, port)),
            [p.ip for role in Role for p in pods[role] if p.draining])

        for role in Role:
            self.report.target(ns, name, role, targets[role])
            current = int(((deployments[role] or {}).get("spec") or {}).get("replicas") or 0)
            views = with_engine_state(pods[role], port, listed, lambda ip, _port: loads.get(ip))
            if role is Role.DECODE and workers.decode_picked_before_prefill:
                views = self._await_prefill(ns, spec, views, pods[Role.PREFILL], now)
            if role is Role.PREFILL:
                views = self._await_handoffs(ns, spec, views, loads, pods[Role.DECODE], now)
            # LWS removes the highest groups first, whatever their load or deletion cost:
            # groups drain from the top (fleet.plan_group_actions)
            plan = plan_group_actions if kinds[role] == lws.KIND else plan_role_actions
            actions = plan(role, targets[role], views, current, now_seconds=now,
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
            for pod in actions.mark_drained:
                self.kube.patch_pod(ns, pod, {"metadata": {"annotations": {
                    DELETION_COST_ANNOTATION: str(DRAINED_DELETION_COST)}}})
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
        port = spec.engine.port
        answers = probe_all(lambda ip: self.vllm_totals(ip, port), [p.ip for p in prefill if p.ip])
        counts: dict[str, PrefillCount | None] = {
            p.name: None if (totals := answers.get(p.ip)) is None else PrefillCount.from_totals(totals)
            for p in prefill if p.ip}
        serving = [p.name for p in prefill if p.ready and p.ip]
        awaited = self.prefill_waits.awaited(ns, leaving, serving, counts, now,
                                             minimum_transfer_timeout_seconds(spec))
        return [replace(p, awaited_by_prefill=True) if p.name in awaited else p for p in decode]

    def _await_handoffs(self, ns: str, spec: PDClusterSpec, prefill: list[PodView],
                        loads: Mapping[str | None, EngineLoad | None], decode: Sequence[PodView],
                        now: float) -> list[PodView]:
        """Gives each draining prefill that is out of the router and holds nothing the reason
        it still waits for its KV to leave (see ``HandoffWaits``), if any."""
        pulls: dict[str, float | None] | None = None

        def pulls_pending() -> Mapping[str, float | None]:
            # Every decode that could hold one of its requests: serving, draining or being
            # deleted, as long as it has an address. Read once a tick, and only if needed.
            nonlocal pulls
            if pulls is None:
                port = spec.engine.port
                answers = probe_all(lambda ip: self.vllm_totals(ip, port), [d.ip for d in decode if d.ip])
                pulls = {d.name: None if (totals := answers.get(d.ip)) is None
                         else decode_pulls_pending(totals) for d in decode if d.ip}
            return pulls

        out = []
        for p in prefill:
            load = loads.get(p.ip)
            if p.draining and not p.in_router and load is not None and load.in_flight == 0:
                why = self.handoff_waits.reason(
                    ns, p.name, load.source, spec.engine.kind, pulls_pending, now,
                    lease_seconds=self.kv_lease_seconds,
                    get_load_wait_seconds=get_load_wait_seconds(spec))
                p = replace(p, handoff_wait=why)
            out.append(p)
        return out


# ---------------------------------------------------------------------------------------
# Deletion: a PDCluster deleted while it serves goes through the same drain, all at once.

#: the operator's finalizer on every PDCluster it reconciles
FINALIZER = "pdscale.io/drain"
#: how long a deletion waits for in-flight work when the spec gives no drain timeout
DEFAULT_DELETION_DRAIN_SECONDS = 300.0


def deletion_timeout_seconds(body: dict[str, Any]) -> float:
    """The longest drain timeout of the spec's roles (a drain never waits longer); the
    default when the spec is not valid."""
    try:
        spec = PDClusterSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return DEFAULT_DELETION_DRAIN_SECONDS
    return max(drain_timeout_seconds(spec, role) for role in Role)


def finalizer_added(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that adds our finalizer, or None when it is there or the PDCluster is
    being deleted (no finalizer may be added then). The test op makes a concurrent change of
    the list fail (409/422) instead of being overwritten."""
    meta = body["metadata"]
    finalizers = meta.get("finalizers")
    if meta.get("deletionTimestamp") or FINALIZER in (finalizers or []):
        return None
    if finalizers is None:
        # an "add" would replace a list added since: only onto the version read
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    return [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def finalizer_removed(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that removes our finalizer (others stay), or None when it is not there."""
    finalizers = list(body["metadata"].get("finalizers") or [])
    if FINALIZER not in finalizers:
        return None
    return [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers",
             "value": [f for f in finalizers if f != FINALIZER]}]


def patch_pdcluster(kube: Kube, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
    """JSON-patch a PDCluster's metadata (the finalizer; the operator never writes the spec)."""
    kube.writes += 1
    # Kube has no PDCluster metadata patch of its own: its generic call, the same door.
    kube._call("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}",
               body=patch, content_type="application/json-patch+json")


@dataclass(frozen=True)
class DeletionState:
    """Where a deletion drain stands (pure summary of one look)."""

    listed: tuple[str, ...]  # engine pods a router still lists
    busy: tuple[str, ...]  # engine pods whose engine holds work (or does not answer)
    overdue: bool  # the drain timeout has passed since the deletion

    @property
    def done(self) -> bool:
        return self.overdue or not (self.listed or self.busy)


def deletion_state(engines: Sequence[PodView], port: int, listed: set[str] | None,
                   in_flight: Mapping[str, int | None], deleted_at: float, now: float,
                   timeout_seconds: float) -> DeletionState:
    """The drain rules of a deletion: every engine out of the router (``listed`` None:
    unknown, so listed) and every engine idle (no answer is not idle; a pod without an IP
    serves nothing; a pod already being deleted is going anyway, after its own drain or
    preStop). All engines idle at once also means no request held at a prefill can still
    reach a decode, and no KV is still on its way to one: a decode counts a request whose KV
    it waits for (SGLang's transfer queue, in /v1/loads and /get_load alike; vLLM's deferred
    waiting), so no hand-off wait (``HandoffWaits``) is needed here."""
    engines = [p for p in engines if p.ip and not p.deleting]
    out = tuple(p.name for p in engines
                if listed is None or normalize_url(f"http://{p.ip}:{port}") in listed)
    busy = tuple(p.name for p in engines if in_flight.get(p.name) != 0)
    return DeletionState(out, busy, now - deleted_at >= timeout_seconds)


class DeletionDrain:
    """A deleted PDCluster, one level-based step at a time: every engine out of the router,
    wait until they are idle (bounded by the drain timeout, counted from the deletion), then
    remove the finalizer so garbage collection removes the children. Its only state is the
    PDCluster's deletionTimestamp: a restarted operator (or a new leader) carries on."""

    def __init__(self, kube: Kube, worker_lists: WorkerLists, *,
                 in_flight: Callable[[str | None, int], int | None] = engine_in_flight):
        self.kube = kube
        self.worker_lists = worker_lists
        self.in_flight = in_flight

    def _owns_engines(self, ns: str, name: str, uid: str) -> bool:
        """No engine Deployment of this PDCluster's names is someone else's: a deletion never
        takes another PDCluster's engines out of its router (their pods carry the same labels
        only when the names collide; the reconcile refuses to adopt them)."""
        for role in Role:
            live = self.kube.get("Deployment", ns, names.child_name(name, role))
            if live is not None and not is_ours(live, uid):
                log.warning("deletion of %s/%s: Deployment %s is not controlled by it; its pods "
                            "are left alone", ns, name, names.child_name(name, role))
                return False
        return True

    def step(self, body: dict[str, Any], now: float) -> bool:
        """True once the finalizer is gone (or was never ours)."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return True
        deleted_at = datetime.fromisoformat(meta["deletionTimestamp"].replace("Z", "+00:00")).timestamp()
        timeout = deletion_timeout_seconds(body)
        try:
            spec: PDClusterSpec | None = PDClusterSpec.model_validate(body.get("spec") or {})
        except ValueError:
            spec = None  # nothing could have been built from it that serves
        if spec is not None and self._owns_engines(ns, name, str(meta.get("uid") or "")):
            pods = lws.leaders_only(self.kube.list_pods(ns, {names.LABEL_INSTANCE: names.base_name(name),
                                                             names.LABEL_MANAGED_BY: names.MANAGER}))
            role_of = {p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(names.LABEL_ROLE)
                       for p in pods}
            engines = [pod_view(p, str(role_of[p["metadata"]["name"]])) for p in pods
                       if role_of[p["metadata"]["name"]] in (Role.PREFILL, Role.DECODE)]
            routers = [pod_view(p, "router") for p in pods if role_of[p["metadata"]["name"]] == "router"]
            workers = self.worker_lists.of(spec, routers)
            workers.make_equal(frozenset())  # every engine out of the router first
            port = spec.engine.port
            asked = [p for p in engines if p.ip and not p.deleting]
            answers = probe_all(lambda ip: self.in_flight(ip, port), [p.ip for p in asked])
            state = deletion_state(engines, port, workers.listed(),
                                   {p.name: answers.get(p.ip) for p in asked},
                                   deleted_at, now, timeout)
            if not state.done:
                log.info("deletion of %s/%s waits: listed %s, busy %s", ns, name,
                         list(state.listed), list(state.busy))
                return False
            if state.overdue and (state.listed or state.busy):
                log.warning("deletion of %s/%s: drain timeout (%.0f s) passed; removing anyway "
                            "(listed %s, busy %s)", ns, name, timeout, list(state.listed),
                            list(state.busy))
        patch = finalizer_removed(body)
        if patch is not None:
            patch_pdcluster(self.kube, ns, name, patch)
            log.info("deletion of %s/%s: engines drained; finalizer removed", ns, name)
        return True
