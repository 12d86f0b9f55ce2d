"""The e2e runs' check that a router catches up with new Ready pods, measured in seconds per
pod (``demo.catch_up_seconds``): what it counts, and that a router left behind fails it."""

from __future__ import annotations

from pdscale.testbed.demo import CATCH_UP_BOUND_SECONDS, catch_up_seconds

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def test_a_spell_runs_from_the_first_check_behind_to_the_first_listed():
    checks = [(0.0, {A}, {A}), (2.0, {A, B}, {A}), (4.5, {A, B}, {A}), (7.0, {A, B}, {A, B})]
    assert catch_up_seconds(checks) == {B: 5.0}


def test_the_longest_of_several_spells_counts_and_leaving_service_ends_one():
    checks = [(0.0, {B}, set()), (2.0, {B}, {B}),  # 2 s
              (10.0, {B}, set()), (16.0, set(), set()),  # 6 s: it stopped serving
              (20.0, set(), set())]
    assert catch_up_seconds(checks) == {B: 6.0}


def test_a_pod_never_listed_is_behind_until_the_last_check_and_fails_the_bound():
    checks = [(float(t), {A, B}, {A}) for t in range(0, 130, 2)]
    lags = catch_up_seconds(checks)
    assert lags == {B: 128.0} and lags[B] > CATCH_UP_BOUND_SECONDS


def test_many_pods_each_a_check_behind_stay_within_the_bound():
    # the case the earlier count-of-checks rule failed on a busy machine: many new pods,
    # each listed at the next check
    checks, serving = [], set()
    for i in range(30):
        listed = set(serving)
        serving = serving | {f"http://10.0.1.{i}:8000"}
        checks.append((2.4 * i, set(serving), listed))
    assert max(catch_up_seconds(checks).values()) <= 2.5 <= CATCH_UP_BOUND_SECONDS
