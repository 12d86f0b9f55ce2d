"""The HTTP simulated engines behind the real router against the replay, on one recording.

Issue 15's fidelity check. For each case (a FIXED fleet and a load), the harness

1. plans the load with the load generator (``testbed/loadgen.py``: Poisson arrivals, prompt
   and output lengths drawn around their means, prompts opening with one of a few shared
   prefixes),
2. sends it, time-compressed, through the real sglang-router 0.3.2 in PD mode with the
   policies a PDCluster renders by default (``--prefill-policy cache_aware
   --decode-policy round_robin``, operator/render/router.py) to simulated SGLang engines
   (``testbed/simengine``) timed by ``--profile`` and started by the loop tests' harness
   (``tests/loop/loop_harness.py``), and records what the client saw,
3. writes that recording as a Mooncake trace (``testbed/demo_replay.trace_rows``: arrival =
   when the client sent it, on the model's clock) and replays it with
   ``planner/replay/simulate.py`` on the same profile and fixed fleet, the deployed stack's
   engine model ("sglang") with the same chunk size and routers (the gateway's CacheAware as
   it really picks: at random for sglang-router 0.3.2, smg's own tree rule for smg;
   round-robin decode), no early rejection and no decode admission,
4. compares attainment under the case's SLO, TTFT and TPOT p50/p90 and the prefix hit rate,
5. and replays the recording once more on the instances the live routers chose ("routed as
   live"): each engine logs the prompts it takes (``--request-log``, matched by
   ``wire.prompt_key``), and the replay's ``SimConfig.recorded_routes`` replaces both of its
   routers' choices. A random router's draw is one of many; with the live draw, what is left
   is the engines' model and the HTTP path.

Everything is in model seconds: the live latencies are multiplied back by the time
compression. Prints a table, writes out/engine_fidelity.json (or ``--out``), progress on
stderr. Run (one live measurement at a time; about a minute per case on two cores):

    PYTHONSAFEPATH=1 PYTHONPATH=... .venv/bin/python bench/engine_fidelity.py [--only 2p2d]

The targets (issue 15): attainment within 2 pp, each latency quantile within 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import load_profile
from pdscale.planner.replay.run import STACKS
from pdscale.planner.replay.simulate import SimConfig, SimResult, simulate
from pdscale.planner.replay.traces import Trace, read_mooncake
from pdscale.testbed.demo_replay import trace_rows, write_jsonl
from pdscale.testbed.loadgen import (
    Phase,
    RequestRecord,
    RequestSpec,
    percentile,
    plan_requests,
    request_body,
    run_load,
)
from pdscale.testbed.simengine.wire import prompt_key, prompt_tokens

HERE = Path(__file__).parent
OUT = HERE.parent / "out" / "engine_fidelity.json"
#: the fidelity targets of issue 15
ATTAINMENT_TOLERANCE_PP = 2.0
LATENCY_TOLERANCE = 0.10
QUANTILES = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
#: the replay's routers other than the deployed stack's, replayed beside it
OTHER_ROUTERS = ("random", "least-queue", "cache-aware", "smg-cache-aware")
#: the replay's prefill router for each gateway's rendered CacheAware (operator/render/router.py
#: prefill_choice: sglang-router 0.3.2 picks PD prefills at random; smg follows its own tree)
GATEWAY_ROUTER = {"sglang-router": "random", "smg": "smg-cache-aware"}
#: random routing replayed with this many seeds (its spread is reported)
RANDOM_SEEDS = 20
#: the API the load is sent in (and its prompts read back from the engines' request logs)
API = "chat"


@dataclass(frozen=True)
class Case:
    """A fixed fleet, the load sent to it and the SLO its attainment is scored against."""

    name: str
    prefill: int
    decode: int
    phase: Phase
    #: model seconds; chosen so that attainment is well inside (0, 1) on this load
    slo_ttft_seconds: float
    slo_tpot_seconds: float
    seed: int = 1


#: demo-sim's instance (planner/profiles/demo-sim.yaml): 250 prompt tokens/s, TPOT 10 ms +
#: 20 ms per running sequence. 300-token prompts, 70% of them one of 4 shared prefixes (3
#: whole 64-token blocks), 20 output tokens.
CASES = (
    # enough of both roles: short prefill queues, decode batches of 1-3
    Case("2p2d", 2, 2, Phase("chat", 100.0, 1.8, 300, 20, 0.7), 1.0, 0.04),
    # one prefill for the same load (about 110% busy): its queue grows over the run
    Case("1p2d-short", 1, 2, Phase("chat", 100.0, 1.8, 300, 20, 0.7), 8.0, 0.1),
)


# -------------------------------------------------------------------- live
def loop_harness() -> ModuleType:
    """The loop tests' process harness (tests/loop is not a package): one way to start
    simulated engines and the real router, not two."""
    path = HERE.parent / "tests" / "loop" / "loop_harness.py"
    spec = importlib.util.spec_from_file_location("loop_harness", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("loop_harness")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["loop_harness"] = module
        spec.loader.exec_module(module)
    return module


def engine_args(profile_name: str, *, compression: float, chunk_tokens: int) -> list[str]:
    """The simulated engine's flags for ``profile_name``: its timing, and the cache, batch
    and memory the replay reads from the same profile."""
    prof = load_profile(profile_name)
    return ["--profile", profile_name, "--time-compression", f"{compression:g}",
            "--block-tokens", str(prof.prefill.block_tokens),
            "--prefix-cache-tokens", str(prof.prefill.prefix_cache_tokens),
            "--chunked-prefill-size", str(chunk_tokens),
            "--max-running-requests", str(prof.decode.max_batch),
            "--max-total-tokens", str(prof.decode.kv_capacity_tokens)]  # fmt: skip


@dataclass
class Live:
    """What the client saw (model seconds) and what the prefill engines counted."""

    records: list[RequestRecord]
    prompt_tokens: float
    cached_tokens: float
    #: requests each prefill engine finished (the router's split)
    per_prefill: list[float]
    #: request index -> (prefill, decode) engine it went to, positions in the fleet's lists
    #: (from the engines' request logs; a request an engine never saw is missing)
    routes: dict[int, tuple[int, int]] = field(default_factory=dict)


def run_live(case: Case, specs: list[RequestSpec], *, profile: str, compression: float,
             chunk_tokens: int, workdir: Path, gateway: str = "sglang-router",
             log: Callable[[str], object] = print) -> Live:
    """Send ``specs`` through the real router (``gateway``: sglang-router, what a PDCluster
    runs by default, or smg) to a fixed fleet of simulated engines."""
    h = loop_harness()
    net = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
    fleet = h.Fleet(workdir, net)
    extra = engine_args(profile, compression=compression, chunk_tokens=chunk_tokens)
    logs = {role: [workdir / f"requests-{role}-{k}.jsonl" for k in range(n)]
            for role, n in (("prefill", case.prefill), ("decode", case.decode))}
    try:
        prefill = [fleet.start_engine("prefill", *extra, "--request-log", str(f)) for f in logs["prefill"]]
        decode = [fleet.start_engine("decode", *extra, "--request-log", str(f)) for f in logs["decode"]]
        # the policies a PDCluster renders by default (operator/render/router.py); it sets no
        # --policy, whose default is cache_aware (the harness's round_robin is overridden)
        fleet.start_router(prefill, decode, "--policy", "cache_aware",
                           "--prefill-policy", "cache_aware", "--decode-policy", "round_robin",
                           gateway=gateway)  # fmt: skip
        wall_specs = [replace(s, at_seconds=s.at_seconds / compression) for s in specs]
        log(f"{case.name}: {len(specs)} requests over {specs[-1].at_seconds:.0f} model s "
            f"({specs[-1].at_seconds / compression:.0f} wall s), {case.prefill}P{case.decode}D")
        records = asyncio.run(run_load(fleet.router_url, wall_specs, api=API,
                                       timeout_seconds=600.0))  # fmt: skip
        prompt = sum(e.metric("sglang:prompt_tokens_total") for e in prefill)
        cached = sum(e.metric("sglang:cached_tokens_total") for e in prefill)
        per_prefill = [e.metric("sglang:num_requests_total") for e in prefill]
    finally:
        fleet.close()

    def model(v: float | None) -> float | None:
        return None if v is None else v * compression

    scaled = [replace(r, sent_seconds=r.sent_seconds * compression, ttft_seconds=model(r.ttft_seconds),
                      tpot_seconds=model(r.tpot_seconds), e2e_seconds=model(r.e2e_seconds))
              for r in records]  # fmt: skip
    return Live(scaled, prompt, cached, per_prefill, served_by(specs, logs["prefill"], logs["decode"]))


def served_by(specs: list[RequestSpec], prefill_logs: list[Path],
              decode_logs: list[Path]) -> dict[int, tuple[int, int]]:
    """Request index -> (prefill, decode) position that served it, from the engines' request
    logs (one file per engine, in fleet order), matched by the prompt's digest; requests
    both roles saw, whose prompt no other request shares."""
    key: dict[str, int | None] = {}
    for s in specs:
        k = prompt_key(prompt_tokens(request_body(API, s, "sim-model")[1]))
        key[k] = None if k in key else s.index  # a prompt sent twice cannot be told apart
    seen: list[dict[int, int]] = [{}, {}]
    for side, files in enumerate((prefill_logs, decode_logs)):
        for k, f in enumerate(files):
            if not f.exists():  # an engine that took no request writes nothing
                continue
            for line in f.read_text().splitlines():
                index = key.get(json.loads(line)["prompt"])
                if index is not None:
                    seen[side][index] = k
    return {i: (k, seen[1][i]) for i, k in seen[0].items() if i in seen[1]}


def trace_routes(records: list[RequestRecord], routes: dict[int, tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The routes in the recorded trace's order (:func:`trace_rows`: by send time, then
    index), -1 where an engine never saw the request (the replay's router picks there)."""
    ordered = sorted(records, key=lambda r: (r.sent_seconds, r.index))
    return tuple(routes.get(r.index, (-1, -1)) for r in ordered)


# -------------------------------------------------------------------- replay
def recorded_trace(specs: list[RequestSpec], records: list[RequestRecord], *, block_tokens: int,
                   path: Path) -> Trace:
    """The recording as the Mooncake trace ``pdscale replay --trace`` reads (the demo's
    writer), read back with the profile's block size."""
    write_jsonl(path, trace_rows(specs, records, block_tokens=block_tokens))
    return read_mooncake(path, block_tokens=block_tokens)


def replay(case: Case, trace: Trace, *, profile: str, chunk_tokens: int,
           router: str | None = None, model: PerformanceModel | None = None,
           seed: int = 1, routes: tuple[tuple[int, int], ...] | None = None) -> SimResult:
    """The same recording through the replay: the deployed stack (its prefill and decode
    routers, as a PDCluster renders them by default) on the case's fixed fleet. ``router``
    replaces the prefill router (how much of a difference is the routing's); ``model`` the
    profile's (a control that must miss the targets); ``routes`` both routers' choices by
    the live ones (what is left is the engines')."""
    model = model or PerformanceModel(load_profile(profile))
    deployed = STACKS["deployed"]
    config = SimConfig(router=router or deployed["router"],
                       decode_router=deployed["decode_router"],
                       early_rejection=False, engine="sglang",
                       prefill_chunk_tokens=chunk_tokens, slo=slo(case),
                       initial_prefill=case.prefill, initial_decode=case.decode,
                       decode_admission="off", start_ready=True, seed=seed,
                       recorded_routes=routes)  # fmt: skip
    return simulate(trace, model, config)


def slo(case: Case) -> Slo:
    return Slo(ttft_seconds=case.slo_ttft_seconds, tpot_seconds=case.slo_tpot_seconds)


# -------------------------------------------------------------------- comparison (pure)
def live_figures(case: Case, live: Live) -> dict[str, Any]:
    """Attainment (a failed request is a miss), quantiles over the served requests, hit rate."""
    ok = [r for r in live.records if r.ok]
    ttft = [r.ttft_seconds for r in ok if r.ttft_seconds is not None]
    tpot = [r.tpot_seconds for r in ok if r.tpot_seconds is not None]
    met = sum(1 for r in ok if r.ttft_seconds is not None and r.ttft_seconds <= case.slo_ttft_seconds
              and (r.tpot_seconds is None or r.tpot_seconds <= case.slo_tpot_seconds))
    return {
        "requests": len(live.records), "failed": len(live.records) - len(ok),
        "attainment": met / len(live.records) if live.records else None,
        "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90),
        "prefix_hit_rate": live.cached_tokens / live.prompt_tokens if live.prompt_tokens else None,
        "requests_per_prefill": live.per_prefill,
    }  # fmt: skip


def replay_figures(case: Case, result: SimResult, output_tokens: list[int]) -> dict[str, Any]:
    """The same figures from the replay (a request of one output token has no TPOT, as the
    client measures it)."""
    served = ~result.rejected
    ttft = [float(v) for v, s in zip(result.ttft_seconds, served, strict=True) if s]
    tpot = [float(v) for v, s, n in zip(result.tpot_seconds, served, output_tokens, strict=True)
            if s and n > 1]  # fmt: skip
    return {
        "requests": len(result.arrival_seconds), "failed": int(result.rejected.sum()),
        "attainment": result.attainment(slo(case)),
        "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90),
        "prefix_hit_rate": result.hit_tokens / result.prompt_tokens if result.prompt_tokens else None,
    }  # fmt: skip


def compare(live: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """Each difference (replay - live), and whether it is within the target."""
    out: dict[str, Any] = {}
    if live["attainment"] is not None:
        pp = 100.0 * (replayed["attainment"] - live["attainment"])
        out["attainment_pp"] = {"difference": pp, "within": abs(pp) <= ATTAINMENT_TOLERANCE_PP}
    for q in QUANTILES:
        if live[q] and replayed[q] is not None:
            rel = replayed[q] / live[q] - 1.0
            out[q] = {"difference": rel, "within": abs(rel) <= LATENCY_TOLERANCE}
    if live["prefix_hit_rate"] is not None and replayed["prefix_hit_rate"] is not None:
        out["prefix_hit_rate_pp"] = {
            "difference": 100.0 * (replayed["prefix_hit_rate"] - live["prefix_hit_rate"])}
    return out


def run_case(case: Case, *, profile: str, compression: float, chunk_tokens: int,
             workdir: Path, recording: Path, gateway: str = "sglang-router",
             log: Callable[[str], object] = print) -> dict[str, Any]:
    """One case, live then replayed; the report's entry for it. The recording (trace.jsonl,
    requests.jsonl: what the client saw, model seconds) goes under ``recording``; the
    processes' logs under ``workdir``."""
    specs = plan_requests([case.phase], seed=case.seed)
    block = load_profile(profile).prefill.block_tokens
    started = time.monotonic()
    live = run_live(case, specs, profile=profile, compression=compression,
                    chunk_tokens=chunk_tokens, workdir=workdir, gateway=gateway, log=log)
    wall = time.monotonic() - started
    trace = recorded_trace(specs, live.records, block_tokens=block, path=recording / "trace.jsonl")
    write_jsonl(recording / "requests.jsonl", (asdict(r) for r in sorted(live.records, key=lambda r: r.index)))
    result = replay(case, trace, profile=profile, chunk_tokens=chunk_tokens,
                    router=GATEWAY_ROUTER[gateway])
    live_f = live_figures(case, live)
    replay_f = replay_figures(case, result, trace.output_tokens)
    # the first request finds every instance idle in both: what is left is the HTTP path
    # (router, bootstrap handshake, streaming), in model seconds
    first = min(live.records, key=lambda r: (r.sent_seconds, r.index))
    if first.ttft_seconds is not None:
        live_f["first_request_ttft_over_replay"] = first.ttft_seconds - float(result.ttft_seconds[0])
    # the replay under its other routers: the spread is what the routing model alone moves
    by_router = {}
    for router in OTHER_ROUTERS:
        other = replay(case, trace, profile=profile, chunk_tokens=chunk_tokens, router=router)
        by_router[router] = replay_figures(case, other, trace.output_tokens)
    # random routing is one draw of many: its spread over seeds is what chance alone moves
    draws = [replay_figures(case, replay(case, trace, profile=profile, chunk_tokens=chunk_tokens,
                                         router="random", seed=seed), trace.output_tokens)
             for seed in range(1, RANDOM_SEEDS + 1)]  # fmt: skip
    spread = {k: sorted(d[k] for d in draws) for k in ("attainment", *QUANTILES)}
    by_router["random"]["over_seeds"] = {
        k: {"min": v[0], "median": v[len(v) // 2], "max": v[-1]} for k, v in spread.items()}
    # every request on the instances the live routers chose: the engines' model alone
    routes = trace_routes(live.records, live.routes)
    routed = replay_figures(case, replay(case, trace, profile=profile, chunk_tokens=chunk_tokens,
                                         routes=routes), trace.output_tokens)
    routed["requests_routed_as_live"] = sum(1 for p, _ in routes if p >= 0)
    return {
        "case": asdict(case), "gateway": gateway, "profile": profile,
        "time_compression": compression,
        "chunk_tokens": chunk_tokens, "live_wall_seconds": wall,
        "live": live_f, "replay": replay_f, "difference": compare(live_f, replay_f),
        "replay_by_router": by_router,
        "replay_routed_as_live": routed, "difference_routed_as_live": compare(live_f, routed),
    }


# -------------------------------------------------------------------- output
def table(reports: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    t = Table(title="engine fidelity: HTTP sim engines behind the real router vs the replay "
                    "(model seconds; difference = replay vs live)")  # fmt: skip
    for col in ("case", "measure", "live", "replay", "difference", "target"):
        t.add_column(col, justify="left" if col in ("case", "measure") else "right")
    for rep in reports:
        live, rp, diff = rep["live"], rep["replay"], rep["difference"]
        name = f"{rep.get('run', rep['case']['name'])} ({rep['gateway']})"
        _measured_rows(t, name, f"attainment (TTFT <= {rep['case']['slo_ttft_seconds']:g} s, TPOT "
                       f"<= {rep['case']['slo_tpot_seconds']:g} s)", live, rp, diff)
        routed = rep.get("replay_routed_as_live")
        if routed:
            _measured_rows(t, "", f"routed as live ({routed['requests_routed_as_live']} of "
                           f"{routed['requests']}): attainment", live, routed,
                           rep["difference_routed_as_live"], prefix="routed as live: ")
        h = diff.get("prefix_hit_rate_pp")
        t.add_row("", "prefix hit rate", _p(live["prefix_hit_rate"]), _p(rp["prefix_hit_rate"]),
                  f"{h['difference']:+.1f} pp" if h else "-", "")
        gap = live.get("first_request_ttft_over_replay")
        if gap is not None:
            t.add_row("", "first request's TTFT over the replay's (HTTP path)",
                      f"{gap * 1000:.0f} ms", "", "", "")
        t.add_row("", "requests / failed", f"{live['requests']} / {live['failed']}",
                  f"{rp['requests']} / {rp['failed']}", "", "")
        for router, other in rep["replay_by_router"].items():
            t.add_row("", f"replay with {router}: attainment, TTFT p50 / p90", "",
                      f"{other['attainment']:.1%}, {_s(other['ttft_p50'])} / {_s(other['ttft_p90'])}",
                      "", "")
            seeds = other.get("over_seeds")
            if seeds:
                t.add_row("", f"  over {RANDOM_SEEDS} seeds (min-max)", "",
                          f"{seeds['attainment']['min']:.1%}-{seeds['attainment']['max']:.1%}, "
                          f"{seeds['ttft_p50']['min']:.2f}-{seeds['ttft_p50']['max']:.2f} / "
                          f"{seeds['ttft_p90']['min']:.2f}-{seeds['ttft_p90']['max']:.2f} s", "", "")
    return t


def _measured_rows(t: Any, name: str, attainment: str, live: dict[str, Any], rp: dict[str, Any],
                   diff: dict[str, Any], prefix: str = "") -> None:
    """Attainment and the latency quantiles, live against a replay, with the targets."""
    a = diff.get("attainment_pp")
    t.add_row(name, attainment, f"{live['attainment']:.1%}", f"{rp['attainment']:.1%}",
              f"{a['difference']:+.1f} pp" if a else "-",
              ("met" if a and a["within"] else "NOT met") + " (2 pp)")
    for q in QUANTILES:
        d = diff.get(q)
        t.add_row("", prefix + q, _s(live[q]), _s(rp[q]), f"{d['difference']:+.1%}" if d else "-",
                  ("met" if d and d["within"] else "NOT met") + " (10%)")


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated case names (default: all): "
                   + ", ".join(c.name for c in CASES))  # fmt: skip
    p.add_argument("--profile", default="demo-sim")
    p.add_argument("--time-compression", type=float, default=4.0,
                   help="model seconds per wall second of the live run (default 4)")
    p.add_argument("--chunk-tokens", type=int, default=8192,
                   help="prefill pass budget, the engines' --chunked-prefill-size and the replay's")
    p.add_argument("--gateway", choices=("sglang-router", "smg"), default="sglang-router",
                   help="the router program (router.gateway; default: a PDCluster's default)")
    p.add_argument("--repeat", type=int, default=1,
                   help="live runs per case (the same load): how much a live figure moves alone")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    err = Console(stderr=True)
    chosen = [c for c in CASES if args.only is None or c.name in args.only.split(",")]
    reports = []
    for case in chosen:
        for k in range(args.repeat):
            run = case.name if args.repeat == 1 else f"{case.name}-{k + 1}"
            with tempfile.TemporaryDirectory(prefix=f"fidelity-{run}-") as tmp:
                reports.append(run_case(case, profile=args.profile,
                                        compression=args.time_compression,
                                        chunk_tokens=args.chunk_tokens, workdir=Path(tmp),
                                        recording=args.out.with_suffix("") / run,
                                        gateway=args.gateway, log=err.print))  # fmt: skip
            reports[-1]["run"] = run
    Console(width=150).print(table(reports))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(reports, indent=1))
    err.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
