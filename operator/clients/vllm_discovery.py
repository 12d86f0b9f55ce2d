"""The vLLM router's worker list, kept equal to the Ready, non-draining pods.

vllm-router (0.1.17, the version checked here) in PD mode has no worker API: ``POST /workers``
answers 400 ("PD router requires specific add_prefill_server or add_decode_server methods"),
and it refuses to start with no ``--prefill``/``--decode`` URL unless it runs its ZMQ service
discovery (``--vllm-discovery-address``). That discovery is how vLLM instances announce
themselves: a msgpack map ``{"type": "P"|"D", "http_address": "host:port",
"zmq_address": "host:port"}`` sent on a ZMQ DEALER socket, repeated; an instance not heard
from for 5 s is dropped ("expired"). Its ``GET /workers`` does not show these.

So the operator speaks for the pods: every second it announces each Ready, non-draining pod
to each router, and it stops announcing a pod once it drains. The router lets go at most
``PING_TIMEOUT_SECONDS`` later; until then the pod counts as listed (``listed``), so a drain
never finishes while the router may still send it work. After an operator restart nothing is
known for one timeout: every pod counts as listed.

Leaving the router is not enough for a decode. vllm-router picks a request's decode worker
when the request arrives and calls it only after the prefill answers, so every request that a
prefill engine held when the decode left may still be sent to it: with a prefill backlog, for
far longer than one prefill. ``PrefillBacklog`` follows those requests out through each
prefill engine's own counters (read from the engine, as the drain's in-flight count is).

Leaving the router and holding nothing is not enough for a prefill either: its KV outlives
its requests (``KVPullWatch``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

import msgpack
import zmq

from pdscale.operator.clients.routersync import WorkerSpec, normalize_url

#: vllm-router drops an instance it has not heard from for this long (DEFAULT_PING_SECONDS)
PING_TIMEOUT_SECONDS = 5.0
ANNOUNCE_EVERY_SECONDS = 1.0
#: slack for a message in flight and the router's expiry sweep
LEAVE_MARGIN_SECONDS = 2.0


def announcement(worker: WorkerSpec, side_channel_port: int) -> bytes:
    """One discovery message for one worker (pure)."""
    host_port = worker.url.split("://", 1)[-1].rstrip("/")
    host = host_port.rsplit(":", 1)[0]
    message: bytes = msgpack.dumps({
        "type": "P" if worker.role == "prefill" else "D",
        "http_address": host_port,
        # The KV side channel of the instance (NIXL's; P2P NCCL reads it from here).
        "zmq_address": f"{host}:{side_channel_port}",
    })
    return message


def still_listed(last_sent: dict[str, float], now: float, started: float) -> set[str] | None:
    """URLs a router may still send new requests to (pure): those announced within the
    timeout. None while the announcer is younger than that window: what an earlier operator
    announced is unknown."""
    window = PING_TIMEOUT_SECONDS + LEAVE_MARGIN_SECONDS
    if now - started < window:
        return None
    return {url for url, at in last_sent.items() if now - at < window}


#: what the drains read from a vLLM engine's ``/metrics``
RUNNING, WAITING, FINISHED = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                              "vllm:request_success_total")
#: waiting requests by ``reason``: "capacity" (no room yet) and "deferred" (skipped this step;
#: among them a decode's requests whose KV is being pulled, WAITING_FOR_REMOTE_KVS)
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"


def vllm_totals(metrics_text: str,
                names: Iterable[str] = (RUNNING, WAITING, FINISHED, WAITING_BY_REASON)
                ) -> dict[str, float] | None:
    """The metrics ``names`` of a vLLM ``/metrics`` page, each summed over its labels (pure);
    a name absent from the page is absent from the result. None when one of their samples
    does not parse (unknown, not zero); other lines are not read."""
    wanted = set(names)
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in wanted:
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            return None
    return totals


@dataclass(frozen=True)
class PrefillCount:
    """One prefill engine at one moment: requests it has finished (``request_success_total``,
    every finish reason, aborts included) and requests it holds (running + waiting)."""

    finished: float
    held: float

    @staticmethod
    def from_totals(totals: Mapping[str, float]) -> PrefillCount | None:
        if FINISHED not in totals or RUNNING not in totals:
            return None
        return PrefillCount(totals[FINISHED], totals[RUNNING] + totals.get(WAITING, 0.0))


@dataclass(frozen=True)
class PrefillBacklog:
    """The requests the prefill engines held once a decode had left the vLLM router, followed
    until none of them can still be sent to that decode (pure).

    vLLM admits waiting requests first come, first served, so once an engine has finished as
    many requests as it held, each request it held has entered its batch; one may still be
    mid-prefill behind shorter, later ones, for at most the slowest prefill (``linger``).
    ``at_leave`` is keyed by prefill pod name: a pod gone since took its requests with it, and
    a counter that went down is an engine restarted (its requests failed with it)."""

    at_leave: Mapping[str, PrefillCount]
    cleared_at: float | None = None

    def follow(self, counts: Mapping[str, PrefillCount | None], now: float) -> PrefillBacklog:
        """The backlog after reading the prefill engines' counters now (None: no answer)."""
        if self.cleared_at is not None:
            return self
        for pod, then in self.at_leave.items():
            if pod not in counts:
                continue
            current = counts[pod]
            if current is None:
                return self  # unknown: not cleared
            if current.finished >= then.finished and current.finished - then.finished < then.held:
                return self
        return replace(self, cleared_at=now)

    def pending(self, now: float, linger_seconds: float) -> bool:
        return self.cleared_at is None or now - self.cleared_at < linger_seconds

    def waiting_on(self) -> int:
        """Requests the prefill engines held when it was taken (for the explanation)."""
        return round(sum(c.held for c in self.at_leave.values()))


#: vLLM NIXL's ``kv_lease_duration`` default, seconds (``kv_connector_extra_config``)
NIXL_KV_LEASE_SECONDS = 30.0
#: time for a prefill's last answer to reach its decode's scheduler through the router (a hop
#: of milliseconds when healthy), seconds: a decode read sooner may not count that request
#: yet. One planner tick (PDSCALE_PLANNER_TICK_SECONDS, 5 s by default).
HANDOFF_GRACE_SECONDS = 5.0


def decode_pulls_pending(totals: Mapping[str, float]) -> float | None:
    """Requests a vLLM decode may still pull KV for from some prefill (pure): every request
    it has waiting, deferred or not. None: the page has neither gauge (unknown).

    Deferred ones are mid-pull. One waiting for capacity has not started its pull, but the
    decode's NIXL scheduler tracks it from arrival (``on_new_request``) and its heartbeats keep
    the prefill's lease on those blocks, so it will pull once admitted. A decode serves only
    requests prefilled elsewhere, so no waiting request is safe to ignore. Versions differ on
    whether ``num_requests_waiting`` includes the deferred ones; the larger of it and the sum
    over reasons is the total either way."""
    values = [totals[name] for name in (WAITING, WAITING_BY_REASON) if name in totals]
    return max(values) if values else None


@dataclass(frozen=True)
class KVPullWatch:
    """A draining vLLM prefill, out of the router and holding nothing since ``idle_since``,
    followed until no decode can still pull KV from it (pure).

    With NIXL a request finishes on the prefill before its decode pulls the KV: the router
    sends it to the decode only once the prefill has answered. The prefill pins the blocks
    (``request_finished`` delays their free) until the decode's pull notifies it, or until a
    lease runs out: ``kv_lease_duration``, 30 s by default, renewed by the decode's heartbeats
    for as long as the request waits there (vLLM's NIXL connector, lease renewal since vLLM PR
    #41383; before it, one fixed ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``). A prefill removed
    before the pull fails that request (``kv_load_failure_policy: fail``).

    The rule: the prefill may leave once, at least ``grace`` after it was first seen idle
    (so its last answer has reached a decode), every decode that could hold one of its
    requests answers and has no request waiting (``decode_pulls_pending``). Decodes do not
    say which prefill a pull is from, so under steady load another prefill's requests can
    keep this from ever holding; the lease bounds the wait: one lease after ``idle_since``
    (which is no earlier than the prefill's last finished request) the prefill would have
    freed any block no heartbeat renewed. A decode that still renews one then (a request
    queued at a decode for longer than a lease) is the one case this bound can cut; the drain
    timeout is the bound above it."""

    idle_since: float
    cleared_at: float | None = None

    def follow(self, pulls_pending: Mapping[str, float | None], now: float,
               grace_seconds: float = HANDOFF_GRACE_SECONDS) -> KVPullWatch:
        """The watch after reading every decode's pending pulls now (pod name -> count;
        None: it did not answer, so not clear)."""
        if self.cleared_at is not None or now - self.idle_since < grace_seconds:
            return self
        if any(n is None or n > 0 for n in pulls_pending.values()):
            return self
        return replace(self, cleared_at=now)

    def pending(self, now: float, lease_seconds: float) -> bool:
        return self.cleared_at is None and now - self.idle_since < lease_seconds


@dataclass
class Announcer:
    """Announces workers to vLLM routers' discovery sockets from its own thread (ZMQ sockets
    are not thread-safe); the planner loop only sets what to announce and asks what is
    listed."""

    side_channel_port: int
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    _desired: dict[str, frozenset[WorkerSpec]] = field(default_factory=dict)
    _last_sent: dict[str, dict[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sockets: dict[str, zmq.Socket[bytes]] = field(default_factory=dict)
    _context: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    def set_workers(self, address: str, workers: Iterable[WorkerSpec]) -> None:
        """What the router at ``address`` (host:port of its discovery socket) should list."""
        with self._lock:
            self._desired[address] = frozenset(workers)

    def forget(self, keep: Iterable[str]) -> None:
        """Stop announcing to routers that are gone."""
        keep = set(keep)
        with self._lock:
            for address in [a for a in self._desired if a not in keep]:
                del self._desired[address]

    def listed(self, address: str) -> set[str] | None:
        with self._lock:
            sent = dict(self._last_sent.get(address, {}))
        return still_listed(sent, self.clock(), self.started)

    def announce_once(self) -> None:
        with self._lock:
            desired = dict(self._desired)
        for address in [a for a in self._sockets if a not in desired]:
            self._sockets.pop(address).close(linger=0)
        for address, workers in desired.items():
            sock = self._sockets.get(address)
            if sock is None:
                sock = self._context.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 1000)  # an unreachable router: drop, do not pile up
                sock.connect(f"tcp://{address}")
                self._sockets[address] = sock
            now = self.clock()
            for worker in workers:
                try:
                    sock.send(announcement(worker, self.side_channel_port), zmq.NOBLOCK)
                except zmq.Again:
                    continue  # not connected yet: not announced, so not counted as listed
                with self._lock:
                    self._last_sent.setdefault(address, {})[normalize_url(worker.url)] = now

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(ANNOUNCE_EVERY_SECONDS):
            self.announce_once()
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()


@dataclass(frozen=True)
class DiscoveryWorkerList:
    """The worker list of a PDCluster's vLLM routers, through their discovery sockets (a
    ``WorkerList``: see workerlist.py). ``addresses`` are host:port of those sockets; the
    ``announcer`` (one per operator) does the sending from its own thread."""

    announcer: Announcer
    addresses: tuple[str, ...]
    #: vllm-router picks a request's decode when the request arrives and calls it only once
    #: the prefill answers: a decode out of the router may still be sent requests held at a
    #: prefill (PrefillBacklog)
    decode_picked_before_prefill: ClassVar[bool] = True

    def listed(self) -> set[str] | None:
        """Worker URLs some vLLM router may still send new requests to; None while that is
        unknown (see ``still_listed``)."""
        urls: set[str] = set()
        for address in self.addresses:
            listed = self.announcer.listed(address)
            if listed is None:
                return None
            urls |= listed
        return urls

    def make_equal(self, desired: frozenset[WorkerSpec]) -> None:
        for address in self.addresses:
            self.announcer.set_workers(address, desired)
