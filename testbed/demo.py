"""The main job, here: the whole product on this machine, under a phase-changing load.

A local Kubernetes with 24 fake 8xH200 nodes, a real Prometheus, the Helm chart, the operator
and a sample PDCluster in planner mode Auto; simulated SGLang engines behind the real SGLang
router; a load that moves from chat (decode-heavy) to long documents (prefill-heavy) to coding
agents (decode-heavy again). A live table shows the load, the prefill (x) and decode (y)
counts, TTFT/TPOT at the client and the planner's decisions. At the end: a PNG plot and a
one-paragraph summary (and a JSON record).

The demo's instances are the ``demo-sim`` profile (planner/profiles/demo-sim.yaml): small
enough that a few requests per second through the real router need several instances.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from pdscale.operator.api.pdcluster import PDClusterSpec
from pdscale.operator.render.builders import PLANNER_MEMORY_KEY, planner_memory_name

from . import demo_replay
from .loadgen import Phase, RequestRecord, RequestSpec, percentile, plan_requests, send_one
from .nodes import api_client
from .stack import Stack

HELP = "the whole loop here: cluster, operator, router, simulated fleet, phased load"  # the line `pdscale --help` shows

GROUP, VERSION, PLURAL = "pdscale.io", "v1alpha1", "pdclusters"

#: The seed's three phases (domain.md) shrunk to what two cores carry through the real router
#: (each streamed token is an HTTP event through router, engine and client): the shapes stay
#: (chat decode-heavy, documents prefill-heavy, agents decode-heavy with cached prefixes).
DEMO_PHASES = (
    Phase("chat", 90.0, 2.0, 100, 40, 0.6),
    Phase("long-documents", 90.0, 1.0, 600, 4, 0.2),
    Phase("agents", 90.0, 1.0, 300, 80, 0.8),
)


@dataclass
class Sample:
    """What the live table and the plot show, every couple of seconds."""

    t_seconds: float
    phase: str
    prefill_ready: int
    decode_ready: int
    prefill_target: int | None
    decode_target: int | None
    decision: str
    explanation: str
    router_workers: int
    #: the plan slot in force (the planner memory's ``lastPlanAtSeconds``) on this clock; None:
    #: none yet, or a recording older than the field
    planned_at_seconds: float | None = None
    #: the prefill and decode workers the router lists (its ``/workers`` stats); None: not
    #: listed by role (vllm-router), unreadable, or a recording older than the fields
    router_prefill: int | None = None
    router_decode: int | None = None


@dataclass
class DemoResult:
    phases: list[dict[str, Any]]
    samples: list[Sample] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    #: the requests planned (prompt, lengths, prefix group), by index: what the recording keeps
    specs: list[RequestSpec] = field(default_factory=list)

    def summary(self, slo_ttft: float, slo_tpot: float) -> dict[str, Any]:
        ok = [r for r in self.records if r.ok]

        def met(r: RequestRecord) -> bool:
            return r.ok and (r.ttft_seconds or 0) <= slo_ttft and (
                r.tpot_seconds is None or r.tpot_seconds <= slo_tpot)

        within = [r for r in self.records if met(r)]
        by_phase = {p["name"]: [r for r in self.records if r.phase == p["name"]] for p in self.phases}
        node_seconds = 0.0
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            node_seconds += (a.prefill_ready + a.decode_ready) * (b.t_seconds - a.t_seconds)
        # a 429 is the router's admission refusing at once (docs/admission.md): a miss, and
        # what the router was told to do under overload, not a failure
        refused = [r for r in self.records if r.status == 429]
        return {
            "requests": len(self.records),
            "refused": len(refused),
            "failed": len(self.records) - len(ok) - len(refused),
            "slo_attainment": len(within) / len(self.records) if self.records else None,
            "ttft_p90_seconds": percentile([r.ttft_seconds for r in ok if r.ttft_seconds], 90),
            "tpot_p90_seconds": percentile([r.tpot_seconds for r in ok if r.tpot_seconds], 90),
            "gpu_hours_ready": node_seconds * 8 / 3600,
            "splits": {p["name"]: self.split_at_end(p["name"]) for p in self.phases},
            # where the misses are: a phase change finds the fleet sized for the last phase
            "slo_attainment_by_phase": {
                name: (sum(map(met, rs)) / len(rs) if rs else None) for name, rs in by_phase.items()},
        }

    def split_at_end(self, phase: str) -> str | None:
        last = [s for s in self.samples if s.phase == phase]
        return f"{last[-1].prefill_ready}P{last[-1].decode_ready}D" if last else None


def phase_clock(phases: list[dict[str, Any]]) -> Callable[[float], str]:
    """The phase running at t seconds after the load started (the last one after its end)."""
    ends, total = [], 0.0
    for p in phases:
        total += p["duration_seconds"]
        ends.append((total, p["name"]))
    return lambda t: next((n for end, n in ends if t < end), ends[-1][1])


#: the scale-down window of the e2e runs: they check that the split moves back, or drains,
#: within a 60-70 s phase, which the default window (HPA's 300 s plus the warm-up, what the
#: demo runs) outlasts
E2E_SCALE_DOWN_WINDOW_SECONDS = 30


#: the router of the old default, sglang-router 0.3.2 (random PD prefill choice, no admission),
#: for the e2e runs whose expectations were measured behind it: they name it explicitly rather
#: than take the new default (smg with derived prefill admission, docs/admission.md)
OLD_DEFAULT_ROUTER = {"gateway": "SGLangRouter", "image": "lmsysorg/sglang:v0.5.6-cu129"}


def load_pdcluster(name: str, namespace: str, prometheus_url: str,
                   pdcluster_path: Path = Path("examples/demo-sim.yaml"), *,
                   scale_down_window_seconds: int | None = None) -> dict[str, Any]:
    """The PDCluster of ``pdcluster_path`` named and pointed at ``prometheus_url``; with
    ``scale_down_window_seconds``, its planner's stabilisation window set to it."""
    body = yaml.safe_load(pdcluster_path.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["planner"]["prometheusURL"] = prometheus_url
    if scale_down_window_seconds is not None:
        body["spec"]["planner"]["stabilizationWindowSeconds"] = scale_down_window_seconds
    return body


def refused_by_router(url: str) -> int | None:
    """POST a body that is not JSON to the router's chat endpoint: the router counts the
    request and refuses it (400) without routing it. Its status; None: no answer."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{url}/v1/chat/completions", data=b"{",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def router_url(core: client.CoreV1Api, namespace: str, name: str, port: int, timeout: float = 180,
               *, model: str = "sim-model", prefill: int = 1, decode: int = 1) -> str:
    """The router pod's address once its router serves: it lists at least ``prefill`` prefill
    and ``decode`` decode workers (the instances have warmed up and joined), or, for a router
    whose workers come from its discovery and are not listed (vllm-router), it answers a
    request."""
    import urllib.request

    def serves(url: str) -> bool:
        body = json.dumps({"model": model, "max_tokens": 1,
                           "messages": [{"role": "user", "content": "ping"}]}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status == 200
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={name},pdscale.io/role=router").items
        for p in pods:
            if p.status.pod_ip:
                url = f"http://{p.status.pod_ip}:{port}"
                discovery = any(a == "--vllm-discovery-address" for a in p.spec.containers[0].args or [])
                if discovery:
                    if serves(url):
                        return url
                    continue
                try:
                    with urllib.request.urlopen(f"{url}/workers", timeout=2) as r:
                        stats = json.loads(r.read()).get("stats") or {}
                except (OSError, ValueError):
                    continue
                if stats.get("prefill_count", 0) >= prefill and stats.get("decode_count", 0) >= decode:
                    return url
        time.sleep(1)
    raise TimeoutError(f"the router of {namespace}/{name} had no prefill and decode worker "
                       f"within {timeout:.0f}s")


def sample(custom: client.CustomObjectsApi, core: client.CoreV1Api, namespace: str, name: str,
           t: float, phase: str, router: str, started_epoch: float) -> Sample:
    import urllib.request

    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    status = body.get("status") or {}
    planner = status.get("planner") or {}
    recommended = planner.get("recommended") or {}

    def serving(role: str) -> int:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={name},pdscale.io/role={role}").items
        return sum(1 for p in pods if p.metadata.deletion_timestamp is None
                   and not (p.metadata.annotations or {}).get("pdscale.io/draining-since")
                   and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])))

    stats: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(f"{router}/workers", timeout=2) as r:
            listed = json.loads(r.read())
        workers, stats = int(listed.get("total", 0)), listed.get("stats") or {}
    except (OSError, ValueError):
        workers = -1
    return Sample(t, phase, serving("prefill"), serving("decode"), recommended.get("prefill"),
                  recommended.get("decode"), planner.get("lastDecision", "-"),
                  planner.get("explanation", ""), workers,
                  planned_at(core, namespace, name, started_epoch),
                  stats.get("prefill_count"), stats.get("decode_count"))


def planned_at(core: client.CoreV1Api, namespace: str, name: str,
               started_epoch: float) -> float | None:
    """The planner memory's last plan slot on the run's clock (which began at
    ``started_epoch``), so the replay can plan on the live loop's schedule."""
    try:
        memory = core.read_namespaced_config_map(planner_memory_name(name), namespace)
        slot = json.loads((memory.data or {}).get(PLANNER_MEMORY_KEY) or "{}").get("lastPlanAtSeconds")
    except (client.ApiException, ValueError):
        return None
    return None if not isinstance(slot, (int, float)) else float(slot) - started_epoch


#: How long an e2e run lets a router leave a serving pod out. The planner loop syncs the
#: routers every tick (5 s), so a pod may be Ready up to a tick (and its plan's reads) before
#: it is listed, and the sample that sees it listed comes up to a sample later. Measured in
#: e2e/test_smg_loop.py beside a CPU-bound job, the closed-loop module on the other xdist
#: worker (load 4 on 2 cores): at most 2.4 s, one sample. The bound is a few loaded ticks:
#: what it catches is a router left behind, not a slow tick. (The earlier check, a count of
#: samples behind, failed CI at 15 of 54: each new pod costs a sample or two.)
CATCH_UP_BOUND_SECONDS = 30.0


def catch_up_seconds(checks: Iterable[tuple[float, set[str], set[str]]]) -> dict[str, float]:
    """Per engine URL, the longest a router left it out while it was serving: ``checks`` are
    (seconds, URLs serving, URLs the router lists) in time order; a spell runs from the
    first check that saw the URL serving and not listed to the first that saw it listed or
    no longer serving (or the last check). A router that catches up within a tick costs each
    new pod a check or two, however many pods a run adds: a bound in seconds, not a count of
    checks behind, is what holds on a busy machine."""
    since: dict[str, float] = {}
    longest: dict[str, float] = {}
    last = 0.0
    for t, serving, listed in checks:
        behind = serving - listed
        for url in [u for u in since if u not in behind]:
            longest[url] = max(longest.get(url, 0.0), t - since.pop(url))
        for url in behind:
            since.setdefault(url, t)
        last = t
    for url, t in since.items():
        longest[url] = max(longest.get(url, 0.0), last - t)
    return longest


def drive(stack: Stack, namespace: str, name: str, phases: tuple[Phase, ...], *,
          on_sample=None, sample_seconds: float = 2.0, seed: int = 7,  # type: ignore[no-untyped-def]
          body: dict[str, Any] | None = None) -> DemoResult:
    """Apply the PDCluster (the demo's, or ``body``), wait for its router, run the phases,
    sample the fleet."""
    assert stack.kubeconfig is not None and stack.prometheus is not None
    api = api_client(stack.kubeconfig)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    body = body or load_pdcluster(name, namespace, stack.prometheus.url)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    # The load starts once the spec's whole starting fleet serves, as a replay of the
    # recording starts it: at the first worker listed, the e2e's first requests all went to
    # one of its two decodes (its second joined 2 s later) and half of them missed TPOT
    spec = body["spec"]
    url = router_url(core, namespace, name, spec["router"]["port"],
                     prefill=spec["prefill"].get("replicas", 1),
                     decode=spec["decode"].get("replicas", 1))
    # The router's request counter must exist before the load starts, as on any cluster
    # that has served: the router creates the series at its first request, and Prometheus'
    # rate() of a series born inside its window reads only what came after its first scrape.
    # The live planner's first tick read 0.3 req/s where 1.8 had arrived, and its forecast
    # took chat's rise for a step where its replay, which counts arrivals exactly, saw a ramp
    # and ordered 8 decodes at the second tick, not 5. A body the router cannot parse is
    # counted and answered 400 by the router itself: no engine sees it (a served request
    # also entered the first interval's lengths as a prompt of 5 tokens and an answer of 1).
    # (A router restarted under load looks the same for one window; the stabilisation
    # window keeps that from removing anything.)
    refused_by_router(url)
    time.sleep(3 * stack.prometheus.scrape_interval_seconds)
    specs = plan_requests(phases, seed=seed)
    result = DemoResult(phases=[asdict(p) for p in phases], specs=specs)
    phase_at = phase_clock(result.phases)

    # one clock for the samples and the requests' send times: the recording is replayed
    # against the samples, interval by interval
    started, started_epoch = time.monotonic(), time.time()

    async def load() -> None:
        from aiohttp import ClientSession, TCPConnector

        async with ClientSession(connector=TCPConnector(limit=0)) as session:
            async def one(spec):  # type: ignore[no-untyped-def]
                await asyncio.sleep(max(spec.at_seconds - (time.monotonic() - started), 0.0))
                record = await send_one(session, url, "chat", spec, "sim-model", started, 120.0)
                result.records.append(record)

            await asyncio.gather(*(one(s) for s in specs))

    loader = threading.Thread(target=lambda: asyncio.run(load()), name="load", daemon=True)
    loader.start()
    while loader.is_alive():
        t = time.monotonic() - started
        s = sample(custom, core, namespace, name, t, phase_at(t), url, started_epoch)
        result.samples.append(s)
        if on_sample is not None:
            on_sample(s, result)
        loader.join(timeout=sample_seconds)
    return result


# -------------------------------------------------------------------- output
def plot(result: DemoResult, path: Path, slo_ttft: float, slo_tpot: float,
         replayed: list[dict[str, Any]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_load, ax_fleet, ax_lat) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    window = 10.0
    horizon = max((s.t_seconds for s in result.samples), default=0.0)
    bins = [i * window for i in range(int(horizon // window) + 2)]
    sent = [sum(1 for r in result.records if b <= r.sent_seconds < b + window) / window for b in bins]
    ax_load.step(bins, sent, where="post", color="black")
    ax_load.set_ylabel("requests/s sent")
    start = 0.0
    for i, p in enumerate(result.phases):
        for ax in (ax_load, ax_fleet, ax_lat):
            ax.axvspan(start, start + p["duration_seconds"], alpha=0.08 if i % 2 else 0.0, color="grey")
        ax_load.text(start + 2, max(sent or [1]) * 0.9, p["name"], fontsize=9)
        start += p["duration_seconds"]
    t = [s.t_seconds for s in result.samples]
    ax_fleet.plot(t, [s.prefill_ready for s in result.samples], label="prefill ready (x)", color="tab:blue")
    ax_fleet.plot(t, [s.decode_ready for s in result.samples], label="decode ready (y)", color="tab:orange")
    ax_fleet.plot(t, [s.prefill_target for s in result.samples], "--", label="prefill decided", color="tab:blue")
    ax_fleet.plot(t, [s.decode_target for s in result.samples], "--", label="decode decided", color="tab:orange")
    if replayed:
        tr = [d["t_seconds"] for d in replayed]
        ax_fleet.step(tr, [d["replay_prefill"] for d in replayed], ":", where="post",
                      label="prefill replayed", color="tab:blue")
        ax_fleet.step(tr, [d["replay_decode"] for d in replayed], ":", where="post",
                      label="decode replayed", color="tab:orange")
    ax_fleet.set_ylabel("instances (8xH200 nodes)")
    ax_fleet.legend(loc="upper left", fontsize=8)
    ok = [r for r in result.records if r.ok]

    def windowed(values: list[tuple[float, float]]) -> list[float | None]:
        return [percentile([v for ts, v in values if b <= ts < b + window], 90) for b in bins]

    ttft = windowed([(r.sent_seconds, r.ttft_seconds) for r in ok if r.ttft_seconds is not None])
    tpot = windowed([(r.sent_seconds, r.tpot_seconds) for r in ok if r.tpot_seconds is not None])
    ax_lat.plot(bins, ttft, label="TTFT p90 (s)", color="tab:green")
    ax_lat.axhline(slo_ttft, ls=":", color="tab:green", label="TTFT SLO")
    ax_tpot = ax_lat.twinx()
    ax_tpot.plot(bins, [v * 1000 if v is not None else None for v in tpot], label="TPOT p90 (ms)", color="tab:red")
    ax_tpot.axhline(slo_tpot * 1000, ls=":", color="tab:red", label="TPOT SLO")
    ax_lat.set_ylabel("TTFT p90 (s)")
    ax_tpot.set_ylabel("TPOT p90 (ms)")
    ax_lat.set_xlabel("seconds")
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_tpot.legend(loc="upper right", fontsize=8)
    fig.suptitle("pdscale demo: the planner moves prefill/decode with the load (measured at the client)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_paragraph(s: dict[str, Any]) -> str:
    att = f"{s['slo_attainment']:.1%}" if s["slo_attainment"] is not None else "n/a"
    splits = ", ".join(f"{k} {v}" for k, v in s["splits"].items())
    phases = ", ".join(f"{k} {v:.0%}" for k, v in s["slo_attainment_by_phase"].items() if v is not None)
    return (f"{s['requests']} requests went through the real SGLang router to simulated engines; "
            f"{s['failed']} failed, {s.get('refused', 0)} refused at the router (429, admission: "
            f"misses). {att} met both SLOs ({phases}; TTFT p90 "
            f"{s['ttft_p90_seconds'] or float('nan'):.2f} s, TPOT p90 "
            f"{(s['tpot_p90_seconds'] or float('nan')) * 1000:.0f} ms at the client). The fleet "
            f"ended each phase at: {splits}, using {s['gpu_hours_ready']:.2f} GPU-hours of Ready "
            f"instances.")


def record_live_load(result: DemoResult, applied: dict[str, Any], out: Path) -> None:
    """Write the load sent, what the client saw and the PDCluster applied under ``out``, the
    trace's prefix blocks in the profile's cache block size."""
    from pdscale.planner.profile import load_profile

    spec = PDClusterSpec.model_validate(applied["spec"])
    block_tokens = load_profile(spec.planner.profile).prefill.block_tokens
    demo_replay.write_recording(out, result.specs, result.records, applied,
                                block_tokens=block_tokens)


def recorded_timing(result: DemoResult, out: Path) -> tuple[float, demo_replay.LiveTiming]:
    """The planning interval of the PDCluster recorded under ``out`` and the live loop's
    timing against it: its plan schedule (ticks a few seconds apart see a phase change
    differently) and its new instances' join delay beyond the warm-up."""
    spec = PDClusterSpec.model_validate(
        yaml.safe_load((out / demo_replay.PDCLUSTER_FILE).read_text())["spec"])
    interval = float(spec.planner.interval_seconds)
    warmup = max(spec.prefill.warmup_seconds, spec.decode.warmup_seconds)
    return interval, demo_replay.live_timing(result.samples, interval, warmup)


def compare_with_replay(result: DemoResult, summary: dict[str, Any], out: Path) -> dict[str, Any]:
    """Replay the recording under ``out`` with the PDCluster applied, through pdscale and the
    oracle (and each replay router), and compare with the live run (demo_replay.fidelity)."""
    pdcluster, trace = out / demo_replay.PDCLUSTER_FILE, out / demo_replay.TRACE_FILE
    interval, timing = recorded_timing(result, out)
    reports = demo_replay.replay_recording(pdcluster, trace, timing=timing)
    phase_at = phase_clock(result.phases)
    rows = demo_replay.side_by_side(
        result.samples, reports["pdscale"]["decisions"], reports["oracle"]["decisions"],
        interval_seconds=interval, phase_at=phase_at)
    by_draw = demo_replay.router_draw_replays(pdcluster, trace, timing)
    f = demo_replay.fidelity(
        summary, reports, rows, interval_seconds=interval, phase_at=phase_at,
        router_draws={seed: r["slo_attainment"] for seed, r in by_draw.items()},
        agreement_between_router_draws=demo_replay.agreement_between_draws(
            [r["decisions"] for r in by_draw.values()]))
    f["tick_phase_seconds"] = timing.tick_phase_seconds
    f["join_delay_seconds"] = timing.join_delay_seconds
    f["replayed_by_tick_phase"] = demo_replay.tick_phase_spread(pdcluster, trace, interval,
                                                                timing=timing)
    f["by_router"] = demo_replay.router_sensitivity(pdcluster, trace, timing)
    return f


def recorded_result(out: Path) -> DemoResult:
    """A finished demo's result, read back from ``out`` (demo.json and the client's records)."""
    record = json.loads((out / "demo.json").read_text())
    lines = (out / demo_replay.CLIENT_FILE).read_text().splitlines()
    return DemoResult(phases=record["phases"], samples=[Sample(**s) for s in record["samples"]],
                      records=[RequestRecord(**json.loads(line)) for line in lines if line])


def report_replay(console: Any, result: DemoResult, summary: dict[str, Any], out: Path,
                  record: dict[str, Any], slo_ttft: float, slo_tpot: float) -> None:
    """Replay the recording, add the comparison to demo.json and the plot, print it."""
    replay = compare_with_replay(result, summary, out)
    record["replay"] = replay
    summary["replay"] = {k: replay[k] for k in (
        "attainment_difference_pp", "attainment_outside_router_draws_pp", "counts_agree_share",
        "intervals_compared")} | {
        "replayed_slo_attainment": replay["replayed"]["slo_attainment"],
        "oracle_slo_attainment": (replay["oracle"] or {}).get("slo_attainment")}
    record["summary"] = summary
    (out / "demo.json").write_text(json.dumps(record, indent=2))
    plot(result, out / "demo.png", slo_ttft, slo_tpot, replay["intervals"])
    console.print(side_by_side_table(replay["intervals"]))
    console.print(summary_paragraph(summary) + " " + demo_replay.fidelity_paragraph(replay))
    console.print(f"recording: {out / demo_replay.TRACE_FILE} (trace), "
                  f"{out / demo_replay.CLIENT_FILE} (what the client saw), "
                  f"{out / demo_replay.PDCLUSTER_FILE} (the PDCluster applied)")


def side_by_side_table(intervals: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    """Decided prefill/decode counts per replayed interval: live, replayed, oracle."""
    from rich.table import Table

    table = Table(title="decided xPyD per interval: live vs replayed (same load, same PDCluster)")
    for col in ("t", "phase", "live", "live ready", "replayed", "oracle", "+-1"):
        table.add_column(col)
    for r in intervals:
        live = (f"{r['live_prefill']}P{r['live_decode']}D" if r["live_prefill"] is not None
                else "-")
        oracle = (f"{r['oracle_prefill']}P{r['oracle_decode']}D"
                  if r["oracle_prefill"] is not None else "-")
        agrees = demo_replay.IntervalCounts(**r).agrees()
        table.add_row(f"{r['t_seconds']:.0f}", r["phase"], live,
                      f"{r['live_prefill_ready']}P{r['live_decode_ready']}D",
                      f"{r['replay_prefill']}P{r['replay_decode']}D", oracle,
                      "-" if agrees is None else ("yes" if agrees else "no"))
    return table


# -------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="folder for the plot, JSON, logs")
    parser.add_argument("--nodes", type=int, default=24, help="fake 8xH200 nodes (default 24)")
    parser.add_argument("--phase-seconds", type=float, default=90.0, help="length of each load phase")
    parser.add_argument("--chart", type=Path, default=Path("charts/pdscale"),
                        help="the Helm chart to install (default: charts/pdscale of this checkout)")
    parser.add_argument("-f", "--pdcluster", type=Path, default=Path("examples/demo-sim.yaml"),
                        help="the PDCluster to apply (default: examples/demo-sim.yaml)")
    parser.add_argument("--replay-only", action="store_true",
                        help="run no demo: replay the recording of the last one under --out and "
                             "compare it with the live run again")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    # piped (a log file, CI) rich assumes 80 columns and folds the "why" column into a word per
    # line; a log has room
    console = Console(width=None if sys.stdout.isatty() else 160)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds the stack: every process started is stopped

    signal.signal(signal.SIGTERM, interrupted)
    phases = tuple(Phase(p.name, args.phase_seconds, p.rate_rps, p.mean_input_tokens,
                         p.mean_output_tokens, p.prefix_share) for p in DEMO_PHASES)
    for path, flag in ((args.chart / "Chart.yaml", "--chart"), (args.pdcluster, "--pdcluster")):
        if not path.is_file():
            console.print(f"[red]pdscale demo: {path} not found: run from a pdscale checkout "
                          f"or pass {flag}[/red]")
            return 2
    slo = PDClusterSpec.model_validate(yaml.safe_load(args.pdcluster.read_text())["spec"]).slo
    slo_ttft, slo_tpot = slo.ttft_seconds, slo.tpot_seconds
    if args.replay_only:
        result = recorded_result(args.out)
        record = json.loads((args.out / "demo.json").read_text())
        summary = result.summary(slo_ttft, slo_tpot)
        report_replay(console, result, summary, args.out, record, slo_ttft, slo_tpot)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with Stack(workdir=args.out / "stack", nodes=args.nodes, profile="demo-sim",
               chart=args.chart) as stack:
        table_rows: list[tuple[str, ...]] = []

        def render() -> Table:
            table = Table(title="pdscale planner at work (PDCluster default/demo, mode Auto)")
            for col in ("t", "phase", "sent/s", "x ready", "y ready", "decided", "TTFT p90",
                        "TPOT p90", "failed", "why"):
                table.add_column(col, overflow="fold", max_width=48 if col == "why" else None)
            for row in table_rows[-15:]:
                table.add_row(*row)
            return table

        with Live(render(), console=console, refresh_per_second=2) as live:
            def on_sample(s: Sample, result: DemoResult) -> None:
                recent = [r for r in result.records if r.sent_seconds >= s.t_seconds - 10]
                ok = [r for r in recent if r.ok]
                ttft = percentile([r.ttft_seconds for r in ok if r.ttft_seconds], 90)
                tpot = percentile([r.tpot_seconds for r in ok if r.tpot_seconds], 90)
                table_rows.append((
                    f"{s.t_seconds:5.0f}", s.phase, f"{len(recent) / 10:.1f}", str(s.prefill_ready),
                    str(s.decode_ready), s.decision, f"{ttft:.2f}s" if ttft else "-",
                    f"{tpot * 1000:.0f}ms" if tpot else "-",
                    str(sum(1 for r in result.records if not r.ok)), s.explanation[:140]))
                live.update(render())

            assert stack.prometheus is not None
            body = load_pdcluster("demo", "default", stack.prometheus.url, args.pdcluster)
            result = drive(stack, "default", "demo", phases, on_sample=on_sample, body=body)
    summary = result.summary(slo_ttft, slo_tpot)
    plot_path, json_path = args.out / "demo.png", args.out / "demo.json"
    record = {"summary": summary, "phases": result.phases,
              "samples": [asdict(s) for s in result.samples]}
    # kept should the replay fail
    json_path.write_text(json.dumps(record, indent=2))
    plot(result, plot_path, slo_ttft, slo_tpot)
    console.print()  # a piped Live leaves the cursor at the end of the table
    record_live_load(result, body, args.out)
    report_replay(console, result, summary, args.out, record, slo_ttft, slo_tpot)
    console.print(f"plot: {plot_path}   data: {args.out / 'demo.json'}   logs: {args.out / 'stack'}")
    return 0 if summary["failed"] == 0 else 1
