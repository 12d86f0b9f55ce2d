"""The demo's load, recorded and replayed: how far does a replay predict what the live loop did?

The demo writes the load it sent as a Mooncake-style JSONL trace (``timestamp`` in ms,
``input_length``, ``output_length``, ``hash_ids``; plus ``index``, ``phase``, ``prefix_group``
and ``shared_prefix_tokens``, which the reader ignores) and what the client saw per request.
It then replays that trace with the PDCluster it applied, through the pdscale policy and the
oracle (``pdscale.replay.configure`` and ``pdscale.planner.replay.run.run_policy``, what
``pdscale replay -f`` runs), and compares attainment and the per-interval decisions.

``hash_ids`` name blocks of the profile's ``prefill.block_tokens`` (the simulated engines'
cache blocks): a block id stands for the whole prefix up to that block's end, so the first
``shared_prefix_tokens // block_tokens`` blocks of a prompt carry its prefix group's ids and
every later block (the unique rest, the partial last block) a fresh id. Two prompts of one
group then share exactly the full blocks their shared words cover, as in the engines' caches.

Everything here but :func:`replay_recording` and the writers is pure.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .loadgen import RequestRecord, RequestSpec
from .localprometheus import SCRAPE_INTERVAL_SECONDS

if TYPE_CHECKING:
    from pdscale.planner.model import PerformanceModel

TRACE_FILE = "trace.jsonl"
CLIENT_FILE = "requests.jsonl"
PDCLUSTER_FILE = "pdcluster.yaml"
#: the issue's fidelity targets: replayed attainment within this of the live run ...
ATTAINMENT_TOLERANCE_PP = 5.0
#: ... and counts within COUNT_TOLERANCE of the live ones in this share of intervals
COUNT_TOLERANCE = 1
AGREEMENT_TARGET = 0.9
#: a shift of the live counts must agree better by this share of intervals before the note
#: calls the live loop late: a point or two is what chance alignment gives
LAG_GAIN = 0.1
MIN_INTERVALS_GAINED = 2
# -------------------------------------------------------------------- recording
def trace_rows(specs: Sequence[RequestSpec], records: Iterable[RequestRecord], *,
               block_tokens: int) -> list[dict[str, Any]]:
    """One Mooncake row per request sent (failed ones too: the load was sent), by send time.

    The arrival is when the client sent it (``sent_seconds``, the run's clock), not when it
    was planned: on two busy cores a request can leave late, and the replay should see what the
    router saw."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    by_index = {s.index: s for s in specs}
    shared_ids: dict[tuple[str, int], int] = {}
    next_id = 0
    rows = []
    for r in sorted(records, key=lambda r: (r.sent_seconds, r.index)):
        spec = by_index[r.index]
        shared_blocks = spec.shared_prefix_tokens // block_tokens if spec.prefix_group else 0
        hash_ids = []
        for j in range(math.ceil(spec.input_tokens / block_tokens)):
            if j < shared_blocks:
                key = (str(spec.prefix_group), j)
                if key not in shared_ids:
                    shared_ids[key] = next_id
                    next_id += 1
                hash_ids.append(shared_ids[key])
            else:
                hash_ids.append(next_id)
                next_id += 1
        rows.append({
            "timestamp": round(r.sent_seconds * 1000.0), "input_length": spec.input_tokens,
            "output_length": spec.output_tokens, "hash_ids": hash_ids, "index": spec.index,
            "phase": spec.phase, "prefix_group": spec.prefix_group,
            "shared_prefix_tokens": spec.shared_prefix_tokens,
        })
    return rows


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def write_recording(out: Path, specs: Sequence[RequestSpec], records: Sequence[RequestRecord],
                    applied: dict[str, Any], *, block_tokens: int) -> None:
    """The trace, the client's view of every request and the PDCluster as applied, under
    ``out`` (``pdscale replay -f out/pdcluster.yaml --trace out/trace.jsonl`` reads them)."""
    import yaml

    write_jsonl(out / TRACE_FILE, trace_rows(specs, records, block_tokens=block_tokens))
    write_jsonl(out / CLIENT_FILE, (asdict(r) for r in sorted(records, key=lambda r: r.index)))
    (out / PDCLUSTER_FILE).write_text(yaml.safe_dump(applied, sort_keys=False))


@dataclass(frozen=True)
class LiveTiming:
    """When the live loop planned and how long its new instances took to serve: what a replay
    of its recording reproduces, measured from the run's samples (:func:`live_timing`)."""

    #: the plan schedule's phase modulo the interval on the recording's clock
    #: (:func:`live_tick_phase`); None: the replay plans from the first arrival
    tick_phase_seconds: float | None = None
    #: seconds from a plan to a new instance serving beyond its warm-up (:func:`join_delay`)
    join_delay_seconds: float = 0.0
    #: the live Prometheus' scrape interval: its planner read counters as of the last scrape,
    #: half this old on average (the replay's lag)
    scrape_seconds: float = SCRAPE_INTERVAL_SECONDS


def replay_recording(pdcluster: Path, trace: Path,
                     policies: Sequence[str] = ("pdscale", "oracle", "oracle:now"), *,
                     router: str | None = None,
                     fleet: PerformanceModel | None = None,
                     timing: LiveTiming = LiveTiming(),
                     router_seed: int = 1) -> dict[str, dict[str, Any]]:
    """Replay the recorded ``trace`` with the planner configuration of the PDCluster in
    ``pdcluster`` (the operator's mapping, as ``pdscale replay -f``) under each policy.

    The trace is read with the profile's block size (``pdscale replay --trace`` reads Mooncake
    files as 512-token blocks). ``router`` is one of the replay's prefill routers; None: the
    spec's, as its router is rendered (decode too: ``pdscale.replay_setup.routing``; and its prefill
    admission, ``pdscale.replay_setup.router_admission``). ``fleet``: a
    simulated fleet other than the profile the planner plans with (a control: a replay on the
    wrong fleet must part from the live run). ``timing``: when the live loop planned and how
    long its instances took to join (:func:`live_timing`), for the replay to plan when it did
    and get its capacity when it did. ``router_seed``: the random routers' draws (the live
    router's were another)."""
    from pdscale.planner.model import Load
    from pdscale.planner.replay.run import ReplaySetup, run_policy
    from pdscale.planner.replay.traces import read_mooncake
    from pdscale.replay import configure, read_spec
    from pdscale.replay_setup import router_admission, routing, spec_replicas

    configured = configure(read_spec(str(pdcluster)), spec_source=f"file {pdcluster}")
    config = configured.config
    recorded = read_mooncake(trace, block_tokens=config.model.profile.prefill.block_tokens)
    routes = routing(configured.spec)
    router = router or routes["router"]
    # The live loop started from the spec's replicas on an idle fleet, and the load began
    # once they had warmed up and joined the router (demo.router_url): its planner had
    # measured zero load for a warm-up, so its first interval with requests was a measurement
    # (part of it idle) and its forecast saw the load rise from nothing. A replay that knew no
    # load before a whole interval of the recording held its first tick and saw no rise: on
    # the demo's run at 9609359 it ordered chat 2-5 decodes fewer at each of its first ticks
    setup = ReplaySetup(trace=recorded, planner=config, router=router,
                        decode_router=routes["decode_router"], fleet_model=fleet,
                        # smg's prefill admission as the spec's router is rendered (on by default)
                        prefill_admission=router_admission(configured.spec),
                        tick_phase_seconds=timing.tick_phase_seconds, router_seed=router_seed,
                        idle_before=True, join_delay_seconds=timing.join_delay_seconds,
                        scrape_seconds=timing.scrape_seconds,
                        # a live tick lands anywhere between two scrapes: the mean lag
                        scrape_lag_seconds=timing.scrape_seconds / 2)
    start = spec_replicas(configured.spec)
    warmup = max(configured.spec.prefill.warmup_seconds, configured.spec.decode.warmup_seconds)
    idle = [Load(0.0, 0.0, 0.0, 0.0)] * max(1, math.ceil(warmup / config.interval_seconds))
    return {policy: run_policy(setup, policy, start_fleet=start, history=idle) | {"router": router}
            for policy in policies}


def live_tick_phase(samples: Sequence[Any], interval_seconds: float) -> float | None:
    """The live loop's plan schedule, as a phase modulo the interval on the recording's
    clock: read off the first plan slot the samples saw (``planned_at_seconds``, the memory's
    ``lastPlanAtSeconds``) at or after the load began, else the last before it; the operator
    keeps its plans an interval apart (``operator.planning.plan_slot``). None: the samples
    saw none (a recording older than the field)."""
    slots = sorted({s.planned_at_seconds for s in samples if s.planned_at_seconds is not None})
    if not slots:
        return None
    after = [t for t in slots if t >= 0.0]
    return (after[0] if after else slots[-1]) % interval_seconds


def join_delay(samples: Sequence[Any], warmup_seconds: float) -> float | None:
    """How long the live stack's new instances took to serve beyond their warm-up.

    Each instance a plan orders (a rise of a role's target, beyond what serves and what is on
    order) is matched, first in first out, with the next rise of that role's serving count (the
    router's listed workers where the samples have them, else Ready pods); an order cancelled
    by a lower target before it serves is dropped newest first (a Deployment scaled down
    deletes its unready pods first). The delay is the median of plan-to-serving times, less
    half the sampling period (a sample sees a join up to a period late), less the warm-up: on
    the demo's local cluster the control plane takes 2-5 s to create and schedule a pod and
    the router lists it 1-2 s after it turns Ready. None: no ordered instance served."""
    if len(samples) < 2:
        return None
    by_router = all(s.router_prefill is not None and s.router_decode is not None
                    for s in samples)
    waits: list[float] = []
    for role in ("prefill", "decode"):
        def serving(s: Any, role: str = role) -> int:
            return int(getattr(s, f"router_{role}" if by_router else f"{role}_ready"))

        ordered: deque[float] = deque()  # plan times of instances not serving yet
        before, last_target = serving(samples[0]), getattr(samples[0], f"{role}_target")
        for s in samples[1:]:
            now = serving(s)
            for _ in range(max(0, now - before)):
                if ordered:
                    waits.append(s.t_seconds - ordered.popleft())
            before = now
            target = getattr(s, f"{role}_target")
            if target is None or s.planned_at_seconds is None:
                continue
            # only a plan that raises the target orders (a replaced pod's wait is not timed)
            if last_target is not None and target > last_target:
                ordered.extend([s.planned_at_seconds] * max(0, min(
                    target - last_target, target - now - len(ordered))))
            while ordered and now + len(ordered) > target:
                ordered.pop()
            last_target = target
    if not waits:
        return None
    period = statistics.median(b.t_seconds - a.t_seconds for a, b in itertools.pairwise(samples))
    return max(0.0, statistics.median(waits) - period / 2 - warmup_seconds)


def live_timing(samples: Sequence[Any], interval_seconds: float,
                warmup_seconds: float,
                scrape_seconds: float = SCRAPE_INTERVAL_SECONDS) -> LiveTiming:
    """The live loop's plan schedule and its instances' join delay, from its samples, with
    its Prometheus' ``scrape_seconds``."""
    return LiveTiming(live_tick_phase(samples, interval_seconds),
                      join_delay(samples, warmup_seconds) or 0.0, scrape_seconds)


def tick_phase_spread(pdcluster: Path, trace: Path, interval_seconds: float,
                      steps: int = 10, timing: LiveTiming = LiveTiming()) -> dict[str, float]:
    """pdscale's replayed attainment with the planner ticking at each of ``steps`` phases of
    its interval (keyed by the phase in seconds).

    A live loop's schedule starts when its PDCluster is applied, so where its ticks fall
    against a change of the load is chance; the spread says how much of a replayed figure (and
    of a live one) that chance moves. On the demo's recording it spans several points.
    ``timing``: the live run's, whose phase is replaced."""
    out = {}
    for k in range(steps):
        phase = k * interval_seconds / steps
        report = replay_recording(pdcluster, trace, ("pdscale",),
                                  timing=replace(timing, tick_phase_seconds=phase))
        out[f"{phase:g}"] = report["pdscale"]["slo_attainment"]
    return out


def span_distance_pp(value: float, draws: Sequence[float]) -> float:
    """How far ``value`` lies outside the span of ``draws``, in percentage points (0 inside)."""
    return 100.0 * max(min(draws) - value, value - max(draws), 0.0)


#: draws of the replay's random routers (ReplaySetup.router_seed) a live run is judged against
ROUTER_DRAWS = range(1, 7)


def router_draw_replays(pdcluster: Path, trace: Path, timing: LiveTiming = LiveTiming(),
                        *, fleet: PerformanceModel | None = None,
                        seeds: Sequence[int] = ROUTER_DRAWS,
                        policy: str = "pdscale") -> dict[int, dict[str, Any]]:
    """``policy``'s replay report under each draw (seed) of the replay's random routers."""
    return {seed: replay_recording(pdcluster, trace, (policy,), fleet=fleet, timing=timing,
                                   router_seed=seed)[policy]
            for seed in seeds}


def router_draw_spread(pdcluster: Path, trace: Path, timing: LiveTiming = LiveTiming(),
                       *, fleet: PerformanceModel | None = None,
                       seeds: Sequence[int] = ROUTER_DRAWS) -> dict[int, float]:
    """pdscale's replayed attainment under each draw (seed) of the replay's random routers.

    sglang-router 0.3.2 picks a PD prefill at random, so a live run is one draw and its
    replay another: on the closed-loop e2e's load six draws at one tick phase span up to
    16 pp. A live figure is judged against the span, not against one draw."""
    return {seed: r["slo_attainment"] for seed, r in
            router_draw_replays(pdcluster, trace, timing, fleet=fleet, seeds=seeds).items()}


def agreement_between_draws(decisions: Sequence[Sequence[dict[str, Any]]],
                            tolerance: int = COUNT_TOLERANCE) -> float | None:
    """The mean, over pairs of draws, of the share of ticks whose decided counts (``prefill``,
    ``decode``) agree within ``tolerance``: how far two runs of the same planner on the same
    load agree when only the random router's draws differ. A live run is one more draw, so
    this bounds the agreement a faithful replay can show with it (on the demo's recording at
    291fa1e: 72% on average, 56% for the least alike pair, against the issue's 90%). None:
    fewer than two draws."""
    shares = []
    for a, b in itertools.combinations(decisions, 2):
        n = min(len(a), len(b))
        if n:
            shares.append(sum(counts_agree((a[k]["prefill"], a[k]["decode"]),
                                           (b[k]["prefill"], b[k]["decode"]), tolerance)
                              for k in range(n)) / n)
    return sum(shares) / len(shares) if shares else None


def router_sensitivity(pdcluster: Path, trace: Path,
                       timing: LiveTiming = LiveTiming()) -> dict[str, dict[str, float]]:
    """pdscale's and the oracle's replayed attainment under each of the replay's routers.

    The spread says how much of a replayed figure is the router model's."""
    from pdscale.planner.replay.routers import ROUTERS

    out = {}
    for router in ROUTERS:
        reports = replay_recording(pdcluster, trace, router=router, timing=timing)
        out[router] = {policy: r["slo_attainment"] for policy, r in reports.items()}
    return out


# -------------------------------------------------------------------- comparison (pure)
def counts_agree(a: tuple[int, int], b: tuple[int, int], tolerance: int = COUNT_TOLERANCE) -> bool:
    """Two (prefill, decode) decisions within ``tolerance`` for both roles."""
    return abs(a[0] - b[0]) <= tolerance and abs(a[1] - b[1]) <= tolerance


@dataclass(frozen=True)
class IntervalCounts:
    """One replayed interval beside the live loop: decided prefill/decode counts."""

    t_seconds: float
    phase: str
    #: what the live planner had decided (status.planner.recommended); None before its first
    live_prefill: int | None
    live_decode: int | None
    #: the live fleet's Ready, non-draining instances
    live_prefill_ready: int
    live_decode_ready: int
    replay_prefill: int
    replay_decode: int
    oracle_prefill: int | None = None
    oracle_decode: int | None = None

    def agrees(self, tolerance: int = COUNT_TOLERANCE) -> bool | None:
        """Live and replayed decisions within ``tolerance`` for both roles; None: no live one."""
        if self.live_prefill is None or self.live_decode is None:
            return None
        return counts_agree((self.live_prefill, self.live_decode),
                            (self.replay_prefill, self.replay_decode), tolerance)


def side_by_side(samples: Sequence[Any], replay_decisions: Sequence[dict[str, Any]],
                 oracle_decisions: Sequence[dict[str, Any]], *, interval_seconds: float,
                 phase_at: Callable[[float], str]) -> list[IntervalCounts]:
    """Each replayed tick beside the live decision in force at the middle of its interval.

    ``samples`` are the demo's (``t_seconds``, ``prefill_target``, ``decode_target``,
    ``prefill_ready``, ``decode_ready``), on the recording's clock. The live planner ticks at
    its own phase; the sample half an interval after the replay's tick shows the live decision
    whose tick lies nearest the replay's, within half an interval either side."""
    ordered = sorted(samples, key=lambda s: s.t_seconds)
    oracle = {round(d["t"], 1): d for d in oracle_decisions}
    rows = []
    for d in replay_decisions:
        mid = d["t"] + interval_seconds / 2
        before = [s for s in ordered if s.t_seconds <= mid]
        if not before:
            continue
        s = before[-1]
        o = oracle.get(round(d["t"], 1))
        rows.append(IntervalCounts(
            d["t"], phase_at(d["t"]), s.prefill_target, s.decode_target, s.prefill_ready,
            s.decode_ready, d["prefill"], d["decode"],
            o["prefill"] if o else None, o["decode"] if o else None))
    return rows


def agreement(rows: Sequence[IntervalCounts], tolerance: int = COUNT_TOLERANCE) -> float | None:
    """Share of intervals with a live decision whose counts agree within ``tolerance``."""
    judged = [a for a in (r.agrees(tolerance) for r in rows) if a is not None]
    return sum(judged) / len(judged) if judged else None


def shifted_agreement(rows: Sequence[IntervalCounts], lag: int, tolerance: int = COUNT_TOLERANCE,
                      roles: tuple[str, ...] = ("prefill", "decode")) -> tuple[int, int]:
    """(intervals agreeing, intervals judged) for the live counts of ``roles`` at k against
    the replayed ones at k - ``lag``."""
    judged = [all(abs(getattr(b, f"live_{role}") - getattr(a, f"replay_{role}")) <= tolerance
                  for role in roles)
              for a, b in zip(rows, rows[lag:], strict=False)
              if b.live_prefill is not None and b.live_decode is not None]
    return sum(judged), len(judged)


def best_lag(rows: Sequence[IntervalCounts], max_lag: int = 6, tolerance: int = COUNT_TOLERANCE,
             roles: tuple[str, ...] = ("prefill", "decode")) -> tuple[int, float | None]:
    """The shift (in intervals, live behind the replay) at which the live counts of ``roles``
    agree best with the replayed ones, and that agreement (the earliest shift among equals)."""
    best: tuple[int, float | None] = (0, None)
    for lag in range(0, max_lag + 1):
        agree, judged = shifted_agreement(rows, lag, tolerance, roles)
        share = agree / judged if judged else None
        if share is not None and (best[1] is None or share > best[1]):
            best = (lag, share)
    return best


def difference_note(rows: Sequence[IntervalCounts], interval_seconds: float,
                    tolerance: int = COUNT_TOLERANCE) -> str:
    """Where the live and replayed counts part by more than ``tolerance``, by role and phase,
    and whether the live ones look like the replayed ones late."""
    parts = []
    for role in ("prefill", "decode"):
        below: dict[str, int] = {}
        above: dict[str, int] = {}
        for r in rows:
            live, replayed = getattr(r, f"live_{role}"), getattr(r, f"replay_{role}")
            if live is None:
                continue
            if live < replayed - tolerance:
                below[r.phase] = below.get(r.phase, 0) + 1
            elif live > replayed + tolerance:
                above[r.phase] = above.get(r.phase, 0) + 1
        if not below and not above:
            parts.append(f"{role}: within {tolerance} in every interval")
            continue
        said = []
        for word, where in (("below", below), ("above", above)):
            if where:
                phases = ", ".join(f"{p} {n}" for p, n in where.items())
                said.append(f"{word} the replay in {sum(where.values())} ({phases})")
        text = f"{role}: live {' and '.join(said)}"
        lag, shifted = best_lag(rows, tolerance=tolerance, roles=(role,))
        agree_now, judged_now = shifted_agreement(rows, 0, tolerance, (role,))
        now = agree_now / judged_now if judged_now else None
        # a shift must set right more than one interval: one disagreement at the start or
        # the end of the run falls out of any shifted comparison
        agree_late, judged_late = shifted_agreement(rows, lag, tolerance, (role,))
        gained = (judged_now - agree_now) - (judged_late - agree_late)
        if (lag and shifted is not None and now is not None and shifted >= now + LAG_GAIN
                and gained >= MIN_INTERVALS_GAINED):
            text += (f", and agrees best with the replay {lag} interval(s) "
                     f"({lag * interval_seconds:g} s) earlier ({shifted:.0%} of intervals, "
                     f"{now:.0%} unshifted): the live loop decides it late")
        parts.append(text)
    return "; ".join(parts) + "."


def interval_attainment_by_phase(per_interval: Sequence[dict[str, Any]], interval_seconds: float,
                                 phase_at: Callable[[float], str]) -> dict[str, float | None]:
    """A replay report's attainment per phase, from its per-interval figures (requests =
    rate x interval): each interval counts for the phase of its middle, so up to one interval
    of requests at each phase change is counted in its neighbour."""
    good: dict[str, float] = {}
    total: dict[str, float] = {}
    for p in per_interval:
        phase = phase_at(p["t"] + interval_seconds / 2)
        n = p["rate_rps"] * interval_seconds
        total[phase] = total.get(phase, 0.0) + n
        good[phase] = good.get(phase, 0.0) + n * (p["attainment"] or 0.0)
    return {phase: (good[phase] / n if n else None) for phase, n in total.items()}


def fidelity(live: dict[str, Any], reports: dict[str, dict[str, Any]],
             rows: Sequence[IntervalCounts], *, interval_seconds: float,
             phase_at: Callable[[float], str],
             router_draws: dict[int, float] | None = None,
             agreement_between_router_draws: float | None = None) -> dict[str, Any]:
    """The figures the issue asks for: live, replayed and oracle attainment (overall and per
    phase), their difference in percentage points, the share of intervals whose decided
    counts agree within +-1, and a note on where they part. ``router_draws``: pdscale's
    attainment over draws of the random router (:func:`router_draw_spread`); the live run is
    one more draw, so how far it lies outside their span is reported too, and
    ``agreement_between_router_draws`` (:func:`agreement_between_draws`) beside the counts'."""
    def outcome(report: dict[str, Any]) -> dict[str, Any]:
        return {"slo_attainment": report["slo_attainment"],
                "slo_attainment_by_phase": interval_attainment_by_phase(
                    report["per_interval"], interval_seconds, phase_at),
                "gpu_hours": report["gpu_hours"], "initial_fleet": report["initial_fleet"]}

    replayed, oracle = reports["pdscale"], reports.get("oracle")
    share = agreement(rows)
    diff = (None if live["slo_attainment"] is None
            else 100.0 * (replayed["slo_attainment"] - live["slo_attainment"]))
    replayed_by_phase = outcome(replayed)["slo_attainment_by_phase"]
    # an overall figure can agree while phases part both ways: say each phase's difference
    by_phase = {phase: 100.0 * (replayed_by_phase[phase] - v)
                for phase, v in live["slo_attainment_by_phase"].items()
                if v is not None and replayed_by_phase.get(phase) is not None}
    outside = (None if live["slo_attainment"] is None or not router_draws
               else span_distance_pp(live["slo_attainment"], list(router_draws.values())))
    return {
        "router": replayed.get("router"),
        "live": {"slo_attainment": live["slo_attainment"],
                 "slo_attainment_by_phase": live["slo_attainment_by_phase"],
                 "gpu_hours_ready": live["gpu_hours_ready"]},
        "replayed": outcome(replayed),
        "oracle": outcome(oracle) if oracle else None,
        # the same solver measuring each interval exactly once it ends, with no forecast: what
        # a planner that cannot see a change coming reaches, so the rest of the gap to the
        # oracle is foresight
        "oracle_now": outcome(reports["oracle:now"]) if "oracle:now" in reports else None,
        "attainment_difference_pp": diff,
        "attainment_within_tolerance": diff is not None and abs(diff) <= ATTAINMENT_TOLERANCE_PP,
        "replayed_by_router_draw": router_draws,
        "attainment_outside_router_draws_pp": outside,
        "attainment_difference_pp_by_phase": by_phase,
        "counts_agree_share": share,
        "counts_agree_within_target": share is not None and share >= AGREEMENT_TARGET,
        "counts_agree_between_router_draws": agreement_between_router_draws,
        "intervals_compared": sum(1 for r in rows if r.agrees() is not None),
        "note": difference_note(rows, interval_seconds),
        "intervals": [asdict(r) for r in rows],
    }


def fidelity_paragraph(f: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    def phases(by_phase: dict[str, float | None]) -> str:
        return ", ".join(f"{k} {pct(v)}" for k, v in by_phase.items())

    live, rep, orc = f["live"], f["replayed"], f["oracle"]
    diff = f["attainment_difference_pp"]
    share = f["counts_agree_share"]
    router = f" (replay router {f['router']})" if f.get("router") else ""
    text = (f"Replayed with the same PDCluster{router}, the recorded load met both SLOs for "
            f"{pct(rep['slo_attainment'])} ({phases(rep['slo_attainment_by_phase'])}) against "
            f"{pct(live['slo_attainment'])} live ({phases(live['slo_attainment_by_phase'])})")
    if diff is not None:
        text += (f": {diff:+.1f} pp ({'within' if f['attainment_within_tolerance'] else 'NOT within'} "
                 f"{ATTAINMENT_TOLERANCE_PP:g} pp)")
    if f.get("attainment_difference_pp_by_phase"):
        text += ", by phase " + ", ".join(
            f"{k} {v:+.1f}" for k, v in f["attainment_difference_pp_by_phase"].items())
    draws = f.get("replayed_by_router_draw")
    if draws:
        text += (f"; over {len(draws)} draws of the replay's random router (the live router's "
                 f"was one more) {pct(min(draws.values()))}-{pct(max(draws.values()))}")
        outside = f.get("attainment_outside_router_draws_pp")
        if outside is not None:
            text += (" with live inside" if outside == 0 else
                     f", live {outside:.1f} pp outside")
    if f.get("join_delay_seconds"):
        text += (f"; the replay's new instances serve {f['join_delay_seconds']:.1f} s after their "
                 "warm-up, as the live ones did")
    spread = f.get("replayed_by_tick_phase")
    if spread:
        text += (f"; with the planner's ticks at other phases of its interval the replay meets "
                 f"{pct(min(spread.values()))}-{pct(max(spread.values()))}")
    if orc is not None:
        text += f"; the oracle on the same load {pct(orc['slo_attainment'])}"
    if f.get("oracle_now") is not None:
        text += (f", and {pct(f['oracle_now']['slo_attainment'])} knowing each interval's load "
                 "exactly once it ends but nothing ahead (oracle:now: the rest of the gap is "
                 "foresight)")
    text += (f". Decided counts agree within +-{COUNT_TOLERANCE} in {pct(share)} of "
             f"{f['intervals_compared']} intervals (target {AGREEMENT_TARGET:.0%})")
    between = f.get("counts_agree_between_router_draws")
    if between is not None:
        text += (f", where the replay's own router draws agree with each other in {pct(between)} "
                 "on average")
    text += f": {f['note']}"
    others = {k: v for k, v in (f.get("by_router") or {}).items() if k != f.get("router")}
    if others:
        text += " Under the replay's other routers pdscale / the oracle met " + ", ".join(
            f"{k} {pct(v.get('pdscale'))} / {pct(v.get('oracle'))}" for k, v in others.items()) + "."
    return text
