"""What the planner loop tells the world: the operator's Prometheus metrics, the PDCluster's
``status.planner`` and its Events. Every decision and every drain step is reported here, and
nothing here decides anything."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.clients.kube import Kube
from pdscale.operator.reconciler.conditions import EVENT_PLANNER_MEMORY_FOREIGN
from pdscale.operator.reconciler.reconcile import Event, post_event
from pdscale.planner.decision import Decision
from pdscale.planner.observe import Observation, Role
from pdscale.planner.prometheus import MetricsSnapshot

from .fleet import PodView
from .planning import decision_event, decision_status, short

log = logging.getLogger(__name__)

_labels = ("namespace", "pdcluster", "role")
# The plan time is set last (``Reporter._planner_input``) and registered first: a scrape
# collects the registry's metrics in registration order, so one that shows a new plan time
# collects everything the decision set before it afterwards, and shows that decision's counts,
# states and decisions count. Registered after them, a scrape on a loaded machine read the
# counts before a decision and its plan time after (the first decision then had no counts
# recorded, and `pdscale replay --prometheus` compared 4 of 5).
LAST_PLAN = Gauge("pdscale_planner_last_plan_timestamp_seconds",
                  "When the planner last decided (the planner's clock, Unix seconds)", _labels[:2])
RECOMMENDED = Gauge("pdscale_planner_recommended_replicas", "Instances the planner decided on", _labels)
TARGET = Gauge("pdscale_planner_target_replicas", "Instances the operator is moving to (Auto)", _labels)
READY = Gauge("pdscale_ready_replicas", "Ready, non-draining instances", _labels)
NODES_PER_INSTANCE = Gauge("pdscale_nodes_per_instance",
                           "Nodes one instance of the role spans (its LeaderWorkerSet group's "
                           "size; 1 for a Deployment's pod): instances x this = nodes", _labels)
PREDICTED_TTFT = Gauge("pdscale_planner_predicted_ttft_seconds", "Predicted TTFT at the SLO percentile", _labels[:2])
PREDICTED_TPOT = Gauge("pdscale_planner_predicted_tpot_seconds", "Predicted TPOT", _labels[:2])
OBSERVED_TTFT = Gauge("pdscale_planner_observed_ttft_seconds", "Observed TTFT at the SLO percentile", _labels[:2])
OBSERVED_TPOT = Gauge("pdscale_planner_observed_tpot_seconds", "Observed TPOT at the SLO percentile", _labels[:2])
SLO_TTFT = Gauge("pdscale_slo_ttft_seconds", "TTFT target", _labels[:2])
SLO_TPOT = Gauge("pdscale_slo_tpot_seconds", "TPOT target", _labels[:2])
REFUSED = Gauge("pdscale_router_refused_requests_per_second",
                "Requests the router refused per second (smg prefill admission 429s), as the planner "
                "read them at its last decision", _labels[:2])
PLAN_SECONDS = Histogram("pdscale_planner_plan_duration_seconds", "Time to read metrics and plan",
                         _labels[:2], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
# The fleet as the planner saw it at its last decision, and when that was (LAST_PLAN, above):
# with the readings (evaluated at that time) they are the whole input of a decision, so
# ``pdscale replay --prometheus`` can re-run it.
OBSERVED_INSTANCES = Gauge("pdscale_planner_observed_instances",
                           "Instances by state (ready, warming, draining, recently_ready) at the last decision",
                           (*_labels, "state"))
WARMING_READY_IN = Gauge("pdscale_planner_warming_ready_in_seconds",
                         "Seconds from the last decision until each warming instance was expected to serve",
                         (*_labels, "slot"))
DECISIONS = Counter("pdscale_planner_decisions_total", "Planner decisions by what bound them",
                    (*_labels[:2], "bound"))
LOOP_ERRORS = Counter("pdscale_loop_errors_total",
                      "Failed ticks of the operator's background loops (each retried with backoff)",
                      ("loop",))
POOL_NODES = Gauge("pdscale_pool_nodes", "Nodes in a PDPool (spec.nodes or counted)",
                   ["namespace", "pool"])
POOL_GRANTED = Gauge("pdscale_pool_granted_nodes", "Nodes the PDPool's last joint plan granted "
                     "a member", ["namespace", "pool", "member"])
LOOP_LAST_TICK = Gauge("pdscale_loop_last_tick_timestamp_seconds",
                       "When a background loop last finished a tick (succeeded or failed)", ("loop",))

#: how long a loop may go without finishing a tick, past its next due start, before the
#: liveness probe calls it stuck; default max(3 x its interval, 60 s)
STUCK_SECONDS_ENV = "PDSCALE_LOOP_STUCK_SECONDS"


def stuck_after_seconds(interval_seconds: float) -> float:
    """The bound past which a loop that has not finished a tick is stuck (its tick blocked)."""
    configured = os.environ.get(STUCK_SECONDS_ENV)
    if configured:
        return float(configured)
    return max(3 * interval_seconds, 60.0)


class Heartbeats:
    """The last tick each background loop finished, for the liveness probe. A loop that keeps
    failing still beats (it is retrying, and says so in its log and LOOP_ERRORS); only one whose
    tick never returns stops beating. Times are ``time.monotonic()`` seconds."""

    def __init__(self) -> None:
        #: loop -> (when it last finished a tick, when its next tick is due to start, bound)
        self.beats: dict[str, tuple[float, float, float]] = {}

    def beat(self, loop: str, now: float, next_in_seconds: float, bound_seconds: float) -> None:
        self.beats[loop] = (now, now + next_in_seconds, bound_seconds)
        LOOP_LAST_TICK.labels(loop).set_to_current_time()

    def forget(self, loop: str) -> None:
        """A loop that was stopped (cancelled) on purpose is not stuck."""
        self.beats.pop(loop, None)

    def stuck(self, now: float) -> dict[str, float]:
        """Loops whose next tick, due by now, has not finished within their bound: loop ->
        seconds since it last finished one."""
        return {loop: now - last for loop, (last, due, bound) in self.beats.items()
                if now - due > bound}


#: the process's loops (the planner loop, the resync loop)
HEARTBEATS = Heartbeats()


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
        #: (namespace, PDCluster, role) -> warming slots exported at the last decision
        self.warming_slots: dict[tuple[str, str, str], int] = {}

    def ready(self, namespace: str, name: str, pods: Mapping[Role, Sequence[PodView]],
              nodes_per_instance: Mapping[Role, int]) -> None:
        for role in Role:
            READY.labels(namespace, name, role).set(sum(1 for p in pods[role] if p.serving))
            NODES_PER_INSTANCE.labels(namespace, name, role).set(nodes_per_instance[role])

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
        refused = obs.rejected_rps
        if refused is not None:  # no reading: status and gauge keep their last value
            # integers in the API: per minute, so that a trickle still shows
            status["refusedRequestsPerMinute"] = round(refused.value * 60)
            REFUSED.labels(ns, name).set(refused.value)
        self.kube.patch_status(ns, name, {"planner": status})
        for role, count in ((Role.PREFILL, decision.prefill), (Role.DECODE, decision.decode)):
            RECOMMENDED.labels(ns, name, role).set(count)
        for gauge, value in ((PREDICTED_TTFT, decision.predicted_ttft_seconds),
                             (PREDICTED_TPOT, decision.predicted_tpot_seconds),
                             (SLO_TTFT, spec.slo.ttft_seconds),
                             (SLO_TPOT, spec.slo.tpot_seconds)):
            gauge.labels(ns, name).set(value)
        for gauge, reading in ((OBSERVED_TTFT, obs.ttft_at_percentile_seconds), (OBSERVED_TPOT, obs.tpot_at_percentile_seconds)):
            if reading is not None:  # no reading: the gauge keeps its last value
                gauge.labels(ns, name).set(reading.value)
        # counted before the plan time is set, so a scrape showing the plan time shows its count
        DECISIONS.labels(ns, name, decision_bound(decision)).inc()
        self._planner_input(ns, name, obs)
        log.info("plan %s/%s: %s (%s)", ns, name, short(decision), decision.explanation)
        event = decision_event(decision, previous)
        if event is not None:
            post_event(self.kube, body, Event(*event), now_rfc3339())

    def _planner_input(self, ns: str, name: str, obs: Observation) -> None:
        """The role states of the decision and its time, the time last (see LAST_PLAN)."""
        for role in Role:
            st = obs.role(role)
            for state, count in (("ready", st.ready), ("warming", len(st.warming)),
                                 ("draining", st.draining), ("recently_ready", st.recently_ready)):
                OBSERVED_INSTANCES.labels(ns, name, role, state).set(count)
            for slot, w in enumerate(st.warming):
                WARMING_READY_IN.labels(ns, name, role, str(slot)).set(w.ready_at_seconds - obs.now_seconds)
            for slot in range(len(st.warming), self.warming_slots.get((ns, name, role), 0)):
                WARMING_READY_IN.remove(ns, name, role, str(slot))
            self.warming_slots[(ns, name, role)] = len(st.warming)
        LAST_PLAN.labels(ns, name).set(obs.now_seconds)

    def memory_ignored(self, body: dict[str, Any], problem: str) -> None:
        """The stored planner memory was not fit to plan from: planning starts afresh."""
        meta = body["metadata"]
        log.warning("planner memory of %s/%s ignored: %s", meta["namespace"], meta["name"], problem)
        post_event(self.kube, body, Event("Warning", "PlannerMemoryIgnored",
                                          f"planner memory ignored, starting from an empty one: "
                                          f"{problem}"), now_rfc3339())

    def memory_foreign(self, body: dict[str, Any], why: str) -> None:
        """A ConfigMap of the memory's name is not this PDCluster's: the planner holds, says
        why in ``status.planner`` and with one Warning Event (level-based: only when the
        explanation it carries differs)."""
        meta = body["metadata"]
        explanation = f"holding: {why}"
        before = (body.get("status") or {}).get("planner") or {}
        if before.get("explanation") == explanation and before.get("held") is True:
            return
        log.warning("planner of %s/%s holds: %s", meta["namespace"], meta["name"], why)
        self.kube.patch_status(meta["namespace"], meta["name"],
                               {"planner": {"held": True, "explanation": explanation}})
        post_event(self.kube, body, Event("Warning", EVENT_PLANNER_MEMORY_FOREIGN, why), now_rfc3339())

    def calibration_reset(self, body: dict[str, Any], why: str) -> None:
        """The profile changed under a learned calibration: planning starts from the profile's."""
        meta = body["metadata"]
        log.info("planner of %s/%s: %s", meta["namespace"], meta["name"], why)
        post_event(self.kube, body, Event("Normal", "PlannerCalibrationReset", why), now_rfc3339())

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
