"""End to end, overload behind the default router: the chart, the operator in Auto, a PDCluster
that names no gateway and no admission (so smg 1.13, the real binary, with the prefill
admission the operator derives: docs/admission.md) in front of simulated SGLang engines, and a
load that exceeds the one prefill it starts with for a while. What a user would check:

- a refused request gets its 429 fast (within a second past the derived queue timeout, and
  well before the TTFT target), not a late answer;
- no admitted request fails;
- the admitted requests meet the TTFT target at the SLO's percentile;
- the planner reads the refusals (``status.planner.refusedRequestsPerMinute``) and adds
  prefill capacity.

About three minutes.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from pdscale.operator.render import router
from pdscale.operator.render.checklist import validate
from pdscale.testbed.demo import (
    E2E_SCALE_DOWN_WINDOW_SECONDS,
    GROUP,
    PLURAL,
    VERSION,
    DemoResult,
    Sample,
    drive,
    load_pdcluster,
)
from pdscale.testbed.loadgen import Phase
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "overload"
#: demo-sim prefills compute 250 tokens/s: a 250-token prompt takes about a second, so 1.6
#: requests/s need two prefills, and the run starts with one
PHASES = (
    Phase("light", 20.0, 0.3, 250, 20, 0.0),
    Phase("overload", 100.0, 1.6, 250, 20, 0.0),
)
TTFT_SECONDS = 3.0


def overload_pdcluster(prometheus_url: str) -> dict:
    body = load_pdcluster(NAME, "default", prometheus_url,
                          scale_down_window_seconds=E2E_SCALE_DOWN_WINDOW_SECONDS)
    spec = body["spec"]
    assert "gateway" not in spec["router"] and "admission" not in spec["router"]
    spec["slo"]["ttftMilliseconds"] = int(TTFT_SECONDS * 1000)
    spec["prefill"].update(replicas=1, minReplicas=1, maxReplicas=6)
    spec["decode"].update(replicas=2, minReplicas=2, maxReplicas=6)
    spec["planner"]["nodeBudget"] = 12
    return body


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("overload")
    refused_seen: list[tuple[float, int]] = []
    with Stack(workdir=workdir / "stack", nodes=12, profile="demo-sim", progress=False,
               release_namespace="pdscale-overload") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        custom = client.CustomObjectsApi(api_client(stack.kubeconfig))
        core = client.CoreV1Api(api_client(stack.kubeconfig))

        def on_sample(sample: Sample, result: DemoResult) -> None:
            pdc = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, NAME)
            per_minute = ((pdc.get("status") or {}).get("planner") or {}).get("refusedRequestsPerMinute")
            if per_minute is not None:
                refused_seen.append((sample.t_seconds, int(per_minute)))

        body = overload_pdcluster(stack.prometheus.url)
        result = drive(stack, "default", NAME, PHASES, on_sample=on_sample, body=body)
        pdc = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, NAME)
        pods = core.list_namespaced_pod(
            "default", label_selector=f"app.kubernetes.io/instance={NAME},pdscale.io/role=router").items
        args = pods[0].spec.containers[0].args if pods else []
        summary = result.summary(TTFT_SECONDS, body["spec"]["slo"]["tpotMilliseconds"] / 1000)
        refused_in = max((r.e2e_seconds or 0.0 for r in result.records if r.status == 429), default=None)
        print(f"\noverload e2e: {summary['requests']} requests, {summary['refused']} refused "
              f"(slowest 429 after {refused_in} s), {summary['failed']} failed; admitted TTFT p90 "
              f"{summary['ttft_p90_seconds']} s; attainment {summary['slo_attainment']}; router args "
              f"{args}; refused/min seen {refused_seen}; prefill targets "
              f"{[s.prefill_target for s in result.samples if s.phase == 'overload']}; "
              f"logs under {stack.workdir}")
        yield result, body, pdc, args, refused_seen, stack
        stack.remove_pdcluster("default", NAME)


def _admission(body: dict) -> router.Admission:
    spec, _ = validate(body["spec"])
    adm = router.admission(spec)
    assert adm is not None
    return adm


def test_the_default_router_is_smg_with_the_derived_admission(run):
    _, body, pdc, args, _, _ = run
    adm = _admission(body)
    # demo-sim: a full pass (33 s) is past half the 3 s target: 1 in flight, 3 - 1.5 -> 1 s
    assert (adm.prefill_inflight_per_worker, adm.queue_timeout_seconds) == (1, 1)
    assert args[args.index("--prefill-max-inflight-requests-per-worker") + 1] == "1"
    assert args[args.index("--prefill-queue-timeout-secs") + 1] == "1"
    assert pdc["status"]["derived"]["prefillInflightPerWorker"] == 1
    assert pdc["status"]["derived"]["prefillQueueTimeoutSeconds"] == 1


def test_refused_requests_get_a_429_fast_not_a_late_answer(run):
    result, body, _, _, _, stack = run
    timeout = _admission(body).queue_timeout_seconds
    refused = [r for r in result.records if r.status == 429]
    assert refused, f"the load never exceeded the fleet (logs under {stack.workdir})"
    slowest = max(r.e2e_seconds or 0.0 for r in refused)
    assert slowest <= timeout + 1.0 < TTFT_SECONDS, (
        f"a 429 took {slowest:.2f} s, the queue timeout is {timeout} s")


def test_no_admitted_request_fails(run):
    result, _, _, _, _, stack = run
    failed = [r for r in result.records if not r.ok and r.status != 429]
    assert not failed, (f"{len(failed)} of {len(result.records)} failed, e.g. {failed[0].error} "
                        f"(logs under {stack.workdir})")


def test_the_admitted_requests_meet_ttft_at_the_slo_percentile(run):
    result, body, _, _, _, _ = run
    percentile = body["spec"]["slo"]["percentile"]
    ttfts = sorted(r.ttft_seconds for r in result.records if r.ok and r.ttft_seconds is not None)
    assert len(ttfts) > 50
    at = ttfts[min(len(ttfts) - 1, int(len(ttfts) * percentile / 100))]
    assert at <= TTFT_SECONDS, f"admitted TTFT p{percentile} {at:.2f} s > {TTFT_SECONDS} s"


def test_the_planner_reads_the_refusals_and_adds_prefill(run):
    result, _, _, _, refused_seen, _ = run
    assert any(n > 0 for _, n in refused_seen), f"status never showed a refusal: {refused_seen}"
    start = next(s.prefill_target for s in result.samples if s.prefill_target)
    grown = [s.prefill_target for s in result.samples
             if s.phase == "overload" and s.prefill_target and s.prefill_target > start]
    assert grown, "the planner did not add prefill capacity under overload"
