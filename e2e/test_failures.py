"""Failures a user will meet, on the whole product (chart, operator in Auto, real router and
Prometheus, simulated engines on fake 8xH200 nodes):

1. the operator is killed (SIGKILL) in the middle of a drain: the restarted operator finishes
   that drain, and the pod is removed only once its engine holds no request;
2. Prometheus stops mid-run: the planner holds the fleet and says why, then resumes when
   Prometheus returns;
3. a rollout whose pods never become Ready: they never join the router, and the PDCluster
   turns Degraded naming them.

The steps share one stack and one PDCluster and run in file order (each leaves the fleet as
the next expects). About five minutes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes import client

from pdscale.testbed.demo import (
    GROUP,
    OLD_DEFAULT_ROUTER,
    PLURAL,
    VERSION,
    load_pdcluster,
    router_url,
)
from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.loadgen import RequestRecord, RequestSpec, send_one
from pdscale.testbed.nodes import api_client
from pdscale.testbed.simfleet import in_flight_at
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME, NS = "fail", "default"
INTERVAL_SECONDS = 10
DRAINING = "pdscale.io/draining-since"


@dataclass
class World:
    stack: Stack
    core: client.CoreV1Api
    apps: client.AppsV1Api
    custom: client.CustomObjectsApi
    router: str
    records: list[RequestRecord] = field(default_factory=list)

    def pdc(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)

    def patch_spec(self, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME, {"spec": spec})

    def pods(self, role: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(
            NS, label_selector=f"app.kubernetes.io/instance={NAME},pdscale.io/role={role}").items

    def listed(self) -> set[str]:
        with urllib.request.urlopen(f"{self.router}/workers", timeout=5) as r:
            return {w["url"].rstrip("/") for w in json.loads(r.read())["workers"]}

    def events(self, reason: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(
            NS, field_selector=f"involvedObject.kind=PDCluster,involvedObject.name={NAME}").items
            if e.reason == reason]

    def send(self, specs: list[RequestSpec]) -> threading.Thread:
        """Send requests through the router in the background; records land in .records."""
        async def run() -> None:
            from aiohttp import ClientSession, TCPConnector

            async with ClientSession(connector=TCPConnector(limit=0)) as session:
                start = time.monotonic()

                async def one(spec: RequestSpec) -> None:
                    await asyncio.sleep(max(spec.at_seconds - (time.monotonic() - start), 0.0))
                    self.records.append(
                        await send_one(session, self.router, "chat", spec, "sim-model", start, 300.0))

                await asyncio.gather(*(one(s) for s in specs))

        thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
        thread.start()
        return thread


def in_flight(pod: client.V1Pod) -> int | None:
    return in_flight_at(f"http://{pod.status.pod_ip}:8000")


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def request(index: int, output_tokens: int, at: float = 0.0) -> RequestSpec:
    words = " ".join(f"w{index}x{i}" for i in range(40))
    return RequestSpec(index, "failures", at, 40, output_tokens, words)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("failures")
    with Stack(workdir=workdir / "stack", nodes=12, profile="demo-sim", progress=False,
               release_namespace="pdscale-failures") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        api = api_client(stack.kubeconfig)
        custom = client.CustomObjectsApi(api)
        body = load_pdcluster(NAME, NS, stack.prometheus.url)
        spec = body["spec"]
        # measured behind sglang-router 0.3.2, which admits everything: named, not defaulted
        spec["router"].update(OLD_DEFAULT_ROUTER)
        spec["prefill"].update(replicas=2, minReplicas=2, maxReplicas=4)
        # A drain may take up to 5 x preStopDrainSeconds before it gives up waiting: 150 s,
        # longer than any request here, so only an idle engine ends a drain.
        for role in ("prefill", "decode"):
            spec[role].update(preStopDrainSeconds=30, terminationGracePeriodSeconds=60)
        spec["decode"].update(replicas=3, minReplicas=1, maxReplicas=3)
        spec["planner"]["nodeBudget"] = 12
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        core = client.CoreV1Api(api)
        w = World(stack, core, client.AppsV1Api(api), custom,
                  router_url(core, NS, NAME, spec["router"]["port"]))
        wait_for(lambda: len(w.listed()) == 5, timeout_seconds=120,
                 what="the router listing 2 prefill and 3 decode workers")
        yield w
        stack.remove_pdcluster(NS, NAME)


def test_operator_killed_mid_drain_restarts_and_finishes_it_only_once_idle(world: World):
    w = world
    decode = {p.metadata.name for p in w.pods("decode")}
    assert len(decode) == 3
    # Two long requests per decode instance (round robin): every candidate for the drain
    # holds work.
    loader = w.send([request(i, 600) for i in range(6)])
    wait_for(lambda: all((in_flight(p) or 0) > 0 for p in w.pods("decode")), timeout_seconds=30,
             what="each decode engine holding a request")
    # The user lowers the ceiling: the planner must drain one decode instance to meet it.
    w.patch_spec({"decode": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2}})
    draining = wait_for(lambda: next((p for p in w.pods("decode")
                                      if (p.metadata.annotations or {}).get(DRAINING)), None),
                        timeout_seconds=3 * INTERVAL_SECONDS, what="a decode pod marked draining")
    # Kill it in the longest step of a drain: out of the router, waiting for in-flight work.
    url = f"http://{draining.status.pod_ip}:8000"
    wait_for(lambda: url not in w.listed(), timeout_seconds=10, what="the router letting go")
    w.stack.kill_operator()
    killed_at = time.time()
    name = draining.metadata.name
    work_at_kill = in_flight(draining)
    assert work_at_kill and work_at_kill > 0, f"{name} was idle when the operator died: no test"

    # Nobody finishes the drain while the operator is down.
    time.sleep(8)
    pod = w.core.read_namespaced_pod(name, NS)
    assert pod.metadata.deletion_timestamp is None
    w.stack.start_operator()

    readings: list[tuple[float, int | None]] = []

    def removed() -> bool:
        try:
            pod = w.core.read_namespaced_pod(name, NS)
        except client.ApiException as exc:
            return exc.status == 404
        if pod.metadata.deletion_timestamp is not None:
            return True
        readings.append((time.time(), in_flight(pod)))
        return False

    wait_for(removed, timeout_seconds=120, interval_seconds=0.5, what=f"{name} removed after its drain")
    assert any((n or 0) > 0 for _, n in readings), "the drain ended before the restart saw work"
    # What the engine held when its pod was deleted: the simulated kubelet reads its load when
    # it first sees the deletion (SIGTERM comes only after the preStop sleep). (The readings
    # above are 0.5 s apart: the last one may predate a request finishing just before the
    # operator's check.)
    fleet, key = w.stack.fleet, f"{NS}/{name}"
    assert fleet is not None

    def at_deletion() -> int | None:
        return fleet.in_flight_at_deletion.get(key)

    wait_for(lambda: at_deletion() is not None, timeout_seconds=30,
             what=f"{name}'s engine read at its deletion")
    held = at_deletion()
    assert held == 0, f"{name} removed while its engine held {held} requests; readings {readings[-5:]}"
    finished = [e for e in w.events("DrainFinished") if name in e.message]
    assert finished and finished[0].first_timestamp.timestamp() >= killed_at - 1
    assert {p.metadata.name for p in w.pods("decode") if not p.metadata.deletion_timestamp} \
        == decode - {name}, "a pod other than the drained one was removed"
    loader.join(timeout=120)
    failed = [r for r in w.records if not r.ok]
    assert len(w.records) == 6 and not failed, f"failed requests: {[r.error for r in failed]}"


def test_prometheus_stopped_mid_run_holds_the_fleet_then_resumes(world: World):
    w = world
    prom = w.stack.prometheus
    assert prom is not None
    # A light steady load, so that every query has data while Prometheus is up.
    specs = [request(100 + i, 10, at=i * 0.5) for i in range(240)]
    loader = w.send(specs)

    def planner() -> dict:
        return (w.pdc().get("status") or {}).get("planner") or {}

    wait_for(lambda: planner().get("metricsAvailable") is True and not planner().get("held"),
             timeout_seconds=6 * INTERVAL_SECONDS, what="a decision on live metrics")
    replicas = {d: w.apps.read_namespaced_deployment(f"{NAME}-{d}", NS).spec.replicas
                for d in ("prefill", "decode")}
    prom.stop()
    held = wait_for(lambda: (p := planner()).get("held") and p.get("metricsAvailable") is False and p,
                    timeout_seconds=3 * INTERVAL_SECONDS, what="the planner holding")
    assert "unreachable" in held["metrics"], held["metrics"]
    assert held["recommended"] == {"prefill": replicas["prefill"], "decode": replicas["decode"]}
    wait_for(lambda: w.events("PlannerHolding"), what="a PlannerHolding Event")
    # Two more intervals without metrics: nothing moves.
    time.sleep(2 * INTERVAL_SECONDS)
    assert {d: w.apps.read_namespaced_deployment(f"{NAME}-{d}", NS).spec.replicas
            for d in ("prefill", "decode")} == replicas
    assert planner()["held"] is True

    prom.start()
    resumed = wait_for(lambda: (p := planner()).get("metricsAvailable") is True
                       and not p.get("held") and p, timeout_seconds=4 * INTERVAL_SECONDS,
                       what="the planner deciding on metrics again")
    assert "unreachable" not in resumed.get("metrics", "")
    loader.join(timeout=180)
    failed = [r for r in w.records if not r.ok]
    assert not failed, f"failed requests: {[r.error for r in failed][:3]}"


def test_pods_that_never_become_ready_stay_out_of_the_router_and_degrade(world: World):
    w = world
    # A rollout whose new pods never pass readiness (an engine stuck loading): one pod per
    # role is replaced at a time (maxUnavailable 1), so each role keeps its other pods.
    w.patch_spec({"placement": {"podAnnotations": {
        "pdscale.io/simulated-ready-delay-seconds": "100000"}}})

    def stuck() -> list[client.V1Pod]:
        return [p for role in ("prefill", "decode") for p in w.pods(role)
                if (p.metadata.annotations or {}).get("pdscale.io/simulated-ready-delay-seconds")
                == "100000" and p.metadata.deletion_timestamp is None]

    wait_for(lambda: len(stuck()) >= 2, timeout_seconds=60, what="a new pod per role")

    def degraded() -> dict | None:
        conds = (w.pdc().get("status") or {}).get("conditions") or []
        cond = next((c for c in conds if c["type"] == "Degraded"), None)
        return cond if cond and cond["status"] == "True" and cond["reason"] == "PodNotReady" else None

    # Allowance: 3 x the 20 s warm-up, from each pod's own start (the roles' new pods may be
    # created seconds apart). Meanwhile, the router never lists a stuck pod.
    def names_all(cond: dict | None) -> bool:
        return cond is not None and all(p.metadata.name in cond["message"] for p in stuck())

    deadline = time.monotonic() + 150
    cond = None
    while not names_all(cond) and time.monotonic() < deadline:
        ips = {f"http://{p.status.pod_ip}:8000" for p in stuck() if p.status.pod_ip}
        assert not ips & w.listed(), f"the router lists a pod that is not Ready: {ips & w.listed()}"
        assert not any(ready(p) for p in stuck())
        cond = degraded()
        time.sleep(1)
    assert cond is not None, "no Degraded/PodNotReady condition within 150 s"
    assert names_all(cond), f"not every stuck pod is named: {cond['message']}"
    assert "kept out of the router" in cond["message"]
    ready_cond = next(c for c in w.pdc()["status"]["conditions"] if c["type"] == "Ready")
    assert ready_cond["status"] == "False"  # a new generation that has not rolled out
    assert w.events("PodNotReady"), "no Warning Event for the stuck pods"
    # The fleet still serves through the pods of the previous generation.
    assert w.listed()
