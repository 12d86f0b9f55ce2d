"""Seasonality from history: the load's time-of-day profile, learned from earlier days.

The planner sees a load change only once it happens, and capacity ordered then serves a
warm-up later. Much of a service's load change is the same every day (the morning rise, the
evening peak), and what the earlier days did at this time of day says what the next minutes
will do before they come. This module keeps the memory that says it, and turns it into a
seasonal index the forecast divides out and multiplies back in (``solve._lead_forecast``):

    seasonal index  s(tau) = the rate at time of day tau over the day's typical rate,
                             the median over the earlier days (each day by its own level)
    forecast        rate(t + k) = F(x / s)(t + k) * s(t + k)

with F the planner's own forecast (recent max, trend, rise margin over the lead) run on the
seasonally adjusted series x / s. The level always comes from the last minutes; earlier days
give only the shape. The rise margin is then learned from what the *shape* did not predict:
a rise that comes every morning is in the forecast, not in the risk priced on top of it.

Robust by construction, and cheap (a few thousand numbers a PDCluster, a median a plan):

- Memory: one mean rate per ``bucket_seconds`` (10 minutes) of the wall clock, at most
  ``MAX_DAYS`` days (4,032 numbers, about 32 kB of JSON): bounded whatever the interval.
- Days: the profile is made of earlier whole days only (UTC days of the planner's clock),
  never of today's (no day explains itself). A day with less than ``MIN_DAY_COVERAGE`` of its
  buckets known (an outage, a gap in the data, the first day) is left out.
- Level: each day is divided by its own median before the days are compared, so a holiday
  (a quiet day) or growth (a busier week) moves no bucket of the shape.
- Shape: per bucket, the median over the days, so a day of another shape is outvoted once
  three days are known. Unknown and zero buckets (Prometheus gaps, released-data gaps)
  are skipped, never read as zero, and the profile is interpolated over them.
- Trust: the shape is shrunk towards flat as far as the days disagree on it (a
  positive-part James-Stein weight: 1 - the variance of the median over the days, against
  the shape's own variance), smoothed over three buckets, and bounded to [1/4, 4] so that
  the adjusted series stays finite over a near-idle night. Days that do not agree (a series
  without a daily pattern) give no profile at all.
- Fewer than two earlier whole days (a single day's shape is not yet a pattern, and its
  spread is unknown): no profile, and the forecast is exactly what it is without this
  module (the index is 1 everywhere).

Weekly: a day-of-week factor on top of the daily shape (``_weekly``). Each earlier day's
level (its median) over the median level of the days around it (three either side: a busier
week, growth, is not a weekday), in logs; per weekday the mean over the earlier weeks; shrunk
towards 1 as far as the same weekdays disagree (the same James-Stein weight, the noise the
spread of the same weekday's days pooled over the weekdays seen twice). It needs
``WEEKLY_MIN_DAYS`` usable earlier days (a week and a day: every weekday once and one twice,
the least from which that spread is known); with fewer, no factor and the index is the daily
profile's alone. Within a day the factor is one constant and cancels out of the forecast
(the level comes from the last minutes): it moves only a forecast whose minutes cross a
midnight, where the index passes from one weekday's factor to the next's (linearly, between
the two buckets' centres). Whether that step is real is for the data to say: in ``auto``
the factor is used only where it forecast the memory's own held-out midnights better than
the daily profile alone (:func:`_weekly_helps`).
"""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

DAY_SECONDS = 86400.0
#: the memory's bucket: ten minutes (the rate series' windows; 144 a day)
BUCKET_SECONDS = 600.0
#: days the memory keeps (and a first plan asks Prometheus for): four weeks, so that the
#: weekly factor sees each weekday up to four times (4,032 numbers)
MAX_DAYS = 28
#: usable earlier whole days the weekly factor needs: a week and a day (every weekday once,
#: one twice: the least from which the same weekday's spread is known)
WEEKLY_MIN_DAYS = 8
#: ``weekly`` settings of :meth:`SeasonalMemory.profile`: auto (only where it forecast the
#: memory's own held-out midnights better), on, off
WEEKLY_MODES = ("auto", "on", "off")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
#: a day enters the profile with at least this share of its buckets known
MIN_DAY_COVERAGE = 0.5
#: the index's bounds (an idle night's ratio would make the adjusted series explode)
INDEX_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True)
class SeasonalMemory:
    """The mean request rate per wall-clock bucket, oldest first (pure data).

    ``start_seconds`` is the Unix time at which ``rates[0]``'s bucket starts (a multiple of
    ``bucket_seconds``; None while empty); ``count`` the observations averaged into the last
    bucket so far; ``seeded`` whether the earlier days were asked of Prometheus already."""

    bucket_seconds: float = BUCKET_SECONDS
    start_seconds: float | None = None
    rates: tuple[float | None, ...] = ()
    count: int = 0
    max_days: int = MAX_DAYS
    seeded: bool = False

    @property
    def max_buckets(self) -> int:
        return int(self.max_days * DAY_SECONDS // self.bucket_seconds)

    def _bucket(self, unix_seconds: float) -> int:
        return math.floor(unix_seconds / self.bucket_seconds + 1e-9)

    def record(self, unix_seconds: float, rate_rps: float | None) -> SeasonalMemory:
        """This memory with the rate observed in the interval ending at ``unix_seconds``
        averaged into its bucket (pure). An unknown or non-finite rate, or a time before the
        last bucket (a clock that went back), changes nothing."""
        if rate_rps is None or not math.isfinite(rate_rps) or rate_rps < 0 or not math.isfinite(unix_seconds):
            return self
        b = self._bucket(unix_seconds)
        if self.start_seconds is None or not self.rates:
            return replace(self, start_seconds=b * self.bucket_seconds, rates=(rate_rps,), count=1)
        last = self._bucket(self.start_seconds) + len(self.rates) - 1
        if b < last:
            return self
        if b == last:
            prev = self.rates[-1]
            n = self.count if prev is not None else 0
            mean = rate_rps if prev is None else (prev * n + rate_rps) / (n + 1)
            return replace(self, rates=(*self.rates[:-1], mean), count=n + 1)
        rates = (*self.rates, *([None] * (b - last - 1)), rate_rps)
        return self._trimmed(rates, 1)

    def _trimmed(self, rates: tuple[float | None, ...], count: int) -> SeasonalMemory:
        assert self.start_seconds is not None
        drop = max(0, len(rates) - self.max_buckets)
        return replace(self, rates=rates[drop:], count=count,
                       start_seconds=self.start_seconds + drop * self.bucket_seconds)

    def with_earlier(self, points: Sequence[tuple[float, float]]) -> SeasonalMemory:
        """This memory with ``points`` = (Unix time a bucket *ends*, mean rate over the
        bucket), as a Prometheus range query at a step of one bucket answers, filled in
        where the memory knows nothing (what was observed live stands), and marked seeded.
        Points outside the kept days are dropped; bounded like :meth:`record`."""
        known: dict[int, float] = {}
        for end, rate in points:
            if math.isfinite(end) and rate is not None and math.isfinite(rate) and rate >= 0:
                known[self._bucket(end - self.bucket_seconds / 2)] = float(rate)
        if self.start_seconds is not None:
            first = self._bucket(self.start_seconds)
            for k, r in enumerate(self.rates):
                if r is not None:
                    known[first + k] = r
        if not known:
            return replace(self, seeded=True)
        lo, hi = min(known), max(known)
        lo = max(lo, hi - self.max_buckets + 1)
        rates = tuple(known.get(b) for b in range(lo, hi + 1))
        own_last = (None if self.start_seconds is None
                    else self._bucket(self.start_seconds) + len(self.rates) - 1)
        return replace(self, start_seconds=lo * self.bucket_seconds, rates=rates, seeded=True,
                       count=self.count if own_last == hi else 1)

    def profile(self, unix_now: float, weekly: str = "auto") -> SeasonalProfile | None:
        """The daily profile from the whole days before ``unix_now``'s, with the day-of-week
        factor by ``weekly`` (one of ``WEEKLY_MODES``; None: no profile usable)."""
        if self.start_seconds is None or not self.rates:
            return None
        per_day = round(DAY_SECONDS / self.bucket_seconds)
        if per_day < 3 or abs(per_day * self.bucket_seconds - DAY_SECONDS) > 1e-6:
            return None  # a bucket that does not divide a day has no time of day
        first = self._bucket(self.start_seconds)
        today = math.floor(unix_now / DAY_SECONDS)
        if weekly not in WEEKLY_MODES:
            raise ValueError(f"weekly must be one of {WEEKLY_MODES}, got {weekly!r}")
        # only the earlier whole days count: one profile a day, however often it is asked
        before = self.rates[: max(0, today * per_day - first)]
        return _profile(self.bucket_seconds, per_day, first, before, today, weekly)


@functools.lru_cache(maxsize=64)
def _profile(bucket_seconds: float, per_day: int, first: int, rates: tuple[float | None, ...],
             today: int, weekly: str) -> SeasonalProfile | None:
    """:meth:`SeasonalMemory.profile` of the ``rates`` before ``today`` (pure, cached)."""
    x = np.array([np.nan if r is None or r <= 0 else r for r in rates], dtype=float)
    if not len(x):
        return None
    days = (first + np.arange(len(x))) // per_day
    slots = (first + np.arange(len(x))) % per_day
    keep = days < today
    if not keep.any():
        return None
    d0 = int(days[keep].min())
    grid = np.full((today - d0, per_day), np.nan)
    grid[days[keep] - d0, slots[keep]] = x[keep]
    known = np.isfinite(grid).sum(axis=1)
    usable = known >= MIN_DAY_COVERAGE * per_day
    grid, day_ids = grid[usable], d0 + np.nonzero(usable)[0]
    if not len(grid):
        return None
    levels = np.nanmedian(grid, axis=1)
    grid = grid / levels[:, None]  # each day by its own level
    with warnings.catch_warnings():  # a bucket no day knew: nan, interpolated below
        warnings.simplefilter("ignore", RuntimeWarning)
        shape = np.nanmedian(grid, axis=0)
    ok = np.isfinite(shape)
    if ok.sum() < MIN_DAY_COVERAGE * per_day:
        return None
    if not ok.all():  # interpolate over buckets no day knew, around the clock
        idx = np.arange(per_day)
        shape = np.interp(idx, idx[ok], shape[ok], period=per_day)
    n = len(grid)
    w = _agreement(grid, shape)
    # a day's level for the weekly factor: its mean (a quieter weekend may differ only
    # through its peaks, which a median never sees)
    means = np.nanmean(grid, axis=1) * levels
    week = None if weekly == "off" else _weekly(day_ids, means)
    if week is not None and weekly == "auto" and not _weekly_helps(grid, day_ids, levels, means, shape):
        week = None
    if w <= 0.0 and week is None:
        return None  # the days do not agree on a shape: the plain forecast
    shape = 0.25 * np.roll(shape, 1) + 0.5 * shape + 0.25 * np.roll(shape, -1)
    shape = 1.0 + max(w, 0.0) * (shape / shape.mean() - 1.0)
    factors, weeks = week if week is not None else ((1.0,) * 7, (0,) * 7)
    return SeasonalProfile(bucket_seconds=bucket_seconds,
                           index=tuple(float(v) for v in np.clip(shape, *INDEX_BOUNDS)),
                           days=n if w > 0.0 else 0, weekly=factors, weeks=weeks)


def _agreement(grid: np.ndarray, shape: np.ndarray) -> float:
    """How far the days agree on ``shape`` (their per-bucket median): the positive-part
    James-Stein weight 1 - noise / signal, with signal the shape's mean squared deviation
    from flat and noise the variance of a median of n days, pi/2 x (the days' spread per
    bucket) / n, averaged over the buckets. 0 (no profile) for a single day, whose spread
    is unknown: a shape seen once is not yet a pattern."""
    n = len(grid)
    if n < 2:
        return 0.0
    level = shape.mean()
    signal = float(np.mean((shape / level - 1.0) ** 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        spread = np.nanvar(grid / level, axis=0, ddof=1)
    spread = spread[np.isfinite(spread)]
    if signal <= 0.0 or not len(spread):
        return 0.0
    noise = math.pi / 2.0 * float(spread.mean()) / n
    return max(0.0, 1.0 - noise / signal)


def weekday(unix_seconds: float) -> int:
    """The UTC weekday of a Unix time, Monday 0 (1970-01-01 was a Thursday)."""
    return (math.floor(unix_seconds / DAY_SECONDS) + 3) % 7


def _relative_levels(day_ids: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Each day's log level over the median log level of the usable days within three days
    of it (itself included): the day's level against its own week's, so that growth or a
    busier week is not read as a weekday."""
    logs = np.log(levels)
    lo = np.searchsorted(day_ids, day_ids - 3, side="left")  # day_ids ascend
    hi = np.searchsorted(day_ids, day_ids + 3, side="right")
    values = logs.tolist()
    out: np.ndarray = logs - np.array([statistics.median(values[a:b]) for a, b in zip(lo, hi, strict=True)])
    return out


def _weekly(day_ids: np.ndarray, levels: np.ndarray) -> tuple[tuple[float, ...], tuple[int, ...]] | None:
    """The day-of-week factor (Monday first) and the earlier days of each weekday it is
    learned from, or None with fewer than ``WEEKLY_MIN_DAYS`` usable days or no weekday seen
    twice. Per weekday: the mean relative log level (:func:`_relative_levels`) of its days,
    shrunk towards 0 by the positive-part James-Stein weight 1 - (noise / n_w) / signal,
    the noise the within-weekday variance pooled over the weekdays seen twice or more, the
    signal the mean square of the weekdays' means (centred). A weekday not seen: 1."""
    ok = np.isfinite(levels) & (levels > 0)
    day_ids, levels = day_ids[ok], levels[ok]
    if len(day_ids) < WEEKLY_MIN_DAYS:
        return None
    rel = _relative_levels(day_ids, levels)
    wd = (day_ids + 3) % 7
    counts = np.bincount(wd, minlength=7)
    means = np.array([rel[wd == k].mean() if counts[k] else 0.0 for k in range(7)])
    seen = counts > 0
    means[seen] -= means[seen].mean()
    dof = int(np.sum(counts[counts > 1] - 1))
    if dof < 1:
        return None  # the same weekday's spread is unknown: no factor
    noise = float(sum(np.sum((rel[wd == k] - rel[wd == k].mean()) ** 2)
                      for k in range(7) if counts[k] > 1)) / dof
    signal = float(np.mean(means[seen] ** 2))
    if signal <= 0.0:
        return None
    factors = []
    for k in range(7):
        weight = max(0.0, 1.0 - noise / counts[k] / signal) if counts[k] else 0.0
        factors.append(float(np.clip(math.exp(weight * means[k]), *INDEX_BOUNDS)))
    if all(abs(f - 1.0) < 1e-9 for f in factors):
        return None  # the weekdays do not agree: no factor
    return tuple(factors), tuple(int(c) for c in counts)


def _weekly_helps(grid: np.ndarray, day_ids: np.ndarray, levels: np.ndarray, means: np.ndarray,
                  shape: np.ndarray) -> bool:
    """Whether the weekly factor forecast the memory's own midnights better than the daily
    shape alone, held out: for each pair of consecutive usable days (d - 1, d) whose
    midnight buckets are known, the factor learned from the *other* days, and the step
    from d - 1's last bucket to d's first forecast as the shape's step times the factors'
    step. True when the summed absolute log error is lower with the factor over at least
    two such midnights (with fewer, nothing to tell by: the daily shape alone)."""
    err_with = err_without = 0.0
    tried = 0
    for k in range(1, len(day_ids)):
        if day_ids[k] != day_ids[k - 1] + 1:
            continue
        last, first = grid[k - 1, -1], grid[k, 0]
        if not (np.isfinite(last) and np.isfinite(first) and last > 0 and first > 0):
            continue
        rest = np.ones(len(day_ids), dtype=bool)
        rest[k - 1 : k + 1] = False
        week = _weekly(day_ids[rest], means[rest])
        if week is None:
            continue
        factors = week[0]
        seen = math.log(first * levels[k] / (last * levels[k - 1]))
        daily = math.log(shape[0] / shape[-1]) if shape[0] > 0 and shape[-1] > 0 else 0.0
        step = math.log(factors[(int(day_ids[k]) + 3) % 7] / factors[(int(day_ids[k - 1]) + 3) % 7])
        err_without += abs(seen - daily)
        err_with += abs(seen - daily - step)
        tried += 1
    return tried >= 2 and err_with < err_without


@dataclass(frozen=True)
class SeasonalProfile:
    """The daily seasonal index per bucket of the day (mean 1 before bounding), the number
    of earlier days it was learned from (0: flat, only the weekly factor), and the day-of-week
    factor (Monday first; ones without one) with the earlier days of each weekday."""

    bucket_seconds: float
    index: tuple[float, ...]
    days: int
    weekly: tuple[float, ...] = (1.0,) * 7
    weeks: tuple[int, ...] = (0,) * 7

    def at(self, unix_seconds: np.ndarray | Sequence[float]) -> np.ndarray:
        """The index at each time, linear between bucket centres (around midnight too), so
        that it never steps at a bucket's edge: a step would read as a ramp or a drop; times
        the weekly factor (:meth:`weekly_at`)."""
        per_day = len(self.index)
        t = np.asarray(unix_seconds, dtype=float)
        pos = np.mod(t, DAY_SECONDS) / self.bucket_seconds - 0.5
        idx = np.arange(per_day, dtype=float)
        out: np.ndarray = np.interp(pos, idx, np.asarray(self.index), period=per_day)
        weekly: np.ndarray = out * self.weekly_at(t)
        return weekly

    def weekly_at(self, unix_seconds: np.ndarray | Sequence[float]) -> np.ndarray:
        """The day-of-week factor at each time: its weekday's, passing linearly to the next
        day's between the centres of the buckets either side of midnight (ones without a
        weekly factor)."""
        t = np.asarray(unix_seconds, dtype=float)
        if all(f == 1.0 for f in self.weekly):
            return np.ones(t.shape)
        f = np.asarray(self.weekly)
        day = np.floor(t / DAY_SECONDS)
        frac = t / DAY_SECONDS - day
        half = self.bucket_seconds / DAY_SECONDS / 2.0
        wd = ((day + 3) % 7).astype(int)
        here = f[wd]
        before = f[(wd - 1) % 7]
        after = f[(wd + 1) % 7]
        out = here.copy()
        early, late = frac < half, frac > 1.0 - half
        a = (frac + half) / (2.0 * half)  # before midnight's bucket centre .. this day's first
        out[early] = (before + (here - before) * a)[early]
        b = (frac - (1.0 - half)) / (2.0 * half)
        out[late] = (here + (after - here) * b)[late]
        result: np.ndarray = out
        return result


def seasonal_times(unix_now: float, interval_seconds: float, past: int,
                   ahead: int) -> tuple[np.ndarray, np.ndarray]:
    """The middles of ``past`` intervals ending at ``unix_now`` and of ``ahead`` from it."""
    back = unix_now - (np.arange(past)[::-1] + 0.5) * interval_seconds
    fwd = unix_now + (np.arange(ahead) + 0.5) * interval_seconds
    return back, fwd


def seasonal_factors(profile: SeasonalProfile | None, unix_now: float, interval_seconds: float,
                     past: int, ahead: int) -> tuple[np.ndarray, np.ndarray]:
    """The index of ``past`` intervals ending at ``unix_now`` (oldest first; the last is the
    interval that just ended) and of the ``ahead`` intervals from it, each at its middle.
    Without a profile, ones: the forecast is the plain one."""
    if profile is None:
        return np.ones(past), np.ones(ahead)
    back, fwd = seasonal_times(unix_now, interval_seconds, past, ahead)
    return profile.at(back), profile.at(fwd)
