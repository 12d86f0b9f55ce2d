"""kopf wiring: thin handlers that read, build, apply and report through reconcile().

Run with ``kopf run -m pdscale.operator.handlers --all-namespaces``. The planner loop (router
worker lists, planning, drains; ``planner_loop``) starts and stops with the operator here.

Only event-watching handlers are used, never change-detecting ones or timers: those make kopf
keep state on the PDCluster (annotations, its own finalizer), i.e. write to it on every change.
Here the operator's writes are children that differ, status that differs, Events, and one
finalizer of its own (``drain.FINALIZER``), added once per PDCluster by a patch when missing.

Why a finalizer: without one, deleting a PDCluster lets garbage collection remove the router
and every engine at once, and requests in flight fail. With it, the deletion goes through the
drains: every engine leaves the router, the operator waits until the engines are idle (at most
the spec's drain timeout, counted from the deletion), then removes the finalizer and garbage
collection removes the children (``drain.DeletionDrain``; its only state is the
deletionTimestamp, so a restarted operator or a new leader carries on). The cost: while no
operator runs, a deletion waits for one (the PDCluster stays, with its deletionTimestamp, and
keeps serving); removing the finalizer by hand deletes at once. A foreground deletion
(propagationPolicy Foreground) removes the children first and is not drained.

Replicas elect a leader through a Lease (``leader``): a startup handler blocks until this
process holds it, so a follower watches nothing and acts on nothing; a leader that cannot
renew exits and restarts as a follower. Failed reconciles are retried with backoff by the
operator's own loop, which also resyncs every PDCluster periodically (level-based: a missed
event costs latency, never correctness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from pdscale.operator.api import tenant_policy
from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.names import LABEL_MANAGED_BY, MANAGER
from pdscale.operator.api.pdcluster import GROUP, KIND, PLURAL, VERSION
from pdscale.operator.api.pdpool import POOL_PLURAL
from pdscale.operator.clients.kube import Kube, api_client_from_environment
from pdscale.operator.loop.drain import DeletionDrain, finalizer_added, patch_pdcluster
from pdscale.operator.loop.planner_loop import PlannerLoop, run_forever, supervise
from pdscale.operator.loop.telemetry import HEARTBEATS, serve_metrics_from_environment
from pdscale.operator.reconciler.reconcile import Outcome, reconcile
from pdscale.operator.render import lws

from . import leader

log = logging.getLogger(__name__)

RESYNC_SECONDS = float(os.environ.get("PDSCALE_RESYNC_SECONDS", "300"))
RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
OURS = {LABEL_MANAGED_BY: MANAGER}
# Process-wide counters (read by the benchmark and tests; a metrics endpoint can export them).
STATS = {"reconciles": 0, "writes": 0, "skipped_child_events": 0}


class Retries:
    """PDClusters whose last reconcile failed, with when to try again (exponential backoff)."""

    def __init__(self) -> None:
        self.due: dict[tuple[str, str], tuple[float, float]] = {}

    def failed(self, key: tuple[str, str], now: float) -> float:
        _, delay = self.due.get(key, (0.0, RETRY_MIN_SECONDS / 2))
        delay = min(RETRY_MAX_SECONDS, delay * 2)
        self.due[key] = (now + delay, delay)
        return delay

    def succeeded(self, key: tuple[str, str]) -> None:
        self.due.pop(key, None)

    def ready(self, now: float) -> list[tuple[str, str]]:
        return [k for k, (when, _) in self.due.items() if when <= now]


def _run(memo: kopf.Memo, body: dict[str, Any]) -> Outcome:
    """Reconcile one PDCluster; on API errors, and when the API server refused a child,
    schedule a retry instead of giving up."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    try:
        outcome = reconcile(Kube(memo.api), body, now_rfc3339())
        if finalizer_added(body) is not None:
            # deletion then goes through the drains (see the module's docstring); the patch is
            # made against the version read now (the reconcile may have just written status)
            fresh = Kube(memo.api).get("PDCluster", *key)
            if fresh is not None and (patch := finalizer_added(fresh)) is not None:
                patch_pdcluster(Kube(memo.api), *key, patch)
    except ApiException as exc:
        delay = memo.retries.failed(key, time.monotonic())
        log.warning("reconcile of %s/%s failed (HTTP %s %s); retrying in %.0f s",
                    *key, exc.status, exc.reason, delay)
        # Conflicts and outages are temporary by nature; kopf logs it, our loop retries.
        raise kopf.TemporaryError(f"HTTP {exc.status}: {exc.reason}", delay=delay) from exc
    if outcome.refused:
        # Said in status (ChildrenApplied=False) and one Warning Event; retried with backoff
        # all the same: a policy or quota may change without the spec changing.
        delay = memo.retries.failed(key, time.monotonic())
        log.warning("reconcile of %s/%s: %s; retrying in %.0f s", *key,
                    "; ".join(outcome.refused), delay)
        raise kopf.TemporaryError("; ".join(outcome.refused), delay=delay)
    memo.retries.succeeded(key)
    STATS["reconciles"] += 1
    STATS["writes"] += outcome.writes
    for (kind, child), rv in outcome.seen.items():
        memo.seen[(meta["namespace"], kind, child)] = rv
    if outcome.writes:
        log.info("reconciled %s/%s: %d writes, events: %s", *key, outcome.writes,
                 [e.reason for e in outcome.events])
    return outcome


def _fresh(memo: kopf.Memo, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
    body = Kube(memo.api).get("PDCluster", namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    if uid is not None and body["metadata"]["uid"] != uid:
        return None
    return body


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # kopf's own readers, which look at $KUBECONFIG when called (the client library's
    # loader fixes its default path at import time).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # no kopf peering (and no peering CRD to require): our own Lease elects the one that acts
    settings.peering.standalone = True
    settings.posting.enabled = False  # we post our own Events, only on meaningful changes
    settings.watching.server_timeout = int(os.environ.get("PDSCALE_WATCH_TIMEOUT_SECONDS", "300"))
    # A watch the API server left hanging (a paused or restarted server) ends client-side too.
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 10
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = int(os.environ.get("PDSCALE_KOPF_REQUEST_TIMEOUT_SECONDS", "60"))
    settings.execution.max_workers = int(os.environ.get("PDSCALE_WORKERS", "8"))
    tenant_policy.configured()  # a malformed policy stops the start here, with its reason
    memo.api = api_client_from_environment()
    memo.retries = Retries()
    # Children's resourceVersions as the last reconcile left them: a child event carrying
    # the same version tells nothing new (e.g. the initial listing after a restart).
    memo.seen = {}
    memo.deletions = {}


@kopf.on.startup()
async def become_leader(memo: kopf.Memo, **_: Any) -> None:
    """Block the operator's start (every later startup handler, every watch) until this
    process holds the leader Lease; then renew it in a thread that exits the process when
    the Lease is lost."""
    if not leader.enabled():
        log.warning(leader.off_reason())
        return
    settings = leader.Settings.from_environment()
    elector = leader.Elector(leader.KubeLeases(Kube(api_client_from_environment()),
                                               settings.namespace, settings.name), settings)
    log.info("leader election: %s asks for Lease %s/%s", settings.identity, settings.namespace,
             settings.name)
    health = os.environ.get("PDSCALE_HEALTH_PORT")
    async with leader.follower_health(int(health) if health else None):
        await elector.acquire()
    memo.elector = elector
    memo.elector_stop = threading.Event()
    threading.Thread(target=elector.renew_until_lost, args=(memo.elector_stop, leader.exit_now),
                     name="leader-lease", daemon=True).start()


@kopf.on.startup()
async def start_resync(memo: kopf.Memo, **_: Any) -> None:
    memo.resync_task = asyncio.create_task(_resync_loop(memo))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "resync_task", None)
    if task is not None:
        task.cancel()


@kopf.on.startup()
async def start_planner(memo: kopf.Memo, **_: Any) -> None:
    serve_metrics_from_environment()
    loop = PlannerLoop(Kube(api_client_from_environment()))
    memo.planner_loop = loop  # its routers' worker lists serve the deletion drains too
    memo.announcer_stop = threading.Event()
    # ZMQ sockets are not thread-safe: the vLLM announcer owns its own thread
    threading.Thread(target=loop.worker_lists.announcer.run, args=(memo.announcer_stop,),
                     name="vllm-discovery", daemon=True).start()
    memo.planner_task = asyncio.create_task(run_forever(loop))


@kopf.on.probe(id="loops")
def loops_alive(**_: Any) -> dict[str, float]:
    """Liveness: fails (kopf's /healthz answers 500) when a background loop's tick has been
    blocked past its bound; a loop that keeps failing is retrying, not stuck."""
    now = time.monotonic()
    stuck = HEARTBEATS.stuck(now)
    if stuck:
        # permanent: kopf retries a probe's other errors, and /healthz would hang, not fail
        raise kopf.PermanentError("background loop stuck: " + ", ".join(
            f"{loop} finished no tick for {age:.0f} s" for loop, age in sorted(stuck.items())))
    return {loop: round(now - last, 1) for loop, (last, _, _) in HEARTBEATS.beats.items()}


@kopf.on.cleanup()
async def stop_planner(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "planner_task", None)
    if task is not None:
        task.cancel()
    stop = getattr(memo, "announcer_stop", None)
    if stop is not None:
        stop.set()


class _Resync:
    """The resync loop's tick: PDClusters due for a retry, and every one each RESYNC_SECONDS."""

    def __init__(self, memo: kopf.Memo):
        self.memo = memo
        self.last_full = time.monotonic()

    async def tick(self) -> None:
        memo = self.memo
        now = time.monotonic()
        keys = memo.retries.ready(now)
        if now - self.last_full >= RESYNC_SECONDS:
            bodies = await asyncio.to_thread(Kube(memo.api).list_pdclusters)
            self.last_full = now  # only once the listing is in hand: a failed one is retried
        else:
            bodies = [b for k in keys if (b := await asyncio.to_thread(_fresh, memo, *k))]
            for k in keys:
                if not any((b["metadata"]["namespace"], b["metadata"]["name"]) == k for b in bodies):
                    memo.retries.succeeded(k)  # gone
        for body in bodies:
            if body["metadata"].get("deletionTimestamp"):
                continue
            with contextlib.suppress(kopf.TemporaryError):  # already scheduled for retry
                await asyncio.to_thread(_run, memo, body)


async def _resync_loop(memo: kopf.Memo) -> None:
    # supervised: an API-server restart or any other failure is logged, counted, retried
    await supervise("resync", _Resync(memo).tick, RETRY_MIN_SECONDS)


@kopf.on.event(GROUP, VERSION, PLURAL)
def pdcluster_changed(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        return  # children go with it: garbage collection follows the owner references
    outcome = _run(memo, _plain(body))
    if outcome.problems:
        # Already reported (SpecValid=False, a Warning Event); retrying cannot help until
        # the spec changes, and the change will wake us.
        raise kopf.PermanentError("; ".join(outcome.problems))


@kopf.on.event(GROUP, VERSION, POOL_PLURAL)
def pdpool_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A PDPool created, edited or deleted: reconcile the PDClusters of its namespace that
    name it, so that their PoolMember condition and pinning follow the pool's members at once
    (not at the next resync). The split itself is the planner loop's, which reads pools each
    tick. On a cluster without the PDPool CRD kopf warns that the resource is unresolved."""
    meta = body.get("metadata", {})
    ns, name = meta.get("namespace"), meta.get("name")
    for pdc in Kube(memo.api).list_pdclusters():
        ref = ((pdc.get("spec") or {}).get("planner") or {}).get("pool") or {}
        if pdc["metadata"]["namespace"] == ns and ref.get("name") == name \
                and not pdc["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(kopf.TemporaryError):  # retried by the resync loop
                _run(memo, pdc)


def _owner_ref(body: kopf.Body) -> dict[str, Any] | None:
    refs: list[dict[str, Any]] = body.get("metadata", {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller") and ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            return ref
    return None


def _child_changed(body: kopf.Body, memo: kopf.Memo) -> None:
    ref = _owner_ref(body)
    if ref is None:
        return
    meta = body["metadata"]
    if memo.seen.get((meta["namespace"], body["kind"], meta["name"])) == meta.get("resourceVersion"):
        STATS["skipped_child_events"] += 1
        return
    owner = _fresh(memo, body["metadata"]["namespace"], ref["name"], ref["uid"])
    if owner is not None:
        _run(memo, owner)


@kopf.on.event("apps", "v1", "deployments", labels=OURS)
def deployment_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # Ready counts and drift (someone edited or deleted our Deployment) both land here.
    _child_changed(body, memo)


@kopf.on.event(lws.GROUP, "v1", lws.PLURAL, labels=OURS)
def leaderworkerset_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # A role of several nodes per instance: its ready groups (instances) land here. On a
    # cluster without the LWS CRD kopf warns that the resource is unresolved and serves the rest.
    _child_changed(body, memo)


@kopf.on.event("", "v1", "services", labels=OURS)
def service_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _child_changed(body, memo)


def _plain(body: kopf.Body) -> dict[str, Any]:
    import copy

    return copy.deepcopy(dict(body))


# ---------------------------------------------------------------------------------------
# Deletion (the finalizer) and stepping down

DELETION_TICK_SECONDS = float(os.environ.get("PDSCALE_DELETION_TICK_SECONDS", "2"))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def pdcluster_deleting(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A PDCluster with a deletionTimestamp: drain it (one task per PDCluster) before its
    children go. The initial listing brings deletions pending from before a restart here."""
    meta = body.get("metadata", {})
    if type == "DELETED" or not meta.get("deletionTimestamp"):
        return
    key = (meta["namespace"], meta["name"])
    task = memo.deletions.get(key)
    if task is None or task.done():
        memo.deletions[key] = asyncio.create_task(_drain_deletion(memo, *key, meta["uid"]))


async def _drain_deletion(memo: kopf.Memo, namespace: str, name: str, uid: str) -> None:
    drain = DeletionDrain(Kube(memo.api), memo.planner_loop.worker_lists)
    kube = Kube(memo.api)
    log.info("PDCluster %s/%s deleted: draining its engines before its children go", namespace, name)
    while True:
        try:
            body = await asyncio.to_thread(kube.get, "PDCluster", namespace, name)
            if body is None or body["metadata"]["uid"] != uid:
                return
            if await asyncio.to_thread(drain.step, body, time.time()):
                return
        except ApiException as exc:
            log.warning("deletion drain of %s/%s: HTTP %s %s; retrying", namespace, name,
                        exc.status, exc.reason)
        except Exception:  # keep trying: a deletion must not stall on one bad tick
            log.exception("deletion drain of %s/%s failed; retrying", namespace, name)
        await asyncio.sleep(DELETION_TICK_SECONDS)


@kopf.on.cleanup()
async def step_down(memo: kopf.Memo, **_: Any) -> None:
    """A graceful stop: stop the deletion drains, then give the Lease up so that a follower
    takes over at once instead of after the Lease's duration."""
    for task in getattr(memo, "deletions", {}).values():
        task.cancel()
    stop = getattr(memo, "elector_stop", None)
    if stop is not None:
        stop.set()
        with contextlib.suppress(ApiException, OSError):
            await asyncio.to_thread(memo.elector.release)
