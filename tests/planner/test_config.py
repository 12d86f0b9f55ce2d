"""PlannerConfig refuses every bad value by name and range; build_config derives the dependent
values in one place (the operator's spec mapping calls it for every caller: see
test_one_configuration.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pdscale.planner.config import (
    HPA_SCALE_DOWN_WINDOW_SECONDS,
    PlannerConfig,
    build_config,
)
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import load_profile

MODEL = PerformanceModel(load_profile())


def make(**kw: object) -> PlannerConfig:
    return PlannerConfig(model=MODEL, **kw)  # type: ignore[arg-type]


def test_the_defaults_are_valid() -> None:
    make()


# (field, a bad value, what the message must say about the allowed range)
RULES = [
    ("interval_seconds", -1.0, "> 0"),
    ("interval_seconds", 0.0, "> 0"),
    ("interval_seconds", math.inf, "finite"),
    ("interval_seconds", math.nan, "finite"),
    ("interval_seconds", "60", "finite number"),
    ("horizon_intervals", 0, ">= 1"),
    ("horizon_intervals", 2.5, "integer"),
    ("horizon_intervals", True, "integer"),
    ("nodes", -1, ">= 0"),
    ("min_prefill", -1, ">= 0"),
    ("min_decode", -1, ">= 0"),
    ("prefill_utilization", 0.0, "in (0, 1]"),
    ("prefill_utilization", 1.5, "in (0, 1]"),
    ("decode_utilization", 0.0, "in (0, 1]"),
    ("decode_utilization", 1.01, "in (0, 1]"),
    ("prefill_service_cv", -0.1, ">= 0"),
    ("stabilization_window_seconds", -1.0, ">= 0 or None"),
    ("stabilization_window_seconds", math.inf, "finite"),
    ("scale_down_tolerance", 1.0, "in [0, 1)"),
    ("scale_down_tolerance", -0.1, "in [0, 1)"),
    ("max_step_up", 0, ">= 1 or None"),
    ("max_step_down", 0, ">= 1 or None"),
    ("burst_quantile", 1.1, "in [0, 1]"),
    ("forecast_window", 0, ">= 1"),
    ("length_window", 0, ">= 1"),
    ("rise_quantile", -0.5, "in [0, 1]"),
    ("decode_rise_quantile", 2.0, "in [0, 1] or None"),
    ("max_rise_margin", 0.5, ">= 1"),
    ("rise_prior", 0.9, ">= 1"),
    ("rise_min_samples", 0, ">= 1"),
    ("rise_history_intervals", 0, ">= 1"),
    ("shortfall_penalty", 0.0, "> 0"),
    ("role_switch_penalty", -1.0, ">= 0"),
    ("max_age_seconds", 0.0, "> 0"),
    ("length_jump_ratio", 0.5, ">= 1 or None"),
    ("backlog_seconds", 0.0, "> 0 or None"),
    ("decode_drain_seconds", -5.0, ">= 0 or None"),
    ("solver_time_limit_seconds", 0.0, "> 0"),
    ("clock_origin_unix_seconds", math.nan, "finite"),
    ("clock_origin_unix_seconds", math.inf, "finite"),
    ("scale_down_hysteresis", "no", "True or False"),
    ("scale_down_served_only", 1, "True or False"),
    ("rise_independent_samples", 1, "True or False"),
    ("seasonality", "Auto", "True or False"),
]


@pytest.mark.parametrize(("name", "bad", "allowed"), RULES,
                         ids=[f"{n}={b!r}" for n, b, _ in RULES])
def test_a_bad_value_is_refused_by_name_and_range(name: str, bad: object, allowed: str) -> None:
    with pytest.raises(ValueError) as err:
        make(**{name: bad})
    message = str(err.value)
    assert message.startswith(f"PlannerConfig.{name} must be ")
    assert allowed in message
    assert f"got {bad!r}" in message


def test_every_field_has_a_rule() -> None:
    # a field added later must be given its range here, or this names it
    from pdscale.planner.config import _BOOL_RULES, _INT_RULES, _REAL_RULES

    ruled = {r[0] for r in _REAL_RULES} | {r[0] for r in _INT_RULES} | set(_BOOL_RULES)
    checked_otherwise = {"model", "slo", "forecast_method", "prefill_queue", "max_prefill",
                         "max_decode", "nodes_per_instance", "schedules", "weekly_seasonality"}
    assert set(PlannerConfig.__dataclass_fields__) - checked_otherwise == ruled
    assert {n for n, _, _ in RULES} == ruled  # and each rule has a bad value tested above


def test_the_weekly_factor_setting_is_one_of_its_modes() -> None:
    with pytest.raises(ValueError, match=r"PlannerConfig.weekly_seasonality must be one of"):
        make(weekly_seasonality="always")
    assert make(weekly_seasonality="off").weekly_seasonality == "off"


@pytest.mark.parametrize("bad", [(0, 1), (1,), (2, 1.5), [2, 4], (True, 1)])
def test_nodes_per_instance_must_be_a_pair_of_whole_nodes(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^PlannerConfig.nodes_per_instance must be a pair of "
                                         r"integers >= 1 \(prefill, decode\), got "):
        make(nodes_per_instance=bad)
    make(nodes_per_instance=(2, 4))


def test_the_message_reads_as_documented() -> None:
    with pytest.raises(ValueError, match=r"^PlannerConfig.interval_seconds must be a finite "
                                         r"number > 0, got -1$"):
        make(interval_seconds=-1)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_max_below_min_is_refused_per_role(role: str) -> None:
    with pytest.raises(ValueError, match=rf"^PlannerConfig.max_{role} must be an integer >= "
                                         rf"min_{role} \(5\), got 4$"):
        make(**{f"min_{role}": 5, f"max_{role}": 4})
    make(**{f"min_{role}": 5, f"max_{role}": 5})  # equal is a fixed role


@pytest.mark.parametrize(("slo", "name"), [
    (Slo(percentile=1.0), "slo.percentile"),
    (Slo(percentile=0.0), "slo.percentile"),
    (Slo(percentile=99.0), "slo.percentile"),  # a percentage where a share belongs
    (Slo(ttft_seconds=0.0), "slo.ttft_seconds"),
    (Slo(tpot_seconds=-0.05), "slo.tpot_seconds"),
    (Slo(tpot_seconds=math.nan), "slo.tpot_seconds"),
])
def test_the_slo_is_checked_too(slo: Slo, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^PlannerConfig.{name} must be a finite number"):
        make(slo=slo)


def test_the_prefill_queue_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"^PlannerConfig.prefill_queue must be one of .*'split'"):
        make(prefill_queue="fifo")


def test_the_forecast_method_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"^PlannerConfig.forecast_method must be one of .*'recent-max'"):
        make(forecast_method="crystal-ball")


def test_replace_validates_as_construction_does() -> None:
    with pytest.raises(ValueError, match=r"^PlannerConfig\.nodes "):
        replace(make(), nodes=-3)


def test_numpy_numbers_are_numbers() -> None:
    np = pytest.importorskip("numpy")
    cfg = make(nodes=np.int64(12), interval_seconds=np.float64(30.0))
    assert cfg.nodes == 12


# -- the builder -----------------------------------------------------------------------------
def build(**kw: object) -> PlannerConfig:
    args: dict[str, object] = {"model": MODEL, "slo": Slo(), "interval_seconds": 60.0,
                               "node_budget": 40}
    return build_config(**{**args, **kw})  # type: ignore[arg-type]


def test_the_builder_derives_the_horizon_from_the_warm_up() -> None:
    # ceil(900 s / 60 s) + 5 intervals: a node started now is seen serving for five intervals
    assert build(warmup_seconds=900.0).horizon_intervals == 20
    # a fast start still plans ten intervals ahead
    assert build(warmup_seconds=30.0).horizon_intervals == 10
    # the profile's warm-up when the deployment gives none
    assert build().horizon_intervals == math.ceil(MODEL.profile.warmup.new_node_seconds / 60) + 5
    assert build(horizon_intervals=30).horizon_intervals == 30


def test_the_builder_replaces_both_warm_ups() -> None:
    cfg = build(warmup_seconds=120.0)
    assert cfg.model.profile.warmup.new_node_seconds == 120.0
    assert cfg.model.profile.warmup.role_switch_seconds == 120.0
    assert cfg.stabilization_seconds == HPA_SCALE_DOWN_WINDOW_SECONDS + 120.0
    assert MODEL.profile.warmup.new_node_seconds != 120.0  # the caller's model is untouched


def test_the_builder_clears_a_backlog_over_an_interval_after_a_warm_up() -> None:
    assert build(count_prefill_backlog=True, warmup_seconds=600.0).backlog_seconds == 660.0
    assert build().backlog_seconds is None


def test_the_builder_names_its_own_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"^build_config.warmup_seconds must be a finite number >= 0"):
        build(warmup_seconds=-1.0)
    with pytest.raises(ValueError, match=r"^build_config.interval_seconds must be a finite number > 0"):
        build(interval_seconds=0.0)
    with pytest.raises(ValueError, match=r"^PlannerConfig.max_decode must be"):
        build(min_decode=3, max_decode=2)

