"""Which forecast method should the planner use? Measured, not chosen by fashion.

Rolling-origin backtest of every method in ``pdscale.planner.forecast`` on the request-rate
series of the shared traces, at the lead where a scale-up must be right (the new-node
warm-up: 10 one-minute intervals; one 600 s window for ServeGen). The planner's criterion is
the 0.9 pinball loss (an under-forecast costs SLO, 9x an over-forecast that costs GPU-hours);
MAE and the share of >10% under-forecasts are shown too. Writes out/forecast_bench.json.

    .venv/bin/python bench/forecast_bench.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pdscale.planner.forecast import METHODS, backtest
from pdscale.planner.replay.traces import read_azure, read_mooncake, read_rate_series

SHARED = Path("/work/shared/traces")
OUT = Path(__file__).parents[1] / "out"


def per_interval(arrivals: list[float], seconds: float) -> list[float]:
    a = np.asarray(arrivals) - arrivals[0]
    counts = np.bincount((a // seconds).astype(int))
    return list(counts / seconds)


def series() -> dict[str, tuple[list[float], int, int]]:
    """name -> (rate series, lead in intervals, season period in intervals or 0)."""
    m = read_mooncake(SHARED / "mooncake/conversation_trace.jsonl")
    a = read_azure(SHARED / "azure2023/AzureLLMInferenceTrace_code.csv")
    out = {
        "mooncake 60s": (per_interval(m.arrival_seconds, 60), 10, 0),
        "azure-code 60s": (per_interval(a.arrival_seconds, 60), 10, 0),
    }
    for name, period in (("m-mid", 144), ("m-small", 144), ("deepseek-r1", 0)):
        rates = [r for _, r in read_rate_series(SHARED / f"servegen/{name}_rate.csv")]
        out[f"servegen {name} 600s"] = (rates, 1, period)
    return out


def main() -> None:
    rows = []
    table = Table(title="forecast error at the warm-up lead (relative to the mean rate)")
    for col in ("series", "lead", "method", "pinball q0.9", "MAE", "under >10%"):
        table.add_column(col, justify="right")
    for name, (s, lead, period) in series().items():
        results = []
        for method in METHODS:
            if method == "seasonal-naive" and period == 0:
                continue
            kw = {"period": period} if method == "seasonal-naive" else {}
            warm = period + lead if method == "seasonal-naive" else 5
            r = backtest(s, method=method, horizon=lead, warmup=warm, **kw)
            results.append((method, r))
            rows.append({"series": name, "lead": lead, "method": method, **r})
        best = min(results, key=lambda x: x[1]["rel_pinball_q90"])[0]
        for method, r in results:
            table.add_row(
                name, str(lead), method + (" *" if method == best else ""),
                f"{r['rel_pinball_q90']:.3f}", f"{r['rel_mae']:.3f}", f"{r['under_10pct']:.2f}",
            )
    Console().print(table)
    summary = {}
    for method in METHODS:
        sel = [r for r in rows if r["method"] == method and r["method"] != "seasonal-naive"]
        if sel:
            summary[method] = {
                k: round(float(np.mean([r[k] for r in sel])), 4)
                for k in ("rel_pinball_q90", "rel_mae", "under_10pct")
            }
    choice = min(summary, key=lambda m: summary[m]["rel_pinball_q90"])
    t2 = Table(title="mean over the five series (seasonal-naive only applies to two)")
    for col in ("method", "pinball q0.9", "MAE", "under >10%"):
        t2.add_column(col, justify="right")
    for m, v in summary.items():
        t2.add_row(m + (" <- lowest pinball" if m == choice else ""), str(v["rel_pinball_q90"]),
                   str(v["rel_mae"]), str(v["under_10pct"]))
    Console().print(t2)
    OUT.mkdir(exist_ok=True)
    (OUT / "forecast_bench.json").write_text(
        json.dumps({"rows": rows, "summary": summary, "choice": choice}, indent=1)
    )


if __name__ == "__main__":
    main()
