"""The planner loop: read pods and metrics, plan, act. The only code here is I/O and order;
every choice is made by pure functions (``planning``, ``fleet``, ``pdscale.planner``).

A fast tick (``PDSCALE_PLANNER_TICK_SECONDS``, default 5 s) moves drains along and keeps
actuation level-based; the planner itself runs once per ``spec.planner.intervalSeconds``.
Modes: Off does nothing; Recommend writes status, an Event and the gauges, and changes
nothing; Auto also moves the fleet to the decision, in the drain-safe order of ``fleet``.

Its memory (recent loads and decisions, the last planning time) lives in a ConfigMap owned by
the PDCluster, ``<name>-planner``, so an operator restart neither forgets the stabilization
window nor re-plans early; drain state lives on the pods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.request
from dataclasses import replace
from typing import Any

import kopf
from aiohttp import ClientError, ClientSession, ClientTimeout
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from pdscale.operator.routersync import (
    RouterClient,
    RouterError,
    SyncPlan,
    WorkerSpec,
    normalize_url,
)
from pdscale.planner.observe import Role
from pdscale.planner.prometheus import (
    MetricsSnapshot,
    observation_from,
    prometheus_client,
    read_metrics,
    render_queries,
)
from pdscale.planner.solve import step

from . import conditions, names, router
from .builders import unready_allowance_seconds
from .checklist import minimum_transfer_timeout_seconds
from .clock import epoch_seconds, now_rfc3339
from .engines import NIXL_SIDE_CHANNEL_PORT
from .fleet import (
    DELETION_COST_ANNOTATION,
    DRAINING_ANNOTATION,
    DRAINING_DELETION_COST,
    PodView,
    plan_role_actions,
    role_state,
    router_workers,
)
from .kube import Kube, api_client_from_environment
from .pdcluster import PDClusterSpec, PlannerMode, RouterKind
from .planning import (
    decision_event,
    decision_status,
    history_from_json,
    history_keep,
    history_to_json,
    planner_config,
    short,
)
from .reconcile import Event, post_event, reconcile
from .status import overdue_pods
from .vllm_discovery import RUNNING, WAITING, Announcer, PrefillBacklog, PrefillCount, vllm_totals

log = logging.getLogger(__name__)

TICK_SECONDS = float(os.environ.get("PDSCALE_PLANNER_TICK_SECONDS", "5"))
HISTORY_KEY = "history.json"

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


def pod_view(pod: client.V1Pod, role: str) -> PodView:
    meta, status = pod.metadata, pod.status
    ready_cond = next((c for c in (status.conditions or []) if c.type == "Ready"), None)
    ready = ready_cond is not None and ready_cond.status == "True"
    annotations = meta.annotations or {}
    draining = annotations.get(DRAINING_ANNOTATION)
    return PodView(
        name=meta.name,
        role=role,
        ip=status.pod_ip,
        ready=ready,
        created_at_seconds=epoch_seconds(meta.creation_timestamp) or 0.0,
        ready_since_seconds=epoch_seconds(ready_cond.last_transition_time) if ready else None,
        deleting=meta.deletion_timestamp is not None,
        draining_since_seconds=float(draining) if draining else None,
    )


def engine_in_flight(ip: str | None, port: int, timeout_seconds: float = 2.0) -> int | None:
    """Requests an engine still holds, or None when it does not answer (unknown is not zero).

    SGLang's ``/get_load`` counts, on a prefill instance, the requests whose KV its decode
    peer has not collected yet: a prefill is idle only once its last hand-off is done. vLLM
    has no such endpoint; its running and waiting gauges come from ``/metrics``. Read from the
    engine, not Prometheus: a drain must not end on a scrape that is a minute old."""
    if not ip:
        return None
    base = f"http://{ip}:{port}"
    try:
        with urllib.request.urlopen(f"{base}/get_load", timeout=timeout_seconds) as r:
            data = json.loads(r.read())
        entries = data if isinstance(data, list) else [data]
        return sum(int(e.get("num_reqs", 0)) for e in entries)
    except (OSError, ValueError, AttributeError):
        pass
    totals = engine_vllm_totals(ip, port, timeout_seconds)
    if totals is None or not {RUNNING, WAITING} & totals.keys():
        return None
    return round(totals.get(RUNNING, 0.0) + totals.get(WAITING, 0.0))


def engine_vllm_totals(ip: str, port: int, timeout_seconds: float = 2.0) -> dict[str, float] | None:
    """A vLLM engine's ``/metrics``, each metric summed over its labels; None: no answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout_seconds) as r:
            return vllm_totals(r.read().decode(errors="replace"))
    except OSError:
        return None


class PlannerLoop:
    """One per operator process. ``tick_all`` is called every TICK_SECONDS."""

    def __init__(self, api: client.ApiClient, prometheus_url: str | None = None):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.kube = Kube(api)
        self.prometheus_url = prometheus_url or os.environ.get("PDSCALE_PROMETHEUS_URL")
        #: announces workers to vLLM routers (they have no worker API); runs in its own thread
        self.announcer = Announcer(side_channel_port=NIXL_SIDE_CHANNEL_PORT)
        self.routers_seen: set[str] = set()
        #: per draining decode (namespace, pod) behind a vLLM router: the prefill requests it
        #: waits out. Memory only: after a restart it is taken again, later, which is safe
        #: (every request the first one would have waited for is done or still held then).
        self.prefill_backlogs: dict[tuple[str, str], PrefillBacklog] = {}
        self.backlogs_seen: set[tuple[str, str]] = set()

    def tick_all(self) -> None:
        # One list of every pod we manage per tick, not three per PDCluster: with hundreds of
        # PDClusters the loop must cost the API server next to nothing.
        pods: dict[tuple[str, str, str], list[client.V1Pod]] = {}
        managed = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
        for pod in self.core.list_pod_for_all_namespaces(label_selector=managed).items:
            labels = pod.metadata.labels or {}
            key = (pod.metadata.namespace, labels.get(names.LABEL_INSTANCE, ""),
                   labels.get(names.LABEL_ROLE, ""))
            pods.setdefault(key, []).append(pod)
        self.routers_seen = set()
        self.backlogs_seen = set()
        for body in self.kube.list_pdclusters():
            if body["metadata"].get("deletionTimestamp"):
                continue
            key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
            try:
                self.tick(body, time.time(), pods)
            except ApiException as exc:
                log.warning("planner tick of %s failed: HTTP %s %s", key, exc.status, exc.reason)
            except Exception:  # one PDCluster's failure must not stop the others'
                log.exception("planner tick of %s failed", key)
        self.announcer.forget(self.routers_seen)
        self.prefill_backlogs = {k: v for k, v in self.prefill_backlogs.items() if k in self.backlogs_seen}

    # ------------------------------------------------------------------------------------
    def tick(self, body: dict[str, Any], now: float,
             listed_pods: dict[tuple[str, str, str], list[client.V1Pod]]) -> None:
        try:
            spec = PDClusterSpec.model_validate(body.get("spec") or {})
        except ValueError:
            return  # reconcile reports SpecValid=False
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        instance = names.base_name(name)
        pods = {role: [pod_view(p, role) for p in listed_pods.get((ns, instance, role), [])]
                for role in Role}
        router_pods = listed_pods.get((ns, instance, "router"), [])
        vllm = router.kind(spec) is RouterKind.VLLM
        routers = self._discovery_addresses(router_pods, spec) if vllm else self._router_urls(router_pods, spec)
        listed = self._announced(routers) if vllm else self._listed(routers)

        def sync_routers(leaving: frozenset[str] = frozenset()) -> None:
            # The routers list exactly the Ready, non-draining pods (minus those about to drain:
            # a pod leaves the router before it is marked, so no one ever sees a draining
            # pod listed).
            desired = router_workers(
                [p for role in Role for p in pods[role] if p.name not in leaving],
                port=spec.engine.port, bootstrap_port=spec.kv_transfer.bootstrap_port)
            for url in routers:
                if vllm:
                    self.announcer.set_workers(url, desired)
                else:
                    self._sync_router(body, url, desired)

        mode = spec.planner.mode
        if mode is not PlannerMode.OFF:
            for role in Role:
                READY.labels(ns, name, role).set(sum(1 for p in pods[role] if p.serving))
            decision = self._plan_if_due(body, spec, pods, now)
            if mode is PlannerMode.AUTO and decision is not None:
                targets = {"prefill": decision.prefill, "decode": decision.decode}
                self._actuate(body, spec, pods, listed, targets, now, sync_routers)
                pods = {role: self._pods(ns, name, role) for role in Role}
        sync_routers()  # in every mode
        self.routers_seen.update(routers)
        self._report_overdue(body, spec, [p for role in Role
                                          for p in listed_pods.get((ns, instance, role), [])], now)

    def _report_overdue(self, body: dict[str, Any], spec: PDClusterSpec,
                        pods: list[client.V1Pod], now: float) -> None:
        """The tick is the clock that notices a pod outstaying its warm-up allowance (no
        event marks that moment); the reconcile, sole writer of conditions, reports it."""
        allowance = {role: unready_allowance_seconds(spec, role) for role in Role}
        # Only pods not Ready can be overdue: serialize those, not the whole fleet every tick.
        unready = [p for p in pods if not pod_view(p, "").ready]
        overdue = {p.name for p in overdue_pods(
            [self.api.sanitize_for_serialization(p) for p in unready], allowance, now)}
        degraded = conditions.find((body.get("status") or {}).get("conditions"), conditions.DEGRADED)
        message = (degraded or {}).get("message", "")
        named = {p.metadata.name for p in pods if p.metadata.name in message}
        if overdue != named:
            fresh = self.kube.get("PDCluster", body["metadata"]["namespace"], body["metadata"]["name"])
            if fresh is not None:
                reconcile(self.kube, fresh, now_rfc3339())

    def _plan_if_due(self, body, spec, pods, now):  # type: ignore[no-untyped-def]
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        history, last_plan = history_from_json(self._load_memory(ns, name))
        decision = history.decisions[-1] if history.decisions else None
        if last_plan is not None and now - last_plan < spec.planner.interval_seconds:
            return decision
        previous = decision
        started = time.monotonic()
        config = planner_config(spec)
        snapshot = self._read_metrics(spec, ns, name, now)
        obs = observation_from(
            snapshot, now,
            role_state(pods["prefill"], now, spec.prefill.warmup_seconds),
            role_state(pods["decode"], now, spec.decode.warmup_seconds),
        )
        decision, history = step(obs, config=config, history=history, now=now)
        self._save_memory(body, history_to_json(history, now, history_keep(config)))
        PLAN_SECONDS.labels(ns, name).observe(time.monotonic() - started)
        self._report(body, spec, decision, previous, snapshot, obs)
        return decision

    # -- the routers ---------------------------------------------------------------------
    def _router_urls(self, pods: list[client.V1Pod], spec: PDClusterSpec) -> list[str]:
        return [f"http://{p.status.pod_ip}:{spec.router.port}" for p in pods
                if p.status.pod_ip and p.metadata.deletion_timestamp is None
                and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]

    def _discovery_addresses(self, pods: list[client.V1Pod], spec: PDClusterSpec) -> list[str]:
        # Not only Ready routers: vllm-router is not Ready until it has workers.
        return [f"{p.status.pod_ip}:{spec.router.discovery_port}" for p in pods
                if p.status.pod_ip and p.metadata.deletion_timestamp is None]

    def _announced(self, addresses: list[str]) -> set[str] | None:
        """Worker URLs some vLLM router may still send new requests to (see vllm_discovery)."""
        urls: set[str] = set()
        for address in addresses:
            listed = self.announcer.listed(address)
            if listed is None:
                return None
            urls |= listed
        return urls

    def _listed(self, routers: list[str]) -> set[str] | None:
        """Worker URLs some router lists; None when a router could not be asked (then every
        pod counts as listed: a drain must not finish on a guess)."""
        if not routers:
            return set()

        async def ask() -> set[str] | None:
            urls: set[str] = set()
            async with ClientSession(timeout=ClientTimeout(total=5)) as session:
                for url in routers:
                    try:
                        urls |= {normalize_url(w.url) for w in await RouterClient(url, session).list_workers()}
                    except (ClientError, RouterError, TimeoutError):
                        return None
            return urls
        return asyncio.run(ask())

    def _sync_router(self, body: dict[str, Any], url: str, desired: frozenset[WorkerSpec]) -> None:
        async def sync() -> SyncPlan:
            async with ClientSession(timeout=ClientTimeout(total=10)) as session:
                return await RouterClient(url, session).sync(desired)
        try:
            done = asyncio.run(sync())
        except (ClientError, RouterError, TimeoutError) as exc:
            log.warning("router %s: worker sync failed: %s", url, exc)
            return
        if not done.empty:
            added = [w.url for w in done.add]
            removed = [w.url for w in done.remove]
            log.info("router %s: added %s, removed %s", url, added, removed)

    def _pods(self, ns: str, name: str, role: str) -> list[PodView]:
        selector = ",".join(f"{k}={v}" for k, v in names.selector_labels(name, role).items())
        return [pod_view(p, role) for p in self.core.list_namespaced_pod(ns, label_selector=selector).items]

    def _read_metrics(self, spec: PDClusterSpec, ns: str, name: str, now: float) -> MetricsSnapshot:
        url = spec.planner.prometheus_url or self.prometheus_url
        queries = render_queries(spec.engine.kind.value, namespace=ns, pdcluster=names.base_name(name),
                                 window_seconds=max(spec.planner.interval_seconds, 10))
        if not url:
            return MetricsSnapshot({q: None for q in queries},
                                   {q: "no Prometheus URL (spec.planner.prometheusURL)" for q in queries})
        return read_metrics(prometheus_client(url), queries, now)

    def _memory_name(self, name: str) -> str:
        return f"{names.base_name(name)}-planner"

    def _load_memory(self, ns: str, name: str) -> str | None:
        try:
            cm = self.core.read_namespaced_config_map(self._memory_name(name), ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return (cm.data or {}).get(HISTORY_KEY)

    def _save_memory(self, body: dict[str, Any], text: str) -> None:
        meta = body["metadata"]
        self.kube.apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": self._memory_name(meta["name"]), "namespace": meta["namespace"],
                "labels": {names.LABEL_MANAGED_BY: names.MANAGER,
                           names.LABEL_INSTANCE: names.base_name(meta["name"])},
                "ownerReferences": [{"apiVersion": body["apiVersion"], "kind": body["kind"],
                                     "name": meta["name"], "uid": meta["uid"], "controller": True}],
            },
            "data": {HISTORY_KEY: text},
        })

    def _report(self, body, spec, decision, previous, snapshot, obs) -> None:  # type: ignore[no-untyped-def]
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = decision_status(decision, spec.planner.mode, snapshot, now_rfc3339())
        status["metricsAvailable"] = not snapshot.failures
        self.kube.patch_status(ns, name, {"planner": status})
        for role, count in (("prefill", decision.prefill), ("decode", decision.decode)):
            RECOMMENDED.labels(ns, name, role).set(count)
        for gauge, value in ((PREDICTED_TTFT, decision.predicted_ttft_seconds),
                             (PREDICTED_TPOT, decision.predicted_tpot_seconds),
                             (SLO_TTFT, spec.slo.ttft_seconds),
                             (SLO_TPOT, spec.slo.tpot_seconds)):
            gauge.labels(ns, name).set(value)
        for gauge, reading in ((OBSERVED_TTFT, obs.ttft_p99_seconds), (OBSERVED_TPOT, obs.tpot_p99_seconds)):
            if reading is not None:
                gauge.labels(ns, name).set(reading.value)
        bound = "held" if decision.held else ("shortfall" if decision.shortfall else "slo")
        DECISIONS.labels(ns, name, bound).inc()
        log.info("plan %s/%s: %s (%s)", ns, name, short(decision), decision.explanation)
        event = decision_event(decision, previous)
        if event is not None:
            post_event(self.kube, body, Event(*event), now_rfc3339())

    def _actuate(self, body, spec, pods, listed, targets, now, sync_routers) -> None:  # type: ignore[no-untyped-def]
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        replicas: dict[str, int] = {}
        waiting: list[str] = []
        leaving: set[str] = set()
        vllm = router.kind(spec) is RouterKind.VLLM
        for role in Role:
            TARGET.labels(ns, name, role).set(targets[role])
            deployment = self.apps.read_namespaced_deployment(names.child_name(name, role), ns)
            current = deployment.spec.replicas or 0
            views = [
                replace(p, in_flight=engine_in_flight(p.ip, spec.engine.port),
                        in_router=listed is None
                        or normalize_url(f"http://{p.ip}:{spec.engine.port}") in listed)
                if p.draining else p
                for p in pods[role]
            ]
            if vllm and role == "decode":
                views = self._await_prefill(ns, spec, views, pods["prefill"], now)
            actions = plan_role_actions(
                role, targets[role], views, current, now_seconds=now,
                drain_timeout_seconds=float(spec.decode.pre_stop_drain_seconds if role == "decode"
                                            else spec.prefill.pre_stop_drain_seconds) * 5,
            )
            for pod in actions.undrain:
                self._mark(ns, pod, draining_since=None)
            if actions.start_drain:
                leaving |= set(actions.start_drain)
                sync_routers(frozenset(leaving))  # out of the router first
            for pod in actions.start_drain:
                self._mark(ns, pod, draining_since=now)
                post_event(self.kube, body, Event("Normal", "DrainStarted",
                                                  f"{role} pod {pod}: out of the router, draining"), now_rfc3339())
            for pod in actions.finish_drain:
                post_event(self.kube, body, Event("Normal", "DrainFinished",
                                                  f"{role} pod {pod}: drained, removing"), now_rfc3339())
            replicas[role] = current if actions.replicas is None else actions.replicas
            waiting += actions.waiting
        status = (body.get("status") or {}).get("planner", {})
        if status.get("replicas") != replicas or status.get("waiting", []) != waiting:
            # ``waiting`` tells a user why the fleet is not yet at the target.
            self.kube.patch_status(ns, name, {"planner": {"replicas": replicas, "waiting": waiting}})
        if status.get("replicas") != replicas:
            # The reconcile applies these to the Deployments (one writer, one field manager).
            fresh = self.kube.get("PDCluster", ns, name)
            if fresh is not None:
                reconcile(self.kube, fresh, now_rfc3339())

    def _await_prefill(self, ns: str, spec: PDClusterSpec, decode: list[PodView],
                       prefill: list[PodView], now: float) -> list[PodView]:
        """Marks each draining decode that has left the vLLM router but may still be sent
        requests held at a prefill engine (see vllm_discovery.PrefillBacklog)."""
        leaving = [p for p in decode if p.draining and not p.in_router]
        if not leaving:
            return decode
        counts: dict[str, PrefillCount | None] = {}
        for p in prefill:
            if p.ip:
                totals = engine_vllm_totals(p.ip, spec.engine.port)
                counts[p.name] = None if totals is None else PrefillCount.from_totals(totals)
        serving = [p.name for p in prefill if p.ready and p.ip]
        linger = minimum_transfer_timeout_seconds(spec)
        awaited: set[str] = set()
        for pod in leaving:
            key = (ns, pod.name)
            self.backlogs_seen.add(key)
            backlog = self.prefill_backlogs.get(key)
            if backlog is None:
                taken = {name: counts.get(name) for name in serving}
                if any(c is None for c in taken.values()):
                    awaited.add(pod.name)  # a serving prefill did not answer: next tick
                    continue
                backlog = PrefillBacklog({n: c for n, c in taken.items() if c is not None})
                log.info("decode %s/%s left the router; waits out %d requests held at prefill",
                         ns, pod.name, backlog.waiting_on())
            followed = backlog.follow(counts, now)
            if followed.cleared_at is not None and backlog.cleared_at is None:
                log.info("decode %s/%s: the prefill requests it waited for are done", ns, pod.name)
            self.prefill_backlogs[key] = backlog = followed
            if backlog.pending(now, linger):
                awaited.add(pod.name)
        return [replace(p, awaited_by_prefill=True) if p.name in awaited else p for p in decode]

    def _mark(self, ns: str, pod: str, *, draining_since: float | None) -> None:
        annotations: dict[str, str | None] = {
            DRAINING_ANNOTATION: None if draining_since is None else f"{draining_since:.3f}",
            DELETION_COST_ANNOTATION: None if draining_since is None else str(DRAINING_DELETION_COST),
        }
        self.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": annotations}})


async def run_forever(loop: PlannerLoop) -> None:
    while True:
        await asyncio.sleep(TICK_SECONDS)
        try:
            await asyncio.to_thread(loop.tick_all)
        except ApiException as exc:
            log.warning("planner loop: listing PDClusters failed: HTTP %s", exc.status)


# -- kopf wiring (imported by handlers.py, so `kopf run -m pdscale.operator.handlers` runs it) --
@kopf.on.startup()
async def start_planner(memo: kopf.Memo, **_: Any) -> None:
    port = os.environ.get("PDSCALE_METRICS_PORT")
    if port:
        # The operator's own metrics: decisions, predicted vs observed latency, time per plan.
        start_http_server(int(port), addr=os.environ.get("PDSCALE_METRICS_HOST", "0.0.0.0"))
    loop = PlannerLoop(api_client_from_environment())
    memo.announcer_stop = threading.Event()
    threading.Thread(target=loop.announcer.run, args=(memo.announcer_stop,), name="vllm-discovery",
                     daemon=True).start()
    memo.planner_task = asyncio.create_task(run_forever(loop))


@kopf.on.cleanup()
async def stop_planner(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "planner_task", None)
    if task is not None:
        task.cancel()
    stop = getattr(memo, "announcer_stop", None)
    if stop is not None:
        stop.set()
