"""Keep the SGLang router's worker list equal to the Ready, non-draining pods, and remove a
worker in the order that drops no request.

One client for both SGLang routers we test, sglang-router 0.3.2 and its successor, the gateway
smg 1.13 (observed against both binaries; docs/routers.md has the side-by-side):

- ``GET /workers`` -> ``{"workers": [{"id", "url", "worker_type": "prefill"|"decode",
  "bootstrap_port" (prefill only), "is_healthy", ...}], "total", "stats"}``. smg adds a
  ``status`` per entry: ``pending`` | ``ready`` | ``not_ready`` | ``failed`` | ``draining``.
- ``POST /workers {"url", "worker_type", "bootstrap_port", "health"}`` -> **202** with
  ``worker_id``;
  the worker appears in ``GET /workers`` only once the router has reached it (``/health``,
  ``/server_info``, ``/model_info``). A URL already registered: 0.3.2 answers 202 again (the
  job then fails with "already exists"), smg answers **409** ``WORKER_ALREADY_EXISTS``; both
  mean "present", so adding is idempotent.
- ``DELETE /workers/{id}`` -> **202**; an unknown id -> 404 ``WORKER_NOT_FOUND``. 0.3.2 drops
  the worker from the next ``GET /workers``. smg lists it as ``draining`` (no longer routed
  to, ``is_healthy`` false) for its drain settle time (5 s) and then drops it; deleting
  it again, or posting its URL meanwhile, can make the late removal take a fresh registration
  with it, so a draining entry is left alone until it has gone. Ids are random per
  registration, so we look them up by URL.
- The workers we add carry ``"health": {"drain_settle_secs": 0}`` (smg's per-worker
  override; 0.3.2 ignores it), so smg drops a removed worker at once. smg's overload veto
  leaves a worker with 8 waiting requests out of routing "while another worker is under the
  thresholds", and counts a ``draining`` one as such (``routers/common/overload.rs:
  all_vetoed`` at 1.13.0): while a removed prefill settled, an overloaded survivor was refused
  and every request failed with 503 "No available prefill workers". Our release order waits
  for the engine itself, so the settle time protects nothing.
- The legacy ``/add_worker``, ``/remove_worker`` and ``/list_workers`` answer **404**.

A ``/workers`` reply that is not that shape (a proxy's error page, a truncated body) reads as
unknown: the listing answers None and the sync holds until the next tick, never guessing.

Release order for a scale-down (:func:`drain_and_stop`): remove from the router first, wait
until the engine has nothing in flight (or a drain timeout), and only then stop it. Removing a
worker from the router does not cancel the requests it already has.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout

from pdscale.planner.observe import Role

log = logging.getLogger(__name__)
T = TypeVar("T")


def normalize_url(url: str) -> str:
    """Compare URLs as the router does: scheme://host:port, no trailing slash, lowercase."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class WorkerSpec:
    """A worker that should be in the router: a Ready, non-draining pod."""

    url: str
    role: str
    #: prefill only: the engine's disaggregation bootstrap port
    bootstrap_port: int | None = None

    def __post_init__(self) -> None:
        if self.role not in tuple(Role):
            raise ValueError(f"role must be one of {[r.value for r in Role]}, not {self.role!r}")
        if self.role == "decode" and self.bootstrap_port is not None:
            raise ValueError(f"decode worker {self.url} cannot have a bootstrap port")


class RouterError(RuntimeError):
    """The router refused a worker call or did not converge in time (message says which)."""


#: smg's entry states in which the entry is not (yet, or any longer) what routing uses
PENDING, DRAINING = "pending", "draining"


@dataclass(frozen=True)
class RouterWorker:
    """A worker as the router lists it."""

    id: str
    url: str
    role: str
    bootstrap_port: int | None = None
    healthy: bool = True
    #: smg's lifecycle state; "" from sglang-router 0.3.2, which lists only reached workers
    status: str = ""
    #: smg's ``health.drain_settle_secs`` for this worker; None when the router lists none
    drain_settle_seconds: int | None = None

    @property
    def draining(self) -> bool:
        """Deleted, no longer routed to, listed until smg's drain settle time has passed."""
        return self.status == DRAINING

    @property
    def leaving_now(self) -> bool:
        """Draining with no settle time: smg is removing it, in milliseconds, or longer on a
        loaded machine. Until it has gone, smg's overload veto still counts it (see above)."""
        return self.draining and self.drain_settle_seconds == 0

    @property
    def pending(self) -> bool:
        """Registered but not reached yet: on its way in, not yet comparable."""
        return self.status == PENDING

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> RouterWorker:
        return cls(
            id=str(item["id"]),
            url=str(item["url"]),
            role=str(item.get("worker_type", "regular")),
            bootstrap_port=item.get("bootstrap_port"),
            healthy=bool(item.get("is_healthy", True)),
            status=str(item.get("status") or ""),
            drain_settle_seconds=_drain_settle_seconds(item.get("health")),
        )

    def matches(self, spec: WorkerSpec) -> bool:
        return (
            normalize_url(self.url) == normalize_url(spec.url)
            and self.role == spec.role
            and (self.bootstrap_port if self.role == "prefill" else None) == spec.bootstrap_port
        )


def _drain_settle_seconds(health: object) -> int | None:
    value = health.get("drain_settle_secs") if isinstance(health, dict) else None
    return value if type(value) is int else None


def parse_worker_list(body: str) -> list[RouterWorker]:
    """The entries of a ``GET /workers`` reply. Pure.

    Raises :class:`RouterError` saying what is wrong when the body is not the router's shape
    (not JSON, no ``workers`` list, an entry without a string ``id`` and ``url``, a bootstrap
    port that is not an integer): a reply we cannot read is unknown, never "no workers"."""
    try:
        data = json.loads(body)
    except ValueError:
        raise RouterError(f"GET /workers answered non-JSON: {body[:80]!r}") from None
    items = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise RouterError(f"GET /workers answered no 'workers' list: {body[:80]!r}")
    workers = []
    for item in items:
        port = item.get("bootstrap_port") if isinstance(item, dict) else None
        if (not isinstance(item, dict) or not isinstance(item.get("id"), str)
                or not isinstance(item.get("url"), str)
                or not isinstance(item.get("worker_type", ""), str)
                or not isinstance(item.get("status") or "", str)
                or (port is not None and (type(port) is not int))):
            raise RouterError(f"GET /workers listed an entry we cannot read: {str(item)[:80]!r}")
        workers.append(RouterWorker.from_api(item))
    return workers


@dataclass(frozen=True)
class SyncPlan:
    """What to change so the router lists exactly the desired workers.

    ``replace`` are registered under a desired URL but with the wrong role or bootstrap port:
    they must be removed before their URL can be added again (the router keys workers by URL).
    ``held`` are desired URLs whose entry is in transition (smg's ``pending`` or ``draining``):
    left alone this time, compared again once they have settled.
    """

    add: tuple[WorkerSpec, ...] = ()
    remove: tuple[RouterWorker, ...] = ()
    replace: tuple[tuple[RouterWorker, WorkerSpec], ...] = ()
    held: tuple[RouterWorker, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to change now (held entries are waited for, not changed)."""
        return not (self.add or self.remove or self.replace)


def diff_workers(desired: Iterable[WorkerSpec], current: Iterable[RouterWorker]) -> SyncPlan:
    """Adds, removes and replacements that turn ``current`` into ``desired``. Pure.

    Matching is by normalized URL; duplicates in ``desired`` collapse (first wins), and every
    router entry for a URL not desired is removed (including ``regular`` workers).

    smg's transitions: a ``draining`` entry is already out of routing and leaves by itself, so
    it is never removed again, and its URL is not added until it has gone (held). A
    ``pending`` entry of a desired URL is on its way in: neither added again nor compared
    (held); one of an unwanted URL is removed like any other."""
    wanted: dict[str, WorkerSpec] = {}
    for spec in desired:
        wanted.setdefault(normalize_url(spec.url), spec)
    have: dict[str, list[RouterWorker]] = {}
    draining: dict[str, list[RouterWorker]] = {}
    for worker in current:
        (draining if worker.draining else have).setdefault(normalize_url(worker.url), []).append(worker)

    add: list[WorkerSpec] = []
    remove: list[RouterWorker] = []
    replace: list[tuple[RouterWorker, WorkerSpec]] = []
    held: list[RouterWorker] = []
    for key, spec in wanted.items():
        entries = have.get(key, [])
        if any(w.pending for w in entries):
            held.extend(w for w in entries if w.pending)
            remove.extend(w for w in entries if not w.pending and not w.matches(spec))
        elif not entries and key in draining:
            held.extend(draining[key])
        elif not entries:
            add.append(spec)
        elif not any(w.matches(spec) for w in entries):
            replace.extend((w, spec) for w in entries[:1])
            remove.extend(entries[1:])
        else:
            remove.extend(w for w in entries if not w.matches(spec))
    for key, entries in have.items():
        if key not in wanted:
            remove.extend(entries)
    by_url = sorted  # stable, readable plans
    return SyncPlan(
        add=tuple(by_url(add, key=lambda s: s.url)),
        remove=tuple(by_url(remove, key=lambda w: w.url)),
        replace=tuple(by_url(replace, key=lambda p: p[1].url)),
        held=tuple(by_url(held, key=lambda w: w.url)),
    )


class RouterClient:
    """Thin async client for the router's ``/workers`` API (loopback or cluster address)."""

    def __init__(self, base_url: str, session: ClientSession, *, poll_seconds: float = 0.02):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.poll_seconds = poll_seconds

    async def list_workers(self) -> list[RouterWorker]:
        """Every entry the router lists, draining ones included. Raises :class:`RouterError`
        when the reply is not a worker list."""
        async with self.session.get(f"{self.base_url}/workers") as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RouterError(f"GET /workers answered {resp.status}: {body[:200]}")
        return parse_worker_list(body)

    async def find(self, url: str) -> RouterWorker | None:
        """The entry routing uses for ``url``: draining entries are already out of it."""
        key = normalize_url(url)
        return next((w for w in await self.list_workers()
                     if normalize_url(w.url) == key and not w.draining), None)

    async def add_worker(self, spec: WorkerSpec, *, timeout_seconds: float = 30.0) -> RouterWorker:
        """Register ``spec`` and wait until the router lists it reached (not pending)."""
        # no drain settle time at smg: see the module docstring (the overload veto)
        body: dict[str, Any] = {"url": spec.url, "worker_type": spec.role,
                                "health": {"drain_settle_secs": 0}}
        if spec.bootstrap_port is not None:
            body["bootstrap_port"] = spec.bootstrap_port
        async with self.session.post(f"{self.base_url}/workers", json=body) as resp:
            # 409: smg already has this URL (0.3.2 answers 202 for the same): present
            if resp.status not in (200, 201, 202, 409):
                raise RouterError(f"POST /workers {spec.url} answered {resp.status}: "
                                  f"{await resp.text()}")  # fmt: skip
            conflict = resp.status == 409
        if conflict and await self.find(spec.url) is None:
            # the URL is registered but draining: it must leave before it can come back
            raise RouterError(f"POST /workers {spec.url} answered 409 while its old entry "
                              "drains; added once it has left")  # fmt: skip
        listed = await self._wait(
            lambda: self.find(spec.url),
            lambda w: w is not None and w.matches(spec) and not w.pending,
            timeout_seconds, f"worker {spec.url} to be listed",
        )  # fmt: skip
        if listed is None:  # _wait returns only once the router lists it
            raise RouterError(f"worker {spec.url} vanished from the list while being added")
        return listed

    async def remove_worker(self, worker: RouterWorker, *, timeout_seconds: float = 30.0) -> None:
        """Deregister ``worker`` and wait until the router no longer routes to its URL: gone,
        or smg's ``draining`` with a settle time (someone else's registration). One we
        registered (no settle time) is waited for until smg has dropped it: until then its
        overload veto counts it, so the next step (the drain, the stop) waits for that too."""
        async with self.session.delete(f"{self.base_url}/workers/{worker.id}") as resp:
            # 404: already gone, which is what we want
            if resp.status not in (200, 202, 204, 404):
                raise RouterError(f"DELETE /workers/{worker.id} ({worker.url}) answered "
                                  f"{resp.status}: {await resp.text()}")  # fmt: skip
        key = normalize_url(worker.url)

        async def still_there() -> bool:
            return any(normalize_url(w.url) == key and (not w.draining or w.leaving_now)
                       for w in await self.list_workers())  # fmt: skip

        await self._wait(still_there, lambda there: not there,
                         timeout_seconds, f"worker {worker.url} to leave the list")  # fmt: skip

    async def _wait(self, probe: Callable[[], Awaitable[T]], done: Callable[[T], bool],
                    timeout_seconds: float, what: str) -> T:
        deadline = time.monotonic() + timeout_seconds
        while True:
            value = await probe()
            if done(value):
                return value
            if time.monotonic() > deadline:
                raise RouterError(f"timed out after {timeout_seconds}s waiting for {what}")
            await asyncio.sleep(self.poll_seconds)

    async def sync(self, desired: Iterable[WorkerSpec]) -> SyncPlan:
        """Make the router list exactly ``desired``; returns the plan it applied.

        New workers are added before stale ones are removed, so capacity arrives before it
        leaves. Removal here does not wait for in-flight work: it *is* the first step of the
        release order. A caller scaling down drops the pod from ``desired`` (or calls
        :func:`drain_and_stop`), waits until the engine is idle, and only then stops it."""
        plan = diff_workers(desired, await self.list_workers())
        for old, _ in plan.replace:
            await self.remove_worker(old)
        for spec in (*plan.add, *(new for _, new in plan.replace)):
            await self.add_worker(spec)
        for worker in plan.remove:
            await self.remove_worker(worker)
        return plan


class SGLangWorkerList:
    """The worker list of a PDCluster's SGLang routers (sglang-router or smg), through each
    one's ``/workers`` API (a ``WorkerList``: see workerlist.py). ``routers`` are their base
    URLs."""

    #: sglang-router and smg send a request to its prefill and its decode at once: a decode
    #: out of the router is sent nothing new
    decode_picked_before_prefill = False
    LIST_TIMEOUT_SECONDS = 5.0
    #: a sync waits for each added worker to be reached, so it gets longer than a listing
    SYNC_TIMEOUT_SECONDS = 10.0
    #: a whole sync of one router, so that a router slow to list new workers costs the tick
    #: seconds, not minutes
    SYNC_DEADLINE_SECONDS = 30.0

    def __init__(self, routers: Sequence[str]):
        self.addresses = tuple(routers)

    def listed(self) -> set[str] | None:
        """Worker URLs some router lists; None when a router could not be asked (then every
        pod counts as listed: a drain must not finish on a guess)."""
        if not self.addresses:
            return set()

        async def ask() -> set[str] | None:
            urls: set[str] = set()
            async with ClientSession(timeout=ClientTimeout(total=self.LIST_TIMEOUT_SECONDS)) as session:
                for url in self.addresses:
                    try:
                        listing = await RouterClient(url, session).list_workers()
                    except (ClientError, RouterError, TimeoutError) as exc:
                        log.warning("router %s: worker list unknown: %s", url, exc)
                        return None
                    # a draining entry is no longer routed to: out, for a drain's purpose
                    urls |= {normalize_url(w.url) for w in listing if not w.draining}
            return urls
        try:  # one deadline over every router's answer, however slowly they drip
            return asyncio.run(asyncio.wait_for(ask(), self.LIST_TIMEOUT_SECONDS))
        except TimeoutError:
            return None

    def make_equal(self, desired: frozenset[WorkerSpec]) -> None:
        """Each router lists exactly ``desired``; a router that fails is logged and left for
        the next tick (the sync is level-based)."""
        for url in self.addresses:
            self._sync(url, desired)

    def _sync(self, url: str, desired: frozenset[WorkerSpec]) -> None:
        async def sync() -> SyncPlan:
            async with ClientSession(timeout=ClientTimeout(total=self.SYNC_TIMEOUT_SECONDS)) as session:
                return await RouterClient(url, session).sync(desired)
        try:  # one deadline over the whole sync: each added worker may be waited for
            done = asyncio.run(asyncio.wait_for(sync(), self.SYNC_DEADLINE_SECONDS))
        except (ClientError, RouterError, TimeoutError) as exc:
            log.warning("router %s: worker sync holds until the next tick: %s", url, exc)
            return
        if not done.empty:
            log.info("router %s: added %s, removed %s", url,
                     [w.url for w in done.add], [w.url for w in done.remove])
        if done.held:
            log.info("router %s: waiting for %s to settle", url,
                     [f"{w.url} ({w.status})" for w in done.held])


async def engine_inflight(session: ClientSession, url: str) -> int:
    """Requests in flight on an SGLang engine: the sum of ``num_reqs`` over ``GET /get_load``.

    The simulated engine counts a prefill whose KV its decode has not collected yet, so a
    prefill instance is not idle until its last hand-off is done."""
    async with session.get(f"{url.rstrip('/')}/get_load", timeout=ClientTimeout(total=5)) as r:
        r.raise_for_status()
        data = await r.json()
    entries = data if isinstance(data, list) else [data]
    return sum(int(e.get("num_reqs", 0)) for e in entries)


@dataclass(frozen=True)
class DrainResult:
    url: str
    #: True if the engine reached zero in-flight requests before the drain timeout
    drained: bool
    #: in-flight requests when it was stopped (0 if drained)
    inflight_at_stop: int
    #: in-flight requests at the first successful poll after the router removal: the work
    #: the drain waited for (-1 if the engine never answered)
    inflight_at_removal: int
    #: wall seconds from the start of the removal to the stop call
    seconds: float
    #: the steps in the order they happened, for logs and tests
    steps: tuple[str, ...]


async def drain_and_stop(
    url: str,
    *,
    remove_from_router: Callable[[], Awaitable[None]],
    inflight: Callable[[], Awaitable[int]],
    stop: Callable[[], Awaitable[None]],
    drain_timeout_seconds: float = 600.0,
    settle_seconds: float = 0.2,
    poll_seconds: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> DrainResult:
    """Scale-down release order: router removal -> in-flight reaches 0 (or timeout) -> stop.

    ``settle_seconds`` after the router confirmed the removal covers a request the router had
    already picked this worker for but not yet sent. An engine that cannot be asked counts as
    still busy until the timeout, never as idle: unknown is not zero."""
    start = clock()
    steps: list[str] = []
    await remove_from_router()
    steps.append("removed_from_router")
    removed = clock()
    deadline = removed + drain_timeout_seconds
    count = first = -1
    while True:
        try:
            count = await inflight()
        except Exception:  # engine unreachable: unknown is not zero
            count = -1
        if first < 0:
            first = count
        # zero counts only once the settle time has passed since the removal
        if count == 0 and clock() - removed >= settle_seconds:
            steps.append("drained")
            break
        if clock() >= deadline:
            steps.append("drain_timeout")
            break
        await sleep(poll_seconds)
    await stop()
    steps.append("stopped")
    return DrainResult(url, count == 0, max(count, 0), first, clock() - start, tuple(steps))


async def remove_worker_in_order(
    router: RouterClient,
    url: str,
    *,
    stop: Callable[[], Awaitable[None]],
    drain_timeout_seconds: float = 600.0,
    settle_seconds: float = 0.2,
) -> DrainResult:
    """:func:`drain_and_stop` against a real router and engine (in-flight from ``/get_load``)."""

    async def remove() -> None:
        worker = await router.find(url)
        if worker is not None:
            await router.remove_worker(worker)

    return await drain_and_stop(
        url,
        remove_from_router=remove,
        inflight=lambda: engine_inflight(router.session, url),
        stop=stop,
        drain_timeout_seconds=drain_timeout_seconds,
        settle_seconds=settle_seconds,
    )
