"""The engine core: queues, timing, the KV hand-off between prefill and decode, metrics.

A prefill instance computes prompts one at a time, first come first served, and keeps each
room's KV until its decode collects it from the bootstrap server (``GET /sim/kv/{room}``, a
long poll); a decode instance waits for its room's KV and the transfer time, then runs the
request in a continuous batch at the timing model's TPOT. Everything a specific engine's API
adds (endpoints, metric names, how the room is named) is its :class:`~.dialect.Dialect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from pdscale.planner.observe import Role

from .dialect import Dialect
from .metrics import Metrics
from .prefix_cache import PrefixCache
from .sglang import SGLang
from .timing import TimingModel
from .vllm import Vllm
from .wire import full_response, is_loopback, max_new_tokens, prompt_tokens, sse, stream_chunk

log = logging.getLogger("pdscale.testbed.simengine")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's settings (the command line's options)."""

    #: "prefill" or "decode" (a :class:`~pdscale.planner.observe.Role` value)
    role: str
    host: str
    port: int
    #: prefill only: where the bootstrap (KV hand-off) server listens, on ``host``
    bootstrap_port: int | None = None
    model_name: str = "sim-model"
    #: model seconds per wall second (10 = everything runs ten times faster)
    time_compression: float = 1.0
    prefix_cache_tokens: int = 1_000_000
    block_tokens: int = 64
    #: decode batch cap (SGLang --max-running-requests); more requests wait in the queue
    max_running_requests: int = 256
    #: decode waits this long for its room's prefill (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)
    waiting_timeout_seconds: float = 300.0
    #: prefill keeps an uncollected room's KV this long (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)
    bootstrap_timeout_seconds: float = 300.0
    #: simulated warm-up: /health answers 503 for this long after start (wall seconds)
    startup_seconds: float = 0.0
    #: or: warm until this wall-clock moment (Unix seconds), the moment its pod turns Ready
    ready_at_unix_seconds: float | None = None
    #: a drain that wants to exit gives up waiting for in-flight work after this long
    drain_timeout_seconds: float = 600.0
    #: reported as ``model_path``; the router loads a tokenizer from it, from the Hugging Face
    #: hub unless it is a local directory with a tokenizer.json (see write_word_tokenizer)
    model_path: str | None = None
    #: which engine's API and metric names to speak: "sglang" or "vllm"
    dialect: str = "sglang"


#: the dialects by ``--dialect`` name
DIALECT_CLASSES: dict[str, type[Dialect]] = {d.name: d for d in (SGLang, Vllm)}
DIALECTS = tuple(DIALECT_CLASSES)


class Room:
    """The prefill side of one bootstrap room: computed-or-not and collected-or-not."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.input_tokens = 0
        self.cached_tokens = 0
        self.owned = False  # a prefill request for this room arrived (else only a decode poll)
        self.serving = False  # its HTTP handler still runs (and is counted as such)
        self.failed = False  # the prefill was refused: the decode half must fail, not wait
        self.collected = False
        self.created = time.monotonic()


@dataclass
class DecodeSequence:
    """A decode sequence in the running batch."""

    context_tokens: int
    remaining: int
    tokens: asyncio.Queue[float | None]


class EngineBusy(Exception):
    """The engine refuses new work (warming up or draining) -> HTTP 503."""


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
        self.config = config
        self.role = Role(config.role)
        self.dialect: Dialect = DIALECT_CLASSES[config.dialect](self)
        self.timing = timing
        self.metrics = Metrics()
        self.cache = PrefixCache(config.prefix_cache_tokens, config.block_tokens)
        # one warm-up clock: a given moment (its pod's Ready), else startup_seconds from now
        self.ready_at = (config.ready_at_unix_seconds if config.ready_at_unix_seconds is not None
                         else time.time() + config.startup_seconds)
        self.draining = False
        self.exit_requested = asyncio.Event()
        self._handlers = 0  # HTTP requests being served (prefill and decode)
        self._rooms: dict[int, Room] = {}
        self._prefill_queue: asyncio.Queue[tuple[list[str], Room, asyncio.Future[None]]] = (
            asyncio.Queue()
        )
        self._prefill_running = 0
        self._decode_waiting = 0  # waiting for KV or for a batch slot
        self._batch: list[DecodeSequence] = []
        self._batch_changed = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_running_requests)
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
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
        """Requests not finished: being served, plus prefilled KV not yet collected by decode."""
        uncollected = sum(
            1 for r in self._rooms.values() if r.owned and not r.serving and not r.collected
        )
        return self._handlers + uncollected

    def running(self) -> int:
        return self._prefill_running if self.role == Role.PREFILL else len(self._batch)

    def queued(self) -> int:
        if self.role == Role.PREFILL:
            return self._prefill_queue.qsize()
        return self._decode_waiting

    def context_tokens(self) -> int:
        """Context tokens of the running decode batch."""
        return sum(s.context_tokens for s in self._batch)

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
        # one prompt at a time, first come first served: queueing delay is part of TTFT
        while True:
            tokens, room, finished = await self._prefill_queue.get()
            if finished.cancelled():
                continue
            self._prefill_running = 1
            try:
                cached = self.cache.match(tokens)
                await asyncio.sleep(self.wall(self.timing.prefill_seconds(len(tokens), cached)))
                self.cache.insert(tokens)
                room.input_tokens, room.cached_tokens = len(tokens), cached
                self.metrics.recent.append((len(tokens), cached))
                room.done.set()
                if not finished.done():
                    finished.set_result(None)
            finally:
                self._prefill_running = 0

    async def _expire_rooms(self) -> None:
        # KV nobody collected (decode gone, or a poll for a room whose prefill never came)
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for room_id, room in list(self._rooms.items()):
                age = now - room.created
                if room.collected or age > self.config.bootstrap_timeout_seconds:
                    del self._rooms[room_id]
            self._update_idle()

    async def prefill(self, tokens: list[str], room_id: int | None) -> Room:
        """Queue and compute one prompt; the room then waits for its decode to collect it."""
        room = self._room(room_id) if room_id is not None else Room()
        room.owned = room.serving = True
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._prefill_queue.put((tokens, room, finished))
        try:
            await finished
        except asyncio.CancelledError:
            # the router gave up on this prefill: its decode half must not wait for the KV
            room.collected = room.failed = True
            room.done.set()
            raise
        if room_id is None:
            room.collected = True
        return room

    async def collect(self, room_id: int) -> Room:
        """Bootstrap server side: wait until the room's prefill is done, then hand it over."""
        room = self._room(room_id)
        await asyncio.wait_for(room.done.wait(), self.config.waiting_timeout_seconds)
        room.collected = True
        self._update_idle()
        return room

    # -- decode ---------------------------------------------------------------------------
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
        if not is_loopback(str(host)):
            raise ValueError(f"bootstrap_host {host!r} is not a loopback address")
        assert self._session is not None
        url = f"http://{host}:{port}/sim/kv/{int(room)}"
        async with self._session.get(
            url, timeout=ClientTimeout(total=self.config.waiting_timeout_seconds + 5)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"bootstrap {url} answered {resp.status}")
            info = await resp.json()
        await asyncio.sleep(self.wall(self.timing.kv_transfer_seconds(info["input_tokens"])))
        return int(info["input_tokens"]), int(info["cached_tokens"])

    async def _decode_loop(self) -> None:
        # continuous batching: every step emits one token to every running sequence, and a
        # step takes TPOT(batch, mean context). Deadlines, not sleeps, so error doesn't add up.
        next_step = time.monotonic()
        while True:
            if not self._batch:
                self._batch_changed.clear()
                await self._batch_changed.wait()
                next_step = time.monotonic()
            batch = len(self._batch)
            mean_context = sum(s.context_tokens for s in self._batch) / batch
            step = self.wall(self.timing.tpot_seconds(batch, mean_context))
            now = time.monotonic()
            next_step = max(next_step, now - step) + step
            await asyncio.sleep(max(next_step - now, 0.0))
            stamp = time.monotonic()
            for seq in list(self._batch):
                seq.remaining -= 1
                seq.context_tokens += 1
                seq.tokens.put_nowait(stamp)
                if seq.remaining <= 0:
                    seq.tokens.put_nowait(None)
                    self._batch.remove(seq)

    async def decode(self, body: dict[str, Any], tokens: list[str], n_out: int):
        """Async iterator of token timestamps: the first right after the KV arrives (it was
        sampled by prefill), then one per decode step. Yields (index, wall time, meta)."""
        self._decode_waiting += 1
        waiting = True
        try:
            n_in, cached = await self._fetch_kv(body, tokens)
            meta = {"prompt_tokens": n_in, "cached_tokens": cached}
            await self._slots.acquire()
            self._decode_waiting -= 1
            waiting = False
        except BaseException:
            if waiting:
                self._decode_waiting -= 1
            raise
        seq = DecodeSequence(context_tokens=n_in + 1, remaining=n_out - 1, tokens=asyncio.Queue())
        try:
            yield 0, time.monotonic(), meta
            if seq.remaining > 0:
                self._batch.append(seq)
                self._batch_changed.set()
                index = 1
                while (stamp := await seq.tokens.get()) is not None:
                    yield index, stamp, meta
                    index += 1
        finally:
            if seq in self._batch:
                self._batch.remove(seq)
            self._slots.release()

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
            self.metrics.requests += 1
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
                room = self._room(int(room_id))
                room.failed = True
                room.done.set()

    async def _serve_prefill(self, request, api, body, tokens, rid, arrived):
        room_id = self.dialect.prefill_room(body)
        room = await self.prefill(tokens, int(room_id) if room_id is not None else None)
        try:
            return await self._answer_prefill(request, api, body, rid, arrived, room, room_id)
        finally:
            room.serving = False  # from here on only the uncollected KV keeps it in flight

    async def _answer_prefill(self, request, api, body, rid, arrived, room, room_id):
        self.metrics.prompt_tokens += room.input_tokens
        self.metrics.cached_tokens += room.cached_tokens
        self.metrics.ttft.observe(time.monotonic() - arrived)
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
        previous = None
        meta: dict[str, Any] = {}
        try:
            async for index, stamp, meta in self.decode(body, tokens, n_out):
                if previous is None:
                    self.metrics.ttft.observe(stamp - arrived)
                else:
                    self.metrics.itl.observe(stamp - previous)
                previous = stamp
                self.metrics.generation_tokens += 1
                if stream:
                    if resp is None:
                        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                        await resp.prepare(request)
                    await resp.write(sse(stream_chunk(api, rid, model, index, n_out, meta)))
        except (ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            # KV never came (prefill died or timed out): SGLang reports this as an abort
            self.metrics.aborted_requests += 1
            log.warning("request %s failed waiting for KV: %s", rid, exc)
            error = {"error": {"message": f"KV transfer failed: {exc}", "code": 500}}
            if resp is None:
                return web.json_response(error, status=500)
            await resp.write(sse(error))
            return resp  # no [DONE]: the client sees a truncated stream
        self.metrics.e2e.observe(time.monotonic() - arrived)
        self.dialect.count_decode_done(meta, tokens)
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
            return web.json_response({"error": "prefill of this room was refused"}, status=409)
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
