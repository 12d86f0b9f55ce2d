"""What the planner remembers between calls (pure data: recent loads, decisions and the
online calibration)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

from .decision import Decision
from .model import Calibration, Load
from .observe import (
    Reading,
)
from .seasonal import SeasonalMemory

T = TypeVar("T")


def _last(xs: tuple[T, ...], n: int) -> tuple[T, ...]:
    """The last ``n`` of ``xs`` (none for ``n`` <= 0)."""
    return xs[max(0, len(xs) - n) :] if n > 0 else ()


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
    #: the request rates of the intervals before ``loads`` (oldest first; None: not known),
    #: one per interval: what the risk over the lead (``solve.lead_margin``) is learned from
    #: beyond the loads kept whole. The operator's memory keeps a day of them at a number
    #: each (:meth:`bounded`), and a fresh install seeds them from Prometheus, so that a
    #: planner learns the risk from the day the replay learns it from, not from its own
    #: first two hours
    earlier_rates: tuple[float | None, ...] = ()

    def rates(self) -> tuple[float | None, ...]:
        """The request rate of every interval remembered, oldest first: ``earlier_rates``
        then the loads'."""
        return (*self.earlier_rates, *(None if x is None else x.rate_rps for x in self.loads))

    def bounded(self, loads: int, rates: int) -> History:
        """This history as a memory of at most ``loads`` whole loads and decisions, and of
        the request rates of up to ``rates`` intervals in all (those of the loads kept
        included): an older load keeps only its rate, in ``earlier_rates``."""
        kept = _last(self.loads, loads)
        every = self.rates()
        older = every[: len(every) - len(kept)]
        return replace(self, loads=kept, decisions=_last(self.decisions, loads),
                       earlier_rates=_last(older, rates - len(kept)))

    def record(self, load: Load | None, decision: Decision) -> History:
        """A new history with this interval appended (pure: the old one is unchanged)."""
        return replace(
            self,
            loads=(*self.loads, load)[-self.max_len :],
            decisions=(*self.decisions, decision)[-self.max_len :],
        )
