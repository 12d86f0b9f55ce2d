"""Replay from Prometheus on the running operator: a Recommend PDCluster plans on SGLang-named
engines read through a real Prometheus, which also scrapes the operator's own metrics; `pdscale
replay --prometheus` over that time range reproduces every decision the planner's memory
ConfigMap recorded, field for field."""

from __future__ import annotations

import itertools
import time

import pytest
from kubernetes import client
from pdc_cluster_helpers import sample, wait_for
from prometheus_client import start_http_server

from pdscale.main import main
from pdscale.operator.loop.planning import history_from_json, history_to_json, planner_config
from pdscale.operator.render.builders import PLANNER_MEMORY_KEY
from pdscale.operator.render.checklist import parse
from pdscale.planner.prometheus import prometheus_client
from pdscale.planner.recording.from_prometheus import read_recording, replay_range
from pdscale.planner.replay.recorded import matches
from pdscale.planner.solve import History
from pdscale.testbed.shape_change_engines import start_engines

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

NAME = "rpl"
SWITCH_SECONDS = 50.0


def test_replay_reproduces_the_operators_recorded_decisions(cluster, admin_api, namespace,
                                                           run_operator, prometheus, capsys):
    engines = start_engines(SWITCH_SECONDS)
    servers = list(engines.values())
    for role, server in engines.items():
        prometheus.set_targets(f"rpl-{role}", [f"127.0.0.1:{server.server_address[1]}"],
                               {"namespace": namespace, "pdcluster": NAME, "role": role})
    # the operator runs in this process (KopfRunner): its registry is this one
    operator_metrics, _ = start_http_server(0, addr="127.0.0.1")
    prometheus.set_targets("rpl-operator", [f"127.0.0.1:{operator_metrics.server_port}"])
    doc = sample("demo-sim.yaml", NAME, **{"planner.mode": "Recommend",
                                          "planner.prometheusURL": prometheus.url})
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    try:
        with run_operator():
            custom.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace,
                                                   "pdclusters", doc)

            def recorded_decisions():
                try:
                    cm = core.read_namespaced_config_map(f"{NAME}-planner", namespace)
                except client.ApiException:
                    return None
                history, _ = history_from_json((cm.data or {}).get(PLANNER_MEMORY_KEY))
                fresh = [d for d in history.decisions if not d.held]
                return history.decisions if len(fresh) >= 5 else None

            decisions = wait_for(recorded_decisions, timeout_seconds=240,
                                 what="five planner decisions on read metrics")
            time.sleep(3)  # the last decision's gauges scraped
        live = list(decisions)
        start, end = live[0].at_seconds - 1.0, live[-1].at_seconds + 2.0
        promql = prometheus_client(prometheus.url)
        recorded, ready, before = read_recording(promql, namespace, NAME, start, end)
        assert not before
        assert [t.at_seconds for t in recorded] == [d.at_seconds for d in live]
        # the decisions counter came with each: one decision between two recorded ones
        decided = [t.decided for t in recorded]
        assert None not in decided and all(b - a == 1 for a, b in itertools.pairwise(decided)), decided
        spec = parse(doc["spec"])
        replayed = replay_range(promql, engine="sglang", namespace=namespace, name=NAME, pdcluster_label=NAME,
                                config=planner_config(spec), start=start, end=end,
                                recorded=recorded, ready=ready,
                                live_interval_seconds=float(spec.planner.interval_seconds))
        assert replayed.caveats == ()
        assert matches(replayed.decisions, recorded) == (len(live), len(live))
        # every field, as the memory keeps them (its JSON writes NaN and infinity alike as null)
        remembered, _ = history_from_json(history_to_json(
            History(decisions=replayed.decisions), None, keep=len(live)))
        assert list(remembered.decisions) == live
        assert any(not d.held for d in live) and any(t.prefill.warming or t.decode.warming
                                                     for t in recorded)

        # the command, with the spec read from the cluster (no -f), says the same
        capsys.readouterr()
        code = main(["replay", "--prometheus", prometheus.url, "--pdcluster", f"{namespace}/{NAME}",
                     "--start", f"{start:.3f}", "--end", f"{end:.3f}"])
        out = " ".join(capsys.readouterr().err.split())
        assert code == 0, out
        assert f"replayed = live in {len(live)} of {len(live)} decisions" in out
        assert "note:" not in out  # nothing stood in the way of an exact replay
    finally:
        operator_metrics.shutdown()
        for server in servers:
            server.shutdown()
        for job in ("rpl-prefill", "rpl-decode", "rpl-operator"):
            prometheus.set_targets(job, [])
