"""A live planner's recorded decisions, as the operator exports them with every decision: the
ticks joined from the exported gauges' samples, a grid of ticks for a what-if interval, and
what compares a re-plan with the live one (instance-hours, missed decisions, matches). Pure:
``pdscale replay --prometheus`` reads the samples (``planner/recording/from_prometheus.py``) and re-plans."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdscale.planner.decision import Decision
from pdscale.planner.observe import RoleState, Warming

#: a raw sample as the HTTP API gives it in a range vector: (timestamp, value)
Sample = tuple[float, float]
#: series labels and their samples
Series = tuple[Mapping[str, str], Sequence[Sample]]


@dataclass(frozen=True)
class RecordedTick:
    """One live decision's inputs other than the readings, as the operator exported them."""

    #: the planner's clock at the decision (Unix seconds)
    at_seconds: float
    prefill: RoleState
    decode: RoleState
    #: the counts the live planner decided (prefill, decode), when recorded
    live: tuple[int, int] | None = None
    #: how many decisions the operator had made by this one (its decisions counter), when
    #: recorded: tells a late plan from decisions made between two scrapes
    decided: int | None = None


@dataclass(frozen=True)
class Recording:
    ticks: tuple[RecordedTick, ...]
    #: why the replay cannot be exact, one line each (empty: nothing known against it)
    caveats: tuple[str, ...] = field(default=())


def tick_times(start_seconds: float, end_seconds: float, interval_seconds: float) -> list[float]:
    """Planning times from ``start`` to ``end`` inclusive, one per interval (a grid: the live
    loop's own times are recorded where the operator exports them; this is the fallback and
    the what-if's clock)."""
    if interval_seconds <= 0 or not math.isfinite(interval_seconds):
        raise ValueError(f"interval: must be a positive number of seconds, got {interval_seconds!r}")
    if end_seconds < start_seconds:
        raise ValueError(f"--end ({end_seconds:.0f}) is before --start ({start_seconds:.0f})")
    n = math.floor((end_seconds - start_seconds) / interval_seconds + 1e-9)
    return [start_seconds + i * interval_seconds for i in range(n + 1)]


def _by_time(series: Sequence[Series], key: str) -> dict[float, dict[str, float]]:
    """timestamp -> {label value of ``key`` (plus ``/slot`` etc. joined) -> value}."""
    out: dict[float, dict[str, float]] = {}
    for labels, samples in series:
        name = "/".join(str(labels.get(k, "")) for k in key.split("/"))
        for ts, value in samples:
            out.setdefault(float(ts), {})[name] = float(value)
    return out


def recorded_ticks(plan_times: Sequence[Series], instances: Sequence[Series],
                   warming: Sequence[Series], recommended: Sequence[Series],
                   decisions: Sequence[Series] = ()) -> list[RecordedTick]:
    """Join the operator's exported gauges into one tick per live decision (pure).

    A decision is the first scrape that shows a new ``plan time`` value; the role states, the
    decided counts and the decisions counter (summed over its ``bound`` label) are read from
    that same scrape (same timestamp: the operator sets the plan time last, so that scrape
    already holds this decision's states and count)."""
    firsts: dict[float, float] = {}  # plan time -> first scrape showing it
    for _, samples in plan_times:
        for ts, value in samples:
            if value not in firsts or ts < firsts[value]:
                firsts[value] = ts
    counts = _by_time(instances, "role/state")
    slots = _by_time(warming, "role/slot")
    decided = _by_time(recommended, "role")
    made = {ts: round(sum(by_bound.values())) for ts, by_bound in _by_time(decisions, "bound").items()}
    ticks = []
    for at in sorted(firsts):
        scrape = firsts[at]
        c, w, d = counts.get(scrape, {}), slots.get(scrape, {}), decided.get(scrape, {})
        live = ((int(d["prefill"]), int(d["decode"]))
                if "prefill" in d and "decode" in d else None)
        ticks.append(RecordedTick(at, _role_state("prefill", at, c, w),
                                  _role_state("decode", at, c, w), live, made.get(scrape)))
    return ticks


def _role_state(role: str, at: float, counts: Mapping[str, float],
                ready_in: Mapping[str, float]) -> RoleState:
    """One role's state from one scrape: counts by ``role/state``, and each warming slot's
    seconds to serving (``role/slot``) made a time again."""
    slots = sorted((int(k.split("/")[1]), v) for k, v in ready_in.items() if k.split("/")[0] == role)
    return RoleState(ready=int(counts.get(f"{role}/ready", 0)),
                     warming=tuple(Warming(ready_at_seconds=at + v) for _, v in slots),
                     draining=int(counts.get(f"{role}/draining", 0)),
                     recently_ready=int(counts.get(f"{role}/recently_ready", 0)))


def grid_ticks(times: Sequence[float], ticks: Sequence[RecordedTick],
               ready: Sequence[Series] = ()) -> list[RecordedTick]:
    """Ticks at ``times`` with the role states of the latest recorded decision at or before
    each (the live fleet's), else the latest ``pdscale_ready_replicas`` (ready only), else an
    empty fleet. Used when the times are not the live decisions' (a what-if interval, or no
    plan times recorded)."""
    by_role: dict[str, list[Sample]] = {}
    for labels, samples in ready:
        by_role.setdefault(str(labels.get("role", "")), []).extend(samples)
    out = []
    for t in times:
        before = [k for k in ticks if k.at_seconds <= t]
        if before:
            last = before[-1]
            states = [RoleState(ready=s.ready, draining=s.draining, recently_ready=s.recently_ready,
                                warming=tuple(Warming(max(t, w.ready_at_seconds)) for w in s.warming))
                      for s in (last.prefill, last.decode)]
        else:
            states = []
            for role in ("prefill", "decode"):
                seen = [v for ts, v in sorted(by_role.get(role, [])) if ts <= t]
                states.append(RoleState(ready=int(seen[-1]) if seen else 0))
        out.append(RecordedTick(t, states[0], states[1], None))
    return out


def instance_hours(times: Sequence[float], counts: Sequence[tuple[int, int]],
                   interval_seconds: float, end_seconds: float | None = None) -> float:
    """Instances decided x the time each decision stood, in hours: each count holds until
    the next decision (the last one for ``interval_seconds``, or until ``end_seconds``).
    Decided, not provisioned: warm-ups and drains are not counted."""
    total = 0.0
    for i, (t, (p, d)) in enumerate(zip(times, counts, strict=True)):
        if i + 1 < len(times):
            held = times[i + 1] - t
        else:
            held = interval_seconds if end_seconds is None else max(0.0, min(interval_seconds, end_seconds - t))
        total += (p + d) * held
    return total / 3600.0


def missed_decisions(ticks: Sequence[RecordedTick], interval_seconds: float,
                     tick_seconds: float = 5.0) -> list[tuple[float, float]]:
    """(time, seconds) of each gap between recorded decisions in which the operator decided
    and was not scraped (it was scraped less often than it plans), so the replay's memory
    parts from the live one's after it. Where both ends carry the operator's decisions counter
    a gap is one when the counter moved by more than one (a plan that came late, as on a busy
    machine, is not); else (no counter, or it restarted) when the gap is longer than an
    interval and the operator's fast tick (the latest a due plan can come)."""
    slack = interval_seconds + tick_seconds + 1.0

    def missed(a: RecordedTick, b: RecordedTick) -> bool:
        if a.decided is not None and b.decided is not None and b.decided > a.decided:
            return b.decided - a.decided > 1
        return b.at_seconds - a.at_seconds > slack

    return [(a.at_seconds, b.at_seconds - a.at_seconds)
            for a, b in itertools.pairwise(ticks) if missed(a, b)]


def matches(decisions: Sequence[Decision], ticks: Sequence[RecordedTick]) -> tuple[int, int]:
    """(ticks whose replayed counts equal the live ones, ticks with live counts recorded)."""
    known = [(d, t.live) for d, t in zip(decisions, ticks, strict=True) if t.live is not None]
    return sum(1 for d, live in known if (d.prefill, d.decode) == live), len(known)
