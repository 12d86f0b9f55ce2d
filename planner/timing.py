"""When capacity serves and leaves, in planning intervals: warm-ups of a new node and of a
role switch, drains, and the warm-ups already under way."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import PlannerConfig
from .model import Load
from .observe import (
    Observation,
)


def _intervals(seconds: float, interval: float) -> int:
    return max(0, math.ceil(seconds / interval - 1e-9))


# -- timing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Timing:
    """The fleet now and what takes time, in intervals of ``interval`` seconds. Per-role pairs
    and rows are (prefill, decode)."""

    interval: float
    #: seconds a removed instance keeps its node: a prefill queue empties in seconds; decode
    #: as configured, or 2x the mean output at the TPOT target
    drain_seconds: tuple[float, float]
    drain_intervals: tuple[int, int]
    #: intervals from ordering a new node to its serving
    new_node: int
    #: intervals from switching a node into a role to its serving: drain of the other role,
    #: then the role-switch warm-up
    switch_in: tuple[int, int]
    ready: np.ndarray
    #: ready + warming per role
    committed0: np.ndarray
    #: shape (2, H): warm-ups already under way that serve by interval t
    landing: np.ndarray
    #: nodes held by instances of either role draining now
    draining: int


def _timing(cfg: PlannerConfig, observation: Observation, now: float, first: Load, H: int) -> _Timing:
    """Warm-ups and drains in whole intervals (rounded up), from the profile, the config and
    ``first``, the load of the first interval; and the fleet as observed at ``now``."""
    model, dt = cfg.model, cfg.interval_seconds
    prof = model.profile
    osl = first.mean_output_tokens
    drain_d_s = (
        cfg.decode_drain_seconds
        if cfg.decode_drain_seconds is not None
        else 2.0 * osl * cfg.slo.tpot_seconds
    )
    drain_p_s = model.prefill_service_seconds(first)  # a prefill queue empties in seconds
    P, D = observation.prefill, observation.decode
    # pre-existing warm-ups landing by interval t
    landing = np.zeros((2, H))
    for r, st in enumerate((P, D)):
        for w in st.warming:
            k = _intervals(w.ready_at_seconds - now, dt)
            if k < H:
                landing[r, k:] += 1
    return _Timing(
        interval=dt,
        drain_seconds=(drain_p_s, drain_d_s),
        drain_intervals=(_intervals(drain_p_s, dt), _intervals(drain_d_s, dt)),
        new_node=_intervals(prof.warmup.new_node_seconds, dt),
        # switch into role r: drain of the other role, then the role-switch warm-up
        switch_in=(
            _intervals(drain_d_s + prof.warmup.role_switch_seconds, dt),
            _intervals(drain_p_s + prof.warmup.role_switch_seconds, dt),
        ),
        ready=np.array([P.ready, D.ready], dtype=float),
        committed0=np.array([P.committed, D.committed], dtype=float),
        landing=landing,
        draining=P.draining * cfg.nodes_per_instance[0] + D.draining * cfg.nodes_per_instance[1],
    )
