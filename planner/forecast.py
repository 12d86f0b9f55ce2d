"""Forecast of a per-interval series (request rate, lengths) over the planning horizon.

A few simple, robust methods; which one the planner uses is chosen by measured error on the
shared traces (``bench/forecast_bench.py``), not by fashion. Unknown intervals (``None``) are
skipped, never read as zero."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METHODS = ("last", "moving-average", "ewma", "holt", "seasonal-naive", "recent-max", "trend")

#: ``trend``: the slope counts only when it is this many standard errors above zero (a
#: steady rate's Poisson noise makes slopes too; planning for them adds nodes to remove later)
TREND_MIN_T = 2.0
#: ``trend``: the extrapolation's damping per interval; the whole extrapolation is at most
#: damping / (1 - damping) = 4 intervals of the slope, however long the horizon
TREND_DAMPING = 0.8
#: ``trend``: a rise whose largest single-interval jump is more than this share of the rise
#: over the window is a step, not a ramp: it is over once seen, and extrapolating it would
#: order a second step that never comes (2x step: 74 instances at peak against the oracle's 45)
TREND_MAX_JUMP_SHARE = 0.7


@dataclass(frozen=True)
class LeadRisk:
    """How one role's forecast was priced against the risk of the lead (capacity ordered now
    serves ``lead`` intervals later), for the decision's explanation."""

    #: the risk quantile sized for (0: off, the plain forecast)
    quantile: float
    #: intervals from ordering to serving: warm-up + one interval
    lead: int
    #: independent leads the history holds (load changes over the lead seen so far)
    samples: int = 0
    #: whether they were enough to learn from (else the bound is ``max_rise_margin`` and the
    #: margin the prior)
    learned: bool = False
    #: the quantile of load(t + lead) / recent max(t): how far a ramp is carried
    bound: float = 1.0
    #: the quantile of what the forecast missed at the lead: multiplies the forecast
    margin: float = 1.0
    #: whether a ramp under way, carried to the lead, sized it (above the margin's forecast)
    carried: bool = False
    #: the recent max rate (req/s of the planned shape)
    base_rps: float = 0.0
    #: the rate sized for at the lead
    at_lead_rps: float = 0.0
    #: the daily profile's index at the lead over its index now (1: flat, or no profile)
    seasonal: float = 1.0
    #: earlier days the profile was learned from (0: none, the plain forecast)
    season_days: int = 0
    #: the day-of-week factor's part of ``seasonal`` (1: none, or no midnight within the lead)
    weekly: float = 1.0
    #: the weekday at the lead (Monday 0) and the earlier days of it the factor is learned from
    weekday: int = 0
    season_weeks: int = 0


def _known(history: Sequence[float | None]) -> list[float]:
    return [x for x in history if x is not None and math.isfinite(x)]


def forecast(
    history: Sequence[float | None],
    horizon: int,
    *,
    method: str = "holt",
    window: int = 5,
    alpha: float = 0.5,
    beta: float = 0.2,
    damping: float = 0.9,
    period: int = 0,
    lead: int = 0,
    cap: float = math.inf,
) -> list[float] | None:
    """Predict the next ``horizon`` values of a series; ``None`` when nothing is known.

    Parameters
    ----------
    history : past values, oldest first, one per interval; ``None`` = unknown.
    horizon : number of future intervals to predict.
    method : ``last``; ``moving-average`` over ``window``; ``ewma`` with weight ``alpha``;
        ``holt`` (level + damped trend, ``alpha``/``beta``/``damping``);
        ``seasonal-naive`` (value one ``period`` ago, falls back to ``holt`` when the history
        is shorter); ``recent-max`` (max of the last ``window``: conservative); ``trend``
        (``recent-max`` plus a bounded, damped trend: :func:`bounded_trend`; with ``lead`` > 0
        the rising slope carried to ``lead`` intervals ahead, at most ``cap`` times the recent
        max: :func:`ramp_projection`).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    xs = _known(history)
    if not xs:
        return None
    if method == "last":
        return [xs[-1]] * horizon
    if method == "moving-average":
        tail = xs[-window:]
        return [sum(tail) / len(tail)] * horizon
    if method == "recent-max":
        return [max(xs[-window:])] * horizon
    if method == "trend" and lead > 0:
        return ramp_projection(xs, horizon, lead=lead, window=window, cap=cap)
    if method == "trend":
        return bounded_trend(xs, horizon, window=window)
    if method == "ewma":
        level = xs[0]
        for x in xs[1:]:
            level += alpha * (x - level)
        return [level] * horizon
    if method == "seasonal-naive" and period > 0 and len(history) >= period + horizon:
        # the same intervals one period ago, skipping unknowns by falling back to holt
        base = history[len(history) - period : len(history) - period + horizon]
        fallback = _holt(xs, horizon, alpha, beta, damping)
        return [b if b is not None else f for b, f in zip(base, fallback, strict=True)]
    return _holt(xs, horizon, alpha, beta, damping)


def significant_slope(xs: Sequence[float], *, min_t: float = TREND_MIN_T) -> float:
    """The least-squares slope of ``xs`` (per step) when it is rising by at least ``min_t``
    standard errors and no single jump makes most of the rise (a step), else 0. A falling
    slope is 0 too: scale-down waits for the load itself (the stabilisation window), it is
    never planned ahead on a trend."""
    if len(xs) < 3:
        return 0.0
    return float(_significant_slopes(np.asarray([xs], dtype=float), min_t)[0])


def _significant_slopes(windows: np.ndarray, min_t: float = TREND_MIN_T) -> np.ndarray:
    """:func:`significant_slope` of each row of ``windows`` (nan rows: 0), vectorised."""
    n = windows.shape[1]
    t = np.arange(n, dtype=float) - (n - 1) / 2.0
    sxx = float(t @ t)
    y = windows - windows.mean(axis=1, keepdims=True)
    slope = (y @ t) / sxx
    resid = y - slope[:, None] * t
    se = np.sqrt((resid * resid).sum(axis=1) / (n - 2) / sxx)
    jump = np.diff(windows, axis=1).max(axis=1)
    ok = (np.isfinite(slope) & (slope > 0) & (slope >= min_t * se)
          & (jump <= TREND_MAX_JUMP_SHARE * slope * (n - 1)))
    return np.where(ok, slope, 0.0)


def bounded_trend(
    xs: Sequence[float], horizon: int, *, window: int = 5, damping: float = TREND_DAMPING,
    min_t: float = TREND_MIN_T,
) -> list[float]:
    """``recent-max`` over ``window`` plus the window's significant rising slope, damped.

    Value at lead h: max(last window) + slope * (damping + damping^2 + ... + damping^h).
    - It leads a ramp instead of lagging it by a warm-up: two or three intervals into a ramp
      the slope is significant, and capacity is ordered for where the ramp is going.
    - It does not extrapolate a ramp past its end: the extrapolation is bounded by
      damping / (1 - damping) intervals of the slope whatever the lead, and the slope is the
      last ``window`` intervals' only, so it is gone ``window`` intervals after the ramp ends
      (sooner, when the flat points make it insignificant)."""
    tail = list(xs[-window:])
    base = max(tail)
    slope = significant_slope(tail, min_t=min_t)
    out, acc = [], 0.0
    for h in range(1, horizon + 1):
        acc += damping**h
        out.append(base + slope * acc)
    return out


def ramp_projection(
    xs: Sequence[float], horizon: int, *, lead: int, window: int = 5, cap: float = 2.0,
    min_t: float = TREND_MIN_T,
) -> list[float]:
    """``recent-max`` over ``window`` plus the window's significant rising slope carried to
    ``lead`` intervals ahead, then held: value at step h = max(last window) + slope * min(h, lead),
    never above ``cap`` times the recent max.

    Capacity ordered now serves a lead (warm-up + interval) later: during a ramp it is
    ordered for where the ramp will be then, not one interval's step at a time (issue 48's
    hour: 9 -> 12 -> 13 -> 14 -> 18 prefills, each landing ten minutes after its minute).
    ``cap`` bounds the projection by the rises the history has shown over the lead (the
    planner passes the risk quantile of :func:`lead_ratios`): a slope measured over five
    intervals is noisy, and a ramp is not carried past what the load has done before. The
    slope test (:func:`significant_slope`) keeps steps and steady noise flat, and the slope
    is the last ``window`` intervals' only: the projection is gone soon after a ramp ends."""
    tail = list(xs[-window:])
    base = max(tail)
    slope = significant_slope(tail, min_t=min_t)
    top = base * max(cap, 1.0)
    return [min(base + slope * min(h, lead), top) for h in range(1, horizon + 1)]


def lead_ratios(
    history: Sequence[float | None],
    *,
    lead: int,
    window: int = 5,
    method: str = "recent-max",
    stride: int = 1,
    cap: float | None = None,
) -> np.ndarray:
    """The observed distribution of load changes over ``lead`` intervals: for each past
    origin t, actual(t + lead) / forecast(t), the forecast being the max of
    history[t - window + 1 .. t] (``recent-max``), plus its damped significant slope
    (``trend``), or plus that slope carried to the lead and at most ``cap`` times the recent
    max (``trend`` with ``cap``: :func:`ramp_projection`). Origins with an unknown value or a
    zero forecast are skipped; ``stride`` > 1 keeps every ``stride``-th origin (the latest
    included). Oldest origin first."""
    xs = np.asarray([np.nan if x is None else x for x in history], dtype=float)
    if lead <= 0 or len(xs) - lead - window + 1 <= 0:
        return np.zeros(0)
    windows = np.lib.stride_tricks.sliding_window_view(xs[: len(xs) - lead], window)
    base = np.nanmax(np.where(np.isnan(windows), -np.inf, windows), axis=1)
    if method == "trend" and window >= 3:
        # the margin covers what the forecast in use misses: with a trend, a ramp already
        # extrapolated is no reason to raise every later forecast for it again
        slopes = _significant_slopes(windows)
        if cap is None:
            base = base + slopes * sum(TREND_DAMPING**h for h in range(1, lead + 1))
        else:
            base = np.minimum(base + slopes * lead, base * max(cap, 1.0))
    actual = xs[window - 1 + lead :]
    ok = np.isfinite(base) & np.isfinite(actual) & (base > 0)
    if stride > 1:
        keep = np.zeros(ok.shape, dtype=bool)
        keep[len(ok) - 1 :: -stride] = True
        ok &= keep
    return np.asarray(actual[ok] / base[ok])


def rise_margin(
    history: Sequence[float | None],
    *,
    lead: int,
    window: int = 5,
    quantile: float = 0.9,
    max_margin: float = 3.0,
    min_samples: int = 20,
    prior: float = 1.0,
    method: str = "recent-max",
    stride: int = 1,
    cap: float | None = None,
) -> float:
    """How much the rate has risen above a ``recent-max`` (or ``trend``: ``method``, with
    ``cap`` the ramp projection's bound) forecast ``lead`` intervals later.

    The ``quantile`` of actual(t + lead) / forecast(t) over the past (:func:`lead_ratios`):
    multiplying the forecast by it covers that share of the ramps seen so far (an empirical,
    self-calibrating prediction interval). ``prior`` until ``min_samples`` origins exist; never above
    ``max_margin`` (an idle-to-busy jump after an empty minute is not a ramp to plan for).

    ``stride`` > 1 takes every ``stride``-th origin only (the latest included): origins less
    than ``lead`` apart see the same rise, so one step seen from ``lead`` consecutive origins
    would count as ``lead`` samples, and an hour holding a single step would plan for a second
    one of the same size at every forecast after it. With ``stride = lead`` the samples are
    independent warm-ups, and ``min_samples`` counts warm-ups."""
    if lead <= 0:
        return 1.0
    ratios = lead_ratios(history, lead=lead, window=window, method=method, stride=stride, cap=cap)
    if len(ratios) < min_samples:
        return prior
    q = float(np.quantile(ratios, quantile))
    return min(max(q, 1.0), max_margin)


def _holt(xs: list[float], horizon: int, alpha: float, beta: float, damping: float) -> list[float]:
    level, trend = xs[0], 0.0
    for x in xs[1:]:
        prev = level
        level = alpha * x + (1 - alpha) * (level + damping * trend)
        trend = beta * (level - prev) + (1 - beta) * damping * trend
    out = []
    phi_sum = 0.0
    for h in range(1, horizon + 1):
        phi_sum += damping**h
        out.append(max(0.0, level + phi_sum * trend))
    return out


def backtest(
    series: Sequence[float],
    *,
    method: str,
    horizon: int,
    warmup: int = 5,
    **kwargs: float,
) -> dict[str, float]:
    """Rolling-origin error of ``method`` at lead ``horizon`` over ``series``.

    Returns the mean absolute error relative to the series mean (``rel_mae``), the 0.9
    pinball loss relative to the mean (``rel_pinball_q90``, the planner's criterion) and the
    share of under-forecasts by more than 10% (``under_10pct``): under-forecasting costs SLO,
    over-forecasting costs only GPU-hours."""
    errs: list[float] = []
    pinball: list[float] = []
    under = 0
    for origin in range(warmup, len(series) - horizon):
        pred = forecast(series[:origin], horizon, method=method, **kwargs)  # type: ignore[arg-type]
        if pred is None:
            continue
        actual = series[origin + horizon - 1]
        p = pred[-1]
        errs.append(abs(p - actual))
        # quantile (pinball) loss at 0.9: an under-forecast costs 9x an over-forecast
        pinball.append(max(0.9 * (actual - p), 0.1 * (p - actual)))
        if p < 0.9 * actual:
            under += 1
    mean = sum(series) / len(series) if series else 0.0
    n = max(len(errs), 1)
    return {
        "rel_mae": (sum(errs) / n) / mean if mean > 0 else 0.0,
        "rel_pinball_q90": (sum(pinball) / n) / mean if mean > 0 else 0.0,
        "under_10pct": under / n,
    }
