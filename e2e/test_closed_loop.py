"""End to end: the Helm chart, the operator in Auto, the real SGLang router and simulated
engines on fake 8xH200 nodes, under a load that goes decode-heavy -> prefill-heavy ->
decode-heavy. What a user would check: the split follows the load, the budget holds, the
router only ever routes to Ready, non-draining pods, no request fails, and every decision
is visible with its reason.

Runs on its own local control plane (or the cluster of KUBECONFIG). About five minutes.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from kubernetes import client

from pdscale.testbed.demo import (
    CATCH_UP_BOUND_SECONDS,
    E2E_SCALE_DOWN_WINDOW_SECONDS,
    OLD_DEFAULT_ROUTER,
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

BUDGET = 24
INTERVAL_SECONDS = 10
PHASES = (
    Phase("chat", 70.0, 2.0, 100, 40, 0.6),
    Phase("long-documents", 70.0, 1.0, 600, 4, 0.2),
    Phase("chat-again", 70.0, 2.0, 100, 40, 0.6),
)


def _router_urls(core: client.CoreV1Api, ns: str) -> set[str]:
    pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance=e2e").items
    return {f"http://{p.status.pod_ip}:8000" for p in pods
            if (p.metadata.labels or {}).get("pdscale.io/role") in ("prefill", "decode")
            and p.status.pod_ip and p.metadata.deletion_timestamp is None
            and not (p.metadata.annotations or {}).get("pdscale.io/draining-since")
            and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("e2e")
    checks: list[dict] = []
    with Stack(workdir=workdir / "stack", nodes=BUDGET, profile="demo-sim", progress=False,
               release_namespace="pdscale-e2e") as stack:
        assert stack.kubeconfig is not None
        core = client.CoreV1Api(api_client(stack.kubeconfig))

        def on_sample(sample: Sample, result: DemoResult) -> None:
            # Pods, then the router, then pods again: a worker the router lists must be Ready
            # and not draining at one of the two reads around it (each read is a moment).
            serving_before = _router_urls(core, "default")
            pods = core.list_namespaced_pod(
                "default", label_selector="app.kubernetes.io/instance=e2e").items
            engine = [p for p in pods if (p.metadata.labels or {}).get("pdscale.io/role") in
                      ("prefill", "decode") and p.metadata.deletion_timestamp is None]
            router = next((p for p in pods if (p.metadata.labels or {}).get("pdscale.io/role")
                           == "router" and p.status.pod_ip), None)
            listed: set[str] | None = None
            if router is not None:
                with urllib.request.urlopen(f"http://{router.status.pod_ip}:30000/workers",
                                            timeout=5) as r:
                    listed = {w["url"] for w in json.loads(r.read())["workers"]}
            serving_after = _router_urls(core, "default")
            checks.append({"t": sample.t_seconds, "phase": sample.phase, "nodes": len(engine),
                           "listed": listed, "serving": serving_before | serving_after,
                           "serving_after": serving_after})

        # the split must move back within chat-again's 70 s
        assert stack.prometheus is not None
        body = load_pdcluster("e2e", "default", stack.prometheus.url,
                              scale_down_window_seconds=E2E_SCALE_DOWN_WINDOW_SECONDS)
        # its bounds (bench/demo_bounds.py, docs/replay.md) were measured behind sglang-router
        # 0.3.2, which admits everything: named here, not defaulted
        body["spec"]["router"].update(OLD_DEFAULT_ROUTER)
        result = drive(stack, "default", "e2e", PHASES, on_sample=on_sample, body=body)
        custom = client.CustomObjectsApi(api_client(stack.kubeconfig))
        pdc = custom.get_namespaced_custom_object("pdscale.io", "v1alpha1", "default",
                                                  "pdclusters", "e2e")
        events = core.list_namespaced_event(
            "default", field_selector="involvedObject.kind=PDCluster,involvedObject.name=e2e").items
        yield result, checks, pdc, events, stack
        stack.remove_pdcluster("default", "e2e")


def _decided(result: DemoResult, phase: str, last_seconds: float) -> tuple[int, int]:
    """The decision held over the last seconds of a phase (the settled split)."""
    samples = [s for s in result.samples if s.phase == phase]
    end = samples[-1].t_seconds
    tail = [s for s in samples if s.t_seconds >= end - last_seconds and s.prefill_target]
    assert tail, f"no decision during {phase}"
    return tail[-1].prefill_target, tail[-1].decode_target


def test_no_request_fails(run):
    result, *_, stack = run
    failed = [r for r in result.records if not r.ok]
    assert result.records, "no request was sent"
    assert not failed, f"{len(failed)} of {len(result.records)} failed, e.g. {failed[0].error} " \
                       f"(logs under {stack.workdir})"


def test_the_split_follows_the_load(run):
    result, *_ = run
    chat_p, chat_d = _decided(result, "chat", 20)
    docs_p, docs_d = _decided(result, "long-documents", 20)
    again_p, again_d = _decided(result, "chat-again", 20)
    assert docs_p > chat_p, f"prefill did not grow for long documents: {chat_p} -> {docs_p}"
    assert docs_d <= chat_d, f"decode grew for long documents: {chat_d} -> {docs_d}"
    assert again_d >= docs_d and again_p < docs_p, (
        f"no move back for chat: {docs_p}P{docs_d}D -> {again_p}P{again_d}D")


def test_prefill_moves_within_four_intervals_of_the_phase_change(run):
    result, *_ = run
    change = PHASES[0].duration_seconds
    # the most chat alone asked for (a chat burst can already raise it)
    before = max(s.prefill_target for s in result.samples
                 if change - 2 * INTERVAL_SECONDS <= s.t_seconds < change
                 and s.prefill_target is not None)
    moved = [s.t_seconds for s in result.samples
             if s.t_seconds >= change and (s.prefill_target or 0) > before]
    timeline = "\n".join(
        f"  t={s.t_seconds:.0f}s {s.prefill_target}P{s.decode_target}D: {s.explanation}"
        for s in result.samples if change - INTERVAL_SECONDS <= s.t_seconds <= change + 60)
    assert moved, f"prefill never grew after the change to long documents:\n{timeline}"
    # The first planning tick after the change may see none of it (ticks fall anywhere in an
    # interval); engines count a request's tokens when it completes and the live planner
    # smooths lengths over 3 intervals, and spreads a prefill queue over an interval plus the
    # warm-up: up to three more ticks, plus a scrape. A CI run measured 32.6 s.
    assert moved[0] - change <= 4 * INTERVAL_SECONDS + 2, f"moved at {moved[0]:.0f}s:\n{timeline}"


def test_never_above_the_node_budget(run):
    _, checks, *_ = run
    assert max(c["nodes"] for c in checks) <= BUDGET


def test_router_routes_only_to_ready_non_draining_pods(run):
    _, checks, *_ = run
    listed_checks = [c for c in checks if c["listed"] is not None]
    assert listed_checks
    # A pod leaves the router before it is marked draining, and joins only once Ready: at
    # every check, every worker the router lists is Ready and not draining.
    for c in listed_checks:
        stray = c["listed"] - c["serving"]
        assert not stray, f"at {c['t']:.0f}s the router listed {stray}, not Ready or draining"
    # ... and it catches up with each new Ready pod within a few ticks, however busy the
    # machine
    lags = catch_up_seconds((c["t"], c["serving_after"], c["listed"]) for c in listed_checks)
    slowest = max(lags.items(), key=lambda kv: kv[1], default=("", 0.0))
    assert slowest[1] <= CATCH_UP_BOUND_SECONDS, (
        f"{slowest[0]} was Ready for {slowest[1]:.0f} s before the router listed it "
        f"(all: { {u: round(s) for u, s in sorted(lags.items())} })")


def test_status_and_events_explain_each_decision(run):
    _, _, pdc, events, _ = run
    planner = pdc["status"]["planner"]
    assert planner["mode"] == "Auto" and planner["lastDecision"].endswith("D")
    assert planner["explanation"]
    decisions = [e for e in events if e.reason in ("PlannerDecision", "PlannerShortfall")]
    assert len(decisions) >= 2
    assert all("->" in e.message and ":" in e.message for e in decisions)
    # decode shrank for long documents: through drains, each announced
    assert any(e.reason == "DrainStarted" for e in events)


def test_kubectl_get_pdc_shows_the_decision(run):
    *_, stack = run
    import subprocess

    from pdscale.testbed.localcluster import DEFAULT_BIN_DIR

    out = subprocess.run([str(DEFAULT_BIN_DIR / "kubectl"), "--kubeconfig", str(stack.kubeconfig),
                          "get", "pdc", "e2e", "-o", "wide"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    header, row = out.splitlines()[:2]
    assert "DECISION" in header and "PLANNER" in header
    assert "Auto" in row and "P" in row.split()[header.split().index("DECISION")]


#: how far above the spec's fleet held fixed (1P2D, its replays over the router's draws) the
#: live loop must meet on its own recorded load. Runs: live 52.1%, 45.3% (three and six
#: CPU-bound jobs beside it) and 46.4% (CI, tiers side by side and image builds beside it)
#: against 8.0-8.3% fixed. Whether the planner meets what a perfect meter meets is a claim
#: about replays, deterministic on a committed recording (tests/testbed/test_closed_loop_bound.py):
#: a live figure is not, CI once met 46.4% where the meter's replays of its recording met
#: 64.7-69.2% (and pdscale's replays came within 10 pp of the live run)
OVER_FIXED_FLEET_PP = 25.0


@pytest.fixture(scope="module")
def recorded(run, tmp_path_factory):
    """The live summary, the recording written from the run and the live loop's timing."""
    from pdscale.testbed import demo_replay
    from pdscale.testbed.demo import record_live_load

    result, _, pdc, _, stack = run
    assert stack.prometheus is not None
    out = tmp_path_factory.mktemp("recording")
    applied = {"apiVersion": pdc["apiVersion"], "kind": pdc["kind"],
               "metadata": {"name": pdc["metadata"]["name"]}, "spec": pdc["spec"]}
    record_live_load(result, applied, out)
    slo = pdc["spec"]["slo"]
    live = result.summary(slo["ttftMilliseconds"] / 1000, slo["tpotMilliseconds"] / 1000)
    pdcluster, trace = out / demo_replay.PDCLUSTER_FILE, out / demo_replay.TRACE_FILE
    assert len(trace.read_text().splitlines()) == len(result.records)
    # The replay plans when the live loop did (where the ticks fall against a load change
    # moves the replayed figure by several points on its own: demo_replay.tick_phase_spread)
    # and its new instances serve as late as the live ones did (the control plane and the
    # router's discovery add seconds to the warm-up: demo_replay.join_delay).
    timing = demo_replay.live_timing(result.samples, INTERVAL_SECONDS,
                                     pdc["spec"]["decode"]["warmupSeconds"],
                                     stack.prometheus.scrape_interval_seconds)
    assert timing.tick_phase_seconds is not None, \
        "the samples saw no plan slot in the planner's memory"
    return live, pdcluster, trace, timing


def test_the_recorded_load_replays_whole_and_its_distance_from_live_is_reported(run, recorded):
    """The loop records what it sent and what the client saw, and that recording replays with
    the PDCluster it ran, over the router's draws, every request it sent.

    How near the replays come to the live attainment is printed, not asserted: a live run at
    10x time compression is a measurement, and load on the machine moves it (CI has put it
    13.4 pp above its replays, and with one CPU-bound job beside it 12.5 pp below, where a fleet
    1.5x as fast replayed 1.1 pp from it). The demo publishes that comparison on the
    configuration users run (``pdscale demo``: demo.json's ``replay``, docs/design/
    replay-fidelity.md); what load cannot move is checked on a committed recording
    (tests/testbed/test_closed_loop_bound.py)."""
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import load_profile, scaled_profile
    from pdscale.testbed import demo_replay

    _, _, pdc, _, _ = run
    live, pdcluster, trace, timing = recorded
    fast = PerformanceModel(scaled_profile(load_profile(pdc["spec"]["planner"]["profile"]),
                                           prefill_speed=1.5, decode_speed=1.5))
    # sglang-router picks PD prefills at random: the live run was one draw, the replay's
    # seeds are others (at one phase, six span up to 16 pp on this load)
    draws = demo_replay.router_draw_replays(pdcluster, trace, timing)
    assert {seed: r["requests"] for seed, r in draws.items()} == \
        {seed: live["requests"] for seed in draws}, "a replay lost or added requests"
    replayed = [r["slo_attainment"] for r in draws.values()]
    control = list(demo_replay.router_draw_spread(pdcluster, trace, timing, fleet=fast).values())
    spread = demo_replay.tick_phase_spread(pdcluster, trace, INTERVAL_SECONDS,
                                           timing=timing).values()
    near = demo_replay.span_distance_pp(live["slo_attainment"], replayed)
    far = demo_replay.span_distance_pp(live["slo_attainment"], control)
    print(f"live {live['slo_attainment']:.1%}; replayed at the live tick phase "
          f"{timing.tick_phase_seconds:.1f} s of "
          f"{INTERVAL_SECONDS} s, instances joining {timing.join_delay_seconds:.1f} s after "
          f"their warm-up, over {len(replayed)} router draws "
          f"{min(replayed):.1%}-{max(replayed):.1%} ({near:.1f} pp outside), on a fleet 1.5x as "
          f"fast {min(control):.1%}-{max(control):.1%} ({far:.1f} pp outside); the first draw "
          f"over ten phases {min(spread):.1%}-{max(spread):.1%}")


def test_the_live_loop_meets_far_more_than_the_spec_fleet_held_fixed(recorded):
    """The live loop scales for its load: on its own recorded load, at its own tick phase and
    over the router's draws, it meets at least OVER_FIXED_FLEET_PP more than the spec's fleet
    held fixed. The meter and the oracle are printed beside it (the planner against the meter
    is checked on a committed recording: tests/testbed/test_closed_loop_bound.py)."""
    from pdscale.testbed import demo_replay

    live, pdcluster, trace, timing = recorded
    spec = yaml.safe_load(pdcluster.read_text())["spec"]
    fixed_fleet = f"static:{spec['prefill']['replicas']}P{spec['decode']['replicas']}D"

    def met(policy: str) -> list[float]:
        return [r["slo_attainment"] for r in demo_replay.router_draw_replays(
            pdcluster, trace, timing, policy=policy).values()]

    fixed, meter, oracle = met(fixed_fleet), met("oracle:now"), met("oracle")
    print(f"live {live['slo_attainment']:.1%}; over {len(fixed)} router draws "
          f"{fixed_fleet} {min(fixed):.1%}-{max(fixed):.1%}, oracle:now "
          f"{min(meter):.1%}-{max(meter):.1%}, the oracle {min(oracle):.1%}-{max(oracle):.1%}")
    assert live["slo_attainment"] >= max(fixed) + OVER_FIXED_FLEET_PP / 100.0
