"""Synthetic load shapes (planner/replay/workloads.py) for measuring ramps and spikes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdscale.planner.replay.traces import read_mooncake
from pdscale.planner.replay.workloads import (
    SHAPE_LEAD_SECONDS,
    SHAPES,
    shape_duration_seconds,
    shape_rate_rps,
    synthetic_trace,
)

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")


def test_shape_rates() -> None:
    lead = SHAPE_LEAD_SECONDS
    assert shape_rate_rps("steady", 3000.0, 10.0) == 10.0
    for shape in ("ramp", "step", "spike"):
        assert shape_rate_rps(shape, lead - 1.0, 10.0) == 10.0
    # +50% over 10 minutes, then held
    assert shape_rate_rps("ramp", lead + 300.0, 10.0) == pytest.approx(12.5)
    assert shape_rate_rps("ramp", lead + 600.0, 10.0) == pytest.approx(15.0)
    assert shape_rate_rps("ramp", lead + 2000.0, 10.0) == pytest.approx(15.0)
    assert shape_rate_rps("step", lead, 10.0) == 20.0
    # spike: 2.5x at once, back within 5% of base after 12 minutes
    assert shape_rate_rps("spike", lead, 10.0) == pytest.approx(25.0)
    assert shape_rate_rps("spike", lead + 720.0, 10.0) < 10.5
    # surge (issue 48's hour): flat 12 minutes, +70% over nine, then 1.05x for the rest
    assert shape_rate_rps("surge", 719.0, 100.0) == 100.0
    assert shape_rate_rps("surge", 720.0 + 270.0, 100.0) == pytest.approx(135.0)
    assert shape_rate_rps("surge", 1259.0, 100.0) == pytest.approx(170.0, rel=0.01)
    assert shape_rate_rps("surge", 1260.0, 100.0) == pytest.approx(105.0)
    assert shape_rate_rps("surge", 3599.0, 100.0) == pytest.approx(105.0)
    assert shape_duration_seconds("surge") == 3600.0
    with pytest.raises(ValueError, match="shape must be one of"):
        shape_rate_rps("sine", 0.0, 1.0)


@pytest.mark.parametrize("shape", SHAPES)
def test_synthetic_trace_follows_its_shape(shape: str) -> None:
    donor = read_mooncake(MOONCAKE)
    t = synthetic_trace(shape, 5.0, donor, seed=1)
    end = shape_duration_seconds(shape)
    assert t.arrival_seconds[0] >= 0.0 and t.arrival_seconds[-1] < end
    # requests per 5 minutes against the shape's mean rate over them (Poisson noise is ~3%)
    for start in range(0, int(end), 300):
        n = sum(1 for a in t.arrival_seconds if start <= a < start + 300)
        want = sum(shape_rate_rps(shape, start + s + 0.5, 5.0) for s in range(300))
        assert n == pytest.approx(want, rel=0.12), (shape, start)
    assert set(t.input_tokens) <= set(donor.input_tokens)
