"""End to end with the smg gateway: the chart, the operator in Auto, a PDCluster whose router
is smg 1.13 (``router.gateway: SMG``, the real binary) and simulated SGLang engines, under a
load that goes decode-heavy -> prefill-heavy. What a user would check: smg routes only to
Ready, non-draining pods at every sample (its own draining entries set aside), it catches up
with each new pod within a few ticks however busy the machine, the planner moves the split
through drains, and no request fails. About three minutes.

Kwok decides the router pod's Readiness here, not smg's /readiness (503 until it has a worker),
so the operator's speaking to a not-yet-Ready smg is covered by tests/loop/test_smg_router.py.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from kubernetes import client

from pdscale.testbed.demo import (
    CATCH_UP_BOUND_SECONDS,
    E2E_SCALE_DOWN_WINDOW_SECONDS,
    DemoResult,
    Sample,
    catch_up_seconds,
    drive,
    load_pdcluster,
)
from pdscale.testbed.loadgen import Phase
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "smg"
PHASES = (
    Phase("chat", 60.0, 2.0, 100, 40, 0.6),
    Phase("long-documents", 70.0, 1.0, 600, 4, 0.2),
)


def smg_pdcluster(prometheus_url: str) -> dict:
    body = load_pdcluster(NAME, "default", prometheus_url,
                          scale_down_window_seconds=E2E_SCALE_DOWN_WINDOW_SECONDS)
    body["spec"]["router"]["gateway"] = "SMG"
    # what this run checks is smg's worker list under the planner, measured with admission off;
    # admission under overload is e2e/test_smg_overload.py
    body["spec"]["router"]["admission"] = {"enabled": False}
    return body


def _serving(core: client.CoreV1Api) -> set[str]:
    """Engine URLs that are Ready, not deleting and not marked draining."""
    pods = core.list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={NAME}").items
    return {f"http://{p.status.pod_ip}:8000" for p in pods
            if (p.metadata.labels or {}).get("pdscale.io/role") in ("prefill", "decode")
            and p.status.pod_ip and p.metadata.deletion_timestamp is None
            and not (p.metadata.annotations or {}).get("pdscale.io/draining-since")
            and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("smg")
    checks: list[dict] = []
    with Stack(workdir=workdir / "stack", nodes=24, profile="demo-sim", progress=False,
               release_namespace="pdscale-smg") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        core = client.CoreV1Api(api_client(stack.kubeconfig))

        def on_sample(sample: Sample, result: DemoResult) -> None:
            # pods, then the router, then pods again: what it routes to must be serving at one
            # of the two reads around it
            before = _serving(core)
            router = next((p for p in core.list_namespaced_pod(
                "default", label_selector=f"app.kubernetes.io/instance={NAME},pdscale.io/role=router").items
                if p.status.pod_ip), None)  # fmt: skip
            entries = None
            if router is not None:
                with urllib.request.urlopen(f"http://{router.status.pod_ip}:30000/workers",
                                            timeout=5) as r:
                    entries = json.loads(r.read())["workers"]
            after = _serving(core)
            checks.append({"t": sample.t_seconds, "entries": entries, "serving": before | after,
                           "serving_after": after})

        result = drive(stack, "default", NAME, PHASES, on_sample=on_sample,
                       body=smg_pdcluster(stack.prometheus.url))
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.kind=PDCluster,involvedObject.name={NAME}").items
        print(f"\nsmg e2e: {len(result.records)} requests, "
              f"{sum(not r.ok for r in result.records)} failed; {len(checks)} samples; "
              f"splits {sorted({(s.prefill_target, s.decode_target) for s in result.samples if s.prefill_target})}; "
              f"drains {sum(e.reason == 'DrainStarted' for e in events)}; logs under {stack.workdir}")
        # what the router listed at each sample, beside the logs, for a failure's reading
        (stack.workdir / "router-checks.json").write_text(json.dumps(
            [c | {"serving": sorted(c["serving"]), "serving_after": sorted(c["serving_after"])}
             for c in checks], indent=1))
        yield result, checks, events, stack
        stack.remove_pdcluster("default", NAME)


def test_the_router_is_smg(run):
    _, checks, _, stack = run
    listed = [e for c in checks for e in c["entries"] or []]
    # sglang-router 0.3.2 lists no lifecycle state; smg lists one on every entry
    assert listed and all(e.get("status") in ("pending", "ready", "not_ready", "failed", "draining")
                          for e in listed), f"not smg's listing (logs under {stack.workdir})"


def test_no_request_fails_through_smg(run):
    result, _, _, stack = run
    failed = [r for r in result.records if not r.ok]
    assert len(result.records) > 50
    assert not failed, f"{len(failed)} of {len(result.records)} failed, e.g. {failed[0].error} " \
                       f"(logs under {stack.workdir})"


def test_smg_routes_only_to_ready_non_draining_pods(run):
    _, checks, _, _ = run
    listed = [c for c in checks if c["entries"] is not None]
    assert listed
    for c in listed:
        routed = {e["url"] for e in c["entries"] if e.get("status") != "draining"}
        stray = routed - c["serving"]
        assert not stray, f"at {c['t']:.0f}s smg routed to {stray}, not Ready or draining"
    # it catches up with each new Ready pod within a few ticks, however busy the machine
    lags = catch_up_seconds(
        (c["t"], c["serving_after"],
         {e["url"] for e in c["entries"] if e.get("status") != "draining"}) for c in listed)
    slowest = max(lags.items(), key=lambda kv: kv[1], default=("", 0.0))
    assert slowest[1] <= CATCH_UP_BOUND_SECONDS, (
        f"{slowest[0]} was Ready for {slowest[1]:.0f} s before smg listed it "
        f"(all: { {u: round(s) for u, s in sorted(lags.items())} })")


def test_the_planner_moves_the_split_through_drains(run):
    result, _, events, _ = run
    chat = [s.prefill_target for s in result.samples if s.phase == "chat" and s.prefill_target]
    docs = [s.prefill_target for s in result.samples
            if s.phase == "long-documents" and s.prefill_target]
    assert chat and docs and max(docs) > chat[-1], f"prefill did not grow: {chat[-1:]} -> {docs}"
    assert [e for e in events if e.reason == "PlannerDecision"]
    assert any(e.reason == "DrainStarted" for e in events), "no drain in a run that moves the split"
