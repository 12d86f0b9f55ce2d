"""Instances each interval of the horizon needs (the performance model over the forecast
loads), decode's floor from the sequences running now, and the split over a node budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import PlannerConfig
from .model import Load
from .observe import (
    Observation,
    fresh,
)
from .schedule import Floors, floors_over
from .timing import _intervals


# -- needs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Needs:
    """Instances each role needs per interval, arrays of shape (2, H): row 0 prefill, 1 decode."""

    #: what the solver is asked to serve: within min/max, split over budget (prefill_share)
    need: np.ndarray
    #: the same before the budget split (for the explanation)
    uncapped: np.ndarray
    #: shape (H,): intervals whose need exceeds the budget left by draining nodes
    over: np.ndarray
    #: what this interval needs (after the split): remembered for the scale-down window
    desired: tuple[int, int]
    #: decode instances the sequences running now need where that exceeds the load model's
    #: (0: the load model's binds), for the explanation (``_decode_need_from_sequences``)
    decode_from_sequences: int = 0
    #: the scheduled minimums per interval (``PlannerConfig.schedules``; None: no schedule)
    scheduled: Floors | None = None
    #: what each role needs per interval from its load and bounds alone (the scheduled floors
    #: left out), shape (2, H): what the scale-down window and its hysteresis remember
    from_load: np.ndarray | None = None


def _needs(
    cfg: PlannerConfig, observation: Observation, future: list[Load], future_decode: list[Load] | None,
    *, now: float | None = None,
) -> _Needs:
    """Instances needed per role and interval at the utilisation caps (prefill with its
    queueing model for the TTFT target), at least the role's minimum and the scheduled floor
    of each interval (``_scheduled``; ``now``: the first interval's start, the observation's
    time when None). Over budget (need_p + need_d > nodes - draining), prefill gets the floor
    of :func:`prefill_share`, clipped to its minimum and the room the decode minimum leaves,
    and decode the rest."""
    model = cfg.model
    cache: dict[Load, tuple[int, int]] = {}

    def needed(ld: Load) -> tuple[int, int]:
        if ld not in cache:
            cache[ld] = instances_needed(cfg, ld)
        return cache[ld]

    need = np.array(
        [[needed(ld)[0] for ld in future],
         [needed(ld)[1] for ld in (future_decode or future)]],
        dtype=float,
    )  # shape (2, H)
    # decode: at least what the sequences running now need, until capacity ordered now
    # serves (from then on the load model's need, and the scale-down window, hold it)
    lead = _intervals(model.profile.warmup.new_node_seconds, cfg.interval_seconds) + 1
    from_sequences = _decode_need_from_sequences(cfg, observation, (future_decode or future)[0])
    binding = from_sequences if from_sequences > need[1, 0] else 0
    need[1, :lead] = np.maximum(need[1, :lead], from_sequences)
    need[0] = np.maximum(need[0], cfg.min_prefill)
    need[1] = np.maximum(need[1], cfg.min_decode)
    # the floors a user stated for the intervals ahead: a need like the load's, so that the
    # capacity for a window is ordered a warm-up before it opens
    scheduled = _scheduled(cfg, observation.now_seconds if now is None else now, need.shape[1])
    from_load = need.copy()
    low = np.array([[cfg.min_prefill], [cfg.min_decode]], dtype=float) * np.ones_like(need)
    if scheduled is not None:
        low = np.maximum(low, [scheduled.prefill, scheduled.decode])
        need = np.maximum(need, low)
    # Over budget, divide the shortfall before solving (prefill_share), so that neither role
    # starves (Dynamo cuts prefill first; neither side's users are worth more by default).
    # The budget is in nodes and an instance spans kp or kd of them (a group): the split
    # below is made in nodes and read back in whole instances.
    uncapped = need.copy()
    kp, kd = cfg.nodes_per_instance
    k = np.array([[kp], [kd]], dtype=float)
    avail = float(cfg.nodes - (observation.prefill.draining * kp + observation.decode.draining * kd))
    total = (need * k).sum(axis=0)
    over = total > avail
    if over.any():
        busy = np.array([[model.fluid_demand(ld, cfg.slo)[0] for ld in future],
                         [model.fluid_demand(ld, cfg.slo)[1] for ld in (future_decode or future)]])
        p_share = np.floor(prefill_share(avail, need * k, busy * k) + 1e-9)
        p_share = np.clip(p_share, low[0] * kp, np.maximum(avail - low[1] * kd, low[0] * kp))
        p_share = np.floor(p_share / kp)  # whole prefill instances
        need[0] = np.where(over, p_share, need[0])
        need[1] = np.where(over, np.maximum(np.floor((avail - p_share * kp) / kd), low[1]),
                           need[1])
    # the scale-down window remembers the load's need, never a floor: when a window closes,
    # the fleet comes back to what the load needs at once
    from_load = np.minimum(need, from_load)
    return _Needs(need=need, uncapped=uncapped, over=over,
                  desired=(int(from_load[0, 0]), int(from_load[1, 0])),
                  decode_from_sequences=binding, scheduled=scheduled, from_load=from_load)


def _scheduled(cfg: PlannerConfig, now: float, H: int) -> Floors | None:
    """The scheduled minimums of the ``H`` intervals from ``now`` (planner seconds, read on
    the wall clock from ``cfg.clock_origin_unix_seconds``); None without schedules."""
    if not cfg.schedules:
        return None
    dt = cfg.interval_seconds
    origin = cfg.clock_origin_unix_seconds + now
    return floors_over(cfg.schedules, [origin + k * dt for k in range(H)], dt)


def prefill_share(avail: float, need: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """Prefill's share of ``avail`` nodes where the roles need more (fractional, per interval).

    Below its fluid demand (``busy``: instances kept 100% busy, at the TPOT target for decode)
    a role falls off a cliff: prefill's queue grows without bound, every decode step runs past
    the TPOT target, and nearly every request misses. Above it, an instance buys margin for
    queueing and bursts. So the budget covers both fluid demands first (in proportion to them
    when even those do not fit), and what is left goes in proportion to each role's margin
    (need - busy). Split in proportion to need alone, the margin prefill's TTFT queueing asks
    for took decode's fluid demand: on Mooncake x6 under a 27-node budget the planner ran
    23P4D to 19P8D and met 25.7%; split this way it runs 20P7D +-1 and meets 64.1% (the best
    fixed split, 19P8D, 66.3%)."""
    busy = np.minimum(busy, need)
    busy_total, margin = busy.sum(axis=0), need - busy
    by_busy = avail * busy[0] / np.maximum(busy_total, 1e-9)
    by_margin = busy[0] + (avail - busy_total) * margin[0] / np.maximum(margin.sum(axis=0), 1e-9)
    share: np.ndarray = np.where(avail <= busy_total, by_busy, by_margin)
    return share


def instances_needed(cfg: PlannerConfig, load: Load) -> tuple[int, int]:
    """(prefill, decode) ``cfg.model`` needs for ``load`` at the configured caps and queueing."""
    return cfg.model.instances_needed(
        load, cfg.slo,
        prefill_utilization=cfg.prefill_utilization,
        decode_utilization=cfg.decode_utilization,
        ttft_queueing=True, service_cv=cfg.prefill_service_cv,
        pooled_prefill=cfg.prefill_queue == "pooled",
    )


def _decode_need_from_sequences(cfg: PlannerConfig, observation: Observation, load: Load) -> int:
    """Decode instances the sequences running now need (0 when unknown or stale).

    Decode, by Little's law: the ``N`` sequences running on the decode instances run at the
    TPOT target on ceil(N x headroom / (b x decode_utilization)) instances, ``b`` the batch
    one instance runs at the target for the load's mean context
    (``model.decode_batch_at_slo``). Rates and lengths are counted when requests finish, so
    after a change of load shape they show the need one residence time and a length window
    late; the sequences already running show it at once. In steady load N = rate x output x
    TPOT with TPOT within the target, which the load model's rate x output / tokens-per-second
    at the target already covers, so this adds nothing there.

    Not the decode queues: in PD mode a decode receives each request with its prefill, so its
    transfer queue holds requests whose prefill has not run yet (docs/conformance.md). Counted,
    the demo's long documents (4 tokens out) asked for 10 decodes for a prefill backlog. That
    backlog is prefill's, and enters as load (``current_load``'s backlog).

    A short decode runs its sequences above the TPOT target, and by the same law holds
    TPOT/target times as many as it would at the target: that excess is a backlog that
    drains within a residence time (N / arrival rate), not load. It counts only as far as it
    could still be running when capacity ordered now serves (decayed over a new node's
    warm-up): behind a 600 s warm-up, a doubled load on a short decode (sequences residing
    about 15 s) asked for 23 decode instances where 9 served it; behind the demo's 20 s
    warm-up most of it still counts.

    The running gauge is at most the requests that decoded over the last scrape
    (``decoding_requests``, where read). SGLang sets the gauge only when it logs a batch, and
    an idle decode shows its last busy batch for up to 30 s: summed over decodes each busy a
    fraction of the time, it read 12 sequences where 3 were decoding, and the demo's chat
    held 9 decodes for them where 4 served (the replay, which counts them exactly, held 4-5).
    A request that is not streamed sends its first chunk at 50 tokens and adds
    nothing before it: there the bound reads low, and the load model's need stands."""
    now, decode = observation.now_seconds, observation.decode
    sequences = fresh(decode.running_requests, now, cfg.max_age_seconds)
    decoded = fresh(decode.decoding_requests, now, cfg.max_age_seconds)
    if sequences is not None and decoded is not None:
        sequences = min(sequences, decoded)
    if sequences is None or sequences <= 0:
        return 0
    model = cfg.model
    context = model.decode_mean_context(load)
    batch = model.decode_batch_at_slo(cfg.slo.tpot_seconds, context)
    if batch <= 0:
        return 0  # the target cannot be met at any batch: the load model says so already
    ready = observation.decode.ready
    tpot_now = model.tpot_seconds(sequences / ready, context) if ready > 0 else 0.0
    if tpot_now > cfg.slo.tpot_seconds and load.rate_rps > 0:
        at_target = sequences * cfg.slo.tpot_seconds / tpot_now
        residence_seconds = sequences / load.rate_rps
        lead_seconds = model.profile.warmup.new_node_seconds
        sequences = at_target + (sequences - at_target) * math.exp(-lead_seconds / residence_seconds)
    per_instance = batch * cfg.decode_utilization / model.calibration.decode_headroom
    return math.ceil(round(sequences / per_instance, 9))
