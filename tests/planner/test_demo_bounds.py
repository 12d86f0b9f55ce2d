"""bench/demo_bounds.py: the hedges it replays are the PDCluster with only the stated change."""

from __future__ import annotations

import argparse

import pytest
from planner_replay_helpers import bench_module

bounds = bench_module("demo_bounds")

BODY = {"spec": {"prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 16},
                 "decode": {"replicas": 2, "minReplicas": 2, "maxReplicas": 16},
                 "planner": {"intervalSeconds": 10}}}


def test_counts_name_either_role_or_both():
    assert bounds.parse_counts("P3") == {"prefill": 3}
    assert bounds.parse_counts("d6") == {"decode": 6}
    assert bounds.parse_counts("P5D6") == {"prefill": 5, "decode": 6}
    for bad in ("", "6", "D6P5", "P-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="P3, D6 or P5D6"):
            bounds.parse_counts(bad)


def test_a_floor_raises_the_minimum_and_the_start_and_never_lowers_either():
    hedged = bounds.with_floor(BODY, {"decode": 6})
    assert hedged["spec"]["decode"] == {"replicas": 6, "minReplicas": 6, "maxReplicas": 16}
    assert hedged["spec"]["prefill"] == BODY["spec"]["prefill"]
    assert bounds.with_floor(BODY, {"decode": 1})["spec"]["decode"]["minReplicas"] == 2
    assert BODY["spec"]["decode"]["minReplicas"] == 2  # the recorded spec is not touched


def test_a_start_changes_the_replicas_only():
    started = bounds.with_start(BODY, {"prefill": 2, "decode": 6})
    assert started["spec"]["prefill"] == {"replicas": 2, "minReplicas": 1, "maxReplicas": 16}
    assert started["spec"]["decode"] == {"replicas": 6, "minReplicas": 2, "maxReplicas": 16}


def test_a_row_spans_its_replays():
    runs = [{"met": 0.7, "gpu_hours": 2.0, "by_phase": {"chat": 0.6, "docs": None}},
            {"met": 0.9, "gpu_hours": 4.0, "by_phase": {"chat": 1.0, "docs": 0.5}}]
    row = bounds.summarise("x", runs)
    assert (row["met_min"], row["met_max"], row["gpu_hours"]) == (0.7, 0.9, 3.0)
    assert row["met_mean"] == pytest.approx(0.8)
    assert row["met_by_phase"] == {"chat": pytest.approx(0.8), "docs": pytest.approx(0.25)}
