"""The engine core: queues, timing, the KV hand-off between prefill and decode, metrics.

A request's path follows the engines' own queues (docs/conformance.md names each one and the
upstream file it copies):

- **SGLang prefill**: bootstrap queue (waits until its decode has room and has asked for the
  room's KV), waiting queue (FIFO, taken by passes of up to ``--chunked-prefill-size``
  tokens), running, then the inflight queue
  while the KV is transferred to the decode; the request finishes, and is counted, only then.
- **vLLM prefill (NIXL)**: waiting, running; the request finishes with its one token and its KV
  stays *pinned* until the decode pulls it or ``kv_lease_seconds`` pass (then it is freed and
  a late pull fails).
- **decode** (both): prealloc queue (waits for KV memory, ``max_total_tokens``), transfer queue
  (waits for its room's KV: vLLM's ``deferred`` waiting), waiting queue (waits for a running
  slot, ``max_running_requests``), the running batch at the timing model's TPOT.

The decode collects a room's KV from the prefill's bootstrap server (``GET /sim/kv/{room}``, a
long poll standing in for the KV connector); that ask is also SGLang's bootstrap handshake, and
the prefill side holds the KV for the transfer time before answering. Everything a specific
engine's API adds (endpoints, metric names, when it counts, how the room is named) is its
:class:`~.dialect.Dialect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from pdscale.planner.observe import Role

from .config import EngineConfig
from .dialect import Dialect
from .metrics import Histogram, Metrics
from .prefix_cache import PrefixCache
from .room import Room
from .sglang import SGLang
from .timing import TimingModel
from .vllm import Vllm
from .wire import (
    cohort_of,
    full_response,
    is_loopback,
    max_new_tokens,
    prompt_key,
    prompt_tokens,
    sse,
    stream_chunk,
)

log = logging.getLogger("pdscale.testbed.simengine")


@dataclass
class _Prefill:
    """A prompt in the prefill passes: how much of it is computed (its cached prefix first)."""

    tokens: list[str]
    room: Room
    finished: asyncio.Future[None]
    cached: int
    computed: int
    #: when a pass first took it (time.monotonic()): its forward time runs from here
    started: float
    #: the request's cohort (:func:`.wire.cohort_of`)
    cohort: str = ""
    #: the engine's modelled prefill clock when it was queued (``Engine._prefill_clock``)
    queued_clock: float = 0.0


#: the dialects by ``--dialect`` name
DIALECT_CLASSES: dict[str, type[Dialect]] = {d.name: d for d in (SGLang, Vllm)}
DIALECTS = tuple(DIALECT_CLASSES)


@dataclass
class DecodeSequence:
    """A decode sequence in the running batch."""

    context_tokens: int
    remaining: int
    tokens: asyncio.Queue[float | None]
    #: wall seconds of the modelled steps since its first token: the step in flight when it
    #: joined (whole: an upper bound of its wait) and every step that gave it a token. What
    #: its TPOT is on an idle host, whatever the host's load does to the steps' real length
    modelled_seconds: float = 0.0
    steps: int = 0
    #: the request's cohort (:func:`.wire.cohort_of`)
    cohort: str = ""


class EngineBusy(Exception):
    """The engine refuses new work (warming up or draining) -> HTTP 503."""


class KvUnavailable(Exception):
    """A decode request's KV never came (prefill refused, timed out, gone or lease expired)."""


class SimEngine:
    """One simulated instance: a prefill FIFO or a decode batch, timed by ``timing``, that
    speaks ``config.dialect`` (:attr:`dialect`) over HTTP."""

    def __init__(self, config: EngineConfig, timing: TimingModel) -> None:
        if config.role not in list(Role):
            raise ValueError(f"role must be one of {[r.value for r in Role]}, not {config.role!r}")
        if config.time_compression <= 0:
            raise ValueError("time_compression must be > 0")
        if config.dialect not in DIALECT_CLASSES:
            raise ValueError(f"dialect must be one of {DIALECTS}, not {config.dialect!r}")
        if config.decode_log_interval < 1:
            raise ValueError("decode_log_interval must be >= 1")
        self.config = config
        self.role = Role(config.role)
        self.dialect: Dialect = DIALECT_CLASSES[config.dialect](self)
        self.timing = timing
        ttft, itl, e2e = self.dialect.default_buckets()
        self.metrics = Metrics(
            ttft=Histogram(config.bucket_time_to_first_token or ttft),
            itl=Histogram(config.bucket_inter_token_latency or itl),
            e2e=Histogram(config.bucket_e2e_request_latency or e2e),
            prompt=Histogram(self.dialect.prompt_buckets),
        )
        self.cache = PrefixCache(config.prefix_cache_tokens, config.block_tokens)
        # one warm-up clock: a given moment (its pod's Ready), else startup_seconds from now
        self.ready_at = (config.ready_at_unix_seconds if config.ready_at_unix_seconds is not None
                         else time.time() + config.startup_seconds)
        self.draining = False
        self.exit_requested = asyncio.Event()
        self._handlers = 0  # HTTP requests being served (prefill and decode)
        self._rooms: dict[int, Room] = {}
        # prefill queues
        self._bootstrap = 0
        self._prefill_queue: asyncio.Queue[tuple[list[str], Room, asyncio.Future[None], str, float]] = (
            asyncio.Queue()
        )
        self._prefill_running = 0
        self._prefill_running_tokens = 0
        #: the prefill passes' modelled seconds so far, compressed (what they would have taken
        #: on an idle host): the clock the prompts' modelled prefill time is read on
        self._prefill_clock = 0.0
        # decode queues
        self._prealloc = 0  # waiting for KV memory
        self._transfer = 0  # waiting for the room's KV
        self._waiting = 0  # KV here, waiting for a running slot
        self._kv_used_tokens = 0
        self._kv_freed = asyncio.Condition()
        self._batch: list[DecodeSequence] = []
        self._batch_changed = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_running_requests)
        self._decode_steps = 0
        #: the modelled length (wall seconds) of the decode step running now, 0 between steps
        self._step_in_flight = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: the gauges as last logged (SGLang refreshes them per logged batch, not per scrape)
        self.logged: dict[str, float] = {**self.queues(), "token_usage": 0.0}
        self._last_log = time.monotonic()
        #: prompts this instance computed itself on the decode side (no remote prefill)
        self.local_prefills = 0
        self.engine_id = uuid.uuid4().hex

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None)
        )
        if self.role == Role.PREFILL:
            self._tasks.append(asyncio.create_task(self._prefill_loop()))
            self._tasks.append(asyncio.create_task(self._expire_rooms()))
        else:
            self._tasks.append(asyncio.create_task(self._decode_loop()))
        self._tasks.append(asyncio.create_task(self._log_when_idle()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    def wall(self, model_seconds: float) -> float:
        return model_seconds / self.config.time_compression

    @property
    def ready(self) -> bool:
        return not self.draining and time.time() >= self.ready_at

    def inflight(self) -> int:
        """Requests not finished (HTTP requests being served), plus, where the engine waits
        for them, KV hand-offs not done. An SGLang prefill request is served until its KV
        transfer is done, so its handler already covers it; a vLLM prefill's request finishes
        before the decode pulls, and its process does not wait for the pull (pinned KV is
        :meth:`kv_held`, not in flight)."""
        return self._handlers

    def kv_held(self) -> int:
        """Rooms whose computed KV has not reached the decode: SGLang's inflight queue, vLLM's
        pinned requests."""
        return sum(1 for r in self._rooms.values() if r.holds_kv())

    def queues(self) -> dict[str, int]:
        """Live queue lengths by the engine's own queue names (docs/conformance.md)."""
        if self.role == Role.PREFILL:
            return {"running": self._prefill_running, "waiting": self._prefill_queue.qsize(),
                    "bootstrap": self._bootstrap, "inflight": self.kv_held()}  # fmt: skip
        return {"running": len(self._batch), "waiting": self._waiting,
                "prealloc": self._prealloc, "transfer": self._transfer}  # fmt: skip

    def running(self) -> int:
        return self._prefill_running if self.role == Role.PREFILL else len(self._batch)

    def queued(self) -> int:
        """Requests accepted and not running, not yet computed (every waiting queue)."""
        q = self.queues()
        if self.role == Role.PREFILL:
            return q["waiting"] + q["bootstrap"]
        return q["waiting"] + q["prealloc"] + q["transfer"]

    def context_tokens(self) -> int:
        """Context tokens of the running decode batch."""
        return sum(s.context_tokens for s in self._batch)

    def used_tokens(self) -> int:
        """KV tokens held by requests (not the evictable prefix cache)."""
        if self.role == Role.PREFILL:
            held = sum(r.input_tokens for r in self._rooms.values() if r.holds_kv())
            return self._prefill_running_tokens + held
        return self._kv_used_tokens

    def token_capacity(self) -> int:
        return self.config.max_total_tokens or self.config.prefix_cache_tokens

    def token_usage(self) -> float:
        return self.used_tokens() / self.token_capacity()

    # -- gauges as SGLang logs them ---------------------------------------------------------
    def log_stats(self) -> None:
        """Refresh the logged gauges from the live queues (SGLang's log_prefill_stats,
        log_decode_stats and the idle check_memory refresh)."""
        self.logged = {**self.queues(), "token_usage": round(self.token_usage(), 2)}
        self._last_log = time.monotonic()

    def busy(self) -> bool:
        """A batch to run: the scheduler is not idle, so only batches log."""
        if self.role == Role.PREFILL:
            return self._prefill_running > 0 or self._prefill_queue.qsize() > 0
        return bool(self._batch)

    async def _log_when_idle(self) -> None:
        interval = self.config.idle_log_interval_seconds
        while True:
            await asyncio.sleep(min(1.0, interval / 4))
            if not self.busy() and time.monotonic() - self._last_log >= interval:
                self.log_stats()

    def _update_idle(self) -> None:
        if self.inflight() == 0:
            self._idle.set()
        else:
            self._idle.clear()

    def begin_drain(self, *, exit_when_done: bool) -> None:
        if not self.draining:
            log.info("draining: %d in flight", self.inflight())
        self.draining = True
        if exit_when_done:
            self.exit_requested.set()

    async def wait_idle(self, timeout_seconds: float) -> bool:
        """True when nothing is in flight, False if ``timeout_seconds`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_seconds)
            return True
        except TimeoutError:
            return False

    def state(self) -> dict[str, Any]:
        return {
            "role": self.config.role,
            "ready": self.ready,
            "draining": self.draining,
            "inflight": self.inflight(),
            "running": self.running(),
            "queued": self.queued(),
            "queues": self.queues(),
            # vLLM has no gauge for this (docs/conformance.md): the sim's own view of it
            "kv_pinned_requests": self.kv_held(),
            "cached_tokens_in_cache": len(self.cache),
            "dialect": self.config.dialect,
            "local_prefills": self.local_prefills,
        }

    # -- prefill --------------------------------------------------------------------------
    def _room(self, room_id: int) -> Room:
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = Room()
        return room

    async def _prefill_loop(self) -> None:
        # One forward pass at a time, as SGLang's and vLLM's schedulers run: a pass takes
        # waiting prompts first come first served until its token budget is spent; the prompt
        # that does not fit whole is chunked and goes on first in the next pass. Every prompt
        # of a pass is done when the pass ends. The prefix cache is matched when a pass takes
        # a prompt and filled after compute, so prompts of one pass never share. The replay
        # models the same (planner/replay/prefill_batches.py).
        chunked: _Prefill | None = None
        while True:
            if chunked is None:
                first = await self._prefill_queue.get()  # idle until a prompt comes
                chunked = None if first[2].cancelled() else self._scheduled(*first)
                if chunked is None:
                    continue
            members: list[_Prefill] = []
            budget, seconds, pass_tokens = self.config.prefill_chunk_tokens, 0.0, 0
            job: _Prefill | None = chunked
            chunked = None
            while budget > 0:
                if job is None:
                    if self._prefill_queue.empty():
                        break
                    item = self._prefill_queue.get_nowait()
                    if item[2].cancelled():
                        continue
                    job = self._scheduled(*item)
                take = min(len(job.tokens) - job.computed, budget)
                seconds += self.timing.prefill_seconds(job.computed + take, job.computed)
                job.computed += take
                budget -= take
                pass_tokens += take
                members.append(job)
                if job.computed < len(job.tokens):
                    chunked = job
                    break
                job = None
            self._prefill_running, self._prefill_running_tokens = len(members), pass_tokens
            self.log_stats()  # SGLang logs each prefill batch as it is formed
            try:
                started = time.monotonic()
                await asyncio.sleep(self.wall(seconds))
                self.metrics.busy_prefill_seconds += time.monotonic() - started
                self._prefill_clock += self.wall(seconds)
                for job in members:
                    if job.computed < len(job.tokens):
                        continue  # chunked: done in a later pass
                    self.cache.insert(job.tokens)
                    job.room.input_tokens, job.room.cached_tokens = len(job.tokens), job.cached
                    job.room.computed_at = time.monotonic()
                    self.metrics.prefill_forward.observe(job.room.computed_at - job.started)
                    self.metrics.observe_modelled_prefill(
                        job.cohort, self._prefill_clock - job.queued_clock)
                    self.metrics.recent.append((len(job.tokens), job.cached))
                    job.room.done.set()
                    if not job.finished.done():
                        job.finished.set_result(None)
            finally:
                self._prefill_running, self._prefill_running_tokens = 0, 0

    def _scheduled(self, tokens: list[str], room: Room, finished: asyncio.Future[None],
                   cohort: str, queued_clock: float) -> _Prefill:
        """A prompt taken by a pass: its cached prefix is matched now. A prompt cached whole
        still computes its last token (its logits), as SGLang's ``init_next_round_input``
        keeps at least one token out of the matched prefix; the replay does the same
        (planner/replay/prefill_batches.py)."""
        cached = min(self.cache.match(tokens), max(len(tokens) - 1, 0))
        return _Prefill(tokens, room, finished, cached=cached, computed=cached,
                        started=time.monotonic(), cohort=cohort, queued_clock=queued_clock)

    async def _expire_rooms(self) -> None:
        # KV nobody collected (decode gone, or a poll for a room whose prefill never came),
        # and vLLM's lease on pinned KV
        lease = self.config.kv_lease_seconds
        while True:
            await asyncio.sleep(min(1.0, lease / 4))
            now = time.monotonic()
            for room_id, room in list(self._rooms.items()):
                age = now - room.created
                if (room.holds_kv() and not room.transferring and self.dialect.pins_kv
                        and room.computed_at is not None and now - room.computed_at > lease):
                    log.info("room %s: KV lease expired before its decode pulled it", room_id)
                    room.fail()
                if room.collected and not room.failed:
                    del self._rooms[room_id]
                elif age > self.config.bootstrap_timeout_seconds and not room.transferring:
                    room.fail()
                    del self._rooms[room_id]
            self._update_idle()

    async def prefill(self, tokens: list[str], room: Room, cohort: str = "") -> None:
        """Queue and compute one prompt for ``room``."""
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # the modelled clock now: a pass in flight counts whole towards this prompt's time
        await self._prefill_queue.put((tokens, room, finished, cohort, self._prefill_clock))
        try:
            await finished
        except asyncio.CancelledError:
            # the router gave up on this prefill: its decode half must not wait for the KV
            room.fail()
            raise

    async def _await_handshake(self, room: Room) -> None:
        """SGLang's bootstrap queue: wait until the decode has KV room and asked for it."""
        self._bootstrap += 1
        try:
            await asyncio.wait_for(room.decode_ready.wait(),
                                   self.config.bootstrap_timeout_seconds)  # fmt: skip
        except TimeoutError:
            room.fail()
            raise KvUnavailable("no decode asked for this room (bootstrap timeout)") from None
        finally:
            self._bootstrap -= 1

    async def collect(self, room_id: int) -> Room:
        """Bootstrap server side: the decode asks for a room (SGLang's handshake); wait until
        its prefill is done, hold the KV for the transfer time, then hand it over."""
        room = self._room(room_id)
        room.decode_ready.set()
        await asyncio.wait_for(room.done.wait(), self.config.waiting_timeout_seconds)
        if room.failed or room.collected:
            return room
        room.transferring = True
        try:
            await asyncio.sleep(self.wall(self.timing.kv_transfer_seconds(room.input_tokens)))
        finally:
            room.transferring = False
        room.transferred.set()
        self._update_idle()
        return room

    # -- decode ---------------------------------------------------------------------------
    async def _allocate(self, tokens: int) -> None:
        """The prealloc queue: wait until ``tokens`` of KV memory are free, then take them."""
        capacity = self.config.max_total_tokens
        async with self._kv_freed:
            # a request larger than the whole memory still runs alone rather than never
            await self._kv_freed.wait_for(
                lambda: capacity is None or self._kv_used_tokens + tokens <= capacity
                or self._kv_used_tokens == 0
            )
            self._kv_used_tokens += tokens

    async def _free(self, tokens: int) -> None:
        async with self._kv_freed:
            self._kv_used_tokens -= tokens
            self._kv_freed.notify_all()

    async def _fetch_kv(self, body: dict[str, Any], tokens: list[str]) -> tuple[int, int]:
        """Wait for this request's prefill (by room) and the KV transfer; (input, cached)."""
        host, port, room = self.dialect.kv_source(body)
        if host is None or room is None:
            # not disaggregated: compute the prefill here, without a queue
            self.local_prefills += 1
            cached = self.cache.match(tokens)
            await asyncio.sleep(self.wall(self.timing.prefill_seconds(len(tokens), cached)))
            self.cache.insert(tokens)
            self.dialect.count_local_prefill(len(tokens), cached)
            return len(tokens), cached
        if not is_loopback(str(host)) and not self.config.pod_network:
            raise ValueError(f"bootstrap_host {host!r} is not a loopback address")
        assert self._session is not None
        url = f"http://{host}:{port}/sim/kv/{int(room)}"
        self._transfer += 1
        try:
            async with self._session.get(
                url, timeout=ClientTimeout(total=self.config.waiting_timeout_seconds + 5)
            ) as resp:
                if resp.status != 200:
                    raise KvUnavailable(f"bootstrap {url} answered {resp.status}")
                info = await resp.json()
        finally:
            self._transfer -= 1
        return int(info["input_tokens"]), int(info["cached_tokens"])

    async def _decode_loop(self) -> None:
        # continuous batching: every step emits one token to every sequence it started with,
        # and a step takes TPOT(batch, mean context). A sequence that joins while a step runs
        # waits for the next one, as SGLang's scheduler merges new requests into the running
        # batch between forward passes (event_loop_normal: get_next_batch_to_run, then
        # run_batch); before, it got a token at the end of the step already running.
        # Deadlines, not sleeps, so error doesn't add up.
        next_step = last_stamp = time.monotonic()
        while True:
            if not self._batch:
                self._batch_changed.clear()
                await self._batch_changed.wait()
                next_step = time.monotonic()
            members = list(self._batch)
            batch = len(members)
            mean_context = sum(s.context_tokens for s in members) / batch
            step = self.wall(self.timing.tpot_seconds(batch, mean_context))
            now = time.monotonic()
            next_step = max(next_step, now - step) + step
            self._step_in_flight = step
            await asyncio.sleep(max(next_step - now, 0.0))
            self._step_in_flight = 0.0
            stamp = time.monotonic()
            # the step ran from its start (its deadline less a step, never before the last
            # step ended) to now
            self.metrics.busy_decode_seconds += stamp - max(next_step - step, last_stamp)
            last_stamp = stamp
            self._decode_steps += 1
            if self._decode_steps % self.config.decode_log_interval == 0:
                self.log_stats()  # SGLang's log_decode_stats, every decode-log-interval steps
            running = {id(seq) for seq in self._batch}
            for seq in members:
                if id(seq) not in running:
                    continue  # left while the step ran (its request went away)
                seq.remaining -= 1
                seq.context_tokens += 1
                seq.modelled_seconds += step
                seq.steps += 1
                seq.tokens.put_nowait(stamp)
                if seq.remaining <= 0:
                    seq.tokens.put_nowait(None)
                    self._batch.remove(seq)
                    self.metrics.observe_modelled_tpot(seq.cohort, seq.modelled_seconds / seq.steps)

    async def decode(self, body: dict[str, Any], tokens: list[str], n_out: int):
        """Async iterator of token timestamps: the first right after the KV arrives (it was
        sampled by prefill), then one per decode step. Yields (index, wall time, meta)."""
        reserved = len(tokens) + n_out
        self._prealloc += 1
        try:
            await self._allocate(reserved)
        finally:
            self._prealloc -= 1
        slot = False
        try:
            n_in, cached = await self._fetch_kv(body, tokens)
            meta = {"prompt_tokens": n_in, "cached_tokens": cached}
            self._waiting += 1
            try:
                await self._slots.acquire()
                slot = True
            finally:
                self._waiting -= 1
            seq = DecodeSequence(context_tokens=n_in + 1, remaining=n_out - 1,
                                 tokens=asyncio.Queue(), cohort=cohort_of(body))  # fmt: skip
            try:
                yield 0, time.monotonic(), meta
                if seq.remaining > 0:
                    seq.modelled_seconds = self._step_in_flight  # it waits for that step
                    self._batch.append(seq)
                    self._batch_changed.set()
                    index = 1
                    while (stamp := await seq.tokens.get()) is not None:
                        yield index, stamp, meta
                        index += 1
            finally:
                if seq in self._batch:
                    self._batch.remove(seq)
        finally:
            if slot:
                self._slots.release()
            await self._free(reserved)

    # -- HTTP -----------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self.ready:
            raise EngineBusy("draining" if self.draining else "warming up")
        self._handlers += 1
        self._idle.clear()

    def _end(self) -> None:
        self._handlers -= 1
        self._update_idle()

    async def handle_generate(self, request: web.Request, api: str) -> web.StreamResponse:
        try:
            self._begin()
        except EngineBusy as exc:
            await self._refuse_room(request)
            return web.json_response(
                {"error": {"message": f"engine {exc}", "code": 503}}, status=503
            )
        arrived = time.monotonic()
        try:
            body = await request.json()
            tokens = prompt_tokens(body)
            n_out = max_new_tokens(api, body)
            rid = str(body.get("rid") or uuid.uuid4().hex)
            if self.config.request_log:
                with open(self.config.request_log, "a") as f:  # small, once per request
                    f.write(json.dumps({"prompt": prompt_key(tokens), "rid": rid, "role": self.role.value,
                                        "port": self.config.port}) + "\n")
            if self.role == Role.PREFILL:
                return await self._serve_prefill(request, api, body, tokens, rid, arrived)
            return await self._serve_decode(request, api, body, tokens, n_out, rid, arrived)
        except asyncio.CancelledError:
            self.metrics.aborted_requests += 1
            raise
        except ConnectionResetError:
            # the router (or its client) went away mid-request; nobody reads the answer
            self.metrics.aborted_requests += 1
            return web.Response(status=499)
        finally:
            self._end()

    async def _refuse_room(self, request: web.Request) -> None:
        # A refused prefill must fail its room at once, as SGLang's bootstrap does: otherwise
        # the decode half, sent at the same time, waits out the whole waiting timeout.
        if self.role != Role.PREFILL:
            return
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            room_id = self.dialect.refused_room(await request.json())
            if room_id is not None:
                self._room(int(room_id)).fail()

    async def _serve_prefill(self, request, api, body, tokens, rid, arrived):
        room_id = self.dialect.prefill_room(body)
        room = self._room(int(room_id)) if room_id is not None else Room()
        room.owned = True
        try:
            if room_id is not None and self.dialect.waits_for_handshake:
                await self._await_handshake(room)
            await self.prefill(tokens, room, cohort_of(body))
            self.metrics.ttft.observe(time.monotonic() - arrived)
            if room_id is None:
                room.transferred.set()  # nobody will collect it
            elif self.dialect.finishes_after_transfer:
                await room.transferred.wait()  # SGLang's inflight queue
            if room.failed:
                raise KvUnavailable("the KV of this room never reached its decode")
        except KvUnavailable as exc:
            self.metrics.aborted_requests += 1
            return web.json_response({"error": {"message": str(exc), "code": 500}}, status=500)
        return await self._answer_prefill(request, api, body, rid, arrived, room, room_id)

    async def _answer_prefill(self, request, api, body, rid, arrived, room, room_id):
        # the request finishes here: counted now (SGLang: after its KV transfer)
        self.metrics.e2e.observe(time.monotonic() - arrived)
        meta = {"prompt_tokens": room.input_tokens, "cached_tokens": room.cached_tokens}
        extra = self.dialect.answer_prefill(room, room_id)
        # Like SGLang's prefill server (and vLLM's with max_tokens=1): the answer carries the
        # one token prefill sampled.
        if not body.get("stream"):
            answer = full_response(api, rid, self.config.model_name, 1, meta)
            return web.json_response({**answer, **extra})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = stream_chunk(api, rid, self.config.model_name, 0, 1, meta)
        await resp.write(sse({**chunk, **extra}))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def _serve_decode(self, request, api, body, tokens, n_out, rid, arrived):
        model = self.config.model_name
        stream = bool(body.get("stream"))
        resp: web.StreamResponse | None = None
        # latencies are observed per output chunk the engine delivers (one token when
        # streaming; SGLang sends a non-streaming request's tokens in chunks of 50)
        chunk_tokens = self.dialect.output_chunk_tokens(stream)
        previous: float | None = None
        pending = 0
        meta: dict[str, Any] = {}
        try:
            async for index, stamp, meta in self.decode(body, tokens, n_out):
                if index == 0:
                    self.dialect.count_first_token(meta)
                self.dialect.count_token()
                pending += 1
                if (index + 1) % chunk_tokens == 0 or index + 1 == n_out:
                    if previous is None:
                        self.metrics.ttft.observe(stamp - arrived)
                    else:
                        self.metrics.itl.observe_many(stamp - previous, pending)
                    previous, pending = stamp, 0
                if stream:
                    if resp is None:
                        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                        await resp.prepare(request)
                    await resp.write(sse(stream_chunk(api, rid, model, index, n_out, meta)))
        except (ClientError, TimeoutError, KvUnavailable, ValueError) as exc:
            # KV never came (prefill died, timed out or freed it): SGLang reports an abort
            self.metrics.aborted_requests += 1
            log.warning("request %s failed waiting for KV: %s", rid, exc)
            error = {"error": {"message": f"KV transfer failed: {exc}", "code": 500}}
            if resp is None:
                return web.json_response(error, status=500)
            await resp.write(sse(error))
            return resp  # no [DONE]: the client sees a truncated stream
        self.metrics.e2e.observe(time.monotonic() - arrived)
        self.dialect.count_decode_done(meta, tokens, n_out)
        if not stream:
            return web.json_response(full_response(api, rid, model, n_out, meta))
        if api == "chat" and (body.get("stream_options") or {}).get("include_usage"):
            usage = full_response(api, rid, model, n_out, meta)["usage"]
            await resp.write(sse({"id": rid, "object": "chat.completion.chunk", "model": model,
                                  "choices": [], "usage": usage}))  # fmt: skip
        assert resp is not None
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="")
        return web.Response(status=503, text="draining" if self.draining else "warming up")

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model_name, "object": "model"}]}
        )

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.dialect.render_metrics(), content_type="text/plain")

    async def handle_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def handle_drain(self, request: web.Request) -> web.Response:
        self.begin_drain(exit_when_done=request.query.get("exit") in ("1", "true"))
        return web.json_response(self.state())

    async def handle_kv(self, request: web.Request) -> web.Response:
        try:
            room = await self.collect(int(request.match_info["room"]))
        except TimeoutError:
            return web.json_response({"error": "prefill of this room never finished"}, status=504)
        if room.failed:
            return web.json_response({"error": "prefill of this room failed or its KV was "
                                      "freed"}, status=409)  # fmt: skip
        return web.json_response(
            {"input_tokens": room.input_tokens, "cached_tokens": room.cached_tokens}
        )

    def app(self) -> web.Application:
        """The engine's HTTP API: what every dialect serves, plus the dialect's own routes."""
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        for path, api in (("/v1/chat/completions", "chat"), ("/v1/completions", "completions")):
            r.add_post(path, functools.partial(self.handle_generate, api=api))
        r.add_get("/health", self.handle_health)
        r.add_get("/v1/models", self.handle_models)
        r.add_get("/metrics", self.handle_metrics)
        r.add_get("/sim/state", self.handle_state)
        r.add_post("/sim/drain", self.handle_drain)
        self.dialect.add_routes(r)
        return app

    async def handle_bootstrap_health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/sim/kv/{room}", self.handle_kv)
        app.router.add_get("/health", self.handle_bootstrap_health)
        return app
