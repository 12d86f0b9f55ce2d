"""The engine as a process: its command line, and serving until a drain lets it exit."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from pdscale.planner.observe import Role
from pdscale.planner.profile import instance_batch_cap

from .config import EngineConfig
from .engine import DIALECTS, SimEngine
from .timing import LinearTiming, TimingModel, planner_timing
from .tokenizer import write_word_tokenizer
from .wire import is_loopback

log = logging.getLogger("pdscale.testbed.simengine")


class _DropHttp2Probe(logging.Filter):
    """The router opens each worker with an HTTP/2 prior-knowledge probe (gRPC detection);
    aiohttp refuses it and logs a traceback per worker. The refusal is the intended answer."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


async def serve(engine: SimEngine, *, on_ready: Callable[[], None] | None = None) -> int:
    """Run ``engine`` until SIGTERM/SIGINT (then drain) or a drain with exit; returns exit code."""
    await engine.start()
    runners = [web.AppRunner(engine.app(), access_log=None)]
    sites = [(engine.config.host, engine.config.port)]
    if engine.role == Role.PREFILL and engine.config.bootstrap_port:
        runners.append(web.AppRunner(engine.bootstrap_app(), access_log=None))
        sites.append((engine.config.host, engine.config.bootstrap_port))
    for runner, (host, port) in zip(runners, sites, strict=True):
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=1024).start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, functools.partial(engine.begin_drain, exit_when_done=True))
    if on_ready:
        on_ready()
    await engine.exit_requested.wait()
    drained = await engine.wait_idle(engine.config.drain_timeout_seconds)
    log.info("exiting: drained=%s inflight=%d", drained, engine.inflight())
    for runner in reversed(runners):
        await runner.cleanup()
    await engine.close()
    return 0 if drained else 3


def add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("timing (model seconds; see LinearTiming)")
    group.add_argument("--profile", help="use the planner's performance model for this profile "
                       "(shipped name or YAML path) instead of the linear model below")  # fmt: skip
    for f in dataclasses.fields(LinearTiming):
        group.add_argument("--" + f.name.replace("_", "-"), type=float, default=f.default)


def timing_from_args(args: argparse.Namespace) -> TimingModel:
    if args.profile:
        return planner_timing(args.profile)
    return LinearTiming(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LinearTiming)})


def build_parser() -> argparse.ArgumentParser:
    description = sys.modules[__package__].__doc__
    p = argparse.ArgumentParser(prog="python -m pdscale.testbed.simengine", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--role", choices=[r.value for r in Role], required=True)
    p.add_argument("--dialect", choices=DIALECTS, default="sglang",
                   help="speak SGLang's API and metric names (default), or vLLM's (PD via "
                   "vllm-router with kv_transfer_params, vllm: metrics, no /get_load)")  # fmt: skip
    p.add_argument("--host", required=True, help="a 127.0.0.0/8 address")
    p.add_argument("--pod-network", action="store_true",
                   help="the process runs in a pod's own network namespace (the kind tier's "
                   "serving image): --host may be any of the pod's addresses, 0.0.0.0 too")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-port", type=int, default=8998,
                   help="prefill only (the vllm dialect's KV side channel too)")  # fmt: skip
    p.add_argument("--model-name", default="sim-model")
    p.add_argument("--time-compression", type=float, default=1.0)
    p.add_argument("--prefix-cache-tokens", type=int, default=1_000_000)
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--chunked-prefill-size", type=int, default=8192, dest="prefill_chunk_tokens",
                   help="prefill pass budget in tokens (vLLM: --max-num-batched-tokens)")
    p.add_argument("--waiting-timeout-seconds", type=float, default=300.0)
    p.add_argument("--bootstrap-timeout-seconds", type=float, default=300.0)
    p.add_argument("--startup-seconds", type=float, default=0.0)
    p.add_argument("--ready-at", type=float, default=None, dest="ready_at_unix_seconds",
                   help="warm until this Unix time instead (overrides --startup-seconds)")
    p.add_argument("--drain-timeout-seconds", type=float, default=600.0)
    p.add_argument("--model-path", help="directory reported to the router as model_path; a "
                   "word-level tokenizer.json is written there so the router loads it locally "
                   "instead of asking the Hugging Face hub (default: --model-name, and the "
                   "router tries the hub)")  # fmt: skip
    p.add_argument("--decode-log-interval", type=int, default=40,
                   help="SGLang: a decode refreshes its gauges every this many decode steps")
    p.add_argument("--idle-log-interval-seconds", type=float, default=30.0,
                   help="SGLang: an idle engine refreshes its gauges this often")
    for name in ("time-to-first-token", "inter-token-latency", "e2e-request-latency"):
        p.add_argument(f"--bucket-{name}", type=float, nargs="+", default=None,
                       help="histogram buckets in seconds, as SGLang's flag of that name "
                       "(default: the dialect's upstream buckets)")  # fmt: skip
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="decode KV memory in tokens: requests wait in the prealloc queue "
                   "until theirs fits (default unlimited)")  # fmt: skip
    p.add_argument("--kv-lease-seconds", type=float, default=30.0,
                   help="vllm dialect: a prefill keeps a finished request's KV pinned this "
                   "long for its decode to pull")  # fmt: skip
    p.add_argument("--request-log", default=None,
                   help="append one JSON line per request taken (prompt digest, rid, role, "
                        "port): which instance served it (the harness's; no engine has it)")
    p.add_argument("--log-level", default="INFO")
    add_timing_arguments(p)
    return p


#: engine server flags the sim honours as they are (SGLang's, and vLLM's renamed), with how
#: many values each takes (None: one or more)
_ENGINE_FLAGS: dict[str, tuple[str, int | None]] = {
    "--bucket-time-to-first-token": ("--bucket-time-to-first-token", None),
    "--bucket-inter-token-latency": ("--bucket-inter-token-latency", None),
    "--bucket-e2e-request-latency": ("--bucket-e2e-request-latency", None),
    "--decode-log-interval": ("--decode-log-interval", 1),
    "--max-running-requests": ("--max-running-requests", 1),
    "--max-total-tokens": ("--max-total-tokens", 1),
    "--max-num-seqs": ("--max-running-requests", 1),  # vLLM's name for the batch cap
    "--chunked-prefill-size": ("--chunked-prefill-size", 1),
    "--max-num-batched-tokens": ("--chunked-prefill-size", 1),  # vLLM's name for the budget
}


#: the engines' data-parallel size flags (SGLang, vLLM), as the operator renders them
_DP_FLAGS = ("--dp-size", "--data-parallel-size")


def _flag_value(container_args: list[str], names: tuple[str, ...]) -> str | None:
    """The last value of any of ``names`` in ``container_args`` (``--flag v`` or ``--flag=v``)."""
    found = None
    for i, arg in enumerate(container_args):
        name, eq, inline = arg.partition("=")
        if name in names:
            found = inline if eq else (container_args[i + 1] if i + 1 < len(container_args) else None)
    return found


def engine_flags(container_args: list[str]) -> list[str]:
    """The sim's flags for the engine server flags in a pod's ``container_args`` that change
    what the sim reports (buckets, log interval, batch and memory caps); others are dropped.
    Pure; ``--flag=value`` and ``--flag value...`` both read. A batch cap becomes the
    instance's, over its DP ranks, as the engine applies it."""
    dp = int(_flag_value(container_args, _DP_FLAGS) or 1)
    out: list[str] = []
    i = 0
    while i < len(container_args):
        name, eq, inline = container_args[i].partition("=")
        i += 1
        if name not in _ENGINE_FLAGS:
            continue
        flag, arity = _ENGINE_FLAGS[name]
        values = [inline] if eq else []
        while not eq and i < len(container_args) and not container_args[i].startswith("--"):
            values.append(container_args[i])
            i += 1
        if arity == 1:
            values = values[:1]
        if eq and arity is None:
            values = inline.replace(",", " ").split()  # one value holding the list
        if values and name in ("--max-running-requests", "--max-num-seqs"):
            values = [str(instance_batch_cap(name, int(values[0]), dp))]
        if values:
            out += [flag, *values]
    return out


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        role=args.role, host=args.host, port=args.port,
        bootstrap_port=args.bootstrap_port if args.role == Role.PREFILL else None,
        model_name=args.model_name, time_compression=args.time_compression,
        prefix_cache_tokens=args.prefix_cache_tokens, block_tokens=args.block_tokens,
        max_running_requests=args.max_running_requests,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        waiting_timeout_seconds=args.waiting_timeout_seconds,
        bootstrap_timeout_seconds=args.bootstrap_timeout_seconds,
        startup_seconds=args.startup_seconds, ready_at_unix_seconds=args.ready_at_unix_seconds,
        drain_timeout_seconds=args.drain_timeout_seconds,
        model_path=args.model_path, dialect=args.dialect,
        decode_log_interval=args.decode_log_interval,
        idle_log_interval_seconds=args.idle_log_interval_seconds,
        bucket_time_to_first_token=_buckets(args.bucket_time_to_first_token),
        bucket_inter_token_latency=_buckets(args.bucket_inter_token_latency),
        bucket_e2e_request_latency=_buckets(args.bucket_e2e_request_latency),
        max_total_tokens=args.max_total_tokens, kv_lease_seconds=args.kv_lease_seconds,
        request_log=args.request_log, pod_network=args.pod_network,
    )  # fmt: skip


def _buckets(values: list[float] | None) -> tuple[float, ...] | None:
    return tuple(sorted(values)) if values else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not is_loopback(args.host) and not args.pod_network:
        print(f"--host {args.host} is not a loopback address (and no --pod-network); refusing",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_DropHttp2Probe())
    config, timing = config_from_args(args), timing_from_args(args)
    if config.model_path:
        write_word_tokenizer(config.model_path)

    def ready() -> None:
        print(f"simengine ready role={args.role} url=http://{args.host}:{args.port}", flush=True)

    return asyncio.run(serve(SimEngine(config, timing), on_ready=ready))
