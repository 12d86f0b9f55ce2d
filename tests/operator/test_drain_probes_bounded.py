"""The drain step asks its draining engines at once, within one bound: 32 engines that never
answer (real loopback servers at 127.0.0.2-33, each probe with its 2 s deadline) cost one
probe's time, not 32 of them (64 s: past the liveness bound), and an engine not answered in
time is unknown, never idle."""

from __future__ import annotations

import time

from test_planner_loop import NOW, NS, FakeKube, FakeWorkers, _pod, _spec_doc

from pdscale.operator.api import names
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.loop.drain import PROBE_BOUND_SECONDS, DeletionDrain, Drains, probe_all
from pdscale.operator.loop.fleet import pod_view
from pdscale.operator.loop.telemetry import Reporter
from pdscale.planner.observe import Role
from pdscale.testbed.hostile_http import HostileServer

SILENT = 32


def _silent_engines() -> list[HostileServer]:
    first = HostileServer("silent", host="127.0.0.2", give_up_seconds=90)
    return [first, *(HostileServer("silent", host=f"127.0.0.{i}", port=first.port, give_up_seconds=90)
                     for i in range(3, SILENT + 2))]


def _fleet(port: int) -> tuple[FakeKube, dict, PDClusterSpec]:
    kube = FakeKube()
    doc = _spec_doc(mode="Auto")
    doc["metadata"]["name"] = "demo"
    doc["spec"]["engine"]["port"] = port
    kube.objects[("PDCluster", NS, "demo")] = doc
    kube.pods = [_pod("demo-prefill-a", "prefill", "10.0.0.1"),
                 *(_pod(f"demo-decode-{i}", "decode", f"127.0.0.{i}", draining=NOW - 1)
                   for i in range(2, SILENT + 2)),
                 _pod("demo-decode-serving", "decode", "10.0.0.9")]
    for role, replicas in (("prefill", 1), ("decode", SILENT + 1)):
        kube.objects[("Deployment", NS, f"demo-{role}")] = {
            "kind": "Deployment", "metadata": {"name": f"demo-{role}", "namespace": NS,
                                                "ownerReferences": [{"controller": True,
                                                                     "uid": doc["metadata"]["uid"]}]},
            "spec": {"replicas": replicas}}
    return kube, doc, PDClusterSpec.model_validate(doc["spec"])


def test_32_silent_draining_engines_cost_one_bound_not_64_seconds():
    servers = _silent_engines()
    try:
        kube, _, spec = _fleet(servers[0].port)
        pods = {role: [pod_view(p, role) for p in kube.list_pods(NS, names.selector_labels("demo", role))]
                for role in Role}
        drains = Drains(kube, Reporter(kube))  # the real probes (engine_probe, 2 s each)
        drains.begin_tick()
        started = time.monotonic()
        drains.move(kube.get("PDCluster", NS, "demo"), spec, pods, FakeWorkers(), set(),
                    {Role.PREFILL: 1, Role.DECODE: 1}, NOW)
        took = time.monotonic() - started
        drains.end_tick()
        assert took < PROBE_BOUND_SECONDS + 2.0, f"the drain step took {took:.1f} s"
        assert sum(s.connections for s in servers) == SILENT  # every one was asked
        # none answered: none is idle, so none ends its drain, and the replicas stay
        planner = kube.get("PDCluster", NS, "demo")["status"]["planner"]
        assert planner["replicas"]["decode"] == SILENT + 1
    finally:
        for server in servers:
            server.close()


def test_a_deleted_pdcluster_asks_its_engines_at_once_too():
    servers = _silent_engines()
    try:
        kube, _, _ = _fleet(servers[0].port)
        body = kube.get("PDCluster", NS, "demo")
        body["metadata"].update(finalizers=["pdscale.io/drain"], deletionTimestamp="2027-01-15T08:00:00Z")

        class Lists:
            def of(self, spec, routers):
                return FakeWorkers()

        started = time.monotonic()
        done = DeletionDrain(kube, Lists()).step(body, NOW)  # type: ignore[arg-type]
        took = time.monotonic() - started
        assert not done  # silent engines are not idle
        assert took < PROBE_BOUND_SECONDS + 2.0, f"the deletion step took {took:.1f} s"
    finally:
        for server in servers:
            server.close()


def test_probes_past_the_bound_are_unknown():
    def slow(target: int) -> int:
        time.sleep(0.3 if target < 4 else 5.0)
        return target

    started = time.monotonic()
    out = probe_all(slow, range(40), bound_seconds=1.0, concurrency=8)
    assert time.monotonic() - started < 2.0
    assert {t: v for t, v in out.items() if v is not None} == {0: 0, 1: 1, 2: 2, 3: 3}
    assert len(out) == 40


def test_a_probe_that_raises_is_unknown():
    def broken(target: str) -> int:
        raise RuntimeError("boom")

    assert probe_all(broken, ["a", "a", "b"]) == {"a": None, "b": None}
