"""All policies side by side on the shared traces, one simulator, one cost accounting.

Traces (scale factors printed with every row). Each is scaled so that it needs >= 16 instances
at peak, counted strictly: even ``static:best``, the smallest fixed fleet meeting 99% in
hindsight (it spends the 1% of misses at the peak), has >= 16; the script warns otherwise.

- Mooncake conversation (59 min), replicated x6 (x5 left static:best at 8P6D = 14); TTFT SLO
  15 s (one uncached 85k-token prompt alone takes ~9.5 s on the default profile, so 2 s cannot
  be met by any fleet).
- Azure 2023 code (57 min), replicated x20; TTFT SLO 2 s.
- ServeGen deepseek-r1 one-day rate series with Mooncake lengths, time compressed x2 (a day
  in 12 hours: 5-minute windows against the real 10-minute warm-up) at 0.6x the original
  rate (rate-scale 0.3 x the compression's 2; 0.2 left static:best at 7P5D = 12); TTFT SLO
  15 s.
- A steady hour (constant 12 req/s, Mooncake lengths): role changes must be zero.
- ``surge`` (only with ``--only surge``): issue 48's hour as a synthetic shape
  (planner/replay/workloads.py): 100 req/s for 12 minutes, +70% over nine, then 105 req/s;
  Azure code lengths; TTFT SLO 2 s.
- Held-out days (only with ``--only heldout-mid-d1,heldout-small-d11``; pdscale and the oracle;
  about 2 minutes per policy): one real-time day of ServeGen's ``m-mid`` (day 1, a plain
  diurnal day) and ``m-small`` (day 11, the spikiest: single 10-minute windows at 2.4x their
  neighbours) series, Mooncake lengths, scaled so that the day's busiest window is 42 req/s
  (about the deepseek-r1 day's peak). Zero windows are gaps in the released data (ServeGen's
  README) and take the mean of their neighbours (day 11 has five). No knob was tuned on
  these days: they check that what the benchmark taught the planner holds on days it never
  saw.
- ``servegen-day`` (only with ``--only servegen-day``; 1.4M requests; measured here: about 90 s
  per dynamic policy, 20 minutes for static:best's search, 10 more per ``@matched``): the
  same series at its own rate over a real day.

A baseline (reactive, sla-interp) that spends fewer GPU-hours than pdscale is also re-run with
its utilisation targets scaled down until it spends as much (``<name>@matched``): attainment
at equal cost. The issue's targets are checked on the measured rows and printed (met / NOT
met) under the table, and stored under ``targets`` in the JSON.

The planner runs the operator's configuration for one PDCluster,
``bench/policy_bench_pdcluster.yaml`` (through ``pdscale.replay.configure``, as ``pdscale
replay -f`` does): TPOT SLO 50 ms, percentile 99, node budget 200, interval 60 s, warm-up
600 s, decode drain 60 s; each trace sets only its TTFT target. Every policy runs on one
fleet, ``--stack`` (planner/replay/run.py ``STACKS``): by default the stack a PDCluster
renders by default, SGLang's batched prefill behind smg's cache-aware policy with the prefill
admission the operator derives (docs/admission.md); ``--old-default`` the earlier default,
sglang-router 0.3.2 (random PD prefill choice) with no admission;
``ideal-router`` adds predicted-TTFT routing with early rejection (the article's overload
control, which no router performs: a what-if); ``article`` is the earlier figures' model. A
rejected request counts as a miss, and latency quantiles are over all requests. By default
(``--start-from history``, as ``pdscale replay``) the trace's first warm-up is history: not
scored, it sizes every dynamic policy's start fleet and is the planner's memory, as if the
planner had been running before; ``hindsight`` sizes the start from the scored window's own
first warm-up (the earlier figures). static:best is searched in hindsight on the scored window.
Writes out/policy_bench.json (``policy_bench_STACK.json`` for another stack,
``..._admission_MODE.json`` with ``--decode-admission``)
and prints the table with ratios against oracle and static:best.

``--nodes-per-instance P,D`` runs the same PDCluster with instances of several nodes
(LeaderWorkerSet groups, docs/multinode.md): prefill P and decode D nodes per instance, the
parallelism as wide as those nodes (TP = DP = EP = 8 x nodes, DP-attention) and, for 2,4, the
profile of that shape (planner/profiles/deepseek-fp8-8xh200-sglang-p2n-d4n.yaml: one group's
capacity). The node budget counts nodes, GPU-hours are nodes x 8 x hours, and the JSON is
``policy_bench_nodesP-D.json``.

    .venv/bin/python bench/policy_bench.py [--only mooncake,azure,servegen,steady] [--stack ideal-router]
    .venv/bin/python bench/policy_bench.py --only heldout-mid-d1,heldout-small-d11
    .venv/bin/python bench/policy_bench.py --only mooncake --nodes-per-instance 2,4
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pdscale.operator.api.pdcluster import PDClusterSpec, RouterAdmission, SGLangGateway
from pdscale.operator.render.checklist import validate
from pdscale.planner.profile import Profile, load_profile
from pdscale.planner.replay.run import STACKS, START_FROM, ReplaySetup, run_policy, start_from
from pdscale.planner.replay.simulate import DECODE_ADMISSIONS
from pdscale.planner.replay.traces import (
    Trace,
    load_trace,
    read_mooncake,
    read_rate_series,
    synthesize_from_rates,
)
from pdscale.planner.replay.workloads import synthetic_trace
from pdscale.replay import configure, read_spec
from pdscale.replay_setup import router_admission, routing

SHARED = Path("/work/shared/traces")
#: the PDCluster whose planner configuration every case runs
PDCLUSTER = Path(__file__).with_name("policy_bench_pdcluster.yaml")
OUT = Path(__file__).parents[1] / "out"
MOONCAKE = SHARED / "mooncake/conversation_trace.jsonl"
#: the shipped profile of an instance shape (prefill, decode nodes per instance)
SHAPE_PROFILES = {(1, 1): None, (2, 4): "deepseek-fp8-8xh200-sglang-p2n-d4n"}
POLICIES = ["pdscale", "oracle", "static:best", "reactive", "sla-interp"]
#: every trace is scaled so that even static:best needs at least this many instances
MIN_PEAK_INSTANCES = 16


def cases() -> dict[str, dict[str, Any]]:
    return {
        "mooncake": dict(path=MOONCAKE, rate_scale=6.0, time_scale=1.0, ttft=15.0),
        "azure": dict(path=SHARED / "azure2023/AzureLLMInferenceTrace_code.csv",
                      rate_scale=20.0, time_scale=1.0, ttft=2.0),
        "servegen": dict(path=SHARED / "servegen/deepseek-r1_rate.csv", lengths=MOONCAKE,
                         rate_scale=0.3, time_scale=2.0, ttft=15.0),
        "servegen-day": dict(path=SHARED / "servegen/deepseek-r1_rate.csv", lengths=MOONCAKE,
                             rate_scale=1.0, time_scale=1.0, ttft=15.0),
        "heldout-mid-d1": dict(path=SHARED / "servegen/m-mid_rate.csv", lengths=MOONCAKE, day=1,
                               peak_rps=42.0, time_scale=1.0, ttft=15.0,
                               policies=["pdscale", "oracle"]),
        "heldout-small-d11": dict(path=SHARED / "servegen/m-small_rate.csv", lengths=MOONCAKE,
                                  day=11, peak_rps=42.0, time_scale=1.0, ttft=15.0,
                                  policies=["pdscale", "oracle"]),
        "steady": dict(steady_rps=12.0, seconds=3600.0, rate_scale=1.0, time_scale=1.0, ttft=15.0,
                       policies=["pdscale"]),
        # issue 48's hour (workloads.py ``surge``): 100 req/s flat, +70% over nine minutes,
        # back to 105; Azure code lengths, TTFT 2 s (only with --only surge)
        "surge": dict(shape="surge", base_rps=100.0, lengths=SHARED / "azure2023/AzureLLMInferenceTrace_code.csv",
                      rate_scale=1.0, time_scale=1.0, ttft=2.0),
    }


def with_shape(spec: PDClusterSpec, nodes: tuple[int, int]) -> PDClusterSpec:
    """``spec`` with prefill and decode instances of ``nodes`` whole nodes each, the layout as
    wide as their GPUs (what the checklist requires: TP x PP = nodes x gpusPerNode with
    DP-attention), as examples/sglang-deepseek-multinode.yaml deploys them."""
    update: dict[str, Any] = {}
    layouts: dict[str, Any] = {}
    for role, n in zip(("prefill", "decode"), nodes, strict=True):
        width = n * spec.placement.gpus_per_node
        layouts[role] = getattr(spec.parallelism, role).model_copy(update={
            "tensor_parallel_size": width, "data_parallel_size": width,
            "expert_parallel_size": width, "data_parallel_attention": True})
        update[role] = getattr(spec, role).model_copy(update={"nodes_per_instance": n})
    update["parallelism"] = spec.parallelism.model_copy(update=layouts)
    shaped = spec.model_copy(update=update)
    validate(shaped.model_dump(by_alias=True, exclude_none=True))  # refuses what cannot run
    return shaped


def shape_profile(nodes: tuple[int, int]) -> Profile | None:
    """The shipped profile of that instance shape (None: the spec's own, for one node)."""
    if nodes not in SHAPE_PROFILES:
        raise SystemExit(f"--nodes-per-instance {nodes[0]},{nodes[1]}: no shipped profile of "
                         f"that shape (have {', '.join(f'{p},{d}' for p, d in SHAPE_PROFILES)})")
    name = SHAPE_PROFILES[nodes]
    return None if name is None else load_profile(name)


def one_day(c: dict[str, Any]) -> Trace:
    """Day ``c['day']`` of a multi-day rate series at real time, its busiest window scaled to
    ``c['peak_rps']``; sets ``c['rate_scale']`` to the factor used (printed with the row)."""
    day = 86400.0
    windows = [(t - c["day"] * day, r) for t, r in read_rate_series(c["path"])
               if c["day"] * day <= t < (c["day"] + 1) * day]
    # ServeGen's README: some zero windows are gaps in the released data, not idle periods.
    # Replayed as zero, a gap becomes an idle half hour and then a step back to full load;
    # the planner would be measured on an artefact. A gap takes the mean of its neighbours.
    rates = [r for _, r in windows]
    for k, r in enumerate(rates):
        if r == 0.0:
            before = next((x for x in reversed(rates[:k]) if x > 0), None)
            after = next((x for x in rates[k + 1:] if x > 0), None)
            known = [x for x in (before, after) if x is not None]
            rates[k] = sum(known) / len(known) if known else 0.0
    c["gap_windows"] = sum(1 for _, r in windows if r == 0.0)
    windows = [(t, r) for (t, _), r in zip(windows, rates, strict=True)]
    c["rate_scale"] = c["peak_rps"] / max(r for _, r in windows)
    return synthesize_from_rates([(t, r * c["rate_scale"]) for t, r in windows],
                                 read_mooncake(c["lengths"]),
                                 name=f"{Path(c['path']).stem}-day{c['day']}@peak{c['peak_rps']:g}rps")


def trimmed(rep: dict[str, Any], nodes: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """A replay report without its per-interval series, with its peak instance count and the
    peak of the nodes those instances span (``nodes``: per prefill, per decode instance)."""
    rep.pop("per_interval", None)
    rep.pop("explanations", None)
    rep["peak_instances"] = max(
        (d["provisioned_prefill"] + d["provisioned_decode"] for d in rep["decisions"]), default=0)
    rep["peak_nodes"] = max((d["provisioned_prefill"] * nodes[0] + d["provisioned_decode"] * nodes[1]
                             for d in rep["decisions"]), default=0)
    return rep


def matched(setup: ReplaySetup, base: str, gpu_hours: float, console: Console,
            history: list[Any] | None) -> dict[str, Any]:
    """``base`` re-run with more headroom until it spends at least ``gpu_hours``.

    A baseline that spends less than pdscale and misses more is not a cheaper way to the same
    result; given the same GPU-hours (its utilisation targets scaled down, bisected), its
    attainment is the fair comparison. Returns the report of the largest scale found that
    spends at least ``gpu_hours`` (or of the smallest scale tried, if none does)."""
    t = time.perf_counter()
    lo, hi = 0.05, 1.0  # utilisation scale: lo spends the most
    best = run_policy(setup, base, utilization_scale=lo, history=history)
    best_scale = lo
    if best["gpu_hours"] >= gpu_hours:
        for _ in range(6):  # the scale to within 0.015
            mid = (lo + hi) / 2
            rep = run_policy(setup, base, utilization_scale=mid, history=history)
            if rep["gpu_hours"] >= gpu_hours:
                lo, best, best_scale = mid, rep, mid
            else:
                hi = mid
    best = trimmed(best, setup.planner.nodes_per_instance)
    best["policy"] = f"{base}@matched(u x{best_scale:.2f})"
    best["utilization_scale"] = round(best_scale, 4)
    console.print(f"  {best['policy']:>22}: attainment {best['slo_attainment']:.4f}, "
                  f"{best['gpu_hours']:.1f} GPU-h (given pdscale's {gpu_hours:.1f}) "
                  f"({time.perf_counter() - t:.0f} s)")
    return best


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for pdscale, checked on the measured rows (not asserted: printed)."""
    out: list[dict[str, Any]] = []

    def check(trace: str, target: str, value: str, met: bool) -> None:
        out.append({"trace": trace, "target": target, "value": value, "met": bool(met)})

    for name, r in results.items():
        reps = r["policies"]
        ours = reps.get("pdscale")
        if ours is None:
            continue
        a, g = ours["slo_attainment"], ours["gpu_hours"]
        if name == "steady":
            check(name, "zero role changes in a steady hour", f"{ours['role_changes']}",
                  ours["role_changes"] == 0)
            continue
        oracle = reps.get("oracle")
        if oracle is None:
            check(name, "SLO attainment >= 99%", f"{a:.2%}", a >= 0.99)
        else:
            # the rule: 99% where the oracle reaches it under the same stack, else
            # within 0.5 pp of the oracle (the stack, not the planner, caps what is reachable)
            oa = oracle["slo_attainment"]
            goal = 0.99 if oa >= 0.99 else oa - 0.005
            check(name, f"SLO attainment >= {goal:.2%} (oracle {oa:.2%})", f"{a:.2%}", a >= goal)
            ratio = g / oracle["gpu_hours"]
            check(name, "GPU-hours <= 1.10x oracle", f"{ratio:.2f}x", ratio <= 1.10)
        best = next((v for k, v in reps.items() if k.startswith("static:best")), None)
        if best and oracle is not None and oracle["gpu_hours"] <= 0.95 * best["gpu_hours"]:
            ratio = g / best["gpu_hours"]
            check(name, "GPU-hours <= static:best (the oracle spends <= 0.95x of it)",
                  f"{ratio:.2f}x", ratio <= 1.0)
        if name.startswith("servegen") and best:  # the diurnal series, either scale
            ratio = g / best["gpu_hours"]
            check(name, "diurnal: GPU-hours <= 0.6x static:best", f"{ratio:.2f}x", ratio <= 0.6)
        for base in ("reactive", "sla-interp"):
            if base not in reps:
                continue
            # the baseline as run, or given pdscale's GPU-hours when it spent less
            other = next((v for k, v in reps.items() if k.startswith(f"{base}@matched")), reps[base])
            check(name, f"better attainment than {base} at no more GPU-hours",
                  f"{a:.2%} vs {other['slo_attainment']:.2%}, {g:.0f} vs {other['gpu_hours']:.0f} GPU-h"
                  f"{' (matched)' if other is not reps[base] else ''}",
                  a > other["slo_attainment"] and g <= other["gpu_hours"] + 1e-9)
    return out


def planner_what_if(text: str) -> dict[str, Any]:
    """``--planner``'s FIELD=VALUE pairs: each value read as JSON (numbers, true/false, null),
    else kept as a string."""
    out: dict[str, Any] = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="mooncake,azure,servegen,steady",
                    help="cases to run, comma-separated; servegen-day (the series at its own "
                         "rate over a real day, 1.4M requests) is not run by default")
    ap.add_argument("--nodes", type=int, default=None,
                    help="node budget (default: the PDCluster's nodeBudget, 200)")
    ap.add_argument("--policies", default=None,
                    help="policies to run, comma-separated (default: all, or the case's own)")
    ap.add_argument("--decode-admission", choices=DECODE_ADMISSIONS, default="off",
                    help="every policy's decode caps its batch at the TPOT target (queue) and "
                         "drops what would wait past the TTFT target (shed): a what-if, see the "
                         "README")
    ap.add_argument("--stack", choices=list(STACKS), default="deployed",
                    help="the fleet every policy runs on (planner/replay/run.py STACKS): "
                         "deployed (SGLang batched prefill behind the PDCluster's router as "
                         "rendered: by default smg, cache-aware, with derived admission), ideal-router (the same engines behind predicted-TTFT "
                         "routing with early rejection, a what-if) or article (the earlier "
                         "figures' model: one prefill at a time)")
    ap.add_argument("--smg-admission", type=int, default=None, metavar="PER_INSTANCE",
                    help="the PDCluster's router is smg with prefill admission "
                         "(router.admission.prefillInflightPerWorker = PER_INSTANCE, the queue "
                         "timeout at the TTFT target), replayed as smg applies it (the rows "
                         "published before admission was derived)")
    ap.add_argument("--old-default", action="store_true",
                    help="the earlier default router: sglang-router 0.3.2 (router.gateway "
                         "SGLangRouter; random PD prefill choice), no admission")
    ap.add_argument("--start-from", choices=list(START_FROM), default="history",
                    help="history: the trace's first warm-up is unscored history that sizes the "
                         "dynamic policies' start (as pdscale replay); hindsight: sized from the "
                         "scored window's first warm-up; running: every policy runs the first "
                         "warm-up on the fleet, unscored (default: history)")
    ap.add_argument("--scrape-lag-seconds", type=float, default=0.0, metavar="S",
                    help="the planner reads Prometheus S seconds after its last scrape of the "
                         "engines (every 5 s): 0 reads right after it (default); a live tick "
                         "falls 2.5 s after it on average (SimConfig.scrape_lag_seconds)")
    ap.add_argument("--load-percentiles", default=None, metavar="P,P",
                    help="also run pdscale at each spec.planner.loadPercentile (rows "
                         "pdscale@pP): the trade curve beside the default's row")
    ap.add_argument("--planner", default=None, metavar="FIELD=VALUE,...",
                    help="a what-if: these PlannerConfig fields replaced for every policy that "
                         "plans (e.g. stabilization_window_seconds=60,scale_down_hysteresis=false,"
                         "max_prefill=16); values are read as JSON, else as strings")
    ap.add_argument("--no-matched", dest="matched", action="store_false",
                    help="skip the baselines re-run at pdscale's GPU-hours")
    ap.add_argument("--nodes-per-instance", default="1,1", metavar="P,D",
                    help="prefill and decode nodes per instance (LeaderWorkerSet groups), with "
                         "the shipped profile of that shape; the budget counts nodes, GPU-hours "
                         "are per node (default 1,1)")
    args = ap.parse_args()
    what_if = planner_what_if(args.planner) if args.planner else {}
    shape = tuple(int(x) for x in args.nodes_per_instance.split(","))
    if len(shape) != 2 or min(shape) < 1:
        ap.error("--nodes-per-instance: two integers >= 1, prefill,decode")
    nodes_per_instance = (shape[0], shape[1])
    profile = shape_profile(nodes_per_instance)
    if (args.smg_admission is not None or args.old_default) and args.stack != "deployed":
        ap.error("--smg-admission and --old-default are the deployed stack's router; the what-if "
                 "stacks have their own")
    if args.smg_admission is not None and args.old_default:
        ap.error("--smg-admission and --old-default name two routers; take one")
    console = Console(width=170)
    spec = read_spec(str(PDCLUSTER))
    if nodes_per_instance != (1, 1):
        spec = with_shape(spec, nodes_per_instance)
    if args.old_default:
        spec = spec.model_copy(update={"router": spec.router.model_copy(update={
            "gateway": SGLangGateway.SGLANG_ROUTER, "admission": None})})
    results: dict[str, Any] = {}
    for name in args.only.split(","):
        c = cases()[name]
        if "steady_rps" in c:
            trace = synthesize_from_rates([(0.0, c["steady_rps"]), (c["seconds"], 0.0)],
                                          read_mooncake(MOONCAKE), name="steady-12rps", seed=3)
        elif "shape" in c:
            trace = synthetic_trace(c["shape"], c["base_rps"], load_trace(c["lengths"]), seed=3)
        elif "day" in c:
            trace = one_day(c)
        else:
            trace = load_trace(c["path"], rate_scale=c["rate_scale"], time_scale=c["time_scale"],
                               lengths_from=c.get("lengths"))
        case_spec = spec
        if args.smg_admission is not None:
            # as published: the queue timeout at the TTFT target in whole seconds, the rule
            # before the derivation (which takes the engine's share off it)
            case_spec = spec.model_copy(update={"router": spec.router.model_copy(update={
                "gateway": SGLangGateway.SMG,
                "admission": RouterAdmission(prefill_inflight_per_worker=args.smg_admission,
                                             queue_timeout_seconds=max(1, int(c["ttft"])))})})
        configured = configure(case_spec, spec_source=f"file {PDCLUSTER.name}",
                               overrides={"--slo-ttft": c["ttft"], "--nodes": args.nodes},
                               profile=profile, profile_source="--nodes-per-instance")
        if what_if:
            configured = replace(configured, config=replace(configured.config, **what_if))
        # the deployed stack routes as the PDCluster renders its router; what-ifs their own way
        deployed = args.stack == "deployed"
        stack = {**STACKS[args.stack], **(routing(configured.spec) if deployed else {})}
        # a what-if stack's router sends each prefill where it is served soonest: one pool
        planner = configured.config if deployed else replace(configured.config, prefill_queue="pooled")
        setup = ReplaySetup(trace=trace, planner=planner, **stack,
                            decode_admission=args.decode_admission,
                            prefill_admission=router_admission(configured.spec) if deployed else None,
                            scrape_lag_seconds=args.scrape_lag_seconds)
        setup, history = start_from(setup, args.start_from)
        console.print(f"[bold]{name}[/bold]: {trace.name}, {len(setup.trace):,} requests scored over "
                      f"{setup.trace.duration_seconds / 3600:.2f} h, rate x{c['rate_scale']:g}, "
                      f"time /{c['time_scale']:g}, TTFT SLO {c['ttft']} s"
                      + (f", after {len(history)} interval(s) of history" if history else ""))
        reps = {}
        policies = args.policies.split(",") if args.policies else c.get("policies", POLICIES)
        curve = [f"pdscale@p{p}" for p in args.load_percentiles.split(",")] if args.load_percentiles else []
        for pol in [*policies, *curve]:
            t = time.perf_counter()
            if pol.startswith("pdscale@p"):
                at = configure(case_spec, spec_source=f"file {PDCLUSTER.name}",
                               overrides={"--slo-ttft": c["ttft"], "--nodes": args.nodes,
                                          "--load-percentile": int(pol.removeprefix("pdscale@p"))},
                               profile=profile, profile_source="--nodes-per-instance")
                at_cfg = replace(at.config, **what_if)
                rep = trimmed(run_policy(replace(setup, planner=at_cfg if deployed else replace(
                    at_cfg, prefill_queue="pooled")), "pdscale", history=history),
                    nodes_per_instance)
                rep["policy"] = pol
            else:
                # static:best's search replays the whole trace once per probe (minutes each on
                # a day-long trace): say each probe as it ends
                rep = trimmed(run_policy(setup, pol, history=history, log=lambda m: console.print(
                    f"    {time.strftime('%H:%M:%S')} {m}")), nodes_per_instance)
            reps[pol] = rep
            peak = rep["peak_instances"]
            console.print(f"  {rep['policy']:>22}: attainment {rep['slo_attainment']:.4f}, "
                          f"{rep['gpu_hours']:.1f} GPU-h, peak {peak} instances "
                          f"({rep['peak_nodes']} nodes), "
                          f"role changes {rep['role_changes']} ({time.perf_counter() - t:.0f} s)")
            if pol == "static:best" and peak < MIN_PEAK_INSTANCES:
                console.print(f"  [red]WARNING: static:best needs only {peak} instances "
                              f"(< {MIN_PEAK_INSTANCES}): raise the rate scale[/red]")
        if args.matched and "pdscale" in reps:
            for base in ("reactive", "sla-interp"):
                if base in reps and reps[base]["gpu_hours"] < reps["pdscale"]["gpu_hours"]:
                    rep = matched(setup, base, reps["pdscale"]["gpu_hours"], console, history)
                    reps[rep["policy"]] = rep
        results[name] = {"scale": {k: c[k] for k in ("rate_scale", "time_scale")},
                         "nodes_per_instance": list(nodes_per_instance),
                         "ttft_slo_seconds": c["ttft"], "requests": len(setup.trace), "trace": trace.name,
                         "start_from": args.start_from, "scrape_lag_seconds": args.scrape_lag_seconds,
                         "history_intervals": len(history) if history is not None else 0,
                         "gap_windows_filled": c.get("gap_windows", 0),
                         "configuration": configured.as_json(),
                         "planner_what_if": what_if,
                         "policies": reps}
    shape_title = ("" if nodes_per_instance == (1, 1) else
                   f"instances of {nodes_per_instance[0]} prefill / {nodes_per_instance[1]} decode "
                   f"nodes, GPU-hours per node, ")
    table = Table(title=f"policies side by side, stack {args.stack} ({shape_title}node budget {setup.nodes}, "
                        f"TPOT SLO 50 ms, {setup.engine} prefill, {setup.router} prefill routing, "
                        f"{setup.decode_router} decode routing, "
                        + ("early rejection" if setup.early_rejection
                           else f"smg admission {args.smg_admission} per prefill, queue timeout "
                                "at the TTFT target" if args.smg_admission is not None
                           else "sglang-router 0.3.2, no admission" if args.old_default
                           else "no admission" if setup.prefill_admission is None
                           else f"smg admission derived: {setup.prefill_admission.inflight_per_instance} "
                                f"per prefill, queue timeout {setup.prefill_admission.queue_timeout_seconds:g} s "
                                "(last trace)")
                        + ("" if args.decode_admission == "off"
                           else f", decode admission: {args.decode_admission}")
                        + (f", read {args.scrape_lag_seconds:g} s after a scrape"
                           if args.scrape_lag_seconds else "") + ")")
    pct = f"p{100 * setup.slo.percentile:g}"
    for col in ("trace (scale)", "policy", "attain.", "missed: rej/TTFT/TPOT/both", f"TTFT {pct}",
                f"TPOT {pct}", "GPU-h",
                "vs oracle", "vs static:best", "peak", "peak nodes", "role chg"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        reps = r["policies"]
        oracle = reps.get("oracle", {}).get("gpu_hours")
        best = reps.get("static:best", {}).get("gpu_hours")
        scale = f"{name} x{r['scale']['rate_scale']:g} /t{r['scale']['time_scale']:g}"
        for rep in reps.values():
            table.add_row(
                scale, rep["policy"], f"{rep['slo_attainment']:.4f}",
                "/".join(str(v) for v in rep["misses"].values()),
                str(rep["ttft_at_percentile"]),
                str(rep["tpot_at_percentile"]), f"{rep['gpu_hours']:.1f}",
                f"{rep['gpu_hours'] / oracle:.2f}x" if oracle else "-",
                f"{rep['gpu_hours'] / best:.2f}x" if best else "-",
                str(rep["peak_instances"]), str(rep["peak_nodes"]), str(rep["role_changes"]),
            )
    console.print(table)
    checks = targets(results)
    for c in checks:
        mark = "[green]met[/green]" if c["met"] else "[red]NOT met[/red]"
        console.print(f"  {c['trace']:>9} {c['target']:<58} {c['value']:<40} {mark}")
    OUT.mkdir(exist_ok=True)
    stem = "policy_bench" + ("" if args.stack == "deployed" else f"_{args.stack}") + (
        "" if args.smg_admission is None else "_smg_admission") + (
        "_old_default" if args.old_default else "") + (
        f"_lag{args.scrape_lag_seconds:g}" if args.scrape_lag_seconds else "") + (
        "" if nodes_per_instance == (1, 1) else f"_nodes{nodes_per_instance[0]}-{nodes_per_instance[1]}") + (
        "_what_if" if what_if else "")  # a what-if never overwrites the published rows
    path = OUT / (f"{stem}.json" if args.decode_admission == "off"
                  else f"{stem}_admission_{args.decode_admission}.json")
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(results)
    old["targets"] = [c for c in old.get("targets", []) if c["trace"] not in results] + checks
    path.write_text(json.dumps(old, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
