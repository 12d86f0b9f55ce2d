"""Scaling policies compared in replay, each a controller ``Observation -> (prefill, decode)``.

All of them run through the same simulator and cost accounting (``replay.py``):

- ``pdscale``: ours (:func:`.solve.plan`, warm-up priced, horizon MILP, stabilised).
- ``static:xPyD``: a fixed fleet; ``static:best`` is searched in ``replay.py``.
- ``reactive``: per-role HPA-style threshold scaler on utilisation, scale-down stabilisation.
- ``sla-interp``: Dynamo-style: forecast, per-role throughput from the profile at the SLO,
  correction factors, no warm-up model, waits while a scale change rolls out.
- ``oracle``: our solver given the true future load of every interval; it pays the same
  warm-up and drain costs, so it is the limit a forecast could reach.
- ``oracle:now``: the same solver knowing the true load of the interval that just ended and
  nothing after it (held flat over the horizon): a perfect meter with no forecast, the limit of
  a planner that measures exactly and at once but cannot see a change coming.
- ``oracle:next``: as ``oracle:now`` but also knowing the interval that begins at the tick
  (one interval of foresight): what seeing a change one interval early is worth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..config import HPA_SCALE_DOWN_WINDOW_SECONDS, PlannerConfig
from ..decision import Decision
from ..forecast import forecast
from ..model import Load, PerformanceModel, Slo
from ..observe import Observation
from ..solve import History, current_load, step
from .simulate import Controller

POLICIES = ("pdscale", "static:xPyD", "static:best", "reactive", "sla-interp", "oracle", "oracle:now",
            "oracle:next")


def parse_static(name: str) -> tuple[int, int]:
    """``static:4P17D`` -> (4, 17); raises ValueError naming the expected form."""
    body = name.split(":", 1)[1] if ":" in name else ""
    try:
        p, d = body.upper().rstrip("D").split("P")
        return int(p), int(d)
    except ValueError:
        raise ValueError(f"static policy must look like static:4P17D, got {name!r}") from None


@dataclass
class PdscaleController:
    """Our planner in a loop, as the operator runs it (``solve.step``: calibrate, plan,
    remember); the only state is the history."""

    config: PlannerConfig
    history: History = field(default_factory=History)
    #: true future loads per interval (oracle); None = forecast from history
    future: Sequence[Load] | None = None
    #: with ``future``: how many intervals of it are known from each tick, counting the one
    #: that just ended as the first (1: a perfect meter; 2: and the one beginning now), held
    #: flat over the horizon; None: the whole horizon (the oracle)
    known_intervals: int | None = None
    decisions: list[str] = field(default_factory=list)

    def __call__(self, obs: Observation) -> tuple[int, int, int, int]:
        d, self.history = self.plan(obs, self.config, self.history)
        self.decisions.append(d.explanation)
        return d.prefill, d.decode, d.switch_to_prefill, d.switch_to_decode

    def plan(self, obs: Observation, cfg: PlannerConfig, history: History) -> tuple[Decision, History]:
        """One plan on ``cfg`` and ``history`` (its future, if known, as in ``__call__``);
        changes nothing of this controller (a pool's member probes its need with it)."""
        now = obs.now_seconds
        future = None
        if self.future is not None:
            k = round(now / cfg.interval_seconds)
            future = list(self.future[k : k + cfg.horizon_intervals])
            if self.known_intervals is not None:
                latest = k - 2 + self.known_intervals  # the latest interval known at this tick
                known = self.future[latest] if 0 <= latest < len(self.future) else None
                future = [known] * len(future) if known is not None else []
            # the future's rate and lengths are known; its cache hit rate is a property of the
            # fleet, so take the one measured now (or the last one measured)
            hit = _get(obs.prefix_hit_rate, now)
            if hit is None and history.loads:
                prev = history.loads[-1]
                hit = prev.prefix_hit_rate if prev else None
            future = [replace(f, prefix_hit_rate=hit or 0.0) for f in future] or None
        return step(obs, config=cfg, history=history, now=now, future_loads=future)


def _get(r: object, now: float, max_age: float = 180.0) -> float | None:
    from ..observe import Reading

    return r.fresh(now, max_age) if isinstance(r, Reading) else None


@dataclass
class ReactiveController:
    """HPA-like per-role scaler: desired = ceil(ready * utilisation / target), +-10% tolerance,
    immediate scale-up, scale-down to the highest recommendation of the last 5 minutes.

    Prefill utilisation = offered prefill work / ready instances (what ``sglang:utilization``
    or DCGM would show); decode utilisation = running sequences / SLO batch per instance."""

    model: PerformanceModel
    slo: Slo
    target_utilization: float = 0.7
    tolerance: float = 0.1
    stabilization_window_seconds: float = HPA_SCALE_DOWN_WINDOW_SECONDS
    min_replicas: int = 1
    max_replicas: int = 10**6
    recs: list[tuple[float, int, int]] = field(default_factory=list)
    last: tuple[int, int] | None = None

    def __call__(self, obs: Observation) -> tuple[int, int]:
        now = obs.now_seconds
        P, D = obs.prefill, obs.decode
        cur = (P.committed, D.committed)
        load = current_load(obs, 180.0)
        if load is None:
            return self.last or cur
        util_p = (
            load.rate_rps / self.model.prefill_request_capacity_rps(load) / P.ready
            if P.ready else math.inf
        )
        run = _get(D.running_requests, now)
        b = self.model.decode_batch_at_slo(self.slo.tpot_seconds, self.model.decode_mean_context(load))
        util_d = (run / (D.ready * max(b, 1))) if (run is not None and D.ready) else math.inf
        desired: list[int] = []
        for c, ready, u in ((cur[0], P.ready, util_p), (cur[1], D.ready, util_d)):
            if math.isinf(u):
                desired.append(int(c))
                continue
            ratio = u / self.target_utilization
            if abs(ratio - 1.0) <= self.tolerance:
                desired.append(int(c))
            else:
                desired.append(max(self.min_replicas, min(self.max_replicas, math.ceil(ready * ratio))))
        self.recs.append((now, desired[0], desired[1]))
        self.recs = [r for r in self.recs if now - r[0] <= self.stabilization_window_seconds]
        out: list[int] = []
        for k in (0, 1):
            if desired[k] >= cur[k]:
                out.append(desired[k])
            else:
                out.append(min(cur[k], max(int(r[1 + k]) for r in self.recs)))
        self.last = (out[0], out[1])
        return self.last


@dataclass
class SlaInterpController:
    """Dynamo-SLA-planner-like: every ``adjustment_interval`` it forecasts the next interval's
    rate and lengths, sizes each role from profiled throughput at the SLO (prefill tokens/s at
    this ISL discounted by the KV hit rate; decode tokens/s at the ITL target), applies
    observed/expected correction, and skips the cycle while new workers are still starting.
    No warm-up model: it asks for what the next interval needs, too late by one warm-up."""

    model: PerformanceModel
    slo: Slo
    #: profiled throughput "at the SLO" is measured below saturation; we give it the same
    #: headroom as ours so that the comparison isolates forecasting and warm-up
    prefill_utilization: float = 0.7
    decode_utilization: float = 0.8
    adjustment_interval_seconds: float = 180.0
    nodes: int = 10**6
    rates: list[float | None] = field(default_factory=list)
    last: tuple[int, int] | None = None
    next_at: float = -math.inf

    def __call__(self, obs: Observation) -> tuple[int, int]:
        now = obs.now_seconds
        load = current_load(obs, 180.0)
        self.rates.append(load.rate_rps if load else None)
        cur = (obs.prefill.committed, obs.decode.committed)
        if self.last is None:
            self.last = cur
        if now < self.next_at or load is None:
            return self.last
        if obs.prefill.warming or obs.decode.warming:
            return self.last  # Dynamo waits for a rollout to finish before the next change
        self.next_at = now + self.adjustment_interval_seconds
        pred = forecast(self.rates, 1, method="holt")
        rate = pred[0] if pred else load.rate_rps
        nxt = replace(load, rate_rps=rate)
        p, d = self.model.instances_needed(
            nxt, self.slo,
            prefill_utilization=self.prefill_utilization,
            decode_utilization=self.decode_utilization,
        )
        p, d = max(p, 1), max(d, 1)
        if p + d > self.nodes:  # over budget: prefill scaled down proportionally, decode the rest
            p = max(1, math.floor(p * self.nodes / (p + d)))
            d = max(1, self.nodes - p)
        self.last = (p, d)
        return self.last


def static_controller(prefill: int, decode: int) -> Controller:
    """A fixed fleet."""

    def ctl(_: Observation) -> tuple[int, int]:
        return prefill, decode

    return ctl
