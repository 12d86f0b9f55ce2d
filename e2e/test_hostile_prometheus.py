"""One tenant's Prometheus cannot hurt another tenant (issue 42), on the whole product (chart,
operator process, real Prometheus, simulated engines on fake 8xH200 nodes).

Four PDClusters name a "Prometheus" on loopback that never answers, drips its answer a byte a
second, streams a 200 answer for ever, or answers 500 with a secret page. The admin's
allow-list (tenantPolicy.allowedPrometheusURLs) admits them here on purpose: what is tested is
the bounds, not the policy. Beside them a healthy PDCluster, reading the stack's Prometheus,
keeps its 10 s planning interval; no status carries a byte of the hostile answers; the
operator's memory stays bounded and its process is never restarted. About four minutes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client

from pdscale.testbed.demo import GROUP, PLURAL, VERSION, load_pdcluster
from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.hostile_http import HostileServer
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS = "default"
HEALTHY = "healthy"
HOSTILE = ("silent", "drip", "stream", "error")
INTERVAL_SECONDS = 10
#: how long the healthy planner is watched with the hostile ones beside it
WATCH_SECONDS = 120


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, HostileServer]]:
    started = {kind: HostileServer(kind, give_up_seconds=900, drip_every_seconds=1.0)
               for kind in HOSTILE}
    yield started
    for server in started.values():
        server.close()


def _spec(body: dict) -> dict:
    spec = body["spec"]
    spec["planner"]["mode"] = "Recommend"
    spec["prefill"].update(replicas=1, minReplicas=1, maxReplicas=2)
    spec["decode"].update(replicas=1, minReplicas=1, maxReplicas=2)
    spec["planner"]["nodeBudget"] = 4
    return body


def test_hostile_prometheus_servers_delay_no_other_plan_leak_nothing_and_cost_bounded_memory(
        tmp_path_factory: pytest.TempPathFactory, servers: dict[str, HostileServer]):
    workdir = tmp_path_factory.mktemp("hostile")
    with Stack(workdir=workdir / "stack", nodes=12, profile="demo-sim", progress=False,
               release_namespace="pdscale-hostile",
               allowed_prometheus_urls=tuple(s.url for s in servers.values())) as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        custom = client.CustomObjectsApi(api_client(stack.kubeconfig))
        operator = stack.operators["operator-0"]

        def planner(name: str) -> dict:
            body = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
            return (body.get("status") or {}).get("planner") or {}

        custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, _spec(load_pdcluster(HEALTHY, NS, stack.prometheus.url)))
        wait_for(lambda: planner(HEALTHY).get("lastDecisionTime"), timeout_seconds=90,
                 what="the healthy PDCluster's first plan")
        baseline = rss_mib(operator.pid)
        for kind, server in servers.items():
            custom.create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, _spec(load_pdcluster(f"hostile-{kind}", NS, server.url)))
        wait_for(lambda: all(s.connections for s in servers.values()), timeout_seconds=60,
                 what="the operator querying every hostile server")

        decisions: set[str] = set()
        peak = baseline
        end = time.time() + WATCH_SECONDS
        while time.time() < end:
            decisions.add(planner(HEALTHY)["lastDecisionTime"])
            peak = max(peak, rss_mib(operator.pid))
            assert operator.poll() is None, "the operator process died"
            time.sleep(1.0)
        times = sorted(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in decisions)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        print(f"\nhealthy plans {len(times)} in {WATCH_SECONDS} s, gaps {[round(g) for g in gaps]}; "
              f"operator RSS {baseline:.0f} MiB -> peak {peak:.0f} MiB; hostile servers sent "
              f"{ {k: s.bytes_sent for k, s in servers.items()} } bytes")
        # the interval kept: a plan every 10 s (one-second timestamps, a 2 s tick, a loaded box)
        assert len(times) >= WATCH_SECONDS // INTERVAL_SECONDS - 2, times
        assert max(gaps) <= INTERVAL_SECONDS + 5, gaps
        healthy = planner(HEALTHY)
        hostile = {kind: planner(f"hostile-{kind}") for kind in HOSTILE}
        text = repr(healthy) + repr(hostile)
        assert servers["error"].secret not in text and "admin console" not in text
        assert "result" not in healthy.get("metrics", "")
        assert hostile["silent"]["metrics"].startswith("Prometheus unreachable: no whole answer within 10 s")
        assert hostile["drip"]["metrics"].startswith("Prometheus unreachable: no whole answer within 10 s")
        assert hostile["stream"]["metrics"].startswith("no metrics read (query failed: answer over 1024 KiB)")
        assert hostile["error"]["metrics"].startswith("no metrics read (query failed: HTTP 5xx)")
        assert all(len(p["metrics"]) < 200 for p in hostile.values())
        # memory: the streaming answers are cut at 1 MiB a query, never buffered whole (the
        # operator without bounds passed 1 GiB in 1.5 s)
        assert peak - baseline < 150, f"operator RSS grew {peak - baseline:.0f} MiB"
        assert servers["stream"].bytes_sent > 1024 * 1024  # it did stream at us
        for name in (HEALTHY, *(f"hostile-{k}" for k in HOSTILE)):
            stack.remove_pdcluster(NS, name)
