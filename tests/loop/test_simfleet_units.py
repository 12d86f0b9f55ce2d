"""The simulated fleet's pure parts: when an engine stops warming up."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kubernetes import client

from pdscale.testbed.simengine import EngineConfig, LinearTiming, SimEngine
from pdscale.testbed.simfleet import READY_DELAY_ANNOTATION, engine_ready_at


def pod(delay: str, initialized_at: datetime | None) -> client.V1Pod:
    conditions = [] if initialized_at is None else [
        client.V1PodCondition(type="Initialized", status="True", last_transition_time=initialized_at)]
    return client.V1Pod(metadata=client.V1ObjectMeta(annotations={READY_DELAY_ANNOTATION: delay}),
                        status=client.V1PodStatus(conditions=conditions))


def test_an_engine_is_ready_when_kwok_makes_its_pod_ready_not_later():
    # kwok counts the delay from the Initialized transition; the fleet noticed the pod (and
    # started the engine) 15 s after it, so the engine has 5 s of warm-up left, not 20
    initialized = datetime(2026, 12, 1, 4, 18, 0, tzinfo=UTC)
    assert engine_ready_at(pod("20", initialized), now=initialized.timestamp() + 15) == \
        initialized.timestamp() + 20
    # unknown transition: from now
    assert engine_ready_at(pod("20", None), now=1000.0) == 1020.0


def test_the_engine_warms_until_the_given_moment():
    def engine(ready_at: float) -> SimEngine:
        return SimEngine(EngineConfig("decode", "127.0.0.1", 0, ready_at_unix_seconds=ready_at),
                         LinearTiming())
    assert not engine(time.time() + 60).ready
    assert engine(time.time() - 1).ready
