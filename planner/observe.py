"""What the planner sees each interval, with unknown values explicit.

A metric that could not be read, or is older than allowed, is ``None`` and never ``0``: a
failed Prometheus query read as zero load is how other planners scale a busy fleet to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class Reading:
    """One metric value and the time (seconds, same clock as ``now``) it was measured at."""

    value: float
    at_seconds: float

    def fresh(self, now_seconds: float, max_age_seconds: float) -> float | None:
        """The value, or ``None`` (unknown) when it is older than ``max_age_seconds``."""
        return self.value if now_seconds - self.at_seconds <= max_age_seconds else None


@dataclass(frozen=True)
class Warming:
    """An instance being started or switched: it will serve at ``ready_at_seconds``."""

    ready_at_seconds: float
    role_switch: bool = False


@dataclass(frozen=True)
class RoleState:
    """Instances of one role by state, plus that role's queue readings."""

    ready: int = 0
    warming: tuple[Warming, ...] = ()
    draining: int = 0
    #: ready instances that became ready recently (their first passes are not yet warm)
    recently_ready: int = 0
    queue_depth: Reading | None = None
    running_requests: Reading | None = None

    @property
    def provisioned(self) -> int:
        """Instances that hold a node: ready, warming and draining (all of them cost)."""
        return self.ready + len(self.warming) + self.draining

    @property
    def committed(self) -> int:
        """Instances that serve now or will serve without a new command (ready + warming)."""
        return self.ready + len(self.warming)


@dataclass(frozen=True)
class Observation:
    """Everything measured about one interval; each reading may be missing.

    Rates in requests/s, lengths in tokens, latencies in seconds, ``prefix_hit_rate`` in [0, 1]
    as a share of prompt tokens."""

    now_seconds: float
    rate_rps: Reading | None = None
    #: highest arrival rate over a 5 s sub-window of the interval (model.PEAK_WINDOW_SECONDS)
    peak_rate_rps: Reading | None = None
    mean_input_tokens: Reading | None = None
    mean_output_tokens: Reading | None = None
    prefix_hit_rate: Reading | None = None
    ttft_p50_seconds: Reading | None = None
    ttft_p99_seconds: Reading | None = None
    tpot_p50_seconds: Reading | None = None
    tpot_p99_seconds: Reading | None = None
    prefill: RoleState = field(default_factory=RoleState)
    decode: RoleState = field(default_factory=RoleState)

    def role(self, role: Role) -> RoleState:
        return self.prefill if role is Role.PREFILL else self.decode
