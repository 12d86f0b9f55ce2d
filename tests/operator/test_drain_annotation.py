"""A draining annotation that is not a time ("nan", "inf", "-inf", negative, garbage, far in
the future) reads as a drain that has timed out, never as one that never times out: it still
waits for the router to let the pod go, then finishes whatever is in flight."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdscale.operator.api.names import DRAINING_ANNOTATION
from pdscale.operator.loop.fleet import (
    DRAIN_START_UNREADABLE,
    drain_started_at,
    plan_role_actions,
    pod_view,
)

NOW = 1_800_000_000.0
TIMEOUT = 300.0


def _pod(annotation: str) -> dict[str, object]:
    return {
        "metadata": {"name": "d1", "annotations": {DRAINING_ANNOTATION: annotation}},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _finishes(annotation: str, *, in_flight: int | None = 3, in_router: bool = False) -> bool:
    view = pod_view(_pod(annotation), "decode")
    assert view.draining
    view = replace(view, in_flight=in_flight, in_router=in_router)
    actions = plan_role_actions("decode", 0, [view], 1, now_seconds=NOW,
                                drain_timeout_seconds=TIMEOUT)
    return actions.finish_drain == ("d1",)


@pytest.mark.parametrize("annotation", [
    "nan", "NaN", "inf", "+inf", "-inf", "Infinity", "-5", "-1e9", "soon", "12:00", "1e999",
    "0x10", "[]",
])
def test_an_unreadable_drain_start_has_timed_out(annotation):
    assert drain_started_at(annotation) == DRAIN_START_UNREADABLE
    assert _finishes(annotation)  # busy, yet timed out
    # ... but the router still lets go first (rule 6)
    assert not _finishes(annotation, in_router=True)


def test_a_far_future_start_has_timed_out_and_a_near_one_waits_at_most_two_timeouts():
    assert _finishes(f"{NOW + 10 * TIMEOUT:.3f}")
    assert _finishes(f"{NOW + 1e12:.3f}")
    assert not _finishes(f"{NOW + 10:.3f}")  # a clock a little ahead: a fresh drain


def test_a_readable_start_is_read_as_is():
    assert drain_started_at(f"{NOW:.3f}") == NOW
    assert drain_started_at("0") == 0.0 and _finishes("0")  # the epoch is long ago, not now
    assert drain_started_at(None) is None and drain_started_at("") is None
    assert not _finishes(f"{NOW - 10:.3f}")
    assert _finishes(f"{NOW - TIMEOUT:.3f}")
    assert _finishes(f"{NOW - 10:.3f}", in_flight=0)
