"""End to end: three PDClusters of different priorities share one PDPool of 24 fake 8xH200
nodes (the chart, the operator in Auto, a real SGLang router and simulated engines each).
The load makes their needs exceed the pool in turn: the high-priority one rises alone (it
fits), then all three rise (they do not: about 33 nodes asked of 24), then all fall.

What a user would check: no engine pod is ever Pending for want of a node (the pool's plan
never starts a pod on a node another member still holds), the members never hold more than
the pool, no request fails, the high-priority member meets its SLO while the low one is
trimmed, and every member gets its need back once the load falls. About five minutes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from kubernetes import client

from pdscale.operator.api.names import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGER
from pdscale.planner.prometheus import BoundedPrometheus
from pdscale.testbed.demo import (
    E2E_SCALE_DOWN_WINDOW_SECONDS,
    OLD_DEFAULT_ROUTER,
    load_pdcluster,
    refused_by_router,
    router_url,
)
from pdscale.testbed.loadgen import Phase, RequestRecord, plan_requests, send_one
from pdscale.testbed.nodes import api_client
from pdscale.testbed.stack import Stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

GROUP, VERSION = "pdscale.io", "v1alpha1"
NS = "default"
POOL_NODES = 24
PRIORITIES = {"high": 100, "mid": 10, "low": 1}
SLO_TTFT, SLO_TPOT = 5.0, 0.050  # examples/demo-sim.yaml
# (phase, seconds, req/s of high, mid, low): chat-like requests (100 tokens in, 40 out); at
# 2.5 req/s a member's planner asks for about 10 nodes, at 0.5 about 4,
# and 1.5 about 7: together about 27 of the pool's 24 while all rise; the high one rises
# first, and its fleet has warmed up (20 s, two intervals) before the others rise. The low
# one's load is one its trimmed share still serves, slowly: a request waits, none times out.
# The high one's rise is 100 s: with 50 s, on a loaded host (its new pods slower to start) the
# backlog its lone first decode took in was still being served when all rose, and 14% of its
# requests sent then shared that decode's long steps (modelled TPOT within 50 ms for 86%); with
# 80 s the same once in three CI passes beside the tests tier (88.4%; 99.4% on a quiet host)
PHASES = (("high-rises", 100.0, (2.5, 0.5, 0.5)),
          ("all-rise", 60.0, (2.5, 2.5, 1.5)),
          ("all-fall", 50.0, (0.5, 0.5, 0.5)))
#: the longest the split may take to return once the load has fallen: the scale-down window
#: (E2E_SCALE_DOWN_WINDOW_SECONDS), the drains (preStopDrainSeconds) and a few intervals
RETURN_SECONDS = 90.0
#: the members' minReplicas (1P1D each): what a trimmed member keeps
FLOOR_NODES = 2


def _phases(member: int) -> tuple[Phase, ...]:
    return tuple(Phase(name, seconds, rates[member], 100, 40, 0.6) for name, seconds, rates in PHASES)


@dataclass
class Run:
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stack: Stack | None = None
    #: wall clock (time.time()) when the load started: phases' ends for Prometheus queries
    started_unix: float = 0.0


def _unschedulable(pod: Any) -> bool:
    return pod.status.phase == "Pending" and any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or [])


def _sample(core: client.CoreV1Api, custom: client.CustomObjectsApi, t: float, phase: str) -> dict:
    pods = core.list_namespaced_pod(NS, label_selector=f"{LABEL_MANAGED_BY}={MANAGER}").items
    engines = [p for p in pods if (p.metadata.labels or {}).get("pdscale.io/role") in
               ("prefill", "decode")]
    held = {name: sum(1 for p in engines if (p.metadata.labels or {}).get(LABEL_INSTANCE) == name)
            for name in PRIORITIES}
    pool = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "pdpools", "shared")
    members = {m["name"]: m for m in (pool.get("status") or {}).get("members") or []}
    return {"t": t, "phase": phase, "held": held,
            "unschedulable": [p.metadata.name for p in engines if _unschedulable(p)],
            "members": members}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("e2e-pool")
    out = Run()
    with Stack(workdir=workdir / "stack", nodes=POOL_NODES, profile="demo-sim", progress=False,
               release_namespace="pdscale-e2e") as stack:
        assert stack.kubeconfig is not None and stack.prometheus is not None
        out.stack = stack
        api = api_client(stack.kubeconfig)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, "pdpools", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PDPool", "metadata": {"name": "shared"},
            "spec": {"nodes": POOL_NODES, "horizonSeconds": 600,
                     "members": [{"name": n, "priority": p} for n, p in PRIORITIES.items()]}})
        for name in PRIORITIES:
            body = load_pdcluster(name, NS, stack.prometheus.url,
                                  scale_down_window_seconds=E2E_SCALE_DOWN_WINDOW_SECONDS)
            body["spec"]["router"].update(OLD_DEFAULT_ROUTER)  # admits all: a miss, not a 429
            body["spec"]["planner"]["pool"] = {"name": "shared"}
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, "pdclusters", body)
        urls = {}
        for name in PRIORITIES:
            urls[name] = router_url(core, NS, name, 30000, prefill=1, decode=1)
            refused_by_router(urls[name])  # the router's counter exists before the load
        time.sleep(3 * stack.prometheus.scrape_interval_seconds)
        # each request names its phase as its cohort: the engines' modelled TPOT
        # then tells the requests sent while all rose from those of high's own rise still
        # finishing on the decode that took the rise alone
        specs = {name: [replace(s, cohort=s.phase) for s in plan_requests(_phases(i), seed=11 + i)]
                 for i, name in enumerate(PRIORITIES)}
        out.records = {name: [] for name in PRIORITIES}
        started = time.monotonic()
        out.started_unix = time.time()

        async def load() -> None:
            from aiohttp import ClientSession, TCPConnector

            async with ClientSession(connector=TCPConnector(limit=0)) as session:
                async def one(name: str, spec: Any) -> None:
                    await asyncio.sleep(max(spec.at_seconds - (time.monotonic() - started), 0.0))
                    out.records[name].append(
                        await send_one(session, urls[name], "chat", spec, "sim-model", started, 120.0))

                await asyncio.gather(*(one(n, s) for n, ss in specs.items() for s in ss))

        loader = threading.Thread(target=lambda: asyncio.run(load()), name="load", daemon=True)
        loader.start()
        ends, total = [], 0.0
        for name, seconds, _ in PHASES:
            total += seconds
            ends.append((total, name))
        while loader.is_alive():
            t = time.monotonic() - started
            phase = next((n for end, n in ends if t < end), PHASES[-1][0])
            out.samples.append(_sample(core, custom, t, phase))
            loader.join(timeout=2.0)
        # then until every member is granted its need again (or RETURN_SECONDS pass)
        fell = time.monotonic()
        while True:
            s = _sample(core, custom, time.monotonic() - started, "end")
            out.samples.append(s)
            if (len(s["members"]) == len(PRIORITIES) and all(
                    m["grantedNodes"] == m["neededNodes"] for m in s["members"].values())) \
                    or time.monotonic() - fell > RETURN_SECONDS:
                break
            time.sleep(2.0)
        yield out


def test_no_engine_pod_waits_for_a_node_and_the_pool_is_never_exceeded(run):
    assert run.samples and max(sum(s["held"].values()) for s in run.samples) > 0
    pending = [(s["t"], s["unschedulable"]) for s in run.samples if s["unschedulable"]]
    assert not pending, f"pods Pending for want of a node: {pending[:3]}"
    most = max(sum(s["held"].values()) for s in run.samples)
    assert most <= POOL_NODES


def test_no_request_fails(run):
    for name, records in run.records.items():
        assert records, f"{name}: no request was sent"
        failed = [r for r in records if not r.ok]
        assert not failed, f"{name}: {len(failed)} of {len(records)} failed, e.g. {failed[0].error}"


def _p90(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.9 * len(values)))]


def _latencies(records: list[RequestRecord], phase: str) -> tuple[float, float, float, int]:
    """(TTFT p90, TPOT p90, the share meeting both targets, requests) of a phase."""
    rs = [r for r in records if r.phase == phase and r.ok]
    met = [r for r in rs if (r.ttft_seconds or 0) <= SLO_TTFT
           and (r.tpot_seconds is None or r.tpot_seconds <= SLO_TPOT)]
    return (_p90([r.ttft_seconds or 0.0 for r in rs]),
            _p90([r.tpot_seconds for r in rs if r.tpot_seconds is not None]),
            len(met) / len(rs), len(rs))


#: the simulated engines' own per-request TPOT had every decode step its modelled length
#: (testbed/simengine: the step time the timing model gives for the batch it ran)
MODELLED_TPOT = "pdscale_sim:request_modelled_tpot_seconds"
#: and their prompts' time on a prefill, queue and compute, had every pass its modelled length
MODELLED_PREFILL = "pdscale_sim:request_modelled_prefill_seconds"


def _modelled_share(run: Run, name: str, phase: str, series: str, role: str,
                    target: float) -> tuple[float, float]:
    """(share of ``name``'s requests sent in ``phase`` whose modelled ``series`` met
    ``target``, requests counted), from its ``role`` engines' histogram in Prometheus: the
    share within the bucket ``le`` = the target (a bucket bound) over all, of the phase's
    cohort (its requests name the phase). Each engine's counts as it last showed them once
    the phase's last request had ended: an engine removed since then counts too."""
    assert run.stack is not None and run.stack.prometheus is not None
    scrape = run.stack.prometheus.scrape_interval_seconds
    ended = max(r.sent_seconds + (r.e2e_seconds or 0.0) for r in run.records[name] if r.phase == phase)
    at = {"time": f"{run.started_unix + ended + 2 * scrape:.3f}"}
    window = f"{int(ended + 3 * scrape)}s"  # from before the load started
    sel = f'pdcluster="{name}",role="{role}",cohort="{phase}"'
    prometheus = BoundedPrometheus(run.stack.prometheus.url)

    def total(query: str) -> float:
        got = prometheus.custom_query(f"sum(max_over_time({query}[{window}]))", params=at)
        assert got, f"{name}: no {series} in Prometheus for {phase}: {query}"
        return float(got[0]["value"][1])

    n_met = total(f'{series}_bucket{{{sel},le="{target}"}}')
    n = total(f"{series}_count{{{sel}}}")
    return (n_met / n if n > 0 else 0.0), n


def test_the_high_priority_meets_its_slo_while_the_low_one_is_trimmed(run):
    busy = [s for s in run.samples if s["phase"] == "all-rise" and s["members"]]
    trimmed = [s for s in busy if s["members"]["low"]["grantedNodes"] < s["members"]["low"]["neededNodes"]]
    assert trimmed, "the low member was never granted less than it needed while all rose"
    # the high member is never trimmed: granted its need, or all the others' floors leave
    short_high = [(s["t"], s["members"]["high"]) for s in busy if s["members"]["high"]["grantedNodes"]
                  < min(s["members"]["high"]["neededNodes"], POOL_NODES - 2 * FLOOR_NODES)]
    assert not short_high, f"the high member went short while all rose: {short_high[:2]}"
    figures = {name: {phase: _latencies(run.records[name], phase) for phase, _, _ in PHASES}
               for name in PRIORITIES}
    modelled = {name: _modelled_share(run, name, "all-rise", MODELLED_TPOT, "decode", SLO_TPOT)
                for name in PRIORITIES}
    prefill = {name: _modelled_share(run, name, "all-rise", MODELLED_PREFILL, "prefill", SLO_TTFT)
               for name in PRIORITIES}
    print(f"\nper member and phase (TTFT p90 s, TPOT p90 s, share meeting both, requests): "
          f"{figures}; modelled TPOT while all rose (share within {SLO_TPOT} s, requests): "
          f"{modelled}; modelled prefill time (share within {SLO_TTFT} s, requests): "
          f"{prefill}; pool samples while all rose: "
          f"{[(round(s['t']), {n: (m['grantedNodes'], m['neededNodes']) for n, m in s['members'].items()}) for s in busy[::5]]}")
    _, _, _, sent = figures["high"]["all-rise"]
    # The SLO (examples/demo-sim.yaml): TTFT and TPOT at the 90th percentile within targets,
    # each as the fleet the grant bought serves it, on the simulated engines' own clock: the
    # simulated GPUs run in wall time, 10x compressed, and a busy host stretches every pass
    # and step. TTFT as the prefill's queue and compute had every pass its modelled length
    # (the router, the bootstrap and the KV transfer, milliseconds here, left out). The
    # client's TTFT p90 was 1.1 s of 5 s on a loaded host, and 5.8 s on a host running two
    # more control planes and a benchmark beside CI, its fleet the same.
    share, counted = prefill["high"]
    assert counted >= 0.9 * sent, f"high: {counted} modelled prefill times of {sent} requests sent"
    assert share >= 0.9, f"high's modelled TTFT p90 above {SLO_TTFT} s while all rose: {prefill}"
    # TPOT as the fleet the planner sized serves it: every decode step its modelled length
    # for the batch it ran (the decodes the grant bought decide the batch), the step a
    # request joined counted whole. The client's TPOT adds the host's scheduling delay to
    # every 10x-compressed step (52.6 ms p90 once at a load average of 30, 34 ms in another run).
    # p90 within the target = at least 90% of the requests within it (a bucket bound).
    share, counted = modelled["high"]
    assert counted >= 0.9 * sent, f"high: {counted} modelled TPOTs of {sent} requests sent"
    assert share >= 0.9, f"high's modelled TPOT p90 above {SLO_TPOT} s while all rose: {modelled}"
    assert figures["high"]["all-rise"][2] > figures["low"]["all-rise"][2], figures


def test_the_split_returns_when_the_load_falls(run):
    last = run.samples[-1]["members"]
    fell = next(s["t"] for s in run.samples if s["phase"] == "end")
    assert run.samples[-1]["t"] - fell <= RETURN_SECONDS + 5
    assert set(last) == set(PRIORITIES)
    for name, m in last.items():
        assert m["grantedNodes"] == m["neededNodes"], f"{name}: {m['reason']}"
    assert run.samples[-1]["held"]["low"] >= FLOOR_NODES
