"""User-stated schedules: windows of minimum instances, read on the wall clock.

A :class:`ScheduledFloor` is KEDA's cron scaler for a PDCluster: a window opens at each
occurrence of ``start`` and closes at the next occurrence of ``end`` (two standard 5-field
cron expressions, read in the IANA ``timezone``), and while it is open each role keeps at
least its minimum. Open at ``t`` means what KEDA's ``IsActive`` computes: the next ``end``
after ``t`` comes no later than the next ``start`` after ``t`` (so a window is ``[start,
end)``, and one whose ``end`` has no occurrence left never opens).

Everything here is pure: the floor in effect at Unix time ``t`` is a function of the
schedules and ``t`` alone. The cron arithmetic (fields, names, ranges, steps, months'
lengths, daylight-saving transitions as Debian's cron handles them) is cronsim's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

#: a cron expression here has exactly the standard five fields (minute hour day-of-month month
#: day-of-week), as KEDA's cron scaler reads them; no seconds field, no ``@daily``
CRON_FIELDS = 5


def cron_problem(expr: object) -> str | None:
    """Why ``expr`` is not a standard 5-field cron expression (None: it is one)."""
    if not isinstance(expr, str):
        return f"a cron expression must be a string, got {type(expr).__name__}"
    fields = expr.split()
    if len(fields) != CRON_FIELDS:
        return (f"{expr!r} has {len(fields)} field(s); a cron expression here has 5: "
                "minute hour day-of-month month day-of-week (e.g. '0 9 * * 1-5')")
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except (CronSimError, ValueError) as exc:  # ValueError: cronsim's int() of a bad token
        return f"{expr!r} is not a valid cron expression ({exc})"
    return None


def timezone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone this machine knows (None: it is one)."""
    if not isinstance(name, str) or not name:
        return "a time zone must be a non-empty IANA name such as 'Europe/Paris' or 'UTC'"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"{name!r} is not an IANA time zone (e.g. 'UTC', 'America/New_York', 'Asia/Kolkata')"
    return None


@dataclass(frozen=True)
class ScheduledFloor:
    """A window of minimum instances (``spec.planner.schedules[]``).

    ``start``/``end``: 5-field cron expressions; ``timezone``: IANA name they are read in;
    ``min_prefill``/``min_decode``: instances each role keeps at least while the window is
    open (0: no floor for that role). Checked on construction: ValueError names the field."""

    name: str
    start: str
    end: str
    timezone: str = "UTC"
    min_prefill: int = 0
    min_decode: int = 0

    def __post_init__(self) -> None:
        for field in ("start", "end"):
            if (why := cron_problem(getattr(self, field))) is not None:
                raise ValueError(f"ScheduledFloor {self.name!r}.{field}: {why}")
        if (why := timezone_problem(self.timezone)) is not None:
            raise ValueError(f"ScheduledFloor {self.name!r}.timezone: {why}")
        if " ".join(self.start.split()) == " ".join(self.end.split()):
            raise ValueError(f"ScheduledFloor {self.name!r}: start and end must differ")
        for field in ("min_prefill", "min_decode"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ScheduledFloor {self.name!r}.{field} must be an integer >= 0, "
                                 f"got {value!r}")

    def describe(self) -> str:
        """The clause a decision carries while this floor binds."""
        mins = [f"{role} >= {n}" for role, n in (("prefill", self.min_prefill),
                                                 ("decode", self.min_decode)) if n > 0]
        return f"scheduled floor {self.name!r}: {', '.join(mins) or 'no minimum'}"


def _occurrences(expr: str, after: datetime) -> Iterator[datetime]:
    """Occurrences of ``expr`` strictly after ``after``, in order (none past cronsim's
    50-year search)."""
    it = CronSim(expr, after)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return


def open_during(floor: ScheduledFloor, starts: Sequence[float], length_seconds: float = 0.0
                ) -> list[bool]:
    """Whether ``floor``'s window is open at some moment of each ``[t, t + length_seconds)``
    (``starts``: increasing Unix times; length 0: at ``t`` itself).

    Open at ``t``: the next ``end`` after ``t`` is no later than the next ``start`` after it
    (KEDA's rule). An interval also counts when a ``start`` falls inside it, so that a window
    shorter than a planning interval, or opening within one, is planned for."""
    if not starts:
        return []
    if any(b < a for a, b in itertools.pairwise(starts)):
        raise ValueError("open_during: starts must be increasing")
    tz = ZoneInfo(floor.timezone)
    # cronsim yields the occurrences strictly after its origin (seconds truncated, then one
    # tick): exactly the "next after t" that KEDA compares
    begin = datetime.fromtimestamp(starts[0], tz)
    s_it, e_it = _occurrences(floor.start, begin), _occurrences(floor.end, begin)
    next_start, next_end = next(s_it, None), next(e_it, None)
    out = []
    for t in starts:
        while next_start is not None and next_start.timestamp() <= t:
            next_start = next(s_it, None)
        while next_end is not None and next_end.timestamp() <= t:
            next_end = next(e_it, None)
        is_open = next_end is not None and (next_start is None or next_end <= next_start)
        opens = next_start is not None and next_start.timestamp() < t + length_seconds
        out.append(is_open or opens)
    return out


@dataclass(frozen=True)
class Floors:
    """The scheduled minimums over a run of intervals: ``prefill[k]``/``decode[k]`` the
    highest minimum of the windows open during interval ``k``, ``names[k]`` those windows."""

    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    names: tuple[tuple[str, ...], ...]


def floors_over(schedules: Sequence[ScheduledFloor], starts: Sequence[float],
                length_seconds: float = 0.0) -> Floors:
    """For each interval ``[t, t + length_seconds)`` of ``starts`` (Unix seconds,
    increasing), the highest minimum per role of the ``schedules`` open during it (0 where
    none is) and their names. Pure: a function of the schedules and the times alone."""
    n = len(starts)
    p, d = [0] * n, [0] * n
    names: list[list[str]] = [[] for _ in range(n)]
    for floor in schedules:
        for k, is_open in enumerate(open_during(floor, starts, length_seconds)):
            if is_open:
                p[k] = max(p[k], floor.min_prefill)
                d[k] = max(d[k], floor.min_decode)
                names[k].append(floor.name)
    return Floors(tuple(p), tuple(d), tuple(tuple(x) for x in names))


def floor_at(schedules: Sequence[ScheduledFloor], unix_seconds: float
             ) -> tuple[int, int, tuple[ScheduledFloor, ...]]:
    """(prefill, decode) minimums in effect at ``unix_seconds`` and the windows open then."""
    open_now = tuple(f for f in schedules if open_during(f, [unix_seconds])[0])
    return (max((f.min_prefill for f in open_now), default=0),
            max((f.min_decode for f in open_now), default=0), open_now)
