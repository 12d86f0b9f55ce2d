"""Seasonality from history, day by day: pdscale with and without its daily profile on the
multi-day rate series, each scored day replayed with the days before it as history.

For each series (ServeGen ``m-mid`` and ``m-small``, 14 days of 10-minute windows, Alibaba
Bailian) and each scored day d:

- the trace is day d at real time, Poisson arrivals at the windows' rates with Mooncake
  lengths (``synthesize_from_rates``, seed d), from ten minutes before midnight: those ten
  minutes are the planner's load history and size the start fleet (``start_from
  "history"``), the day itself is scored;
- the whole series is scaled once so that its busiest window is ``--peak-rps`` (a service's
  days keep their levels); zero windows of the scored day are gaps in the released data
  (ServeGen's README) and take the mean of their neighbours, as ``policy_bench.one_day``;
- the planner's seasonal memory holds the windows of the days before d (at most 14), as the
  operator seeds it from Prometheus on a first plan; their zero windows are left as they are
  (the profile skips them: robustness to gaps is part of what is measured);
- the two rows differ only in ``PlannerConfig.seasonality`` (``spec.planner.seasonality``
  Auto / Off). Day 0 has no earlier day: both rows must be identical there.

The planner is the operator's configuration for ``bench/policy_bench_pdcluster.yaml`` (TTFT
15 s, TPOT 50 ms at p99, 600 s warm-ups, 60 s interval) on the deployed stack. Prints a table
and writes ``out/season_bench.json``.

    nice -n 10 .venv/bin/python bench/season_bench.py [--series m-small,m-mid] [--days 1,2,3] [--forecast-only]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pdscale.planner.replay.run import (
    STACKS,
    ReplaySetup,
    rates_before,
    run_policy,
    season_before,
    start_from,
)
from pdscale.planner.replay.traces import read_mooncake, read_rate_series, synthesize_from_rates
from pdscale.planner.seasonal import MAX_DAYS
from pdscale.replay import configure, read_spec
from pdscale.replay_setup import router_admission, routing

SHARED = Path("/work/shared/traces")
MOONCAKE = SHARED / "mooncake/conversation_trace.jsonl"
SERIES = {"m-mid": SHARED / "servegen/m-mid_rate.csv", "m-small": SHARED / "servegen/m-small_rate.csv"}
PDCLUSTER = Path(__file__).with_name("policy_bench_pdcluster.yaml")
OUT = Path(__file__).parents[1] / "out"
DAY = 86400.0
#: the history before the scored day: one warm-up (the profile's 600 s)
LEAD_IN = 600.0
#: the arms: (PlannerConfig.seasonality, PlannerConfig.weekly_seasonality). "with" is Auto as
#: shipped (the daily profile, the day-of-week factor where the memory's own held-out
#: midnights say it helps); "daily" the daily profile alone; "weekly" the factor always
ARMS = {"without": (False, "off"), "daily": (True, "off"), "with": (True, "auto"),
        "weekly": (True, "on")}
#: the forecast-only mode's midnight origins: every minute of the scored day's last 20
#: (those whose lead crosses into the next day, where the weekly factor acts)
MIDNIGHT_MINUTES = 20


def gaps_filled(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Zero windows take the mean of the nearest non-zero neighbours (gaps in the data)."""
    rates = [r for _, r in windows]
    out = []
    for k, (t, r) in enumerate(windows):
        if r == 0.0:
            before = next((x for x in reversed(rates[:k]) if x > 0), None)
            after = next((x for x in rates[k + 1:] if x > 0), None)
            known = [x for x in (before, after) if x is not None]
            r = sum(known) / len(known) if known else 0.0
        out.append((t, r))
    return out


def one_day(series: list[tuple[float, float]], day: int, lengths: Any, start_hour: float = 0.0) -> Any:
    """Day ``day`` (from ``start_hour`` on, 24 hours) with the ten minutes before it, gaps
    filled, clock from the lead-in."""
    lo, hi = day * DAY + start_hour * 3600.0 - LEAD_IN, (day + 1) * DAY + start_hour * 3600.0
    windows = gaps_filled([(t - lo, r) for t, r in series if lo <= t < hi])
    return synthesize_from_rates(windows, lengths, name=f"day{day}", seed=day)


def earlier_rates(series: list[tuple[float, float]], day: int, config: Any,
                  history_intervals: int, start_hour: float = 0.0) -> list[float | None]:
    """The per-interval rates before day ``day``'s lead-in that the operator would seed from
    Prometheus: ``rise_history_intervals`` in all with the lead-in's loads (gaps filled as
    the scored day's are; Poisson counts, seed 1000 + day)."""
    until = day * DAY + start_hour * 3600.0 - LEAD_IN
    span = config.rise_history_intervals * config.interval_seconds
    windows = gaps_filled([(t, r) for t, r in series if until - span - DAY <= t < until])
    return rates_before(windows, until_seconds=until, interval_seconds=config.interval_seconds,
                        intervals=config.rise_history_intervals - history_intervals, seed=1000 + day)


def forecast_day(series: list[tuple[float, float]], day: int, config: Any, *, arm: str,
                 seed: int) -> dict[str, Any]:
    """The planner's prefill rate forecast at the lead over one day, without the simulator:
    per-minute observed rates (Poisson counts at the windows' rates), the planner's own
    ``_lead_forecast`` from each ten-minute origin with one day of minutes as its history
    and the earlier days as its seasonal memory, against the true rate at the lead.
    Returns the share of origins forecast under the truth (what costs SLO)
    and the mean forecast over the truth (what costs GPU-hours); and the same with the
    mean absolute log error over the midnight origins (every minute of the day's last
    ``MIDNIGHT_MINUTES``, the next day's first minutes at the lead; none on the last day)."""
    import numpy as np

    from pdscale.planner.history import History
    from pdscale.planner.solve import forecast_rates, lead_intervals

    rng = np.random.default_rng(seed)
    dt = config.interval_seconds
    rate_at = dict(series)
    step = series[1][0] - series[0][0]

    def true(t: float) -> float:
        return rate_at.get(math.floor(t / step) * step, 0.0)

    on, weekly = ARMS[arm]
    cfg = replace(config, seasonality=on, weekly_seasonality=weekly, clock_origin_unix_seconds=0.0)
    lead = lead_intervals(cfg)
    H = cfg.horizon_intervals
    end = min((day + 1) * DAY + (H + 1) * dt, series[-1][0] + step)
    minutes = np.arange((day - 1) * DAY, end, dt)
    truth = np.array([true(t) for t in minutes])
    observed = rng.poisson(truth * dt) / dt
    memory = season_before(series, unix_start=0.0, until_unix=day * DAY)
    per_day = int(DAY / dt)

    def score(origins: Any) -> tuple[list[bool], list[float]]:
        under, ratio = [], []
        for k in origins:
            if k + H >= len(minutes):
                continue
            now = minutes[k] + dt  # the minute k just ended
            if truth[k] <= 0 or truth[k + lead] <= 0:
                continue  # a gap in the released data: no truth to score against
            seen = [float(x) for x in observed[k - per_day + 1 : k + 1]]
            rates = forecast_rates(cfg, seen, History(season=memory), now)
            actual = truth[k + lead]
            under.append(bool(rates[lead - 1] < actual))
            ratio.append(rates[lead - 1] / actual)
        return under, ratio

    under, ratio = score(range(per_day, 2 * per_day, int(600 / dt)))
    m_under, m_ratio = score(range(2 * per_day - int(MIDNIGHT_MINUTES * 60 / dt), 2 * per_day))
    return {"under": float(np.mean(under)), "mean_over_truth": float(np.mean(ratio)),
            "origins": len(under),
            "midnight_under": float(np.mean(m_under)) if m_under else None,
            "midnight_abs_log_error": float(np.mean(np.abs(np.log(m_ratio)))) if m_ratio else None,
            "midnight_origins": len(m_under)}


def weekly_used(series: list[tuple[float, float]], day: int) -> str:
    """Whether the day-of-week factor exists for day ``day`` (on) and whether Auto uses it:
    "auto" (learned and used), "on only" (learned, not used: the held-out midnights said
    no), "-" (too few days)."""
    memory = season_before(series, unix_start=0.0, until_unix=day * DAY)
    flat = (1.0,) * 7
    on = memory.profile(day * DAY + 1.0, weekly="on")
    if on is None or on.weekly == flat:
        return "-"
    auto = memory.profile(day * DAY + 1.0, weekly="auto")
    return "auto" if auto is not None and auto.weekly != flat else "on only"


def forecasts(args: Any, configured: Any, console: Console) -> None:
    """``--forecast-only``: :func:`forecast_day` for every day of every series, with and
    without seasonality; a table and ``out/season_forecast.json``."""
    out: dict[str, Any] = {}
    table = Table(title="the planner's prefill forecast at the lead (11 min), ten-minute origins "
                        "(under: share of origins forecast under the true rate; over: mean forecast / "
                        "truth); midnight: the day's last 20 one-minute origins, mean |log(forecast / "
                        "truth)|; arms: without / daily / with (Auto) / weekly (always)")
    for col in ("series", "day", "under", "over", "midnight |log err|", "weekly used"):
        table.add_column(col, justify="right")
    arms = ("without", "daily", "with", "weekly")

    def cells(row: dict[str, Any], key: str) -> str:
        return " / ".join("-" if row[a][key] is None else f"{row[a][key]:.3f}" for a in arms)

    for name in args.series.split(","):
        raw = read_rate_series(SERIES[name])
        scale = args.peak_rps / max(r for _, r in raw)
        series = [(t, r * scale) for t, r in raw]
        out[name] = {}
        for day in (int(d) for d in args.days.split(",") if int(d) >= 1):
            scored: dict[str, Any] = {arm: forecast_day(series, day, configured.config, arm=arm,
                                                        seed=day) for arm in arms}
            scored["weekly_used"] = weekly_used(series, day)
            out[name][str(day)] = scored
            table.add_row(name, str(day), cells(scored, "under"), cells(scored, "mean_over_truth"),
                          cells(scored, "midnight_abs_log_error"), scored["weekly_used"])
    console.print(table)
    path = OUT / "season_forecast.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    console.print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", default="m-small,m-mid")
    ap.add_argument("--days", default="0,1,2,3,4,5,6,7,8,9,10,11,12,13")
    ap.add_argument("--peak-rps", type=float, default=6.0,
                    help="the series' busiest window, scaled to this rate (req/s)")
    ap.add_argument("--out", default=str(OUT / "season_bench.json"))
    ap.add_argument("--merge", default="", metavar="A.json,B.json",
                    help="fold these earlier outputs (runs split over processes) into --out; "
                         "with --days '' only merge and print")
    ap.add_argument("--arms", default="without,with",
                    help="which arms to run, of " + ",".join(ARMS) + " (ARMS); a row already in "
                         "--out for another arm is kept (the off arm does not depend on the method)")
    ap.add_argument("--earlier-rates", choices=("on", "off"), default="on",
                    help="on (as the operator seeds them from Prometheus): the planner also "
                         "remembers the per-interval rates of the day before the scored one "
                         "(``History.earlier_rates``) and learns the risk over the lead from them "
                         "from the first minute; off: from the scored day's own loads, the "
                         "prior until ten leads are seen")
    ap.add_argument("--start-hour", type=float, default=0.0,
                    help="score 24 hours from this hour of each day (UTC of the series; 0: from "
                         "midnight): a planner installed at that hour")
    ap.add_argument("--forecast-only", action="store_true",
                    help="score the planner's rate forecast at the lead on every day instead of "
                         "replaying (seconds, not hours): out/season_forecast.json")
    args = ap.parse_args()
    console = Console(width=150)
    spec = read_spec(str(PDCLUSTER))
    configured = configure(spec, spec_source=f"file {PDCLUSTER.name}", overrides={"--slo-ttft": 15.0})
    if args.forecast_only:
        forecasts(args, configured, console)
        return
    stack = {**STACKS["deployed"], **routing(configured.spec)}
    lengths = read_mooncake(MOONCAKE)
    path = Path(args.out)
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for other in filter(None, args.merge.split(",")):
        for name, r in json.loads(Path(other).read_text()).items():
            days = results.setdefault(name, {**r, "days": {}})["days"]
            for day, got in r["days"].items():
                days.setdefault(day, {}).update(got)
    for name in args.series.split(",") if args.days else ():
        raw = read_rate_series(SERIES[name])
        scale = args.peak_rps / max(r for _, r in raw)
        series = [(t, r * scale) for t, r in raw]
        rows = results.setdefault(name, {"rate_scale": scale, "peak_rps": args.peak_rps, "days": {}})
        for day in (int(d) for d in args.days.split(",")):
            start = day * DAY + args.start_hour * 3600.0
            trace = one_day(series, day, lengths, args.start_hour)
            season = season_before(series, unix_start=0.0, until_unix=start)
            row: dict[str, Any] = rows["days"].setdefault(str(day), {})
            row.update(requests=len(trace), history_days=min(day, MAX_DAYS),
                       earlier_rates=args.earlier_rates, start_hour=args.start_hour,
                       weekly_used=weekly_used(series, day))
            for label, (on, weekly) in ARMS.items():
                if label not in args.arms.split(","):
                    continue
                planner = replace(configured.config, seasonality=on, weekly_seasonality=weekly,
                                  clock_origin_unix_seconds=start - LEAD_IN)
                setup = ReplaySetup(trace=trace, planner=planner, **stack,
                                    prefill_admission=router_admission(configured.spec))
                setup, history = start_from(setup, "history")
                earlier = (earlier_rates(series, day, planner, len(history), args.start_hour)
                           if args.earlier_rates == "on" else [])
                t = time.perf_counter()
                rep = run_policy(setup, "pdscale", history=history, season=season,
                                 earlier_rates=earlier)
                row[label] = {"slo_attainment": rep["slo_attainment"], "gpu_hours": rep["gpu_hours"],
                              "role_changes": rep["role_changes"],
                              "peak_instances": max((d["provisioned_prefill"] + d["provisioned_decode"]
                                                     for d in rep["decisions"]), default=0),
                              "wall_seconds": round(time.perf_counter() - t, 1)}
                console.print(f"{name} day {day} {label:>7} seasonality: attainment "
                              f"{rep['slo_attainment']:.4f}, {rep['gpu_hours']:.1f} GPU-h "
                              f"({time.perf_counter() - t:.0f} s)")
                path.parent.mkdir(exist_ok=True)
                path.write_text(json.dumps(results, indent=1))
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    table = Table(title=f"pdscale with and without seasonality, day by day (busiest window "
                        f"{args.peak_rps:g} req/s, TTFT 15 s, TPOT 50 ms at p99, deployed stack)")
    for col in ("series", "day", "history days", "weekly", "requests",
                *(f"{arm}: attain. / GPU-h" for arm in ARMS), "with - without"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        for day, row in sorted(r["days"].items(), key=lambda kv: int(kv[0])):
            arms = [f"{100 * row[a]['slo_attainment']:.2f}% / {row[a]['gpu_hours']:.1f}"
                    if a in row else "-" for a in ARMS]
            diff = "-"
            if "without" in row and "with" in row:
                a0, a1 = row["without"]["slo_attainment"], row["with"]["slo_attainment"]
                g0, g1 = row["without"]["gpu_hours"], row["with"]["gpu_hours"]
                diff = f"{100 * (a1 - a0):+.2f} pp / {100 * (g1 / g0 - 1):+.1f}%" if g0 else "-"
            table.add_row(name, day, str(row["history_days"]), row.get("weekly_used", "?"),
                          f"{row['requests']:,}", *arms, diff)
    console.print(table)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
