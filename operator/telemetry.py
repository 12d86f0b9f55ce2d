"""What the planner loop tells the world: the operator's Prometheus metrics, the PDCluster's
``status.planner`` and its Events. Every decision and every drain step is reported here, and
nothing here decides anything."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from pdscale.planner.decision import Decision
from pdscale.planner.observe import Observation, Role
from pdscale.planner.prometheus import MetricsSnapshot

from .clock import now_rfc3339
from .fleet import PodView
from .kube import Kube
from .pdcluster import PDClusterSpec
from .planning import decision_event, decision_status, short
from .reconcile import Event, post_event

log = logging.getLogger(__name__)

_labels = ("namespace", "pdcluster", "role")
RECOMMENDED = Gauge("pdscale_planner_recommended_replicas", "Instances the planner decided on", _labels)
TARGET = Gauge("pdscale_planner_target_replicas", "Instances the operator is moving to (Auto)", _labels)
READY = Gauge("pdscale_ready_replicas", "Ready, non-draining instances", _labels)
PREDICTED_TTFT = Gauge("pdscale_planner_predicted_ttft_seconds", "Predicted TTFT at the SLO percentile", _labels[:2])
PREDICTED_TPOT = Gauge("pdscale_planner_predicted_tpot_seconds", "Predicted TPOT", _labels[:2])
OBSERVED_TTFT = Gauge("pdscale_planner_observed_ttft_seconds", "Observed p99 TTFT", _labels[:2])
OBSERVED_TPOT = Gauge("pdscale_planner_observed_tpot_seconds", "Observed p99 TPOT", _labels[:2])
SLO_TTFT = Gauge("pdscale_slo_ttft_seconds", "TTFT target", _labels[:2])
SLO_TPOT = Gauge("pdscale_slo_tpot_seconds", "TPOT target", _labels[:2])
PLAN_SECONDS = Histogram("pdscale_planner_plan_duration_seconds", "Time to read metrics and plan",
                         _labels[:2], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
DECISIONS = Counter("pdscale_planner_decisions_total", "Planner decisions by what bound them",
                    (*_labels[:2], "bound"))


def serve_metrics_from_environment() -> None:
    """The operator's own metrics endpoint (decisions, predicted vs observed latency, time per
    plan), on ``PDSCALE_METRICS_PORT`` when it is set; none otherwise."""
    port = os.environ.get("PDSCALE_METRICS_PORT")
    if port:
        start_http_server(int(port), addr=os.environ.get("PDSCALE_METRICS_HOST", "0.0.0.0"))


def decision_bound(decision: Decision) -> str:
    """What bound a decision, the ``bound`` label of DECISIONS: the previous decision held
    (inputs unknown), the fleet's limits (shortfall), or the SLO."""
    if decision.held:
        return "held"
    return "shortfall" if decision.shortfall else "slo"


class Reporter:
    """Reports for the planner loop, through one Kube (status patches and Events) and the
    process's metrics registry."""

    def __init__(self, kube: Kube):
        self.kube = kube

    def ready(self, namespace: str, name: str, pods: Mapping[Role, Sequence[PodView]]) -> None:
        for role in Role:
            READY.labels(namespace, name, role).set(sum(1 for p in pods[role] if p.serving))

    def target(self, namespace: str, name: str, role: Role, count: int) -> None:
        TARGET.labels(namespace, name, role).set(count)

    def plan_seconds(self, namespace: str, name: str, seconds: float) -> None:
        PLAN_SECONDS.labels(namespace, name).observe(seconds)

    def decision(self, body: dict[str, Any], spec: PDClusterSpec, decision: Decision,
                 previous: Decision | None, snapshot: MetricsSnapshot, obs: Observation) -> None:
        """A new decision: ``status.planner``, the gauges, a log line, and an Event when
        something a user would want to hear changed."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = decision_status(decision, spec.planner.mode, snapshot, now_rfc3339())
        status["metricsAvailable"] = not snapshot.failures
        self.kube.patch_status(ns, name, {"planner": status})
        for role, count in ((Role.PREFILL, decision.prefill), (Role.DECODE, decision.decode)):
            RECOMMENDED.labels(ns, name, role).set(count)
        for gauge, value in ((PREDICTED_TTFT, decision.predicted_ttft_seconds),
                             (PREDICTED_TPOT, decision.predicted_tpot_seconds),
                             (SLO_TTFT, spec.slo.ttft_seconds),
                             (SLO_TPOT, spec.slo.tpot_seconds)):
            gauge.labels(ns, name).set(value)
        for gauge, reading in ((OBSERVED_TTFT, obs.ttft_p99_seconds), (OBSERVED_TPOT, obs.tpot_p99_seconds)):
            if reading is not None:  # no reading: the gauge keeps its last value
                gauge.labels(ns, name).set(reading.value)
        DECISIONS.labels(ns, name, decision_bound(decision)).inc()
        log.info("plan %s/%s: %s (%s)", ns, name, short(decision), decision.explanation)
        event = decision_event(decision, previous)
        if event is not None:
            post_event(self.kube, body, Event(*event), now_rfc3339())

    def drain_started(self, body: dict[str, Any], role: Role, pod: str) -> None:
        post_event(self.kube, body, Event("Normal", "DrainStarted",
                                          f"{role} pod {pod}: out of the router, draining"), now_rfc3339())

    def drain_finished(self, body: dict[str, Any], role: Role, pod: str) -> None:
        post_event(self.kube, body, Event("Normal", "DrainFinished",
                                          f"{role} pod {pod}: drained, removing"), now_rfc3339())

    def progress(self, body: dict[str, Any], replicas: Mapping[str, int], waiting: Sequence[str]) -> bool:
        """``status.planner.replicas`` (what the reconcile applies) and ``waiting`` (why the
        fleet is not at the target yet), patched only when they changed. True when the
        replicas changed: then the reconcile has something new to apply."""
        meta = body["metadata"]
        status = (body.get("status") or {}).get("planner", {})
        replicas, waiting = dict(replicas), list(waiting)
        if status.get("replicas") != replicas or status.get("waiting", []) != waiting:
            self.kube.patch_status(meta["namespace"], meta["name"],
                                   {"planner": {"replicas": replicas, "waiting": waiting}})
        return bool(status.get("replicas") != replicas)
