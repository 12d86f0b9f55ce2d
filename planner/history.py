"""What the planner remembers between calls (pure data: recent loads, decisions and the
online calibration)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .decision import Decision
from .model import Calibration, Load
from .observe import (
    Reading,
)
from .seasonal import SeasonalMemory


@dataclass(frozen=True)
class History:
    """What the planner remembers between calls: recent loads and decisions (oldest first)."""

    loads: tuple[Load | None, ...] = ()
    decisions: tuple[Decision, ...] = ()
    #: the model's online correction learned from past intervals' metrics (None: not yet,
    #: the configured model's own)
    calibration: Calibration | None = None
    #: the last observation's prefill queue (requests), for the next interval's throughput
    #: (calibration.samples); None: not known (a restored memory learns again from the next)
    prefill_queue: Reading | None = None
    #: keep at most this many entries
    max_len: int = 4096
    #: the request rate per ten minutes of the wall clock over the last days (bounded:
    #: ``seasonal.MAX_DAYS``), what the forecast's seasonal index is learned from
    season: SeasonalMemory = field(default_factory=SeasonalMemory)

    def record(self, load: Load | None, decision: Decision) -> History:
        """A new history with this interval appended (pure: the old one is unchanged)."""
        return replace(
            self,
            loads=(*self.loads, load)[-self.max_len :],
            decisions=(*self.decisions, decision)[-self.max_len :],
        )
