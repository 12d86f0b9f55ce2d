"""bench/policy_bench.py ``--planner``: the what-if's FIELD=VALUE pairs reach PlannerConfig
with their types (a bound measured with a string where a bool was meant would be a bound of
nothing)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from pdscale.planner.config import PlannerConfig
from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile

MODEL = PerformanceModel(load_profile())
BENCH = Path(__file__).resolve().parents[2] / "bench" / "policy_bench.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("policy_bench_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pairs_are_read_as_json_values_and_replace_the_config_fields():
    what_if = _bench().planner_what_if(
        "stabilization_window_seconds=60, scale_down_hysteresis=false,max_prefill=16,forecast_method=recent-max")
    assert what_if == {"stabilization_window_seconds": 60, "scale_down_hysteresis": False,
                       "max_prefill": 16, "forecast_method": "recent-max"}
    cfg = replace(PlannerConfig(model=MODEL), **what_if)
    assert cfg.stabilization_intervals == 1
    assert cfg.scale_down_hysteresis is False
    assert cfg.max_prefill == 16


def test_an_unknown_field_is_refused_not_ignored():
    what_if = _bench().planner_what_if("no_such_knob=1")
    with pytest.raises(TypeError):
        replace(PlannerConfig(model=MODEL), **what_if)
