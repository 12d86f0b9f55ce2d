"""Keep the SGLang router's worker list equal to the Ready, non-draining pods, and remove a
worker in the order that drops no request.

What sglang-router 0.3.2 offers in PD mode (observed against the real binary):

- ``GET /workers`` -> ``{"workers": [{"id", "url", "worker_type": "prefill"|"decode",
  "bootstrap_port" (prefill only), "is_healthy", ...}], "total", "stats"}``.
- ``POST /workers {"url", "worker_type", "bootstrap_port"}`` -> **202** with ``worker_id``;
  the worker appears in ``GET /workers`` only once the router has reached it (``/health``,
  ``/server_info``, ``/model_info``); until then ``GET /workers/{id}`` shows the job as
  ``processing``. Posting a URL that is already registered answers 202 with the existing id
  (the job then fails with "already exists"): adding is idempotent.
- ``DELETE /workers/{id}`` -> **202**; the worker is gone from the next ``GET /workers``;
  an unknown id -> 404 ``WORKER_NOT_FOUND``. Ids are random per registration, so we look
  them up by URL.
- The legacy ``/add_worker``, ``/remove_worker`` and ``/list_workers`` answer **404**.

Release order for a scale-down (:func:`drain_and_stop`): remove from the router first, wait
until the engine has nothing in flight (or a drain timeout), and only then stop it. Removing a
worker from the router does not cancel the requests it already has.
"""

from __future__ import annotations

import asyncio
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


@dataclass(frozen=True)
class RouterWorker:
    """A worker as the router lists it."""

    id: str
    url: str
    role: str
    bootstrap_port: int | None = None
    healthy: bool = True

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> RouterWorker:
        return cls(
            id=str(item["id"]),
            url=str(item["url"]),
            role=str(item.get("worker_type", "regular")),
            bootstrap_port=item.get("bootstrap_port"),
            healthy=bool(item.get("is_healthy", True)),
        )

    def matches(self, spec: WorkerSpec) -> bool:
        return (
            normalize_url(self.url) == normalize_url(spec.url)
            and self.role == spec.role
            and (self.bootstrap_port if self.role == "prefill" else None) == spec.bootstrap_port
        )


@dataclass(frozen=True)
class SyncPlan:
    """What to change so the router lists exactly the desired workers.

    ``replace`` are registered under a desired URL but with the wrong role or bootstrap port:
    they must be removed before their URL can be added again (the router keys workers by URL).
    """

    add: tuple[WorkerSpec, ...] = ()
    remove: tuple[RouterWorker, ...] = ()
    replace: tuple[tuple[RouterWorker, WorkerSpec], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.add or self.remove or self.replace)


def diff_workers(desired: Iterable[WorkerSpec], current: Iterable[RouterWorker]) -> SyncPlan:
    """Adds, removes and replacements that turn ``current`` into ``desired``. Pure.

    Matching is by normalized URL; duplicates in ``desired`` collapse (first wins), and every
    router entry for a URL not desired is removed (including ``regular`` workers)."""
    wanted: dict[str, WorkerSpec] = {}
    for spec in desired:
        wanted.setdefault(normalize_url(spec.url), spec)
    have: dict[str, list[RouterWorker]] = {}
    for worker in current:
        have.setdefault(normalize_url(worker.url), []).append(worker)

    add: list[WorkerSpec] = []
    remove: list[RouterWorker] = []
    replace: list[tuple[RouterWorker, WorkerSpec]] = []
    for key, spec in wanted.items():
        entries = have.get(key, [])
        if not entries:
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
    )


class RouterError(RuntimeError):
    """The router refused a worker call or did not converge in time (message says which)."""


class RouterClient:
    """Thin async client for the router's ``/workers`` API (loopback or cluster address)."""

    def __init__(self, base_url: str, session: ClientSession, *, poll_seconds: float = 0.02):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.poll_seconds = poll_seconds

    async def list_workers(self) -> list[RouterWorker]:
        async with self.session.get(f"{self.base_url}/workers") as resp:
            if resp.status != 200:
                raise RouterError(f"GET /workers answered {resp.status}: {await resp.text()}")
            data = await resp.json()
        return [RouterWorker.from_api(item) for item in data.get("workers", [])]

    async def find(self, url: str) -> RouterWorker | None:
        key = normalize_url(url)
        return next((w for w in await self.list_workers() if normalize_url(w.url) == key), None)

    async def add_worker(self, spec: WorkerSpec, *, timeout_seconds: float = 30.0) -> RouterWorker:
        """Register ``spec`` and wait until the router lists it (it has reached the engine)."""
        body: dict[str, Any] = {"url": spec.url, "worker_type": spec.role}
        if spec.bootstrap_port is not None:
            body["bootstrap_port"] = spec.bootstrap_port
        async with self.session.post(f"{self.base_url}/workers", json=body) as resp:
            if resp.status not in (200, 201, 202):
                raise RouterError(f"POST /workers {spec.url} answered {resp.status}: "
                                  f"{await resp.text()}")  # fmt: skip
        listed = await self._wait(
            lambda: self.find(spec.url), lambda w: w is not None and w.matches(spec),
            timeout_seconds, f"worker {spec.url} to be listed",
        )  # fmt: skip
        if listed is None:  # _wait returns only once the router lists it
            raise RouterError(f"worker {spec.url} vanished from the list while being added")
        return listed

    async def remove_worker(self, worker: RouterWorker, *, timeout_seconds: float = 30.0) -> None:
        """Deregister ``worker`` and wait until the router no longer lists its URL."""
        async with self.session.delete(f"{self.base_url}/workers/{worker.id}") as resp:
            # 404: already gone, which is what we want
            if resp.status not in (200, 202, 204, 404):
                raise RouterError(f"DELETE /workers/{worker.id} ({worker.url}) answered "
                                  f"{resp.status}: {await resp.text()}")  # fmt: skip
        await self._wait(
            lambda: self.find(worker.url), lambda w: w is None,
            timeout_seconds, f"worker {worker.url} to leave the list",
        )  # fmt: skip

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
    """The worker list of a PDCluster's SGLang routers, through each one's ``/workers`` API
    (a ``WorkerList``: see workerlist.py). ``routers`` are their base URLs."""

    #: sglang-router sends a request to its prefill and its decode at once: a decode out of
    #: the router is sent nothing new
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
                        urls |= {normalize_url(w.url) for w in await RouterClient(url, session).list_workers()}
                    except (ClientError, RouterError, TimeoutError):
                        return None
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
            log.warning("router %s: worker sync failed: %s", url, exc)
            return
        if not done.empty:
            log.info("router %s: added %s, removed %s", url,
                     [w.url for w in done.add], [w.url for w in done.remove])


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
