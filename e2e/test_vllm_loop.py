"""End to end with vLLM: the chart, the operator in Auto, the real vllm-router (its worker list
announced by the operator on its ZMQ discovery) and simulated engines speaking vLLM's API and
metric names, under a load that goes decode-heavy -> prefill-heavy. The planner must read the
vLLM metrics, move the split, and drain without a failed request. About three minutes.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from pdscale.testbed.demo import E2E_SCALE_DOWN_WINDOW_SECONDS, DemoResult, drive, load_pdcluster
from pdscale.testbed.loadgen import Phase
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "vl"
PHASES = (
    Phase("chat", 60.0, 2.0, 100, 40, 0.6),
    Phase("long-documents", 70.0, 1.0, 600, 4, 0.2),
)


def vllm_pdcluster(prometheus_url: str) -> dict:
    body = load_pdcluster(NAME, "default", prometheus_url,
                          scale_down_window_seconds=E2E_SCALE_DOWN_WINDOW_SECONDS)
    spec = body["spec"]
    spec["engine"].update(kind="VLLM", image="vllm/vllm-openai:v0.11.0")
    spec["parallelism"] = {"prefill": {"tensorParallelSize": 8}, "decode": {"tensorParallelSize": 8}}
    spec["kvCache"] = {"pageSizeTokens": 64, "dtype": "Auto", "layout": "HND"}
    spec["kvTransfer"] = {"backend": "NIXL"}
    spec["router"]["image"] = "vllm/vllm-router:v0.1.17"
    return body


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("vllm")
    with Stack(workdir=workdir / "stack", nodes=24, profile="demo-sim", progress=False,
               release_namespace="pdscale-vllm") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        planners: list[dict] = []

        def on_sample(sample, result: DemoResult) -> None:
            pdc = client.CustomObjectsApi(api_client(stack.kubeconfig)).get_namespaced_custom_object(
                "pdscale.io", "v1alpha1", "default", "pdclusters", NAME)
            planners.append((pdc.get("status") or {}).get("planner") or {})

        result = drive(stack, "default", NAME, PHASES, on_sample=on_sample,
                       body=vllm_pdcluster(stack.prometheus.url))
        core = client.CoreV1Api(api_client(stack.kubeconfig))
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.kind=PDCluster,involvedObject.name={NAME}").items
        yield result, planners, events, stack
        stack.remove_pdcluster("default", NAME)


def test_no_request_fails_through_the_vllm_router(run):
    result, _, _, stack = run
    failed = [r for r in result.records if not r.ok]
    assert len(result.records) > 50
    assert not failed, f"{len(failed)} of {len(result.records)} failed, e.g. {failed[0].error} " \
                       f"(logs under {stack.workdir})"


def test_the_planner_reads_vllm_metrics_and_moves_the_split(run):
    result, planners, events, _ = run
    assert any(p.get("metricsAvailable") is True and not p.get("held") for p in planners), \
        "the planner never decided on vLLM metrics"
    chat = [s.prefill_target for s in result.samples if s.phase == "chat" and s.prefill_target]
    docs = [s.prefill_target for s in result.samples
            if s.phase == "long-documents" and s.prefill_target]
    assert chat and docs and max(docs) > chat[-1], f"prefill did not grow: {chat[-1:]} -> {docs}"
    assert [e for e in events if e.reason == "PlannerDecision"]


def test_a_drain_says_in_status_what_it_waits_for(run):
    # status.planner.waiting: why the fleet is not yet at the target, one line per pod
    _, planners, events, _ = run
    drained = {e.message.split()[2].rstrip(":") for e in events
               if e.reason == "DrainStarted" and e.message.startswith("decode")}
    assert drained, "no decode drain in a run that moves the split toward prefill"
    lines = {line for p in planners for line in p.get("waiting") or []}
    assert any(line.startswith(pod) for pod in drained for line in lines), (drained, lines)
