"""Discrete-event simulator of a PD fleet, used for replay and for the routing seed.

Requests arrive from a :class:`~.traces.Trace`. The router picks a ready prefill instance
(``random``, ``least-queue``, ``cache-aware``, ``predicted-ttft``; optional early rejection)
which computes the uncached part of the prompt FIFO (prefix cache per instance, LRU over the
trace's block ids); the KV cache moves to the least-loaded ready decode instance, which runs
the request in a continuous batch at the profile's TPOT for the batch it joins. A controller
is called every interval with an :class:`~.observe.Observation` and returns target counts;
instances then warm up, drain and switch roles as the profile says, and every second they hold
a node is accounted.

Modelling choices (and why):

- A prefill instance is a FIFO server whose work is known at admission (``busy_until``), as
  in the article: prefill batches trade latency for throughput, and the throughput is what the
  profile measures. This makes the prefill side O(1) per request.
- The prefix cache is updated when a request is admitted, not when it finishes: the queue is
  FIFO, so by the time a later request runs the earlier one has filled the cache.
- A request's TPOT is the model's TPOT at the batch it joins (including itself). The batch
  seen at admission samples the time-average batch, which is what sizing uses; a request whose
  batch grows later is slightly flattered.
- A decode instance full (batch cap or KV capacity) makes the request wait for the next
  finishing sequence; the wait is part of its TTFT.
- Without admission (``decode_admission="off"``) a decode instance takes every request, so
  one short by a fraction slows every running sequence past the TPOT target (a cliff). With
  ``"queue"`` it caps its batch where the TPOT meets the target (what SGLang's
  ``--max-running-requests`` does, sized to the SLO): a request waits for enough running
  sequences to finish. ``"shed"`` also drops it, like an early rejection, when that wait would
  already break the TTFT target; a short decode fleet then loses only its excess, as a short
  prefill fleet does under early rejection. No engine or router sheds so today.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..model import PEAK_WINDOW_SECONDS, PerformanceModel, Slo
from ..observe import Observation, Reading, RoleState, Warming
from .traces import Trace

ROUTERS = ("random", "least-queue", "cache-aware", "predicted-ttft")
DECODE_ADMISSIONS = ("off", "queue", "shed")

WARMING, READY, DRAINING, STOPPED = 0, 1, 2, 3

#: controller(observation) -> (prefill target, decode target), counts of ready + warming;
#: a controller may add (switch_to_prefill, switch_to_decode): how many of the changes must be
#: made by switching existing nodes (the planner's decision), else the simulator decides
Controller = Callable[[Observation], tuple[int, ...]]


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulation run (times in seconds)."""

    router: str = "predicted-ttft"
    early_rejection: bool = False
    slo: Slo = field(default_factory=Slo)
    interval_seconds: float = 60.0
    initial_prefill: int = 1
    initial_decode: int = 1
    #: node budget: provisioned instances (any state) never exceed it
    nodes: int = 10**6
    #: "off": every request joins the decode batch; "queue": decode caps its batch at the TPOT
    #: target and the rest wait; "shed": and drops what would wait past the TTFT target
    decode_admission: str = "off"
    #: skip decode and KV transfer: TTFT = prefill queue + compute (the article's routing sim)
    prefill_only: bool = False
    #: initial instances start ready (True) or cold (False)
    start_ready: bool = True
    #: prefix cache capacity per prefill instance in blocks; None = from the profile
    cache_blocks: int | None = None
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


class _Fleet:
    """Instances of both roles; parallel lists indexed by instance id (hot-path friendly)."""

    def __init__(self) -> None:
        self.role: list[str] = []
        self.state: list[int] = []
        self.ready_at: list[float] = []
        self.since: list[float] = []  # start of the current accounting state
        self.switch_to: list[str | None] = []
        self.acc = {"warming": 0.0, "ready": 0.0, "draining": 0.0}

    def account(self, i: int, now: float) -> None:
        s = self.state[i]
        if s == STOPPED:
            return
        key = ("warming", "ready", "draining")[s]
        self.acc[key] += max(0.0, now - self.since[i])
        self.since[i] = now


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
    if config.router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {config.router!r}")
    if config.decode_admission not in DECODE_ADMISSIONS:
        raise ValueError(f"decode_admission must be one of {DECODE_ADMISSIONS}, "
                         f"got {config.decode_admission!r}")
    capped = config.decode_admission != "off"
    shed = config.decode_admission == "shed"
    prof = model.profile
    n_req = len(trace)
    arr = trace.arrival_seconds
    ins = trace.input_tokens
    outs = trace.output_tokens
    hids = trace.hash_ids
    block = trace.block_tokens
    cap_blocks = config.cache_blocks or max(1, prof.prefill.prefix_cache_tokens // block)
    slo_ttft = config.slo.ttft_seconds
    slo_tpot = config.slo.tpot_seconds
    rng = random.Random(config.seed)
    switch_seconds = prof.warmup.role_switch_seconds
    new_seconds = prof.warmup.new_node_seconds

    ttft = np.full(n_req, np.nan)
    tpot = np.full(n_req, np.nan)
    rejected = np.zeros(n_req, dtype=bool)
    hit_total = 0
    prompt_total = 0

    fleet = _Fleet()
    # prefill-side state, indexed by instance id (decode ids leave holes)
    busy: list[float] = []
    caches: list[OrderedDict[int, None]] = []
    index: dict[int, int] = {}  # block id -> bitmask of prefill instances caching it
    ready_p: list[int] = []
    ready_mask = 0
    # decode-side state
    running: list[list[tuple[float, float]]] = []  # heap of (finish, context) per instance
    ctx_sum: list[float] = []
    ready_d: list[int] = []
    pending_decode: list[int] = []  # requests waiting for any ready decode instance
    events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, payload)
    seq = 0
    EV_READY, EV_ADMIT, EV_RELEASE = 0, 1, 2
    role_changes = 0

    # interval statistics for observations
    st = {"n": 0, "in": 0, "out": 0, "hit": 0}
    st_sub: dict[int, int] = {}  # arrivals per PEAK_WINDOW_SECONDS bucket of this interval
    st_ttft: list[float] = []
    st_tpot: list[float] = []
    ticks: list[tuple[float, int, int, int, int]] = []

    def new_instance(role: str, now: float, warm_seconds: float) -> int:
        nonlocal seq
        i = len(fleet.role)
        fleet.role.append(role)
        fleet.state.append(WARMING if warm_seconds > 0 else READY)
        fleet.ready_at.append(now + warm_seconds)
        fleet.since.append(now)
        fleet.switch_to.append(None)
        busy.append(now + warm_seconds)
        caches.append(OrderedDict())
        running.append([])
        ctx_sum.append(0.0)
        if warm_seconds > 0:
            seq += 1
            heapq.heappush(events, (now + warm_seconds, EV_READY, seq, i))
        else:
            make_ready(i, now)
        return i

    def make_ready(i: int, now: float) -> None:
        nonlocal ready_mask
        fleet.account(i, now)
        fleet.state[i] = READY
        if fleet.role[i] == "prefill":
            busy[i] = max(busy[i], now)
            ready_p.append(i)
            ready_p.sort()
            ready_mask |= 1 << i
        else:
            ready_d.append(i)
            ready_d.sort()
            while pending_decode:
                admit_decode(pending_decode.pop(0), now)

    def drop_cache(i: int) -> None:
        bit = 1 << i
        for b in caches[i]:
            m = index.get(b, 0) & ~bit
            if m:
                index[b] = m
            else:
                index.pop(b, None)
        caches[i].clear()

    def start_drain(i: int, now: float, switch: str | None) -> None:
        """Stop routing to instance i; release (or switch) it when its work is done."""
        nonlocal ready_mask, seq
        fleet.account(i, now)
        if fleet.state[i] == WARMING:
            # cancelling a warm-up frees the node at once; the READY event is ignored later
            fleet.state[i] = STOPPED
            if switch is not None:
                new_instance(switch, now, switch_seconds)
            return
        fleet.state[i] = DRAINING
        fleet.switch_to[i] = switch
        if fleet.role[i] == "prefill":
            ready_p.remove(i)
            ready_mask &= ~(1 << i)
            done = max(busy[i], now)
            drop_cache(i)
        else:
            ready_d.remove(i)
            done = max((f for f, _ in running[i]), default=now)
            done = max(done, now)
        seq += 1
        heapq.heappush(events, (done, EV_RELEASE, seq, i))

    def release(i: int, now: float) -> None:
        fleet.account(i, now)
        fleet.state[i] = STOPPED
        to = fleet.switch_to[i]
        if to is not None:
            new_instance(to, now, switch_seconds)

    def committed(role: str) -> list[int]:
        return [
            i for i, r in enumerate(fleet.role)
            if r == role and fleet.state[i] in (WARMING, READY)
        ]

    def provisioned() -> int:
        return sum(1 for s in fleet.state if s != STOPPED)

    def reconcile(target_p: int, target_d: int, now: float, switches: tuple[int, int] | None) -> None:
        nonlocal role_changes
        cp, cd = committed("prefill"), committed("decode")
        # in-flight role switches will land as committed instances of their new role
        sw_p = sum(1 for i, s in enumerate(fleet.state) if s == DRAINING and fleet.switch_to[i] == "prefill")
        sw_d = sum(1 for i, s in enumerate(fleet.state) if s == DRAINING and fleet.switch_to[i] == "decode")
        dp = target_p - (len(cp) + sw_p)
        dd = target_d - (len(cd) + sw_d)

        def victims(ids: list[int], k: int) -> list[int]:
            # cancel warm-ups first (nothing served yet), then the least-loaded ready ones
            def key(i: int) -> tuple[int, float]:
                if fleet.state[i] == WARMING:
                    return (0, -fleet.ready_at[i])
                load = busy[i] if fleet.role[i] == "prefill" else float(len(running[i]))
                return (1, load)
            return sorted(ids, key=key)[:k]

        # a role switch reuses a node (weights resident) and saves the budget a new node needs;
        # when the controller says how many switches it wants, exactly those are made
        if switches is not None:
            for k, src, dst in ((switches[0], cd, "prefill"), (switches[1], cp, "decode")):
                k = min(k, len(src))
                for i in victims(src, k):
                    start_drain(i, now, dst)
                    role_changes += 1
                if dst == "prefill":
                    dp -= k
                    dd += k
                else:
                    dd -= k
                    dp += k
        elif dp > 0 and dd < 0:
            k = min(dp, -dd)
            for i in victims(cd, k):
                start_drain(i, now, "prefill")
                role_changes += 1
            dp -= k
            dd += k
        elif dd > 0 and dp < 0:
            k = min(dd, -dp)
            for i in victims(cp, k):
                start_drain(i, now, "decode")
                role_changes += 1
            dd -= k
            dp += k
        if dp < 0:
            for i in victims(committed("prefill"), -dp):
                start_drain(i, now, None)
        if dd < 0:
            for i in victims(committed("decode"), -dd):
                start_drain(i, now, None)
        room = config.nodes - provisioned()
        for _ in range(max(0, min(dp, room))):
            new_instance("prefill", now, new_seconds)
            room -= 1
        for _ in range(max(0, min(dd, room))):
            new_instance("decode", now, new_seconds)

    def admit_decode(r: int, now: float) -> None:
        if not ready_d:
            pending_decode.append(r)
            return
        # least loaded by running sequences; lazy pops keep the heaps current
        best = -1
        best_n = 1 << 60
        for i in ready_d:
            h = running[i]
            while h and h[0][0] <= now:
                _, c = heapq.heappop(h)
                ctx_sum[i] -= c
            if len(h) < best_n:
                best, best_n = i, len(h)
        i = best
        h = running[i]
        ctx = ins[r] + outs[r] / 2.0
        start = now
        cap = min(prof.decode.max_batch, int(prof.decode.kv_capacity_tokens // max(ctx, 1.0)))
        while len(h) >= max(cap, 1):
            f, c = heapq.heappop(h)
            ctx_sum[i] -= c
            start = max(start, f)
        b, ctx_total = len(h) + 1, ctx_sum[i] + ctx
        if capped and model.tpot_seconds(b, ctx_total / b) > slo_tpot:
            # start once enough of the running sequences (soonest first) have finished for
            # the batch, this one included, to meet the TPOT target; the others keep running
            # (they stay in the heap, so later arrivals see them)
            for f, c in sorted(h):
                b, ctx_total, start = b - 1, ctx_total - c, max(start, f)
                if model.tpot_seconds(b, ctx_total / b) <= slo_tpot:
                    break
            if shed and start - arr[r] > slo_ttft:
                rejected[r] = True
                return
        ctx_sum[i] += ctx
        t_tok = model.tpot_seconds(b, ctx_total / b)
        heapq.heappush(h, (start + outs[r] * t_tok, ctx))
        tpot[r] = t_tok
        first = start - arr[r]
        ttft[r] = first
        st_ttft.append(first)
        st_tpot.append(t_tok)

    last_obs = [math.nan]

    def observe(now: float) -> Observation:
        span = config.interval_seconds
        n = st["n"]
        # before a whole interval has been watched, the load is unknown, not zero
        measured = not math.isnan(last_obs[0])
        last_obs[0] = now

        def rd(v: float | None) -> Reading | None:
            return None if v is None else Reading(v, now)

        def rl(v: float | None) -> Reading | None:
            return rd(v) if measured else None

        def q(xs: list[float], p: float) -> Reading | None:
            return rd(float(np.quantile(xs, p))) if xs else None

        def role_state(role: str) -> RoleState:
            ids = [i for i, r in enumerate(fleet.role) if r == role]
            ready = [i for i in ids if fleet.state[i] == READY]
            warming = tuple(
                Warming(fleet.ready_at[i], False) for i in ids if fleet.state[i] == WARMING
            )
            draining = sum(1 for i in ids if fleet.state[i] == DRAINING)
            recently = sum(1 for i in ready if now - fleet.ready_at[i] < span)
            if role == "prefill":
                queue = sum(max(0.0, busy[i] - now) for i in ready)
                return RoleState(len(ready), warming, draining, recently, rd(queue), None)
            run = sum(len(running[i]) for i in ready)
            return RoleState(len(ready), warming, draining, recently, rd(float(len(pending_decode))), rd(float(run)))

        obs = Observation(
            now_seconds=now,
            rate_rps=rl(n / span),
            peak_rate_rps=rl(max(st_sub.values(), default=0) / PEAK_WINDOW_SECONDS),
            mean_input_tokens=rl(st["in"] / n) if n else None,
            mean_output_tokens=rl(st["out"] / n) if n else None,
            prefix_hit_rate=rl(st["hit"] / st["in"]) if st["in"] else None,
            ttft_p50_seconds=q(st_ttft, 0.5),
            ttft_p99_seconds=q(st_ttft, 0.99),
            tpot_p50_seconds=q(st_tpot, 0.5),
            tpot_p99_seconds=q(st_tpot, 0.99),
            prefill=role_state("prefill"),
            decode=role_state("decode"),
        )
        st.update(n=0, **{"in": 0, "out": 0, "hit": 0})
        st_ttft.clear()
        st_tpot.clear()
        st_sub.clear()
        return obs

    t0 = arr[0] if n_req else 0.0
    for _ in range(config.initial_prefill):
        new_instance("prefill", t0, 0.0 if config.start_ready else new_seconds)
    if not config.prefill_only:
        for _ in range(config.initial_decode):
            new_instance("decode", t0, 0.0 if config.start_ready else new_seconds)

    next_tick = t0 if controller is not None else math.inf
    last_arrival = arr[-1] if n_req else t0
    report_every = max(1, n_req // 100)
    router = config.router
    reject = config.early_rejection
    prefill_only = config.prefill_only
    prefill_seconds = model.prefill_seconds
    kv_seconds = model.kv_transfer_seconds

    def drain_events(until: float) -> None:
        while events and events[0][0] <= until:
            t, kind, _, x = heapq.heappop(events)
            if kind == EV_ADMIT:
                admit_decode(x, t)
            elif kind == EV_READY:
                if fleet.state[x] == WARMING:
                    make_ready(x, t)
            else:
                release(x, t)

    for r in range(n_req):
        t = arr[r]
        while next_tick <= t:
            drain_events(next_tick)
            assert controller is not None
            obs = observe(next_tick)
            out = controller(obs)
            tp, td = out[0], out[1]
            reconcile(tp, td, next_tick, (out[2], out[3]) if len(out) >= 4 else None)
            ticks.append((
                next_tick, tp, td,
                sum(1 for i, s in enumerate(fleet.state) if s != STOPPED and fleet.role[i] == "prefill"),
                sum(1 for i, s in enumerate(fleet.state) if s != STOPPED and fleet.role[i] == "decode"),
            ))
            next_tick = next_tick + config.interval_seconds if next_tick < last_arrival else math.inf
        drain_events(t)
        if progress is not None and r % report_every == 0:
            progress(r / n_req)

        n_in = ins[r]
        ids = hids[r]
        st["n"] += 1
        sb = int(t // PEAK_WINDOW_SECONDS)
        st_sub[sb] = st_sub.get(sb, 0) + 1
        st["in"] += n_in
        st["out"] += outs[r]
        if not ready_p:
            rejected[r] = True  # no prefill instance at all: nothing can serve it
            continue

        # prefix hits per ready instance by walking the block index (bitmask intersection)
        hits: dict[int, int] = {}
        cand = ready_mask
        k = 0
        for b in ids:
            m = index.get(b, 0) & cand
            if m != cand:
                if k:
                    dropped = cand & ~m
                    while dropped:
                        low = dropped & -dropped
                        hits[low.bit_length() - 1] = k
                        dropped ^= low
                cand = m
                if not cand:
                    break
            k += 1
        while cand:
            low = cand & -cand
            hits[low.bit_length() - 1] = k
            cand ^= low

        if router == "random":
            i = ready_p[rng.randrange(len(ready_p))]
        elif router == "least-queue":
            i = min(ready_p, key=busy.__getitem__)
        elif router == "cache-aware":
            if hits:
                i = max(ready_p, key=lambda j: (hits.get(j, 0), -busy[j]))
            else:
                i = min(ready_p, key=busy.__getitem__)
        else:
            # predicted TTFT = queueing + uncached compute; among instances without a hit the
            # least busy is the only candidate worth pricing
            i = ready_p[0]
            wait_i = max(busy[i] - t, 0.0)
            for j in ready_p:
                w = busy[j] - t
                if w < 0.0:
                    w = 0.0
                if w < wait_i:
                    i, wait_i = j, w
            best = wait_i + prefill_seconds(n_in, min(hits.get(i, 0) * block, n_in))
            for j, hb in hits.items():
                if j == i:
                    continue
                c = max(busy[j] - t, 0.0) + prefill_seconds(n_in, min(hb * block, n_in))
                if c < best or (c == best and j < i):
                    best, i = c, j
        hit_tok = min(hits.get(i, 0) * block, n_in)
        service = prefill_seconds(n_in, hit_tok)
        done = max(busy[i], t) + service
        if reject:
            predicted = done - t if prefill_only else done - t + kv_seconds(n_in)
            if predicted > slo_ttft:
                rejected[r] = True
                continue
        busy[i] = done
        prompt_total += n_in
        hit_total += hit_tok
        st["hit"] += hit_tok

        # LRU update: touch the prompt's blocks in order, evict the coldest beyond capacity
        cache = caches[i]
        bit = 1 << i
        for b in ids:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
                index[b] = index.get(b, 0) | bit
        while len(cache) > cap_blocks:
            b, _ = cache.popitem(last=False)
            m = index[b] & ~bit
            if m:
                index[b] = m
            else:
                del index[b]

        if prefill_only:
            ttft[r] = done - t
            st_ttft.append(done - t)
        else:
            seq += 1
            heapq.heappush(events, (done + kv_seconds(n_in), EV_ADMIT, seq, r))

    drain_events(math.inf)
    end = last_arrival
    for i in range(len(fleet.role)):
        if fleet.role[i] == "prefill":
            end = max(end, busy[i] if fleet.state[i] != STOPPED else end)
        for f, _ in running[i]:
            end = max(end, f)
    for i in range(len(fleet.role)):
        fleet.account(i, end)
    if progress is not None:
        progress(1.0)
    return SimResult(
        arrival_seconds=np.asarray(arr, dtype=float),
        ttft_seconds=ttft,
        tpot_seconds=tpot,
        rejected=rejected,
        hit_tokens=hit_total,
        prompt_tokens=prompt_total,
        instance_seconds=dict(fleet.acc),
        role_changes=role_changes,
        ticks=ticks,
        end_seconds=end,
    )
