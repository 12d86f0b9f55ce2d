"""The API server failing under a running product (chart, operator in Auto, real router and
Prometheus, simulated engines on fake 8xH200 nodes, a steady load):

1. the kube-apiserver is restarted mid-run (every connection and watch breaks);
2. the kube-apiserver is paused (SIGSTOP) for 30 s, then resumed (connections hang: only
   timeouts notice).

After each, the operator's loops resume (the planner writes a new decision, its loops beat
again), the router lists exactly the Ready, non-draining pods at every sample, no request
fails, and the operator process is still the one that started; after the pause, the planner
loop counted the calls its timeouts cut. Each test has its own stack (a fault leaves the
control plane in no state to share). About two minutes each (4 min for the module).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME, NS = "apifault", "default"
INTERVAL_SECONDS = 10
DRAINING = "pdscale.io/draining-since"


@dataclass
class Sample:
    t: float
    listed: set[str]
    #: Ready, non-draining engine pods read just before and just after the router
    before: set[str]
    after: set[str]
    #: Ready pods marked draining at either read: the operator marks a pod first and drops
    #: it from the router next, so the router may still list it for that moment (harmless:
    #: the pod serves until it is idle)
    draining: set[str] = field(default_factory=set)


@dataclass
class World:
    stack: Stack
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    router: str
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def planner(self) -> dict:
        pdc = self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
        return (pdc.get("status") or {}).get("planner") or {}

    def listed(self) -> set[str]:
        with urllib.request.urlopen(f"{self.router}/workers", timeout=5) as r:
            return {w["url"].rstrip("/") for w in json.loads(r.read())["workers"]}

    def serving(self) -> tuple[set[str], set[str]]:
        """Ready engine pods not being deleted: (not draining, draining)."""
        pods = self.core.list_namespaced_pod(
            NS, label_selector=f"app.kubernetes.io/instance={NAME}", _request_timeout=5).items
        ready = [p for p in pods
                 if (p.metadata.labels or {}).get("pdscale.io/role") in ("prefill", "decode")
                 and p.status.pod_ip and p.metadata.deletion_timestamp is None
                 and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
        split: tuple[set[str], set[str]] = (set(), set())
        for p in ready:
            split[bool((p.metadata.annotations or {}).get(DRAINING))].add(f"http://{p.status.pod_ip}:8000")
        return split

    def sample_forever(self) -> None:
        """A sample a second while the API server answers (none while it does not)."""
        while not self.stop.is_set():
            try:
                before, draining_before = self.serving()
                listed = self.listed()
                after, draining_after = self.serving()
            except Exception:  # the API server is down or paused: no sample
                pass
            else:
                self.samples.append(Sample(time.time(), listed, before, after,
                                           draining_before | draining_after))
            self.stop.wait(1.0)

    def send_steady_load(self) -> threading.Thread:
        """One short request through the router every half second until ``stop``."""
        async def run() -> None:
            from aiohttp import ClientSession, TCPConnector

            async with ClientSession(connector=TCPConnector(limit=0)) as session:
                start = time.monotonic()

                async def one(spec: RequestSpec) -> None:
                    self.records.append(
                        await send_one(session, self.router, "chat", spec, "sim-model", start, 120.0))

                sent: list[asyncio.Task[None]] = []
                while not self.stop.is_set():
                    words = " ".join(f"w{len(sent)}x{j}" for j in range(40))
                    spec = RequestSpec(len(sent), "steady", time.monotonic() - start, 40, 10, words)
                    sent.append(asyncio.create_task(one(spec)))
                    await asyncio.sleep(0.5)
                await asyncio.gather(*sent)

        thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
        thread.start()
        return thread

    def operator_processes(self) -> list:
        """The operator processes of the stack (one, or several electing a leader)."""
        many = getattr(self.stack, "operators", None)
        if many:
            return list(many.values())
        one = getattr(self.stack, "operator", None)
        return [one] if one is not None else []

    def loop_metric(self, name: str) -> dict[str, float]:
        """One of the operator's per-loop metrics, by loop."""
        url = f"http://127.0.0.1:{self.stack.operator_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        return {m[0]: float(m[1]) for m in re.findall(
            rf'^{name}\{{loop="([^"]+)"\}} (\S+)$', text, re.M)}

    def loop_beats(self) -> dict[str, float]:
        """Each loop's last finished tick (epoch seconds)."""
        return self.loop_metric("pdscale_loop_last_tick_timestamp_seconds")


def _time(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # The operator's API calls time out after 10 s (default 30 s): shorter than the pause, so
    # that the pause is met by timeouts (and counted), not waited out.
    monkeypatch.setenv("PDSCALE_KUBE_TIMEOUT_SECONDS", "5,10")
    with Stack(workdir=tmp_path / "stack", nodes=6, profile="demo-sim", progress=False,
               release_namespace="pdscale-apifaults") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        api = api_client(stack.kubeconfig)
        custom = client.CustomObjectsApi(api)
        body = load_pdcluster(NAME, NS, stack.prometheus.url)
        spec = body["spec"]
        # measured behind sglang-router 0.3.2, which admits everything: named, not defaulted
        spec["router"].update(OLD_DEFAULT_ROUTER)
        # A fixed fleet (1 prefill, 2 decode) under a light load: the planner decides every
        # interval, and its decisions move nothing, so the router's list must stay put.
        spec["prefill"].update(replicas=1, minReplicas=1, maxReplicas=1)
        spec["decode"].update(replicas=2, minReplicas=2, maxReplicas=2)
        spec["planner"]["nodeBudget"] = 6
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        core = client.CoreV1Api(api)
        w = World(stack, core, custom, router_url(core, NS, NAME, spec["router"]["port"]))
        wait_for(lambda: len(w.listed()) == 3, timeout_seconds=120,
                 what="the router listing 1 prefill and 2 decode workers")
        yield w
        w.stop.set()
        print(f"operator log: {stack.workdir / 'operator.log'}")


def _run_through(w: World, fault: Callable[[], None]) -> None:
    """Steady load and samples; a first decision; the fault; then the checks."""
    operators = w.operator_processes()
    assert operators, "no operator process"
    loader = w.send_steady_load()
    sampler = threading.Thread(target=w.sample_forever, daemon=True)
    sampler.start()
    first = wait_for(lambda: (p := w.planner()).get("lastDecisionTime") and p,
                     timeout_seconds=6 * INTERVAL_SECONDS, what="a first decision")
    fault()
    recovered = time.time()
    # The loops resume: a decision made after the API server came back ...
    after = wait_for(lambda: (p := w.planner()).get("lastDecisionTime")
                     and _time(p["lastDecisionTime"]) > recovered and p,
                     timeout_seconds=90, interval_seconds=1, what="a new decision after the fault")
    assert _time(after["lastDecisionTime"]) > _time(first["lastDecisionTime"])
    # ... and every background loop finishing ticks again
    wait_for(lambda: (b := w.loop_beats()) and all(t > recovered for t in b.values())
             and {"planner", "resync"} <= b.keys(),
             timeout_seconds=60, what="every loop beating after the fault")
    resumed = time.time()
    # A few more intervals of steady load on the recovered control plane.
    time.sleep(2 * INTERVAL_SECONDS)
    w.stop.set()
    sampler.join(timeout=15)
    loader.join(timeout=150)
    checked = [s for s in w.samples if s.t >= resumed]
    assert len(checked) >= 5, f"only {len(checked)} samples after recovery"
    for s in checked:
        # equal, up to the moment between reads: nothing listed that was not serving (or just
        # marked draining) at one of the two reads around it, nothing serving at both reads
        # missing from the list
        stray = s.listed - (s.before | s.after | s.draining)
        missing = (s.before & s.after) - s.listed
        assert not stray and not missing, (
            f"at {s.t - resumed:.0f}s after recovery the router listed {sorted(s.listed)}; "
            f"not serving: {sorted(stray)}, serving but not listed: {sorted(missing)}")
    failed = [r for r in w.records if not r.ok]
    assert w.records, "no request was sent"
    assert not failed, f"{len(failed)} of {len(w.records)} failed, e.g. {failed[0].error}"
    assert all(p.poll() is None for p in operators), "an operator process died"
    assert w.operator_processes() == operators, "the operator was restarted"


def test_apiserver_restarted_mid_run_the_loops_resume(world: World):
    w = world
    assert w.stack.local is not None, "needs the local control plane (not KUBECONFIG)"
    local = w.stack.local
    _run_through(w, lambda: local.restart_apiserver(down_seconds=5))


def test_apiserver_paused_30s_mid_run_the_loops_resume(world: World):
    w = world
    assert w.stack.local is not None, "needs the local control plane (not KUBECONFIG)"

    def pause() -> None:
        assert w.stack.local is not None
        w.stack.local.pause_apiserver()
        try:
            time.sleep(30)
        finally:
            w.stack.local.resume_apiserver()

    _run_through(w, pause)
    # the hung calls were cut by their timeout and retried, not waited on for good
    errors = w.loop_metric("pdscale_loop_errors_total")
    assert errors.get("planner", 0) >= 1, errors
