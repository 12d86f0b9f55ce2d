"""A fresh install seeds the planner's memory from Prometheus on its first plan, against a
fake Prometheus on loopback: its seasonal memory (one bounded range query of the request rate
over the last 28 days in ten-minute steps) and the rates of the last day's planning intervals
the risk over the lead is learned from (one more); the memory keeps both (bounded) and the
next plans do not ask again."""

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
from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.loop.planner_loop import PlannerLoop, pods_by_key
from pdscale.operator.loop.planner_memory import PlannerMemory
from pdscale.operator.loop.planning import history_from_json, planner_config
from pdscale.planner.config import PlannerConfig
from pdscale.planner.prometheus import (
    QueryError,
    prometheus_client,
    rate_window_seconds,
    rates_on_grid,
    read_rate_history,
)
from pdscale.planner.seasonal import BUCKET_SECONDS, MAX_DAYS
from pdscale.planner.solve import lead_margin

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
                               span_seconds=MAX_DAYS * DAY, step_seconds=BUCKET_SECONDS)
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
        read_rate_history(Two(), "q", now_seconds=NOW, span_seconds=14 * DAY, step_seconds=600)


#: the rates the planner learns the risk over the lead from (``rise_history_intervals``)
DAY_OF_RATES = PlannerConfig.rise_history_intervals

#: the fleet the reconcile built (a first plan waits for it)
FLEET = pods_by_key([_pod("demo-prefill-0", "prefill"), _pod("demo-decode-0", "decode")])

def _seasonal(ranges: list[dict[str, str]]) -> list[dict[str, str]]:
    return [q for q in ranges if float(q["step"]) == BUCKET_SECONDS]


def _rates(ranges: list[dict[str, str]]) -> list[dict[str, str]]:
    return [q for q in ranges if float(q["step"]) != BUCKET_SECONDS]


def test_a_first_plan_seeds_the_seasonal_memory_once_and_the_memory_keeps_it(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["planner"]["prometheusURL"] = prometheus
    _deployments(kube)
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick(doc, NOW, FLEET, None)
    assert len(_seasonal(FakePrometheus.ranges)) == 1 and FakePrometheus.instants > 0
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
    assert len(FakePrometheus.ranges) == 2  # the season's and the rates', once each


def test_seasonality_off_asks_no_seasonal_history(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["planner"].update(prometheusURL=prometheus, seasonality="Off")
    _deployments(kube)
    PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers())).tick(doc, NOW, FLEET, None)
    assert _seasonal(FakePrometheus.ranges) == [] and FakePrometheus.instants > 0


def test_a_first_plan_learns_the_risk_over_the_lead_from_the_last_day_of_rates(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]
    doc["spec"]["planner"].update(prometheusURL=prometheus, seasonality="Off")
    _deployments(kube)
    interval = doc["spec"]["planner"]["intervalSeconds"]
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick(doc, NOW, FLEET, None)
    (asked,) = _rates(FakePrometheus.ranges)
    # read as each tick reads the rate (the live window), one point per planning interval
    assert float(asked["step"]) == interval and f"[{rate_window_seconds(interval)}s]" in asked["query"]
    history, _ = history_from_json(PlannerMemory(kube).load(NS, "demo"))
    rates = history.rates()
    # the planner's rise_history_intervals in all (the fake's NaN step unknown): those before
    # this tick, then its load
    assert len(rates) == DAY_OF_RATES and len(history.loads) == 1
    assert sum(r is None for r in history.earlier_rates) == 1
    assert max(r for r in rates[:-1] if r is not None) > 1.5 * min(r for r in rates[:-1] if r is not None)
    # the first plan prices the lead with what those rates learned (a smooth day: about no
    # margin), not with the prior held until ten leads are known
    config = planner_config(PDClusterSpec.model_validate(doc["spec"]))
    assert config.rise_prior > 1.05
    for quantile in config.rise_quantiles:
        assert lead_margin(config, rates, quantile) < 1.02
        assert lead_margin(config, rates[-20:], quantile) == config.rise_prior
    # the memory keeps a day of rates in all as loads come in, and nothing is asked again
    for k in range(1, 4):
        loop.tick(doc, NOW + k * interval, FLEET, None)
    history, _ = history_from_json(PlannerMemory(kube).load(NS, "demo"))
    assert len(history.rates()) == DAY_OF_RATES and len(history.loads) == 4
    PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers())).tick(doc, NOW + 4 * interval, FLEET, None)
    assert len(_rates(FakePrometheus.ranges)) == 1


def test_rates_go_to_the_interval_ending_nearest_them_and_the_current_one_is_left_out():
    points = [(1000.0, 1.0), (940.0, 2.0), (820.0, 4.0), (700.0, 9.0), (995.0, 5.0)]
    # intervals of 60 s ending at 940, 880, 820, 760 (oldest last); 1000 is now's, 700 too old
    assert rates_on_grid(points, now_seconds=1000.0, step_seconds=60.0, intervals=4) == (
        None, 4.0, None, 2.0)


def test_a_prometheus_that_cannot_answer_the_range_costs_nothing_but_the_seed(prometheus):
    kube, _ = _cluster("Recommend")
    doc = kube.objects[("PDCluster", NS, "demo")]  # nothing listens on port 9
    _deployments(kube)
    loop = PlannerLoop(kube, worker_lists=FakeWorkerLists(FakeWorkers()))
    loop.tick(doc, NOW, FLEET, None)
    history, _ = history_from_json(PlannerMemory(kube).load(NS, "demo"))
    assert not history.season.seeded and history.decisions  # planned (held), not stopped
