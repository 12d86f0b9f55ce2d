"""Replay a trace through the simulator under a policy, with one cost accounting for all.

This is what ``pdscale replay`` runs; it is pure apart from the simulation's CPU time."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..config import HPA_SCALE_DOWN_WINDOW_SECONDS, PlannerConfig
from ..model import PEAK_WINDOW_SECONDS, Load, PerformanceModel, Slo
from ..needs import prefill_share
from ..observe import Observation, RoleState
from ..seasonal import SeasonalMemory
from ..solve import History, lead_margin, step
from .policies import (
    POLICIES,
    PdscaleController,
    ReactiveController,
    SlaInterpController,
    parse_static,
    static_controller,
)
from .router_admission import PrefillAdmission
from .simulate import SCRAPE_SECONDS, Controller, SimConfig, SimResult, simulate
from .traces import Trace, split_at


@dataclass(frozen=True)
class ReplaySetup:
    """Everything that is the same for every policy compared on one trace.

    ``planner`` is the planner's whole configuration, as the operator runs it: the command
    line and the benchmarks derive it from a PDCluster spec with the operator's own mapping
    (``operator/loop/planning.py: planner_config``); the model, the SLO with its percentile, the
    node budget and the interval are read from it, never set twice. The other fields are the
    simulation's alone (the fleet's router and admission, what static:best aims at).

    ``fleet_model`` is the simulated fleet's true performance, which may differ from the
    profile the planner believes (``planner.model``): a real profile is always off by
    something. The simulator runs the fleet's; the pdscale planner, reactive and sla-interp
    plan from their belief; the oracle and static:best are hindsight bounds and size from the
    fleet's truth. None: the fleet is exactly what the planner believes."""

    trace: Trace
    planner: PlannerConfig
    #: the prefill routing of a PDCluster's default router: sglang-router 0.3.2 renders
    #: router.prefillPolicy CacheAware but picks PD prefills at random (STACKS)
    router: str = "random"
    #: the decode routing a PDCluster renders by default (router.decodePolicy RoundRobin)
    decode_router: str = "round-robin"
    #: False: what sglang-router, smg and vllm-router do by default (shed nothing); True: the
    #: ideal admission router's early rejection at the predicted TTFT (a what-if)
    early_rejection: bool = False
    #: how prefill batches (simulate.SimConfig.engine): the engines' passes, or "article"
    engine: str = "sglang"
    #: tokens per prefill pass; None = the engine's default
    prefill_chunk_tokens: int | None = None
    #: "off", "queue" (decode caps its batch at the TPOT target) or "shed" (and drops what
    #: would wait past the TTFT target): simulate.SimConfig.decode_admission; a property of the
    #: fleet, the same for every policy
    decode_admission: str = "off"
    #: the router's prefill admission (smg's, from a PDCluster's ``router.admission``), the
    #: same for every policy; None: the router admits everything
    prefill_admission: PrefillAdmission | None = None
    #: static:best is the smallest fixed fleet reaching this attainment; None: the SLO's
    #: percentile (a fleet meeting both targets for that share of requests)
    target_attainment: float | None = None
    #: the fleet's own performance (None: the planner's model, ``planner.model``)
    fleet_model: PerformanceModel | None = None
    #: trace time the scored window opens at; before it every policy runs unscored on the
    #: fleet (:func:`start_from` "running"). None: the whole trace is scored
    scored_from_seconds: float | None = None
    #: the planner's ticks fall at this phase modulo the interval (SimConfig); None: from the
    #: first arrival. A live run's recording replays on the live loop's schedule
    tick_phase_seconds: float | None = None
    #: the fleet ran idle before the trace began (SimConfig.idle_before): a live run's
    #: recording, whose planner measured zero load until the first request
    idle_before: bool = False
    #: seconds a new instance takes to serve beyond its warm-up (SimConfig.join_delay_seconds):
    #: the stack's own latency, which a live run's recording measures
    join_delay_seconds: float = 0.0
    #: seconds between two Prometheus scrapes (SimConfig.scrape_seconds): the planner reads
    #: counters and gauges as of the last scrape before its tick
    scrape_seconds: float = SCRAPE_SECONDS
    #: how long before each tick the last scrape falls (SimConfig.scrape_lag_seconds)
    scrape_lag_seconds: float = 0.0
    #: the random routers' draws (SimConfig.seed): a live router's are another draw, so a
    #: recording's replay is judged against several
    router_seed: int = 1

    def knowing_the_fleet(self) -> ReplaySetup:
        """This setup with the planner believing the fleet's true performance (hindsight)."""
        return replace(self, planner=replace(self.planner, model=self.fleet), fleet_model=None)

    @property
    def model(self) -> PerformanceModel:
        """What the planner believes (its profile)."""
        return self.planner.model

    @property
    def fleet(self) -> PerformanceModel:
        """What the simulated fleet really does."""
        return self.planner.model if self.fleet_model is None else self.fleet_model

    @property
    def slo(self) -> Slo:
        return self.planner.slo

    @property
    def nodes(self) -> int:
        return self.planner.nodes

    @property
    def interval_seconds(self) -> float:
        return self.planner.interval_seconds

    @property
    def attainment_target(self) -> float:
        """What static:best must reach (``target_attainment``, or the SLO's percentile)."""
        return self.slo.percentile if self.target_attainment is None else self.target_attainment


#: the fleets a replay can stand for, by name: the stack users deploy (SGLang's batched
#: prefill and continuous decode behind the PDCluster's default router, sglang-router 0.3.2,
#: which sheds nothing and in PD mode picks the prefill at random even with its default
#: cache_aware policy: its PD prefill policy never gets a tree, tests/loop/
#: test_router_prefill_tree.py; decode round robin), the same engines behind an ideal admission
#: router (predicted-TTFT routing, early rejection at the TTFT target, decode to the least
#: loaded: a what-if, no router does it), and the global-scheduling article's model (one
#: prefill at a time, exact predictions, early rejection: the seed reproduction's). A
#: PDCluster's own gateway and policies replace the deployed stack's routers
#: (``pdscale.replay_setup.routing``: smg 1.13 keeps prefixes on a prefill, ``smg-cache-aware``).
STACKS: dict[str, dict[str, Any]] = {
    # what a PDCluster renders by default: smg (cache-aware PD prefill choice by its own rule)
    # with derived prefill admission (pdscale/replay.py router_admission); the old default,
    # sglang-router 0.3.2's random choice with no admission, is router.gateway SGLangRouter
    "deployed": {"engine": "sglang", "router": "smg-cache-aware", "decode_router": "round-robin",
                 "early_rejection": False},
    "ideal-router": {"engine": "sglang", "router": "predicted-ttft", "decode_router": "least-loaded",
                     "early_rejection": True},
    "article": {"engine": "article", "router": "predicted-ttft", "decode_router": "least-loaded",
                "early_rejection": True},
}


def interval_loads(trace: Trace, interval_seconds: float, hit_rate: float = 0.0) -> list[Load]:
    """True per-interval load of a trace (what the oracle knows), intervals from t = first."""
    if not len(trace):
        return []
    t0 = trace.arrival_seconds[0]
    idx = ((np.asarray(trace.arrival_seconds) - t0) // interval_seconds).astype(int)
    n = int(idx[-1]) + 1
    cnt = np.bincount(idx, minlength=n).astype(float)
    isl = np.bincount(idx, weights=np.asarray(trace.input_tokens, float), minlength=n)
    isl_square = np.bincount(idx, weights=np.asarray(trace.input_tokens, float) ** 2, minlength=n)
    osl = np.bincount(idx, weights=np.asarray(trace.output_tokens, float), minlength=n)
    # the highest PEAK_WINDOW_SECONDS arrival rate inside each interval, as the planner sees it
    a = np.asarray(trace.arrival_seconds)
    sub = np.bincount((a // PEAK_WINDOW_SECONDS).astype(int))
    sub_start = np.arange(len(sub)) * PEAK_WINDOW_SECONDS
    sub_iv = ((sub_start - t0) // interval_seconds).astype(int).clip(0, n - 1)
    peak = np.zeros(n)
    np.maximum.at(peak, sub_iv, sub / PEAK_WINDOW_SECONDS)
    out = []
    for k in range(n):
        c = cnt[k]
        out.append(Load(
            c / interval_seconds, isl[k] / c if c else 0.0, osl[k] / c if c else 0.0, hit_rate,
            peak_rate_rps=float(max(peak[k], c / interval_seconds)),
            # the prompts' true spread, as their true mean (no histogram buckets: hindsight)
            input_tokens_square_ratio=float(isl_square[k] * c / isl[k] ** 2) if isl[k] > 0 else 1.0,
        ))
    return out


def planner_config(setup: ReplaySetup) -> PlannerConfig:
    """The pdscale planner's configuration for this replay: ``setup.planner`` as given, but
    for one what-if of the simulated fleet. With ``decode_admission="shed"`` the planner drops
    its decode hedge (decode covers the same rise quantile as prefill): a decode fleet that
    sheds what would wait past the TTFT target loses only its excess, as prefill does, so the
    hedge against the TPOT cliff buys nothing (README, decode admission). A queue is no such
    insurance: what waits piles up, and the hedge stays."""
    if setup.decode_admission == "shed":
        return replace(setup.planner, decode_rise_quantile=None)
    return setup.planner


def initial_fleet(setup: ReplaySetup, history: Sequence[Load] | None = None,
                  earlier_rates: Sequence[float | None] = ()) -> tuple[int, int]:
    """Where dynamic policies start, ready: sized for the highest load of ``history`` (the
    intervals before the scored window, :func:`with_history`), or, without one, for the
    trace's own first warm-up window (hindsight: the scored window's first minutes); with
    the margin learned from ``earlier_rates`` and the history's rates
    (:func:`run_policy`).

    A planner that had been running before the replay starts would have the fleet for the
    load it could see coming; starting from the first minute's need instead would charge
    every dynamic policy a cold start that a static fleet (sized in hindsight) never pays.
    The sizing counts no cache hits (the caches are cold) and is the same for all dynamic
    policies."""
    w = max(1, math.ceil(setup.model.profile.warmup.new_node_seconds / setup.interval_seconds))
    loads = list(history) if history is not None else interval_loads(setup.trace, setup.interval_seconds)[:w]
    cfg = planner_config(setup)
    if not loads:
        return cfg.min_prefill, cfg.min_decode
    p, d = cfg.min_prefill, cfg.min_decode
    busy_p = busy_d = 0.0
    # a planner running before would hold each role for the risk it prices over the next
    # warm-up: from the history's rises, or the prior while it has seen too few warm-ups
    rates: list[float | None] = [*earlier_rates, *(ld.rate_rps for ld in loads)]
    pm, dm = (lead_margin(cfg, rates, q) if q > 0 else 1.0 for q in cfg.rise_quantiles)
    for ld in loads:
        np_, nd = setup.model.instances_needed_at(
            ld, setup.slo, (pm, dm),
            prefill_utilization=cfg.prefill_utilization, decode_utilization=cfg.decode_utilization,
            ttft_queueing=True, service_cv=cfg.prefill_service_cv,
            pooled_prefill=cfg.prefill_queue == "pooled",
        )
        fp, fd = setup.model.fluid_demand(ld, setup.slo)
        p, d, busy_p, busy_d = max(p, np_), max(d, nd), max(busy_p, fp), max(busy_d, fd)
    kp, kd = cfg.nodes_per_instance  # the budget counts an instance's nodes
    if p * kp + d * kd > setup.nodes:  # split as the planner splits an over-budget need
        share = prefill_share(float(setup.nodes), np.array([[p * kp], [d * kd]], dtype=float),
                              np.array([[busy_p * kp], [busy_d * kd]]))
        p = max(cfg.min_prefill, math.floor(float(share[0]) + 1e-9) // kp)
        d = max(cfg.min_decode, (setup.nodes - p * kp) // kd)
    return p, d


#: the policies that run our solver on the true load (PdscaleController.known_intervals: how
#: much of it they know from each tick; None: all of it)
KNOWING: dict[str, int | None] = {"oracle": None, "oracle:now": 1, "oracle:next": 2}


def planner_controller(setup: ReplaySetup, policy: str,
                       history: Sequence[Load] | None,
                       start: tuple[int, int] | None = None,
                       season: SeasonalMemory | None = None,
                       earlier_rates: Sequence[float | None] = ()) -> PdscaleController:
    """Our planner as ``policy`` runs it: ``pdscale`` forecasts from what it observes; the
    oracles (:data:`KNOWING`) are told the true load and the fleet's true performance.

    ``start``: the fleet a new PDCluster starts from (its spec's replicas). The operator's
    first tick comes before any engine was scraped, and holds the counts there are (``solve``:
    unknown is not zero); the scale-down window keeps that hold. A replay that began with
    its idle history alone released the spec's second decode on a first tick that saw the
    demo's load 1 s old (0.1 req/s), where the live loop had kept it: at that tick phase its
    replay met 58% where the others met 73-78% (the demo's recording at cfcd1a7)."""
    cfg = planner_config(setup)
    future = None
    if policy != "pdscale":
        future = interval_loads(setup.trace, setup.interval_seconds)
        # The oracle hedges nothing: the warm-up part of the derived scale-down window
        # guards against a future the forecast cannot see, so it keeps HPA's 300 s only
        # (oracle:now and :next cannot see it either, and keep the window pdscale has).
        if cfg.stabilization_window_seconds is None and policy == "oracle":
            cfg = replace(cfg, stabilization_window_seconds=HPA_SCALE_DOWN_WINDOW_SECONDS)
        # and it knows the fleet's true performance, as it knows the future
        cfg = replace(cfg, model=setup.fleet)
    remembered = History(loads=tuple(history)) if history is not None else History()
    if season is not None:  # the earlier days of a multi-day trace
        remembered = replace(remembered, season=season)
    if earlier_rates:  # and the rates of the intervals before the history, as Prometheus holds them
        remembered = replace(remembered, earlier_rates=tuple(earlier_rates))
    if start is not None:
        before = -cfg.interval_seconds * (len(remembered.loads) + 1)
        unscraped = Observation(now_seconds=before, prefill=RoleState(ready=start[0]),
                                decode=RoleState(ready=start[1]))
        hold, _ = step(unscraped, config=cfg, history=History(), now=before)
        remembered = replace(remembered, decisions=(hold,))
    return PdscaleController(cfg, history=remembered, future=future,
                             known_intervals=KNOWING.get(policy))


def stated_start(setup: ReplaySetup, start: tuple[int, int]) -> tuple[int, int]:
    """A stated start fleet within the planner's bounds, as the operator would scale a spec's
    replicas outside them on its first tick."""
    cfg = planner_config(setup)
    return (min(max(start[0], cfg.min_prefill), cfg.max_prefill),
            min(max(start[1], cfg.min_decode), cfg.max_decode))


def with_history(setup: ReplaySetup) -> tuple[ReplaySetup, list[Load]]:
    """An honest start: the trace's first warm-up (whole intervals) becomes history, not
    scored, and the rest is the scored window (its clock restarted at the split).

    Every policy is scored on the same window; dynamic ones start from the fleet that
    history sizes (:func:`initial_fleet`) and the planner starts with it as its memory, as a
    planner that had been running before would; nothing of the scored window is known in
    advance. The history's loads count no cache hits (they are what a cold start sees)."""
    seconds = _first_warmup_seconds(setup)
    head, tail = split_at(setup.trace, seconds)
    # the scored window's clock restarts at the split: the wall clock its schedules are read
    # on (PlannerConfig.clock_origin_unix_seconds) moves with it
    shift = (setup.trace.arrival_seconds[0] if len(setup.trace) else 0.0) + seconds
    planner = replace(setup.planner,
                      clock_origin_unix_seconds=setup.planner.clock_origin_unix_seconds + shift)
    return replace(setup, trace=tail, planner=planner), interval_loads(head, setup.interval_seconds)


def season_before(windows: Sequence[tuple[float, float]], *, unix_start: float,
                  until_unix: float) -> SeasonalMemory:
    """The planner's seasonal memory from the earlier days of a multi-day trace: ``windows``
    = (Unix start of a window, mean rate over it), those ending by ``until_unix`` (the
    scored window's start) read as a Prometheus range query would answer them, one point per
    ten-minute bucket, at most ``seasonal.MAX_DAYS`` days back. ``unix_start`` is the Unix
    time of the windows' time 0. Windows need not be ten minutes: each bucket takes the
    time-weighted mean of the windows over it."""
    memory = SeasonalMemory()
    b = memory.bucket_seconds
    rows = sorted((unix_start + t, r) for t, r in windows)
    points: dict[int, tuple[float, float]] = {}
    for k, (t, r) in enumerate(rows):
        end = rows[k + 1][0] if k + 1 < len(rows) else t + (rows[1][0] - rows[0][0] if len(rows) > 1 else b)
        lo = t
        while lo < min(end, until_unix) - 1e-9:
            bucket = math.floor(lo / b + 1e-9)
            hi = min(end, until_unix, (bucket + 1) * b)
            w, s = points.get(bucket, (0.0, 0.0))
            points[bucket] = (w + (hi - lo), s + r * (hi - lo))
            lo = hi
    whole = [(float((k + 1) * b), s / w) for k, (w, s) in points.items() if w >= b - 1e-6]
    return memory.with_earlier(whole)


def rates_before(windows: Sequence[tuple[float, float]], *, until_seconds: float,
                 interval_seconds: float, intervals: int, seed: int = 0) -> list[float | None]:
    """The request rates of the ``intervals`` planning intervals ending at ``until_seconds``
    (oldest first) of a trace made of ``windows`` (start of a window, mean rate over it, in
    the trace's clock), as Prometheus answers the planner's rate query over each interval:
    the arrivals counted in it (Poisson at the window's rate, as the trace's are drawn,
    ``seed``) over its length. None before the first window. What a multi-day trace's replay
    seeds the planner's ``History.earlier_rates`` with, as the operator seeds them on a first
    plan."""
    rows = sorted(windows)
    if not rows:
        return [None] * intervals
    starts = [t for t, _ in rows]
    rng = np.random.default_rng(seed)
    out: list[float | None] = []
    for k in range(intervals, 0, -1):
        t = until_seconds - k * interval_seconds
        if t < starts[0]:
            out.append(None)
            continue
        rate = rows[bisect.bisect_right(starts, t) - 1][1]
        out.append(float(rng.poisson(rate * interval_seconds)) / interval_seconds)
    return out


def _first_warmup_seconds(setup: ReplaySetup) -> float:
    """A new node's warm-up in whole intervals (at least one): the unscored start."""
    dt = setup.interval_seconds
    return max(dt, math.ceil(setup.model.profile.warmup.new_node_seconds / dt - 1e-9) * dt)


#: the ``--start-from`` choices of the benchmarks and ``pdscale replay``
START_FROM = ("history", "running", "hindsight")


def start_from(setup: ReplaySetup, how: str) -> tuple[ReplaySetup, list[Load] | None]:
    """The setup to score and the history before it, for a ``--start-from`` choice.

    ``"history"``: the first warm-up's loads are history (:func:`with_history`): the planner
    starts on the scored window with what it could have known, and nothing it could only have
    learned by running (a fleet's speed: a first deployment). ``"running"``: every policy
    runs through the first warm-up on the simulated fleet, unscored, and is scored on the same
    window as ``"history"``: a planner that has been running, its calibration learned from the
    fleet (the start fleet is sized from that warm-up, as ``"hindsight"``, but it is not
    scored). ``"hindsight"``: the whole trace is scored and dynamic policies size their start
    from its first warm-up."""
    if how == "history":
        return with_history(setup)
    if how == "running":
        t0 = setup.trace.arrival_seconds[0] if len(setup.trace) else 0.0
        return replace(setup, scored_from_seconds=t0 + _first_warmup_seconds(setup)), None
    if how == "hindsight":
        return setup, None
    raise ValueError(f"start_from must be one of {START_FROM}, got {how!r}")


def simulate_fleet(
    setup: ReplaySetup,
    start: tuple[int, int],
    controller: Controller | None,
    progress: Callable[[float], None] | None,
    *,
    prefill_only: bool = False,
) -> SimResult:
    """Simulate ``setup`` from ``start`` = (prefill, decode) instances; ``controller`` None keeps
    the fleet fixed, ``prefill_only`` skips decode (a prefill-side probe)."""
    cfg = SimConfig(
        router=setup.router, decode_router=setup.decode_router,
        early_rejection=setup.early_rejection, slo=setup.slo,
        decode_admission=setup.decode_admission, engine=setup.engine,
        prefill_chunk_tokens=setup.prefill_chunk_tokens, prefill_admission=setup.prefill_admission,
        interval_seconds=setup.interval_seconds, tick_phase_seconds=setup.tick_phase_seconds,
        idle_before=setup.idle_before, join_delay_seconds=setup.join_delay_seconds,
        scrape_seconds=setup.scrape_seconds, scrape_lag_seconds=setup.scrape_lag_seconds,
        initial_prefill=start[0],
        initial_decode=start[1], nodes=setup.nodes, prefill_only=prefill_only,
        nodes_per_instance=setup.planner.nodes_per_instance,
        scored_from_seconds=setup.scored_from_seconds, seed=setup.router_seed,
    )
    return simulate(setup.trace, setup.fleet, cfg, controller, progress=progress)


#: where even an ample fixed fleet meets less than the target, static:best aims at what that
#: fleet meets less this much (a share of requests): the smallest fleet reaching what a fixed
#: fleet can reach
STATIC_REACH_TOLERANCE = 0.001


@dataclass(frozen=True)
class StaticSearch:
    """static:best's answer: the fleet, every probe replayed, and what it aimed at."""

    prefill: int
    decode: int
    #: (prefill, decode, attainment); decode 0: a prefill-only probe (TTFT attainment)
    probes: list[tuple[int, int, float]]
    #: the attainment it aimed at: the setup's target, or, where the ample fleet meets less,
    #: what it meets less ``STATIC_REACH_TOLERANCE``
    target: float
    #: what an ample fleet meets: each role from twice its peak fluid demand, raised by half
    #: while that gains (within the budget)
    reach: float

    def report(self, asked: float) -> dict[str, Any]:
        """The replay report's fields on the search."""
        return {"static_probes": [{"prefill": p, "decode": d, "attainment": a} for p, d, a in self.probes],
                "static_target": {"aimed_at": self.target, "asked": asked, "ample_fleet_meets": self.reach}}


class _StaticProbes:
    """Fixed fleets replayed for static:best, each once, in the order tried."""

    def __init__(self, setup: ReplaySetup, decode_ample: int,
                 progress: Callable[[str], None] | None) -> None:
        self.setup, self.decode_ample, self.progress = setup, decode_ample, progress
        self.tried: list[tuple[int, int, float]] = []
        self.ttft_at: dict[int, float] = {}
        # (attainment, TTFT-only, TPOT-only) per fleet replayed whole: not the results, which
        # hold every request (a day-long trace's are hundreds of MB each)
        self.full_at: dict[tuple[int, int], tuple[float, float, float]] = {}

    def ttft(self, p: int) -> float:
        """TTFT attainment of ``p`` prefills, decode not replayed."""
        if p not in self.ttft_at:
            r = simulate_fleet(self.setup, (p, self.decode_ample), None, None, prefill_only=True)
            self.ttft_at[p] = r.attainment(self.setup.slo, ttft_only=True)
            self._tried(p, 0, self.ttft_at[p], f"{p}P: TTFT attainment")
        return self.ttft_at[p]

    def full(self, p: int, d: int) -> tuple[float, float, float]:
        """Attainment of ``p``P``d``D replayed whole, and its TTFT and TPOT shares."""
        if (p, d) not in self.full_at:
            slo = self.setup.slo
            r = simulate_fleet(self.setup, (p, d), None, None)
            self.full_at[p, d] = (r.attainment(slo), r.attainment(slo, ttft_only=True),
                                  float(np.mean(r.tpot_seconds[~r.rejected] <= slo.tpot_seconds)))
            self._tried(p, d, self.full_at[p, d][0], f"{p}P{d}D: attainment")
        return self.full_at[p, d]

    def _tried(self, p: int, d: int, attainment: float, what: str) -> None:
        self.tried.append((p, d, attainment))
        if self.progress:
            self.progress(f"static probe {what} {attainment:.4f}")


def _bisect(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """The smallest x in [lo, hi] where ``pred`` holds (it holds from there on); hi if nowhere."""
    if not pred(hi):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _plateau(attainment: Callable[[int], float], start: int, cap: int,
             target: float) -> tuple[int, float]:
    """One role's ample size and what it meets: from ``start``, raised by half while that
    gains at least ``STATIC_REACH_TOLERANCE``, until the target is met or ``cap``."""
    x, a = start, attainment(start)
    while a < target and x < cap:
        more = min(cap, math.ceil(x * 1.5))
        gained = attainment(more)
        if gained - a < STATIC_REACH_TOLERANCE:
            break
        x, a = more, gained
    return x, a


def static_best(setup: ReplaySetup, progress: Callable[[str], None] | None = None) -> StaticSearch:
    """The smallest fixed xPyD (in hindsight) meeting the target attainment.

    Prefill and decode are nearly separable (TTFT depends on prefill, TPOT on decode), so each
    is bisected with the other side ample, then the pair is checked and the weaker side raised.

    Each role's ample size starts at twice its peak fluid demand and is raised by half while
    that gains. Where even the ample fleet meets less than the target (prompts whose compute
    alone exceeds the TTFT target, a router's tail: a held-out ServeGen day meets 98.2% at 74
    prefills as at 89), no fleet meets it, and sizing for it returned the largest fleet
    tried. The search then aims at what the ample fleet meets, less
    ``STATIC_REACH_TOLERANCE``: the fixed fleet a user would size for that trace. A fleet
    beyond the budget is never returned; if no probe within it meets the aim, the best one
    does (the fewest nodes among equals)."""
    loads = interval_loads(setup.trace, setup.interval_seconds)
    # a hindsight bound: sized from what the fleet really does, not what the planner believes
    peak_p = max((setup.fleet.fluid_demand(ld, setup.slo)[0] for ld in loads), default=1.0)
    peak_d = max((setup.fleet.fluid_demand(ld, setup.slo)[1] for ld in loads), default=1.0)
    d_ample = min(setup.nodes - 1, max(2, math.ceil(peak_d * 2)))
    p_ample = min(setup.nodes - 1, max(2, math.ceil(peak_p * 2)))
    probes = _StaticProbes(setup, d_ample, progress)
    target = setup.attainment_target
    p_hi, p_reach = _plateau(probes.ttft, p_ample, max(p_ample, setup.nodes - 1), target)
    target_p = target if p_reach >= target else p_reach - STATIC_REACH_TOLERANCE
    p = _bisect(lambda x: probes.ttft(x) >= target_p, 1, p_hi)
    d_hi, reach = _plateau(lambda y: probes.full(p_hi, y)[0], d_ample,
                           max(d_ample, setup.nodes - p_hi), target)
    aim = target if reach >= target else reach - STATIC_REACH_TOLERANCE
    d = _bisect(lambda y: probes.full(p_hi, y)[0] >= aim, 1, d_hi)
    for _ in range(6):
        if p + d > setup.nodes:
            break
        a, ttft_ok, tpot_ok = probes.full(p, d)
        if a >= aim:
            return StaticSearch(p, d, probes.tried, aim, reach)
        if ttft_ok <= tpot_ok:
            p += max(1, p // 10)
        else:
            d += max(1, d // 10)
    within = [(a, -(x + y), x, y) for (x, y), (a, _, _) in probes.full_at.items()
              if x + y <= setup.nodes]
    if not within:  # every probe beyond the budget: the budget, each side as far as it goes
        p = min(p, setup.nodes - 1)
        return StaticSearch(p, min(d, setup.nodes - p), probes.tried, aim, reach)
    _, _, p, d = max(within)
    return StaticSearch(p, d, probes.tried, aim, reach)


def run_policy(
    setup: ReplaySetup,
    policy: str,
    *,
    progress: Callable[[float], None] | None = None,
    log: Callable[[str], None] | None = None,
    utilization_scale: float = 1.0,
    history: Sequence[Load] | None = None,
    start_fleet: tuple[int, int] | None = None, season: SeasonalMemory | None = None,
    earlier_rates: Sequence[float | None] = (),
) -> dict[str, Any]:
    """Replay ``setup.trace`` under ``policy`` and return the report (JSON-ready dict).

    ``history``: the loads of the intervals before the trace (:func:`with_history`); dynamic
    policies start from the fleet they size and the planner remembers them. None: start from
    the trace's own first warm-up (hindsight, the report says so). ``start_fleet``: a stated
    (prefill, decode) fleet every dynamic policy starts from instead, ready (a live run's
    recording replayed from the spec's replicas, where the live loop started). ``season``:
    the planner's seasonal memory at the start (:func:`season_before`); ``earlier_rates``:
    the rates before ``history``, as the operator seeds them (:func:`rates_before`).

    ``utilization_scale`` multiplies the utilisation targets of ``reactive`` and
    ``sla-interp`` (below 1: more headroom, more instances): it lets a benchmark give a
    baseline the GPU-hours another policy spent and compare attainment at equal cost."""
    if not 0.0 < utilization_scale <= 10.0:
        raise ValueError(f"utilization_scale must be in (0, 10], got {utilization_scale}")
    started = time.perf_counter()
    stated_fleet = None if start_fleet is None else stated_start(setup, start_fleet)
    name = policy
    extra: dict[str, Any] = {}
    controller: Controller | None = None
    explanations: list[str] = []
    if policy.startswith("static:") and policy != "static:best":
        start = parse_static(policy)
        controller = static_controller(*start)
    elif policy == "static:best":
        search = static_best(setup, log)
        start = (search.prefill, search.decode)
        controller, name = static_controller(*start), f"static:best={start[0]}P{start[1]}D"
        extra.update(search.report(setup.attainment_target))
    elif policy in ("pdscale", *KNOWING):
        # the oracles are hindsight bounds: their start is sized from the fleet's true speed too
        start = initial_fleet(setup if policy == "pdscale" else setup.knowing_the_fleet(), history,
                              earlier_rates)
        ctl = planner_controller(setup, policy, history, start=stated_fleet, season=season,
                                 earlier_rates=earlier_rates)
        controller = ctl
        explanations = ctl.decisions
    elif policy == "reactive":
        start = initial_fleet(setup, history)
        reactive = ReactiveController(setup.model, setup.slo)
        reactive.target_utilization *= utilization_scale
        controller = reactive
    elif policy == "sla-interp":
        start = initial_fleet(setup, history)
        pc = planner_config(setup)
        controller = SlaInterpController(
            setup.model, setup.slo, nodes=setup.nodes,
            prefill_utilization=pc.prefill_utilization * utilization_scale,
            decode_utilization=pc.decode_utilization * utilization_scale,
        )
    else:
        raise ValueError(f"policy must be one of {POLICIES} (static:xPyD e.g. static:4P17D), got {policy!r}")
    stated = False
    if stated_fleet is not None and not policy.startswith("static:"):
        start, stated = stated_fleet, True
    result = simulate_fleet(setup, start, controller, progress)
    report = summarize(setup, name, result)
    report["wall_seconds"] = round(time.perf_counter() - started, 2)
    report["initial_fleet"] = {"prefill": start[0], "decode": start[1]}
    if not policy.startswith("static:"):
        report["initial_fleet"]["sized_from"] = _sized_from(setup, history, stated)
    if explanations:
        # the scored ticks are the last ones (an unscored start's come first)
        scored = explanations[max(0, len(explanations) - len(result.ticks)):]
        report["explanations"] = [
            {"t": round(t, 1), "why": w} for (t, *_), w in zip(result.ticks, scored, strict=False)
        ]
    report.update(extra)
    return report


def _sized_from(setup: ReplaySetup, history: Sequence[Load] | None, stated: bool) -> str:
    """What a dynamic policy's start fleet was sized from, for the report."""
    return ("stated (the spec's replicas)" if stated
            else f"{len(history)} interval(s) of history before the scored window" if history is not None
            else "the first warm-up, run unscored on the fleet" if setup.scored_from_seconds is not None
            else "the scored window's first warm-up (hindsight)")


def _pct(x: np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile of a latency over all requests, where nan (rejected, or never
    served) counts as a miss beyond any latency; None when the percentile falls on such a
    request (or none was measured at all, as TPOT in a prefill-only run)."""
    if x.size == 0 or np.isnan(x).all():
        return None
    served = np.nanmax(x)
    # a miss is a finite stand-in above every latency (inf would interpolate to nan)
    v = float(np.percentile(np.where(np.isnan(x), 2.0 * served + 1e9, x), q))
    return None if v > served else round(v, 4)


def _served_quantiles(slo: Slo, r: SimResult) -> dict[str, Any]:
    """TTFT/TPOT quantiles over the requests that were served (finite latency) only."""
    out: dict[str, Any] = {"requests": int(np.count_nonzero(~r.rejected))}
    for name, x in (("ttft", r.ttft_seconds), ("tpot", r.tpot_seconds)):
        v = x[np.isfinite(x)]
        for label, q in (("at_percentile", 100.0 * slo.percentile), ("p50", 50), ("p90", 90), ("p99", 99)):
            out[f"{name}_{label}"] = round(float(np.percentile(v, q)), 4) if v.size else None
    return out


def misses(slo: Slo, r: SimResult) -> dict[str, int]:
    """Requests that missed, by cause: rejected by the router, or served late only on TTFT
    (a prefill queue, or a wait for a decode slot), only on TPOT (a decode batch past the
    target), or on both. Where the misses come from says which role was short."""
    served = ~r.rejected
    late_first = served & (r.ttft_seconds > slo.ttft_seconds)
    slow = served & (r.tpot_seconds > slo.tpot_seconds)
    return {
        "rejected": int(r.rejected.sum()),
        "ttft_only": int(np.count_nonzero(late_first & ~slow)),
        "tpot_only": int(np.count_nonzero(slow & ~late_first)),
        "both": int(np.count_nonzero(late_first & slow)),
    }


def summarize(setup: ReplaySetup, policy: str, r: SimResult) -> dict[str, Any]:
    """The replay JSON: the issue's fields plus per-interval series for plotting."""
    gpus = setup.fleet.profile.gpus_per_instance
    missed = misses(setup.slo, r)
    attainment = round(r.attainment(setup.slo), 5)
    inst_h = {k: v / 3600.0 for k, v in r.instance_seconds.items()}
    t0 = float(r.arrival_seconds[0]) if len(r.arrival_seconds) else 0.0
    dt = setup.interval_seconds
    idx = ((r.arrival_seconds - t0) // dt).astype(int) if len(r.arrival_seconds) else np.zeros(0, int)
    n = int(idx.max()) + 1 if idx.size else 0
    ok = (r.ttft_seconds <= setup.slo.ttft_seconds) & (r.tpot_seconds <= setup.slo.tpot_seconds)
    cnt = np.bincount(idx, minlength=n)
    good = np.bincount(idx, weights=ok.astype(float), minlength=n)
    per_interval = [
        {
            "t": round(t0 + k * dt, 1),
            "rate_rps": round(float(cnt[k]) / dt, 3),
            "attainment": round(float(good[k] / cnt[k]), 4) if cnt[k] else None,
        }
        for k in range(n)
    ]
    return {
        "policy": policy,
        "trace": setup.trace.name,
        # the profile the planner plans from and the one the simulated fleet runs (they
        # differ in a model-error what-if; the oracle and static:best size from the fleet's)
        "planner_profile": setup.model.profile.name,
        "fleet_profile": setup.fleet.profile.name,
        "requests": len(r.arrival_seconds),
        "slo": {"ttft_seconds": setup.slo.ttft_seconds, "tpot_seconds": setup.slo.tpot_seconds,
                "percentile": setup.slo.percentile},
        "slo_attainment": attainment,
        # the SLO holds when at least its percentile of requests (rejected ones count as
        # misses) met both targets; every latency quantile is over all requests too, rejected
        # ones beyond any latency (null: the quantile falls on a rejected request)
        "slo_met": attainment >= setup.slo.percentile,
        "quantiles_over": "all requests, rejected = miss",
        "ttft_at_percentile": _pct(r.ttft_seconds, 100.0 * setup.slo.percentile),
        "tpot_at_percentile": _pct(r.tpot_seconds, 100.0 * setup.slo.percentile),
        "ttft_p50": _pct(r.ttft_seconds, 50),
        "ttft_p90": _pct(r.ttft_seconds, 90),
        "ttft_p99": _pct(r.ttft_seconds, 99),
        "tpot_p50": _pct(r.tpot_seconds, 50),
        "tpot_p90": _pct(r.tpot_seconds, 90),
        "tpot_p99": _pct(r.tpot_seconds, 99),
        # the same quantiles over the requests served only, beside them: under heavy
        # rejection these look fine while the ones above say how many users were failed
        "served_only": _served_quantiles(setup.slo, r),
        "rejected": missed["rejected"],
        "misses": missed,
        "gpu_hours": round(sum(inst_h.values()) * gpus, 3),
        "instance_hours_by_state": {k: round(v, 3) for k, v in inst_h.items()},
        "role_changes": r.role_changes,
        "prefix_hit_rate": round(r.hit_tokens / r.prompt_tokens, 4) if r.prompt_tokens else None,
        "nodes": setup.nodes,
        "decisions": [
            {"t": round(t, 1), "prefill": p, "decode": d, "provisioned_prefill": pp, "provisioned_decode": pd}
            for t, p, d, pp, pd in r.ticks
        ],
        "per_interval": per_interval,
    }


#: issue 48's rule for "dominated" (:func:`dominated`): attainment points behind, and share
#: of GPU-hours over
DOMINATED_POINTS = 0.5
DOMINATED_COST = 0.02


def dominated(row: dict[str, Any], by: dict[str, Any]) -> bool:
    """Whether ``by`` dominates ``row`` (summaries with ``slo_attainment`` as a share and
    ``gpu_hours``): ``row`` meets more than :data:`DOMINATED_POINTS` points less *and* spends
    more than :data:`DOMINATED_COST` more GPU-hours."""
    return bool(100.0 * (by["slo_attainment"] - row["slo_attainment"]) > DOMINATED_POINTS
                and row["gpu_hours"] > (1.0 + DOMINATED_COST) * by["gpu_hours"])
