"""Decode instances that batch as SGLang and vLLM do: continuous batching, one step at a time.

Every step of a decode instance emits one token to every running sequence and takes the
profile's TPOT for the batch and context running *now*
(:meth:`~..model.PerformanceModel.tpot_seconds`), so a request joining a batch slows every
sequence in it from that step on, and one finishing speeds them up (SGLang's
``event_loop_normal`` / ``run_batch``; vLLM v1's scheduler steps). A request's first token is
the one its prefill sampled, so it needs ``output - 1`` steps here; its TPOT is what a client
measures: (last token - first token) / (output - 1).

All sequences of an instance advance in lockstep, so progress is counted in steps, not time: a
sequence that joins at step ``S0`` needing ``n`` steps finishes at step ``S0 + n``, whatever the
batch does meanwhile. Between two changes of the batch (a join or a finish) the batch size
``B`` is fixed and the context grows by ``B`` tokens per step, so the step time grows linearly
(``A + G·k`` at the k-th step) and the time to the next finish is a closed form: one event per
join or finish, not per step.

The router chooses the decode instance (``SimConfig.decode_router``, the PDCluster's
``router.decodePolicy``): ``round-robin`` (what a PDCluster renders by default), ``random``,
``power-of-two`` or ``cache-aware`` as sgl-router's policies do for prefill
(:mod:`.routers`), with a decode instance's load the router's count of its requests there
(running and waiting) and the router's prefix tree for decode kept as "the instance each
block was last sent to"; or ``least-loaded`` (the fewest sequences, an ideal what-if). The
router's policies choose when the request arrives (:meth:`DecodeBatches.bind`): sgl-router
and smg pick a request's prefill and decode together and dispatch both at once, so the decode
it waits for is one of those ready then, and one that drains before the KV arrives still
takes it (its engine waits for the requests in flight); ``least-loaded`` chooses when the KV
arrives, among those ready then, as no router does. A request
waits there, first come first served, while the instance is full: its batch at the
profile's ``max_batch``, or its KV cache unable to hold the request's prompt and output (what
SGLang's decode pre-allocation reserves, as the simulated engine does). The wait is part of
its TTFT. Modes (``SimConfig.decode_admission``):

- ``off``: nothing more; one sequence too many slows every running one (the TPOT cliff).
- ``queue``: the batch is also capped where its TPOT would break the target (SGLang's
  ``--max-running-requests`` sized to the SLO): the request starts once enough have finished.
- ``shed``: as ``queue``, but a request that has waited past the TTFT target is dropped when
  its turn comes instead of started (it has missed already; dropping it spares those behind).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence

from ..model import PerformanceModel, Slo
from .fleet import DRAINING, Events, Fleet

DECODE_ADMISSIONS = ("off", "queue", "shed")
DECODE_ROUTERS = ("round-robin", "random", "power-of-two", "cache-aware", "least-loaded")
#: steps short of a finish still counted as finished (float error of the closed form)
_STEP_EPS = 1e-6


class DecodeBatches:
    """Continuous batches on the fleet's decode instances.

    ``fleet.running[i]`` is instance ``i``'s batch as a heap of (finishing step, request,
    context offset); ``fleet.decode_waiting[i]`` its queue. Callbacks: ``on_start(r, t)`` when
    request ``r`` gets its first token, ``on_finish(r, start, t)`` when it gets its last,
    ``on_shed(r, t)`` when it is dropped."""

    def __init__(
        self,
        fleet: Fleet,
        events: Events,
        model: PerformanceModel,
        mode: str,
        slo: Slo,
        *,
        input_tokens: Sequence[int],
        output_tokens: Sequence[int],
        arrival_seconds: Sequence[float],
        on_start: Callable[[int, float], None],
        on_finish: Callable[[int, float, float], None],
        on_shed: Callable[[int, float], None],
        router: str = "least-loaded",
        rng: random.Random | None = None,
        blocks: Sequence[tuple[int, ...]] = (),
        block_tokens: int = 512,
        recorded: Sequence[int] | None = None,
    ) -> None:
        if mode not in DECODE_ADMISSIONS:
            raise ValueError(f"decode_admission must be one of {DECODE_ADMISSIONS}, got {mode!r}")
        if router not in DECODE_ROUTERS:
            raise ValueError(f"decode_router must be one of {DECODE_ROUTERS}, got {router!r}")
        self.router = router
        #: request -> position among the ready decodes it went to live (-1: the router picks)
        self._recorded = recorded
        self.rng = rng or random.Random(1)
        self._count = 0  # round robin's counter
        #: request -> the decode instance the router sent it to when it arrived (``bind``)
        self._bound: dict[int, int] = {}
        self._blocks, self.block_tokens = blocks, block_tokens
        #: cache-aware: block id -> the decode instance it was last sent to, and how many
        #: blocks each instance holds so (its tree's size)
        self._owner: dict[int, int] = {}
        self._tree_blocks: dict[int, int] = {}
        self.fleet, self.events, self.model = fleet, events, model
        self.capped, self.shed = mode != "off", mode == "shed"
        self.slo_ttft, self.slo_tpot = slo.ttft_seconds, slo.tpot_seconds
        d = model.profile.decode
        self.max_batch, self.kv_capacity_tokens = d.max_batch, d.kv_capacity_tokens
        self._input, self._output, self._arrival = input_tokens, output_tokens, arrival_seconds
        self.on_start, self.on_finish, self.on_shed = on_start, on_finish, on_shed
        # per instance (dicts: instances join the fleet as the run goes)
        #: steps run by ``_at[i]``, and that time
        self._steps: dict[int, float] = {}
        self._at: dict[int, float] = {}
        #: sum over the batch of (context at join - step at join): the batch's context is
        #: this + B x steps, updated in O(1) per join and finish
        self._ctx_offset: dict[int, float] = {}
        #: the batch's sum of mean contexts over each sequence's decode (the cap's sizing)
        self._mean_context: dict[int, float] = {}
        #: KV tokens reserved by the batch (prompt + output of each running sequence)
        self._reserved: dict[int, int] = {}
        #: the sequence number of instance i's one live finish event (older ones are stale)
        self._event: dict[int, int] = {}
        self._started: dict[int, float] = {}
        #: the inter-token gaps streamed since the last :meth:`take_gaps`: their seconds (each
        #: sequence of a batch adds each step's time) and their count (one per sequence per
        #: step), as an engine's inter-token histogram sums and counts them as tokens stream
        self._gap_seconds = 0.0
        self._gaps = 0.0

    # -- routing ------------------------------------------------------------------------------
    def load(self, i: int) -> int:
        """Requests the router has on decode instance ``i``: running, waiting, and sent there
        with their KV still to come."""
        fleet = self.fleet
        return len(fleet.running[i]) + len(fleet.decode_waiting[i]) + fleet.decode_bound[i]

    def bind(self, r: int) -> None:
        """Request ``r`` arrived and the router dispatched it: choose its decode now, among
        the ready ones (none ready: when its KV arrives). ``least-loaded`` always waits."""
        if self.router == "least-loaded" or not self.fleet.ready_decode:
            return
        i = self.choose(r)
        self._bound[r] = i
        self.fleet.decode_bound[i] += 1

    def bound(self, r: int) -> bool:
        """Whether request ``r`` was sent to a decode instance when it arrived."""
        return r in self._bound

    def choose(self, r: int) -> int:
        """The ready decode instance the router sends request ``r`` to."""
        ready, load = self.fleet.ready_decode, self.load
        if len(ready) == 1:
            if self.router == "round-robin":
                # the router's counter moves on every pick, one worker or many (smg
                # ``policies/round_robin.rs``: fetch_add, then modulo the healthy workers)
                self._count += 1
            return ready[0]
        if self._recorded is not None and 0 <= self._recorded[r] < len(ready):
            return ready[self._recorded[r]]
        if self.router == "round-robin":
            self._count += 1
            return ready[(self._count - 1) % len(ready)]
        if self.router == "random":
            return ready[self.rng.randrange(len(ready))]
        if self.router == "power-of-two":
            a, b = self.rng.sample(ready, 2)
            return a if load(a) <= load(b) else b
        if self.router == "cache-aware":
            return self._cache_aware(r)
        return min(ready, key=load)

    def _cache_aware(self, r: int) -> int:
        """sgl-router's cache_aware thresholds (:class:`.routers.CacheAwareRouter`) over the
        decode instances, then the record of where each block was last sent."""
        ready, load, owner = self.fleet.ready_decode, self.load, self._owner
        lo = min(ready, key=load)
        hi = max(load(j) for j in ready)
        blocks = self._blocks[r]
        if hi - load(lo) > 64 and hi > load(lo) * 1.5:
            chosen = lo
        else:
            first = owner.get(blocks[0]) if blocks else None
            matched = 0
            while matched < len(blocks) and owner.get(blocks[matched]) == first:
                matched += 1
            if (first is not None and first in ready
                    and matched * self.block_tokens > 0.3 * int(self._input[r])):
                chosen = first
            else:
                chosen = min(ready, key=lambda j: (self._tree_blocks.get(j, 0), load(j)))
        trees = self._tree_blocks
        for b in blocks:
            old = owner.get(b)
            if old is not None:
                trees[old] -= 1
            owner[b] = chosen
            trees[chosen] = trees.get(chosen, 0) + 1
        return chosen

    def place(self, r: int, now: float) -> None:
        """Request ``r``'s KV arrived at ``now``: join its instance's batch (the one it was
        sent to, draining or not, else the one chosen now), or wait in its queue. Needs a
        ready decode instance when it was not sent to one."""
        i = self._bound.pop(r, None)
        if i is None:
            i = self.choose(r)
        else:
            self.fleet.decode_bound[i] -= 1
        waiting = self.fleet.decode_waiting[i]
        if waiting or not self._fits(i, r, now):
            waiting.append(r)
            return
        self._join(i, r, now)
        # a one-token answer finishes as it joins, without a finish event: a draining
        # instance it was the last work of is released here
        self._release_if_drained(i, now)

    # -- the batch ----------------------------------------------------------------------------
    def _context(self, i: int) -> float:
        return self._ctx_offset.get(i, 0.0) + len(self.fleet.running[i]) * self._steps.get(i, 0.0)

    def _fits(self, i: int, r: int, now: float) -> bool:
        batch = self.fleet.running[i]
        b = len(batch)
        if b == 0:
            return True  # an empty instance takes anything (else a long request waits forever)
        if b >= self.max_batch:
            return False
        n_in, n_out = int(self._input[r]), int(self._output[r])
        if self._reserved.get(i, 0) + n_in + n_out > self.kv_capacity_tokens:
            return False
        if self.capped:
            # sized as the planner sizes a batch: by each sequence's mean context over its
            # decode (prompt + half its output), not the context now, which grows
            ctx = self._mean_context.get(i, 0.0) + n_in + n_out / 2.0
            return self.model.tpot_seconds(b + 1, ctx / (b + 1)) <= self.slo_tpot
        return True

    def _advance(self, i: int, now: float) -> None:
        """Count the steps instance ``i`` ran up to ``now`` (its batch unchanged since)."""
        at = self._at.get(i, now)
        self._at[i] = now
        b = len(self.fleet.running[i])
        if b == 0 or now <= at:
            return
        a, g = self._step_time(i)
        dt = now - at
        # steps k in dt: a·k + g·k(k-1)/2 = dt
        lin = a - g / 2.0
        k = dt / a if g <= 0 else (-lin + math.sqrt(lin * lin + 2.0 * g * dt)) / g
        self._steps[i] = self._steps.get(i, 0.0) + k
        self._gap_seconds += b * dt
        self._gaps += b * k

    def take_gaps(self, now: float) -> tuple[float, float]:
        """The inter-token gaps streamed since the last call, every batch counted up to
        ``now``: (their seconds, their count); resets them. Over an interval these are the
        inter-token histogram's sum and count: their ratio the mean gap of the tokens streamed
        in it, the sum over the interval the requests decoding (Little's law). A finished
        request's TPOT is its gaps' mean over its whole decode, which lags a batch that
        grows: on the demo's chat ramp the replay read its decode fast where the live
        histogram read it slow."""
        for i in self._at:
            if self.fleet.running[i]:
                self._advance(i, now)
        out = (self._gap_seconds, self._gaps)
        self._gap_seconds = self._gaps = 0.0
        return out

    def _step_time(self, i: int) -> tuple[float, float]:
        """(the next step's seconds, its growth per step) of instance ``i``'s batch now: the
        context grows by the batch size each step and the model is linear in it."""
        b = len(self.fleet.running[i])
        ctx = self._context(i)
        a = self.model.tpot_seconds(b, ctx / b)
        return a, self.model.tpot_seconds(b, (ctx + b) / b) - a

    def _join(self, i: int, r: int, now: float) -> None:
        self._advance(i, now)
        n_in, n_out = int(self._input[r]), int(self._output[r])
        self.on_start(r, now)
        if n_out <= 1:  # its only token came from prefill
            self.on_finish(r, now, now)
            return
        self._started[r] = now
        s = self._steps.get(i, 0.0)
        heapq.heappush(self.fleet.running[i], (s + n_out - 1, r, n_in + 1 - s))
        self._ctx_offset[i] = self._ctx_offset.get(i, 0.0) + n_in + 1 - s
        self._reserved[i] = self._reserved.get(i, 0) + n_in + n_out
        self._mean_context[i] = self._mean_context.get(i, 0.0) + n_in + n_out / 2.0
        self._schedule(i, now)

    def _schedule(self, i: int, now: float) -> None:
        """Put instance ``i``'s next finish on the event heap (its earlier one goes stale)."""
        batch = self.fleet.running[i]
        if not batch:
            self._event.pop(i, None)
            return
        n = max(batch[0][0] - self._steps.get(i, 0.0), 0.0)
        a, g = self._step_time(i)
        # the inverse of _advance's count: n steps take a·n + g·n(n-1)/2
        self._event[i] = self.events.push(now + a * n + g * n * (n - 1.0) / 2.0, Events.DECODE, i)

    def finish_due(self, i: int, now: float, seq: int) -> None:
        """A finish event of instance ``i`` at ``now`` (ignored when stale): the sequences done
        leave the batch, then what waits joins while it fits."""
        if self._event.get(i) != seq:
            return
        self._advance(i, now)
        batch, s = self.fleet.running[i], self._steps[i]
        while batch and batch[0][0] <= s + _STEP_EPS:
            _, r, offset = heapq.heappop(batch)
            self._ctx_offset[i] -= offset
            n_in, n_out = int(self._input[r]), int(self._output[r])
            self._reserved[i] -= n_in + n_out
            self._mean_context[i] -= n_in + n_out / 2.0
            self.on_finish(r, self._started.pop(r), now)
        if not batch:  # an empty batch restarts its sums (no float drift over a long run)
            self._steps[i] = self._ctx_offset[i] = self._mean_context[i] = 0.0
        self._admit_waiting(i, now)
        self._schedule(i, now)
        self._release_if_drained(i, now)

    def _release_if_drained(self, i: int, now: float) -> None:
        """Release draining instance ``i`` once it holds no work (called where its work can
        end: a finish event, and a placement that finished at once)."""
        fleet = self.fleet
        if fleet.state[i] == DRAINING and not fleet.decode_holds_work(i):
            self.events.push(now, Events.RELEASE, i)

    def _admit_waiting(self, i: int, now: float) -> None:
        waiting = self.fleet.decode_waiting[i]
        while waiting:
            r = waiting[0]
            if self.shed and now - float(self._arrival[r]) > self.slo_ttft:
                waiting.popleft()
                self.on_shed(r, now)
                continue
            if not self._fits(i, r, now):
                return
            waiting.popleft()
            self._join(i, r, now)

    def batch_now(self, i: int, now: float) -> tuple[int, int, float]:
        """Instance ``i``'s batch at ``now``: (sequences, their KV tokens, the step's seconds;
        0 when empty), what an engine's per-pass metrics report of its latest step."""
        b = len(self.fleet.running[i])
        if b == 0:
            return 0, 0, 0.0
        self._advance(i, now)
        return b, round(self._context(i)), self._step_time(i)[0]

    def waiting(self) -> int:
        """Requests waiting in the decode instances' queues."""
        return sum(len(w) for w in self.fleet.decode_waiting)


