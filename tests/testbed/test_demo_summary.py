"""The demo's summary: what a user reads after ``make demo`` (pure: no cluster)."""

from __future__ import annotations

from dataclasses import asdict

from pdscale.testbed.demo import DemoResult, summary_paragraph
from pdscale.testbed.loadgen import Phase, RequestRecord


def record(i: int, phase: str, ttft: float | None, tpot: float | None, error: str | None = None) -> RequestRecord:
    return RequestRecord(i, phase, float(i), 100, 10, 10, 200 if error is None else 503,
                         ttft, tpot, 1.0, error)


def test_attainment_is_reported_per_phase_and_failures_count_as_misses() -> None:
    phases = [asdict(Phase("chat", 90, 1, 100, 10)), asdict(Phase("docs", 90, 1, 600, 4)),
              asdict(Phase("idle", 90, 0, 1, 1))]
    result = DemoResult(phases=phases, records=[
        record(0, "chat", 0.5, 0.02), record(1, "chat", 0.5, 0.2),   # TPOT miss
        record(2, "docs", 9.0, 0.02), record(3, "docs", 1.0, None),  # TTFT miss; one token
        record(4, "docs", None, None, error="503"),                  # failed
    ])
    s = result.summary(slo_ttft=5.0, slo_tpot=0.05)
    assert s["slo_attainment"] == 2 / 5
    assert s["slo_attainment_by_phase"] == {"chat": 0.5, "docs": 1 / 3, "idle": None}
    s["gpu_hours_ready"] = 0.0
    assert "chat 50%, docs 33%;" in summary_paragraph(s)
