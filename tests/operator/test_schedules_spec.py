"""spec.planner.schedules: what admission can check (the CRD's patterns and CEL rules), and
what the operator refuses naming the field (checklist: the cron expressions and time zone as
the planner reads them, minimums within the role's max and the node budget), and the
configuration the planner gets from it."""

from __future__ import annotations

import copy
import re

import pytest

from pdscale.operator.api.crd import build_crd
from pdscale.operator.api.pdcluster import CRON_PATTERN, TIMEZONE_PATTERN
from pdscale.operator.loop.planning import planner_config
from pdscale.operator.render.checklist import SpecError, validate

MINIMAL = {
    "model": {"servedName": "m", "path": "org/model"},
    "engine": {"kind": "SGLang", "image": "lmsysorg/sglang:v0.5.0"},
    "router": {"image": "ghcr.io/lightseekorg/smg:1.13.0-sglang-v0.5.0"},
    "prefill": {"replicas": 2, "minReplicas": 1, "maxReplicas": 8},
    "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4},
}
WINDOW = {"name": "business-hours", "start": "0 9 * * 1-5", "end": "0 18 * * 1-5",
          "timezone": "Europe/Paris", "minPrefillReplicas": 6, "minDecodeReplicas": 3}


def spec_with(*windows: dict, **planner: object) -> dict:
    raw = copy.deepcopy(MINIMAL)
    raw["planner"] = {"schedules": [dict(w) for w in windows], **planner}
    return raw


def problems(raw: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        validate(raw)
    return {p.field: p.message for p in err.value.problems}


def test_a_good_window_reaches_the_planner() -> None:
    spec, _ = validate(spec_with(WINDOW))
    floors = planner_config(spec).schedules
    assert len(floors) == 1
    f = floors[0]
    assert (f.name, f.start, f.end, f.timezone, f.min_prefill, f.min_decode) == (
        "business-hours", "0 9 * * 1-5", "0 18 * * 1-5", "Europe/Paris", 6, 3)


def test_the_time_zone_defaults_to_utc_and_a_role_s_minimum_to_none() -> None:
    spec, _ = validate(spec_with({"name": "n", "start": "0 22 * * *", "end": "0 6 * * *",
                                  "minDecodeReplicas": 2}))
    f = planner_config(spec).schedules[0]
    assert (f.timezone, f.min_prefill, f.min_decode) == ("UTC", 0, 2)


def test_a_cron_the_planner_cannot_read_is_refused_naming_the_field() -> None:
    got = problems(spec_with({**WINDOW, "start": "0 25 * * 1-5"}))
    assert "Bad hour" in got["spec.planner.schedules[0].start"]
    got = problems(spec_with({**WINDOW, "end": "0 18 31 2 *"}))
    assert "Bad day-of-month" in got["spec.planner.schedules[0].end"]


def test_a_cron_of_the_wrong_shape_is_refused_by_the_model_s_pattern() -> None:
    got = problems(spec_with({**WINDOW, "start": "@daily"}))
    assert "spec.planner.schedules[0].start" in got


def test_an_unknown_time_zone_is_refused_naming_the_field() -> None:
    got = problems(spec_with({**WINDOW, "timezone": "Europe/Pariss"}))
    assert got["spec.planner.schedules[0].timezone"] == (
        "'Europe/Pariss' is not an IANA time zone (e.g. 'UTC', 'America/New_York', 'Asia/Kolkata')")


def test_minimums_above_the_role_s_max_are_refused_naming_the_field() -> None:
    got = problems(spec_with({**WINDOW, "minPrefillReplicas": 9, "minDecodeReplicas": 5}))
    assert got["spec.planner.schedules[0].minPrefillReplicas"] == (
        "9 exceeds prefill.maxReplicas (8): the window could never hold it")
    assert got["spec.planner.schedules[0].minDecodeReplicas"] == (
        "5 exceeds decode.maxReplicas (4): the window could never hold it")


def test_a_window_above_the_node_budget_is_refused() -> None:
    got = problems(spec_with(WINDOW, nodeBudget=8))
    assert got["spec.planner.schedules[0]"] == (
        "window 'business-hours' holds 9 nodes (prefill 6 x 1, decode 3 x 1), above "
        "planner.nodeBudget (8)")


def test_start_equal_to_end_no_minimum_and_repeated_names_are_refused() -> None:
    got = problems(spec_with({**WINDOW, "end": "0 9 * * 1-5"}))
    assert "start and end must differ" in got["spec.planner.schedules[0]"]
    got = problems(spec_with({**WINDOW, "minPrefillReplicas": 0, "minDecodeReplicas": 0}))
    assert "raises minPrefillReplicas or minDecodeReplicas above 0" in got["spec.planner.schedules[0]"]
    got = problems(spec_with(WINDOW, WINDOW))
    assert "names must be unique, ['business-hours'] repeated" in got["spec.planner"]


# -- what admission checks (the CRD) ------------------------------------------------------------
def _planner_schema() -> dict:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def test_the_crd_bounds_the_list_and_keys_it_by_name() -> None:
    node = _planner_schema()["properties"]["planner"]["properties"]["schedules"]
    assert node["maxItems"] == 16
    assert node["x-kubernetes-list-type"] == "map"
    assert node["x-kubernetes-list-map-keys"] == ["name"]
    rules = {r["rule"]: r["message"] for r in node["items"]["x-kubernetes-validations"]}
    assert rules["self.start != self.end"] == "start and end must differ (as in KEDA's cron scaler)"
    assert "self.minPrefillReplicas > 0 || self.minDecodeReplicas > 0" in rules


def test_the_crd_refuses_minimums_above_each_role_s_max() -> None:
    rules = {r["message"]: r["rule"] for r in _planner_schema()["x-kubernetes-validations"]}
    assert rules["planner.schedules: minPrefillReplicas must not exceed prefill.maxReplicas"] == (
        "!has(self.planner.schedules) || self.planner.schedules.all(s, "
        "s.minPrefillReplicas <= self.prefill.maxReplicas)")
    assert "planner.schedules: minDecodeReplicas must not exceed decode.maxReplicas" in rules


@pytest.mark.parametrize(("expr", "admitted"), [
    ("0 9 * * 1-5", True), ("*/15 8-18 * * MON-FRI", True), ("0  9 * * *", True),
    ("@daily", False), ("0 9 * *", False), ("0 0 9 * * 1", False), ("0 9 * * 1#2", False),
    ("0 9 * * 1; rm", False),
])
def test_admission_takes_five_fields_of_cron_characters(expr: str, admitted: bool) -> None:
    assert bool(re.search(CRON_PATTERN, expr)) == admitted


@pytest.mark.parametrize(("tz", "admitted"), [
    ("UTC", True), ("Europe/Paris", True), ("America/Argentina/Buenos_Aires", True),
    ("Etc/GMT+5", True), ("../etc/passwd", False), ("/etc/localtime", False), ("", False),
])
def test_admission_takes_the_shape_of_an_iana_name(tz: str, admitted: bool) -> None:
    assert bool(re.search(TIMEZONE_PATTERN, tz)) == admitted
