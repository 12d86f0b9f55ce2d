"""Leader election over a coordination.k8s.io Lease: of the operator's replicas, only the one
holding the Lease reconciles, runs the planner loop and drains.

The shape is controller-runtime's. A startup handler blocks until this process holds the Lease
(kopf starts no watch and no other startup handler before it returns), a background thread
renews it, and a process that cannot renew within the renew deadline exits at once: its pod
restarts and becomes a follower. No one acts after losing the Lease, because the renew deadline
is shorter than the Lease's duration.

Expiry is judged by this process's own clock, never by comparing the holder's renewTime with
it (the nodes' clocks may disagree): a Lease not written (same resourceVersion) for its
duration, as seen from here, is expired. A follower therefore takes over one Lease duration after the
leader's last renewal it saw. A record's duration is believed only within bounds
(``trusted_duration_seconds``): a Lease written with a duration of decades, or a renew time
in the future, does not stop the operator for decades.

The decisions (``decide``) are pure and tested against an in-memory store; ``KubeLeases`` is
the store on the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from pdscale.operator.api.names import LEASE_NAME
from pdscale.operator.clients.kube import Kube

log = logging.getLogger(__name__)

#: where a pod's ServiceAccount namespace is mounted
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_NAMESPACE = "pdscale-system"


@dataclass(frozen=True)
class Settings:
    """How long a Lease lasts unrenewed, how long the leader keeps trying to renew before it
    gives up (shorter), and how often anyone tries."""

    namespace: str = DEFAULT_NAMESPACE
    name: str = LEASE_NAME
    identity: str = "unknown"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease "
                             f"duration, got {self.retry_period_seconds} / "
                             f"{self.renew_deadline_seconds} / {self.lease_duration_seconds}")

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        return cls(
            namespace=env.get("PDSCALE_LEADER_NAMESPACE") or _own_namespace(),
            name=env.get("PDSCALE_LEADER_LEASE_NAME") or LEASE_NAME,
            identity=env.get("PDSCALE_LEADER_IDENTITY") or f"{socket.gethostname()}_{os.getpid()}",
            lease_duration_seconds=float(env.get("PDSCALE_LEADER_LEASE_DURATION_SECONDS", "15")),
            renew_deadline_seconds=float(env.get("PDSCALE_LEADER_RENEW_DEADLINE_SECONDS", "10")),
            retry_period_seconds=float(env.get("PDSCALE_LEADER_RETRY_PERIOD_SECONDS", "2")),
        )


def enabled(env: dict[str, str] | None = None, *, in_pod: bool | None = None) -> bool:
    """Whether to elect a leader. PDSCALE_LEADER_ELECTION decides when set. Unset, a process
    elects when it runs in a pod (the chart's replicas) or is told the Lease's namespace
    (PDSCALE_LEADER_NAMESPACE); a process run by hand with neither is alone and runs without
    election, rather than wait for a Lease in a namespace nothing created."""
    env = dict(os.environ if env is None else env)
    value = env.get("PDSCALE_LEADER_ELECTION", "").strip().lower()
    if value:
        return value not in ("false", "0", "no", "off")
    if in_pod is None:
        in_pod = os.path.exists(SERVICE_ACCOUNT_NAMESPACE)
    return in_pod or bool(env.get("PDSCALE_LEADER_NAMESPACE"))


def off_reason(env: dict[str, str] | None = None) -> str:
    """The one log line that says why election is off and what turns it on."""
    env = dict(os.environ if env is None else env)
    if env.get("PDSCALE_LEADER_ELECTION", "").strip():
        return ("leader election off (PDSCALE_LEADER_ELECTION=false): run one operator only")
    return ("leader election off: not in a pod and PDSCALE_LEADER_NAMESPACE is unset, so this "
            "operator runs alone; run one only, or set PDSCALE_LEADER_NAMESPACE to an existing "
            "namespace to elect a leader through a Lease there")


def missing_namespace_message(namespace: str, name: str) -> str:
    """What a process waiting on a Lease whose namespace does not exist needs (said once)."""
    return (f"leader election: namespace {namespace!r} does not exist, so Lease {namespace}/{name} "
            f"cannot be created and this operator reconciles nothing until it does: create it "
            f"(kubectl create namespace {namespace}), set PDSCALE_LEADER_NAMESPACE to an existing "
            "namespace, or set PDSCALE_LEADER_ELECTION=false to run a single operator without "
            "election")


def _own_namespace() -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


# ---------------------------------------------------------------------------------------
# The decisions (pure)


@dataclass(frozen=True)
class Record:
    """The Lease's spec as far as the election goes."""

    holder: str | None
    lease_duration_seconds: int
    renew_time: str | None = None
    acquire_time: str | None = None
    transitions: int = 0

    def to_spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.lease_duration_seconds,
                "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                "leaseTransitions": self.transitions}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Record:
        return cls(holder=spec.get("holderIdentity") or None,
                   lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                   renew_time=spec.get("renewTime"), acquire_time=spec.get("acquireTime"),
                   transitions=int(spec.get("leaseTransitions") or 0))


class Action(Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # ours
    TAKE = "take"  # free (released) or expired
    WAIT = "wait"  # another's, unexpired


#: a holder's leaseDurationSeconds is believed up to this many times our own: every replica
#: runs with the chart's one setting, so more is a foreign write, not a leader
MAX_LEASE_DURATION_FACTOR = 4.0
#: how far ahead of this process's wall clock a renewTime may be (node clock skew)
MAX_RENEW_SKEW_SECONDS = 300.0


def _epoch(micro: str | None) -> float | None:
    if not micro:
        return None
    try:
        return datetime.fromisoformat(micro.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def trusted_duration_seconds(current: Record, own_duration_seconds: float,
                             wall_now: float | None = None) -> float:
    """How long ``current`` keeps its holder, as this process believes it (pure): the
    record's leaseDurationSeconds, but at most MAX_LEASE_DURATION_FACTOR times our own, and
    only our own when its renewTime lies beyond MAX_RENEW_SKEW_SECONDS in the future (no
    leader renews from the future: the record was written to hold the Lease for ever)."""
    duration = min(float(current.lease_duration_seconds),
                   MAX_LEASE_DURATION_FACTOR * own_duration_seconds)
    renewed = _epoch(current.renew_time)
    if wall_now is not None and renewed is not None and renewed > wall_now + MAX_RENEW_SKEW_SECONDS:
        duration = min(duration, own_duration_seconds)
    return duration


def decide(current: Record | None, identity: str, unchanged_for_seconds: float,
           duration_seconds: float | None = None) -> Action:
    """What to do with the Lease as read now. ``unchanged_for_seconds``: how long this process
    has seen this very record unchanged (0 when it just changed or was first seen);
    ``duration_seconds``: how long the record holds (``trusted_duration_seconds``; None: its
    own leaseDurationSeconds)."""
    if current is None:
        return Action.CREATE
    if current.holder == identity:
        return Action.RENEW
    holds = current.lease_duration_seconds if duration_seconds is None else duration_seconds
    if current.holder is None or unchanged_for_seconds >= holds:
        return Action.TAKE
    return Action.WAIT


def next_record(current: Record | None, action: Action, identity: str, duration_seconds: int,
                now: str) -> Record:
    """The record to write for ``action`` (not WAIT)."""
    if action is Action.RENEW and current is not None:
        return replace(current, renew_time=now, lease_duration_seconds=duration_seconds)
    transitions = 0 if current is None else current.transitions + (action is Action.TAKE)
    return Record(holder=identity, lease_duration_seconds=duration_seconds, renew_time=now,
                  acquire_time=now, transitions=transitions)


# ---------------------------------------------------------------------------------------
# The store


class Conflict(Exception):
    """Someone else wrote the Lease since we read it (or created it first)."""


class LeaseStore(Protocol):
    def get(self) -> tuple[Record, str] | None:
        """The record and its resourceVersion, or None when there is no Lease."""
        ...

    def create(self, record: Record) -> None: ...

    def update(self, record: Record, resource_version: str) -> None:
        """Replace the record only if the Lease is still at ``resource_version``."""
        ...


class KubeLeases:
    """The Lease on the API server (optimistic concurrency through resourceVersion)."""

    def __init__(self, kube: Kube, namespace: str, name: str):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def get(self) -> tuple[Record, str] | None:
        try:
            lease = self.kube._call("GET", f"{self.base}/{self.name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return Record.from_spec(lease.get("spec") or {}), str(lease["metadata"]["resourceVersion"])

    def create(self, record: Record) -> None:
        self._write("POST", self.base, self._body(record, None))

    def update(self, record: Record, resource_version: str) -> None:
        self._write("PUT", f"{self.base}/{self.name}", self._body(record, resource_version))

    def _body(self, record: Record, resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/name": "pdscale"}}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {k: v for k, v in record.to_spec().items() if v is not None}}

    def _write(self, method: str, path: str, body: dict[str, Any]) -> None:
        try:
            self.kube._call(method, path, body=body, content_type="application/json")
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from exc
            raise


def micro_time(seconds: float) -> str:
    """A MicroTime as the API server writes it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------
# The elector


class Elector:
    """One process's part in the election. ``clock`` is monotonic (expiry as seen from here);
    ``wall`` only stamps the records."""

    def __init__(self, store: LeaseStore, settings: Settings, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.store = store
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.observed: Record | None = None
        #: the resourceVersion of the record observed (any write changes it)
        self.observed_version = ""
        self.observed_at = 0.0
        #: the holder other than us seen last (for the logs)
        self.other: str | None = None
        #: the last failure logged (each is logged once, until an attempt gets through)
        self.last_problem: str | None = None

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this process holds the Lease now."""
        got = self.store.get()
        now = self.clock()
        current, version = got if got is not None else (None, "")
        if (current, version) != (self.observed, self.observed_version):
            self.observed, self.observed_version, self.observed_at = current, version, now
        trusted = None if current is None else trusted_duration_seconds(
            current, self.settings.lease_duration_seconds, self.wall())
        action = decide(current, self.settings.identity, now - self.observed_at, trusted)
        if action is Action.WAIT:
            if current is not None and current.holder != self.other:
                self.other = current.holder
                log.info("leader election: %s holds Lease %s/%s; waiting", current.holder,
                         self.settings.namespace, self.settings.name)
            return False
        record = next_record(current, action, self.settings.identity,
                             max(1, round(self.settings.lease_duration_seconds)),
                             micro_time(self.wall()))
        try:
            if action is Action.CREATE:
                self.store.create(record)
            else:
                self.store.update(record, version)
        except Conflict:
            return False  # someone else wrote first: read again next time
        # our write's version is unknown here: the next read counts as a change, never as expiry
        self.observed, self.observed_version, self.observed_at = record, "", self.clock()
        if action is not Action.RENEW:
            log.info("leader election: %s now holds Lease %s/%s (%s)", self.settings.identity,
                     self.settings.namespace, self.settings.name, action.value)
        return True

    def attempt(self) -> bool:
        """try_acquire_or_renew, an API error counting as a failed attempt. The same failure is
        logged once, not at every retry; a missing namespace is said with what to do."""
        try:
            ok = self.try_acquire_or_renew()
        except (ApiException, OSError) as exc:
            # a GET of a missing Lease is None, so a 404 here is the create's: no namespace
            missing = isinstance(exc, ApiException) and exc.status == 404
            if missing:
                message = missing_namespace_message(self.settings.namespace, self.settings.name)
            else:
                message = (f"leader election: Lease {self.settings.namespace}/"
                           f"{self.settings.name} not reachable: {exc}")
            if message != self.last_problem:
                log.log(logging.ERROR if missing else logging.WARNING, message)
            self.last_problem = message
            return False
        self.last_problem = None
        return ok

    async def acquire(self) -> None:
        """Return once this process holds the Lease."""
        while not await asyncio.to_thread(self.attempt):
            await asyncio.sleep(self.settings.retry_period_seconds)

    def renew_until_lost(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew every retry period until ``stop``; call ``on_lost`` when no renewal succeeded
        for the renew deadline, or another process holds the Lease."""
        renewed = self.clock()
        while not stop.wait(self.settings.retry_period_seconds):
            if self.attempt():
                renewed = self.clock()
                continue
            taken = self.observed is not None and self.observed.holder not in (None, self.settings.identity)
            if taken or self.clock() - renewed >= self.settings.renew_deadline_seconds:
                log.critical("leader election: Lease %s/%s lost (%s); exiting",
                             self.settings.namespace, self.settings.name,
                             f"held by {self.observed.holder}" if taken and self.observed
                             else "not renewed within the renew deadline")
                on_lost()
                return

    def release(self) -> None:
        """Give the Lease up (a graceful stop), so a follower takes over at once."""
        got = self.store.get()
        if got is None or got[0].holder != self.settings.identity:
            return
        record, version = got
        with contextlib.suppress(Conflict):
            self.store.update(replace(record, holder=None, lease_duration_seconds=1), version)
            log.info("leader election: %s released Lease %s/%s", self.settings.identity,
                     self.settings.namespace, self.settings.name)


def exit_now() -> None:
    """Lost the Lease: stop acting this instant (no cleanup; the pod restarts as a follower)."""
    logging.shutdown()
    os._exit(1)


@contextlib.asynccontextmanager
async def follower_health(port: int | None) -> AsyncIterator[None]:
    """While a follower waits in a startup handler, kopf's liveness endpoint is not served
    yet: answer the probes on its port meanwhile (closed before kopf opens its own)."""
    if port is None:
        yield
        return
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="follower: waiting for the leader Lease\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()
