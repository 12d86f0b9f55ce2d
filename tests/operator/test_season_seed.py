"""A fresh install seeds the planner's seasonal memory from Prometheus on its first plan: one
bounded range query of the request rate over the last 28 days in ten-minute steps, against a
fake Prometheus on loopback; the memory keeps it (bounded) and the next plans do not ask
again."""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from test_planner_loop import NS, FakeWorkerLists, FakeWorkers, _cluster, _deployments, _pod

from pdscale.operator.api import tenant_policy
from pdscale.operator.loop.planner_loop import PlannerLoop, pods_by_key
from pdscale.operator.loop.planner_memory import PlannerMemory
from pdscale.operator.loop.planning import history_from_json
from pdscale.planner.prometheus import QueryError, prometheus_client, read_rate_history
from pdscale.planner.seasonal import BUCKET_SECONDS, MAX_DAYS

DAY = 86400.0
NOW = 1_800_000_000.0  # a Unix time: 2027-01-15
#: the fake's retention: three days
RETENTION_DAYS = 3


def _rate(t: float) -> float:
    """A daily shape: 10 req/s at night, 30 at noon (UTC)."""
    return 20.0 - 10.0 * math.cos(2 * math.pi * (t % DAY) / DAY)


class FakePrometheus(BaseHTTPRequestHandler):
    """Range queries answer the daily shape over the retention; instant queries a vector."""

    ranges: ClassVar[list[dict[str, str]]] = []
    instants = 0

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        if url.path == "/api/v1/query_range":
            type(self).ranges.append(q)
            start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
            first = max(start, end - RETENTION_DAYS * DAY)
            n = int((end - first) // step) + 1
            values = [[first + k * step, f"{_rate(first + k * step - step / 2):.4f}"] for k in range(n)]
            values[5][1] = "NaN"  # no traffic in that step: unknown, not zero
            data = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        else:
            type(self).instants += 1
            data = {"resultType": "vector", "result": [{"metric": {}, "value": [NOW, "1"]}]}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(tenant_policy.POLICY_ENV, '{"allowedPrometheusURLs": ["127.0.0.1"]}')
    tenant_policy.configured.cache_clear()
    FakePrometheus.ranges, FakePrometheus.instants = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    tenant_policy.configured.cache_clear()


def test_the_range_query_asks_twenty_eight_days_in_ten_minute_steps_and_skips_unknowns(prometheus):
    points = read_rate_history(prometheus_client(prometheus), "sum(rate(x[600s]))", now_seconds=NOW,
                               days=MAX_DAYS, step_seconds=BUCKET_SECONDS)
    (asked,) = FakePrometheus.ranges
    assert asked["query"] == "sum(rate(x[600s]))" and float(asked["step"]) == 600.0
    end = math.floor(NOW / 600) * 600
    assert float(asked["end"]) == end and float(asked["start"]) == end - 28 * DAY + 600
    # what retention held, less the NaN step
    assert len(points) == RETENTION_DAYS * 144 + 1 - 1
    assert all(v > 0 for _, v in points)


def test_an_answer_of_several_series_is_refused_not_mixed():
    class Two:
        def custom_query_range(self, query, *, start, end, step, timeout=None):
            return [{"metric": {"a": "1"}, "values": [[end, "1"]]},
                    {"metric": {"a": "2"}, "values": [[end, "2"]]}]

    with pytest.raises(QueryError, match="2 series"):
        read_rate_history(Two(), "q", now_seconds=NOW, days=14, step_seconds=600)


#: the fleet the reconcile built (a first plan waits for it)
FLEET = pods_by_key([_pod("demo-prefill-0", "prefill"), _pod("demo-decode-0", "decode")])

def test_a_first_plan_seeds_the_seasonal_memory_once_and_the_memory_keeps_it(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["planner"]["prometheusURL"] = prometheus
    _deployments(kube)
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick(doc, NOW, FLEET, None)
    assert len(FakePrometheus.ranges) == 1 and FakePrometheus.instants > 0
    history, _ = history_from_json(PlannerMemory(kube).load(NS, "demo"))
    season = history.season
    assert season.seeded
    # three days of ten-minute rates (one unknown), and the first plan's own observation
    known = [r for r in season.rates if r is not None]
    assert RETENTION_DAYS * 144 - 1 <= len(known) <= RETENTION_DAYS * 144 + 1
    assert len(season.rates) <= season.max_buckets
    # the earlier days are whole: the profile has the daily shape (noon over midnight)
    profile = season.profile(NOW)
    assert profile is not None and profile.days >= 2
    noon, midnight = profile.at([math.floor(NOW / DAY) * DAY + DAY / 2, math.floor(NOW / DAY) * DAY])
    assert noon > 1.5 * midnight
    # the next plans neither ask again in this process, nor after a restart (it is stored)
    interval = doc["spec"]["planner"]["intervalSeconds"]
    loop.tick(doc, NOW + interval, FLEET, None)
    PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers())).tick(doc, NOW + 2 * interval, FLEET, None)
    assert len(FakePrometheus.ranges) == 1


def test_seasonality_off_asks_nothing(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["planner"].update(prometheusURL=prometheus, seasonality="Off")
    _deployments(kube)
    PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers())).tick(doc, NOW, FLEET, None)
    assert FakePrometheus.ranges == [] and FakePrometheus.instants > 0


def test_a_prometheus_that_cannot_answer_the_range_costs_nothing_but_the_seed(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]  # nothing listens on port 9
    _deployments(kube)
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick(doc, NOW, FLEET, None)
    history, _ = history_from_json(PlannerMemory(kube).load(NS, "demo"))
    assert not history.season.seeded and history.decisions  # planned (held), not stopped
