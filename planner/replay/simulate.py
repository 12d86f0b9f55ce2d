"""Discrete-event simulator of a PD fleet, used for replay and for the routing seed.

Requests arrive from a :class:`~.traces.Trace`. The router picks a ready prefill instance
(:data:`~.routers.ROUTERS`; optional early rejection) which computes the uncached part of the
prompt in batched passes (prefix cache per instance, LRU over the trace's block ids); the KV
cache moves to the decode instance the router picks (:data:`~.decode_batches.DECODE_ROUTERS`),
which runs the request in its continuous batch. A controller
is called every interval with an :class:`~.observe.Observation` and returns target counts;
instances then warm up, drain and switch roles as the profile says, and every second they hold
a node is accounted.

Modelling choices (and why):

- A prefill instance is a FIFO server whose work is known at admission (``busy_until``), as
  in the article: prefill batches trade latency for throughput, and the throughput is what the
  profile measures. This makes the prefill side O(1) per request.
- The prefix cache is updated when a request is admitted, not when it finishes: the queue is
  FIFO, so by the time a later request runs the earlier one has filled the cache.
- Decode is continuous batching (:mod:`.decode_batches`): each step emits a token to every
  running sequence and takes the profile's TPOT for the batch and context running then, so a
  joining request slows every running one. A request's TPOT is what a client measures, over
  its whole decode, and is observed when it finishes (as the engines' histograms are).
- A decode instance full (batch cap or KV capacity) makes the request wait in its queue for
  finishing sequences; the wait is part of its TTFT.
- Without admission (``decode_admission="off"``) a decode instance takes every request, so
  one short by a fraction slows every running sequence past the TPOT target (a cliff). With
  ``"queue"`` it caps its batch where the TPOT meets the target (what SGLang's
  ``--max-running-requests`` does, sized to the SLO): a request waits for enough running
  sequences to finish. ``"shed"`` also drops a request that has waited past the TTFT target;
  a short decode fleet then loses only its excess, as a short prefill fleet does under early
  rejection. No engine or router sheds so today.
- With ``prefill_admission`` (smg's, :mod:`.router_admission`) the router holds what finds
  every ready prefill instance at its cap, oldest first, and refuses it when its queue is full
  or it waited past the timeout; a slot opens when a prefill's response ends (after its KV
  transfer: the engine answers the router then) or an instance becomes ready.

The parts, each testable alone: :mod:`.prefix_index` (the prefix caches and which instance
holds which block), :mod:`.routers` (the choice of a prefill instance), :mod:`.fleet`
(instances warming, draining and switching roles per the controller's targets, and their
accounting), :mod:`.decode_batches` (the decode instances' continuous batches) and
:mod:`.interval_stats` (what the controller observes of each interval). This module wires them
and runs the event loop.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..model import PerformanceModel, Slo
from ..observe import Observation, Role
from .decode_batches import DECODE_ADMISSIONS, DECODE_ROUTERS, DecodeBatches
from .fleet import DRAINING, READY, WARMING, Events, Fleet, reconcile
from .interval_stats import IntervalStats
from .prefill_batches import ENGINES, PrefillBatches
from .prefix_index import PrefixIndex
from .router_admission import AdmissionQueue, PrefillAdmission
from .routers import ROUTERS, make_router
from .traces import Trace

__all__ = ["DECODE_ADMISSIONS", "DECODE_ROUTERS", "ENGINES", "ROUTERS", "Controller", "ForwardPass",
           "SimConfig", "SimResult", "simulate"]

#: controller(observation) -> (prefill target, decode target), counts of ready + warming;
#: a controller may add (switch_to_prefill, switch_to_decode): how many of the changes must be
#: made by switching existing nodes (the planner's decision), else the simulator decides
Controller = Callable[[Observation], tuple[int, ...]]


class ForwardPass(NamedTuple):
    """A ready instance's latest forward pass at a tick, as an engine's per-pass metrics
    report it (Dynamo's ``ForwardPassMetrics``): what it scheduled, how long the pass takes,
    and what waits on it. An idle instance reports zeros (an engine's idle heartbeat).

    Handed to a controller that has a ``see_forward_passes(now, passes)`` method, before
    it is called at each tick."""

    role: str  # "prefill" or "decode"
    instance: int
    wall_seconds: float
    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_kv_tokens: int = 0
    decode_requests: int = 0
    decode_kv_tokens: int = 0
    queued_prefill_requests: int = 0
    queued_prefill_tokens: int = 0
    queued_decode_requests: int = 0
    queued_decode_kv_tokens: int = 0


#: seconds between two Prometheus scrapes (a common setting is 5-15 s)
SCRAPE_SECONDS = 5.0


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulation run (times in seconds)."""

    router: str = "predicted-ttft"
    #: how the router picks a decode instance (:data:`.decode_batches.DECODE_ROUTERS`):
    #: "least-loaded" is an ideal; a PDCluster renders "round-robin" by default
    decode_router: str = "least-loaded"
    #: what the router sheds: False is what sglang-router, smg and vllm-router do by default
    #: (nothing); True drops a request whose predicted TTFT breaks the target (the article's
    #: ideal admission router, a what-if)
    early_rejection: bool = False
    #: how prefill instances batch (:data:`.prefill_batches.ENGINES`): "sglang" and "vllm"
    #: run passes up to ``prefill_chunk_tokens``, every request of a pass finishing when it
    #: ends, the prefix cache matched at scheduling and filled after compute; "article" is the
    #: global-scheduling article's model (one request at a time, cache filled at routing)
    engine: str = "sglang"
    #: tokens per prefill pass (SGLang --chunked-prefill-size, vLLM --max-num-batched-tokens);
    #: None = the engine's default on H100/H200
    prefill_chunk_tokens: int | None = None
    slo: Slo = field(default_factory=Slo)
    interval_seconds: float = 60.0
    #: the planner ticks at times this phase modulo the interval (the first at or after the
    #: first arrival), as a live loop whose schedule started elsewhere; None: at the first
    #: arrival
    tick_phase_seconds: float | None = None
    #: the fleet ran idle before the trace began (a live run's recording: its planner measured
    #: zero load until the first request), so the first interval is a measurement from the
    #: trace's start; False: it is unknown, not zero (a trace cut out of a longer day)
    idle_before: bool = False
    #: seconds a new instance takes to serve beyond the profile's warm-up: on a live stack the
    #: control plane creates and schedules its pod, and the router lists it only after its
    #: discovery sees it Ready (3.6-5 s measured on the demo's local cluster; a warm-up counts from pod
    #: start, as ``warmupSeconds`` does). 0: the warm-up is the whole wait
    join_delay_seconds: float = 0.0
    #: seconds between two Prometheus scrapes: the planner reads the gauges' means and every
    #: counter as of the last scrape before its tick
    scrape_seconds: float = SCRAPE_SECONDS
    #: how long before each tick the last scrape falls: 0 reads right after a scrape (the
    #: benchmarks); a live tick falls anywhere between two scrapes of a target, half a scrape
    #: interval after the last on average (the demo's replay). Counters and gauges (queues,
    #: batches) alike are read as of that scrape; the fleet's instances by state at the tick
    #: (the operator counts them from the pods)
    scrape_lag_seconds: float = 0.0
    initial_prefill: int = 1
    initial_decode: int = 1
    #: node budget: the nodes of provisioned instances (any state) never exceed it
    nodes: int = 10**6
    #: whole nodes one (prefill, decode) instance spans (a LeaderWorkerSet group): it takes
    #: that many nodes of the budget, and its seconds count that many times in
    #: ``instance_seconds`` (so GPU-hours are per node); (1, 1): one-node instances
    nodes_per_instance: tuple[int, int] = (1, 1)
    #: "off": every request joins the decode batch; "queue": decode caps its batch at the TPOT
    #: target and the rest wait; "shed": and drops what would wait past the TTFT target
    decode_admission: str = "off"
    #: the router's prefill admission (smg's, rendered from ``router.admission``): a cap per
    #: prefill instance, the rest waiting at the router and refused past a timeout; None = the
    #: router admits everything (every router's default)
    prefill_admission: PrefillAdmission | None = None
    #: skip decode and KV transfer: TTFT = prefill queue + compute (the article's routing sim)
    prefill_only: bool = False
    #: initial instances start ready (True) or cold (False)
    start_ready: bool = True
    #: trace time from which requests, instance-seconds, role changes and ticks count in the
    #: result; before it the fleet and its controller run unscored (a planner that has been
    #: running on this fleet, and has learned it, when the scored window opens). None: all
    scored_from_seconds: float | None = None
    #: prefix cache capacity per prefill instance in blocks; None = from the profile
    cache_blocks: int | None = None
    #: the (prefill, decode) instance each request of the trace went to in a live run, as
    #: positions among the ready instances of each role (-1: not known); they replace both
    #: routers' choices, so that a fidelity check compares the engines apart from the
    #: router's draw (bench/engine_fidelity.py). For a fixed fleet. None: the routers choose.
    recorded_routes: tuple[tuple[int, int], ...] | None = None
    seed: int = 1


@dataclass
class SimResult:
    """Per-request outcomes and fleet accounting of one run (times in seconds)."""

    arrival_seconds: np.ndarray
    ttft_seconds: np.ndarray  # nan for rejected requests
    tpot_seconds: np.ndarray  # nan for rejected requests (and prefill-only runs)
    rejected: np.ndarray  # bool
    hit_tokens: int
    prompt_tokens: int
    instance_seconds: dict[str, float]
    role_changes: int
    #: per control tick: (t, commanded prefill, commanded decode, provisioned P, provisioned D)
    ticks: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    end_seconds: float = 0.0

    def attainment(self, slo: Slo, *, ttft_only: bool = False) -> float:
        """Share of all requests (rejected count as misses) meeting TTFT and TPOT targets."""
        n = len(self.arrival_seconds)
        if n == 0:
            return 1.0
        ok = self.ttft_seconds <= slo.ttft_seconds
        if not ttft_only:
            ok &= self.tpot_seconds <= slo.tpot_seconds
        return float(np.count_nonzero(ok)) / n


def simulate(
    trace: Trace,
    model: PerformanceModel,
    config: SimConfig,
    controller: Controller | None = None,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay ``trace`` through a simulated fleet; see the module docstring for the model.

    ``controller`` (None = fixed fleet) is called at t = 0, interval, 2*interval, ... up to
    the last arrival with the interval's observation and returns (prefill, decode) targets.
    ``progress`` receives the share of arrivals processed, now and then.
    """
    return _Replay(trace, model, config, controller).run(progress)


def _check_scrapes(config: SimConfig) -> None:
    """Refuse a scrape schedule Prometheus cannot have, naming the field."""
    if not (math.isfinite(config.scrape_seconds) and config.scrape_seconds > 0):
        raise ValueError(f"scrape_seconds must be a positive number, got {config.scrape_seconds!r}")
    if not 0 <= config.scrape_lag_seconds < config.scrape_seconds:
        raise ValueError(f"scrape_lag_seconds must be >= 0 and below scrape_seconds "
                         f"({config.scrape_seconds:g}), got {config.scrape_lag_seconds!r}")


class _Gauges(NamedTuple):
    """What one scrape reads besides the counters IntervalStats keeps: the queues, decode's
    batches on ready instances, and the inter-token gaps streamed since the last such read."""

    waiting_decode: int
    queued_prefill: int
    decode_running: int
    gaps: tuple[float, float]


class _Scored(NamedTuple):
    """The counters at the start of a scored window (``SimConfig.scored_from_seconds``)."""

    t: float
    instance_seconds: dict[str, float]
    role_changes: int
    hit_tokens: int
    prompt_tokens: int


class _Replay:
    """One run of :func:`simulate`: the parts wired together, and the event loop.

    Arrivals are processed in order; before each, the controller ticks that are due and the
    events (instances ready, KV arrived at decode, drains done) up to its time are run."""

    def __init__(
        self, trace: Trace, model: PerformanceModel, config: SimConfig, controller: Controller | None
    ) -> None:
        self.trace, self.model, self.config, self.controller = trace, model, config, controller
        prof = model.profile
        block = trace.block_tokens
        # what the per-request path reads, bound once (attribute chains cost in the hot loop)
        self._arrival, self._input, self._output = (
            trace.arrival_seconds, trace.input_tokens, trace.output_tokens
        )
        self._blocks, self._block_tokens = trace.hash_ids, block
        self._prefill_seconds, self._kv_seconds = model.prefill_seconds, model.kv_transfer_seconds
        self.events = Events()
        self.prefix = PrefixIndex(config.cache_blocks or max(1, prof.prefill.prefix_cache_tokens // block))
        self.fleet = Fleet(self.prefix, self.events, prof.warmup.role_switch_seconds,
                           nodes_per_instance=config.nodes_per_instance,
                           prefill_busy_exact=config.engine == "article")
        self.fleet.on_decode_ready = self._admit_waiting
        self.router = make_router(config.router, self.fleet, model, block, random.Random(config.seed))
        self.decode = DecodeBatches(
            self.fleet, self.events, model, config.decode_admission, config.slo,
            input_tokens=trace.input_tokens, output_tokens=trace.output_tokens,
            arrival_seconds=trace.arrival_seconds, on_start=self._decode_started,
            on_finish=self._decode_finished, on_shed=self._decode_shed,
            router=config.decode_router, rng=random.Random(config.seed + 1),
            blocks=trace.hash_ids, block_tokens=block,
            recorded=None if config.recorded_routes is None else [d for _, d in config.recorded_routes],
        )
        _check_scrapes(config)
        self.stats = IntervalStats(config.interval_seconds, config.slo.percentile,
                                   measured_from_start=config.idle_before, counters_at_scrape=True)
        if config.recorded_routes is not None and len(config.recorded_routes) != len(trace):
            raise ValueError(f"recorded_routes has {len(config.recorded_routes)} routes for "
                             f"{len(trace)} requests")
        if config.engine not in ENGINES:
            raise ValueError(f"engine must be one of {tuple(ENGINES)}, got {config.engine!r}")
        chunk = config.prefill_chunk_tokens or ENGINES[config.engine]
        #: batched prefill passes, or None for the article's one request at a time
        self.batches = None if config.engine == "article" else PrefillBatches(
            self.fleet, self.prefix, self.events, model, chunk_tokens=chunk or 1,
            input_tokens=trace.input_tokens, blocks=trace.hash_ids, block_tokens=block,
            on_done=self._prefilled,
        )
        #: requests waiting at the router for a prefill slot (``prefill_admission``)
        self.admission_queue = None
        if config.prefill_admission is not None:
            if self.batches is None:
                # the article's model completes a prefill when it is routed: no slot is held
                raise ValueError("prefill_admission needs a batching engine, not 'article'")
            self.admission_queue = AdmissionQueue(config.prefill_admission)
        #: a prefill slot opened (a prefill answered, an instance became ready) since the
        #: queue at the router was last served
        self._slot_opened = False
        #: requests whose KV is ready while no decode instance is
        self.waiting_decode: list[int] = []
        #: prefill instance -> start times of the prefills queued on it, oldest first (each
        #: instance runs its queue in order): the requests still waiting at a tick are the
        #: queue the engines report, which the planner reads as a backlog
        self.prefill_starts: dict[int, deque[float]] = {}
        n = len(trace)
        self.ttft = np.full(n, np.nan)
        self.tpot = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.hit_tokens = 0
        self.prompt_tokens = 0
        #: when the last request completed (its last token, or its prefill when prefill-only)
        self.last_done = 0.0
        #: requests admitted by the router that have not finished decoding (or, prefill-only,
        #: prefill) yet
        self.unfinished = 0
        #: request -> the prefill instance it was routed to, until it completes end to end
        #: (its prefill slot is released at prefill, the router's load at the end)
        self._prefill_of: dict[int, int] = {}
        #: request -> its cached prompt tokens, from its prefill until its KV transfer ends
        self._hits_of: dict[int, int] = {}
        self.ticks: list[tuple[float, int, int, int, int]] = []
        #: when Prometheus scrapes next and the planner ticks next (set in ``run``), and the
        #: gauges of the last scrape before that tick (None: none scraped yet)
        self._next_scrape = self._next_tick = math.inf
        self._gauges: _Gauges | None = None

    def run(self, progress: Callable[[float], None] | None) -> SimResult:
        cfg, fleet = self.config, self.fleet
        arr = self.trace.arrival_seconds
        n_req = len(arr)
        new_seconds = self.model.profile.warmup.new_node_seconds
        t0 = arr[0] if n_req else 0.0
        warm = 0.0 if cfg.start_ready else new_seconds
        for _ in range(cfg.initial_prefill):
            fleet.add(Role.PREFILL, t0, warm)
        if not cfg.prefill_only:
            for _ in range(cfg.initial_decode):
                fleet.add(Role.DECODE, t0, warm)

        first_tick = t0 if cfg.tick_phase_seconds is None else (
            t0 + (cfg.tick_phase_seconds - t0) % cfg.interval_seconds)
        next_tick = self._next_tick = first_tick if self.controller is not None else math.inf
        # scrapes from the first arrival on, the last before each tick scrape_lag_seconds
        # before it
        scrape = cfg.scrape_seconds
        self._next_scrape = t0 + (first_tick - cfg.scrape_lag_seconds - t0) % scrape
        last_arrival = arr[-1] if n_req else t0
        report_every = max(1, n_req // 100)
        scored = cfg.scored_from_seconds
        first_scored = 0 if scored is None else bisect.bisect_left(arr, scored)
        if scored is not None and first_scored >= n_req:
            raise ValueError(f"scored_from_seconds {scored:g} is after the last arrival")
        before = _Scored(-math.inf, {}, 0, 0, 0)
        for r in range(n_req):
            t = arr[r]
            if scored is not None and r == first_scored:
                while next_tick < scored:
                    self._scrape_until(next_tick)
                    self._tick(next_tick)
                    next_tick = self._next_tick = next_tick + cfg.interval_seconds
                before = self._tally(scored)
            while next_tick <= t:
                self._scrape_until(next_tick)
                self._tick(next_tick)
                next_tick = next_tick + cfg.interval_seconds if next_tick < last_arrival else math.inf
                self._next_tick = next_tick
            self._scrape_until(t)
            self._run_events(t)
            if progress is not None and r % report_every == 0:
                progress(r / n_req)
            self._arrive(r, t)

        # run what still completes a request (KV arrivals, a decode instance some request waits
        # for); a node still warming after that serves no one
        heap, q = self.events.heap, self.admission_queue
        while heap and (self.unfinished or (q is not None and q.waiting)):
            self._run_events(heap[0][0])
        if q is not None:
            for r, _ in q.waiting:  # no prefill instance left to take them
                self.rejected[r] = True
            q.waiting.clear()
        # the run ends when the last request completes, for every policy alike: a node still
        # warming (or a queue of nothing) past that point serves no one and is not charged
        end = max(self.last_done, last_arrival)
        for i in range(len(fleet.role)):
            fleet.account(i, end)
        if progress is not None:
            progress(1.0)
        k = first_scored
        return SimResult(
            arrival_seconds=np.asarray(arr[k:], dtype=float),
            ttft_seconds=self.ttft[k:],
            tpot_seconds=self.tpot[k:],
            rejected=self.rejected[k:],
            hit_tokens=self.hit_tokens - before.hit_tokens,
            prompt_tokens=self.prompt_tokens - before.prompt_tokens,
            instance_seconds={s: v - before.instance_seconds.get(s, 0.0) for s, v in fleet.acc.items()},
            role_changes=fleet.role_changes - before.role_changes,
            ticks=[tk for tk in self.ticks if tk[0] >= before.t],
            end_seconds=end,
        )

    def _scrape_until(self, t: float) -> None:
        """Prometheus' scrapes up to ``t`` (only a controller reads them); one within a
        microsecond of ``t`` counts as at ``t``, whatever the sums' rounding."""
        if self.controller is None:
            return
        while self._next_scrape <= t + 1e-6:
            at = self._next_scrape
            self._run_events(at)
            self.stats.scrape(self.fleet)
            self._next_scrape += self.config.scrape_seconds
            if self._next_scrape > self._next_tick + 1e-6:
                # the last scrape before the tick: what the tick's instant queries read
                self._gauges = self._read_gauges(at)

    def _read_gauges(self, now: float) -> _Gauges:
        """The queues and decode's batches at ``now``, and the gaps streamed up to it (those
        after it stay counted for the next read)."""
        fleet = self.fleet
        running = sum(len(fleet.running[i]) for i, r in enumerate(fleet.role)
                      if r == Role.DECODE and fleet.state[i] == READY)
        return _Gauges(len(self.waiting_decode) + self.decode.waiting(), self._queued_prefill(now),
                       running, self.decode.take_gaps(now))

    def _tally(self, now: float) -> _Scored:
        """What has been counted up to ``now``, the start of the scored window (the cache
        counters are per prefill: a request that arrived before and prefills after counts)."""
        self._run_events(now)
        fleet = self.fleet
        for i in range(len(fleet.role)):
            fleet.account(i, now)
        return _Scored(now, dict(fleet.acc), fleet.role_changes, self.hit_tokens, self.prompt_tokens)

    def _tick(self, now: float) -> None:
        """Call the controller with the interval ending ``now`` and apply its targets."""
        assert self.controller is not None
        fleet = self.fleet
        self._run_events(now)
        # as of the last scrape; none yet (a first tick at the first arrival, lagged): now
        g = self._gauges if self._gauges is not None else self._read_gauges(now)
        self._gauges = None
        see_passes = getattr(self.controller, "see_forward_passes", None)
        if see_passes is not None:
            see_passes(now, self.forward_passes(now))
        out = self.controller(self.stats.observe(now, fleet, g.waiting_decode,
                                                 queued_prefill=g.queued_prefill, gaps=g.gaps,
                                                 decode_running=g.decode_running))
        tp, td = out[0], out[1]
        reconcile(
            fleet, tp, td, now, (out[2], out[3]) if len(out) >= 4 else None,
            nodes=self.config.nodes,
            new_seconds=self.model.profile.warmup.new_node_seconds + self.config.join_delay_seconds,
        )
        self.ticks.append((now, tp, td, fleet.provisioned(Role.PREFILL), fleet.provisioned(Role.DECODE)))

    def forward_passes(self, now: float) -> list[ForwardPass]:
        """Each ready instance's latest pass at ``now`` (:class:`ForwardPass`); prefill only
        on a batching engine (the article's model has no passes)."""
        fleet, out = self.fleet, []
        b = self.batches
        for i in fleet.ready_prefill:
            if b is None:
                break
            waiting = b.queued(i), b.queued_tokens(i)
            if i in b.running:
                n, tokens, kv = b.pass_shape[i]
                out.append(ForwardPass("prefill", i, b.pass_seconds[i], n, tokens, kv,
                                       queued_prefill_requests=waiting[0],
                                       queued_prefill_tokens=waiting[1]))
            else:
                out.append(ForwardPass("prefill", i, 0.0, queued_prefill_requests=waiting[0],
                                       queued_prefill_tokens=waiting[1]))
        for i, role in enumerate(fleet.role):
            if role != Role.DECODE or fleet.state[i] != READY:
                continue
            n, kv, seconds = self.decode.batch_now(i, now)
            queue = fleet.decode_waiting[i]
            out.append(ForwardPass("decode", i, seconds, decode_requests=n, decode_kv_tokens=kv,
                                   queued_decode_requests=len(queue),
                                   queued_decode_kv_tokens=sum(int(self._input[r]) for r in queue)))
        return out

    def _queued_prefill(self, now: float) -> int:
        """Requests whose prefill has not started by ``now``: on a ready prefill instance, and
        held at the router by its admission (which the live planner adds to the engines'
        queues from ``smg_pd_prefill_admission_queued``)."""
        fleet, queued = self.fleet, 0
        if self.admission_queue is not None:
            self._expire_admission_queue(now)
            queued += len(self.admission_queue.waiting)
        if self.batches is not None:
            return queued + sum(self.batches.queued(i) for i in fleet.ready_prefill)
        for i, starts in self.prefill_starts.items():
            while starts and starts[0] <= now:
                starts.popleft()
            if fleet.role[i] == Role.PREFILL and fleet.state[i] == READY:
                queued += len(starts)
        return queued

    def _run_events(self, until: float) -> None:
        """Run every event due at or before ``until``, in time order."""
        heap, fleet = self.events.heap, self.fleet
        while heap and heap[0][0] <= until:
            t, kind, seq, x = heapq.heappop(heap)
            if kind == Events.DECODE:
                self.decode.finish_due(x, t, seq)
            elif kind == Events.ADMIT:
                self.stats.prompt_finished(self._input[x], self._hits_of.pop(x))
                self._prefill_answered(x, t)
                self._admit_decode(x, t)
            elif kind == Events.PASS:
                assert self.batches is not None
                self.stats.prefill_busy_seconds += self.batches.pass_done(x, t)
            elif kind == Events.READY:
                if fleet.state[x] == WARMING:  # else its warm-up was cancelled
                    fleet.make_ready(x, t)
                    self._slot_opened = True
            else:
                fleet.release(x, t)
            if self._slot_opened and self.admission_queue is not None:
                # served after the event, not inside it: a pass ending must not start another
                # pass on its own instance while it is still being closed
                self._slot_opened = False
                self._serve_admission_queue(t)

    def _arrive(self, r: int, t: float) -> None:
        """Request ``r`` arrives at ``t``: route it to a prefill instance (or reject it) and
        queue its prefill there; its KV reaches decode after the transfer."""
        fleet = self.fleet
        self.stats.arrival(t)
        if not fleet.ready_prefill:
            self.rejected[r] = True  # no prefill instance at all: nothing can serve it
            self.stats.rejections += 1
            return
        q = self.admission_queue
        if q is not None:
            self._expire_admission_queue(t)
            open_ = q.open_instances(fleet.ready_prefill, fleet.outstanding)
            if not open_ or q.waiting:  # first come, first served at the router
                if not q.offer(r, t):
                    self.rejected[r] = True  # the queue is full: 429 at once
                    self.stats.rejections += 1
                return
            self._route(r, t, open_)
            return
        self._route(r, t, None)

    def _expire_admission_queue(self, now: float) -> None:
        assert self.admission_queue is not None
        for r in self.admission_queue.expire(now):
            self.rejected[r] = True  # waited past the queue timeout: 429
            self.stats.rejections += 1

    def _serve_admission_queue(self, now: float) -> None:
        """Route the requests waiting at the router, oldest first, while a slot is open."""
        q, fleet = self.admission_queue, self.fleet
        assert q is not None
        self._expire_admission_queue(now)
        while q.waiting:
            open_ = q.open_instances(fleet.ready_prefill, fleet.outstanding)
            if not open_:
                return
            r, _ = q.waiting.popleft()
            self._route(r, now, open_)

    def _route(self, r: int, t: float, among: list[int] | None) -> None:
        """Route request ``r`` at ``t`` to a ready prefill instance (one of ``among`` when
        given), or reject it early; queue its prefill there."""
        n_in = self._input[r]
        blocks = self._blocks[r]
        fleet, cfg = self.fleet, self.config
        hits = self.prefix.hits(blocks, fleet.prefill_mask)
        if among is not None and len(among) < len(fleet.ready_prefill):
            allowed = set(among)
            hits = {j: h for j, h in hits.items() if j in allowed}
        routes = cfg.recorded_routes
        k = routes[r][0] if routes is not None else -1
        if 0 <= k < len(fleet.ready_prefill):
            i = fleet.ready_prefill[k]
        else:
            i = self.router.choose(t, n_in, hits, among, blocks=blocks)
        hit_tok = min(hits.get(i, 0) * self._block_tokens, n_in)
        start = max(fleet.busy[i], t)
        done = start + self._prefill_seconds(n_in, hit_tok)
        if cfg.early_rejection:
            # from the request's arrival: it may have waited at the router for a slot
            waited = t - self._arrival[r]
            predicted = waited + done - t if cfg.prefill_only else waited + done - t + self._kv_seconds(n_in)
            if predicted > cfg.slo.ttft_seconds:
                self.rejected[r] = True
                self.stats.rejections += 1
                return
        # the router's estimate of when the instance runs empty (what it ranks and predicts by)
        fleet.busy[i] = done
        fleet.outstanding[i] += 1
        fleet.inflight[i] += 1
        self._prefill_of[r] = i
        self.unfinished += 1
        if not cfg.prefill_only:
            self.decode.bind(r)  # the router dispatches the decode half now too
        if self.batches is not None:
            self.batches.submit(i, r, t)
            return
        # the article's model: one request at a time, FIFO, done exactly when predicted, and
        # the cache filled at routing (by the time a later request runs, this one is computed)
        if start > t:
            self.prefill_starts.setdefault(i, deque()).append(start)
        self.prefix.insert(i, blocks)
        self._prefilled(r, done, hit_tok, done - start)

    def _prefilled(self, r: int, done: float, hit_tok: int, forward_seconds: float) -> None:
        """Request ``r``'s prefill completed at ``done``, ``hit_tok`` of its prompt cached,
        after ``forward_seconds`` in forward passes."""
        n_in, stats = self._input[r], self.stats
        stats.prefill_forward.append(forward_seconds)
        if self.batches is None:
            stats.prefill_busy_seconds += forward_seconds  # one request per pass
        self.prompt_tokens += n_in
        self.hit_tokens += hit_tok
        if self.config.prefill_only:
            self._prefill_answered(r, done)
            stats.prompt_finished(n_in, hit_tok)
            self._completed(r)
            t = self._arrival[r]
            self.ttft[r] = done - t
            stats.ttft.append(done - t)
            self.last_done = max(self.last_done, done)
            self.unfinished -= 1
        else:
            # the prefill engine counts the request (and its prompt) as its KV transfer ends
            self._hits_of[r] = hit_tok
            self.events.push(done + self._kv_seconds(n_in), Events.ADMIT, r)

    def _prefill_answered(self, r: int, now: float) -> None:
        """Request ``r``'s prefill response ended at ``now``: in PD mode after its KV transfer
        (SGLang's prefill holds a request in its inflight queue until the transfer polls done,
        and only then answers; ``process_disagg_prefill_inflight_queue``), prefill-only at its
        prefill. The router's prefill slot and load for it are released (smg drops its
        ``PrefillLoadGuard`` when the prefill response ends), and a draining prefill instance
        with nothing left in flight is released (pdscale stops an engine once it has nothing
        in flight)."""
        fleet = self.fleet
        i = self._prefill_of[r]
        fleet.outstanding[i] -= 1
        self._slot_opened = True
        if fleet.state[i] == DRAINING and fleet.outstanding[i] == 0:
            self.events.push(now, Events.RELEASE, i)

    def _admit_decode(self, r: int, now: float) -> None:
        """Request ``r``'s KV arrived at ``now``: a decode instance takes it (into its batch or
        its queue), or it waits for one to be ready."""
        if not self.fleet.ready_decode and not self.decode.bound(r):
            self.waiting_decode.append(r)
            return
        self.decode.place(r, now)

    def _decode_started(self, r: int, now: float) -> None:
        first = now - self._arrival[r]
        self.ttft[r] = first
        self.stats.ttft.append(first)

    def _completed(self, r: int) -> None:
        """Request ``r``'s response ended (served or dropped): the router's load drops."""
        self.fleet.inflight[self._prefill_of.pop(r)] -= 1

    def _decode_finished(self, r: int, start: float, now: float) -> None:
        n_out = self._output[r]
        self.stats.response_finished(n_out)
        self._completed(r)
        self.unfinished -= 1
        self.last_done = max(self.last_done, now)
        if n_out <= 1:
            self.tpot[r] = 0.0  # one token, from prefill: no inter-token time to miss
            return
        tpot = (now - start) / (n_out - 1)
        self.tpot[r] = tpot
        self.stats.decoded(tpot, n_out - 1)

    def _decode_shed(self, r: int, now: float) -> None:
        self._completed(r)
        self.unfinished -= 1
        self.rejected[r] = True
        self.stats.rejections += 1

    def _admit_waiting(self, now: float) -> None:
        """A decode instance became ready: admit what waited for one, first come first."""
        while self.waiting_decode:
            self._admit_decode(self.waiting_decode.pop(0), now)
