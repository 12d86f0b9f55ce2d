"""A bounded load generator for the router: open-loop arrivals, streamed responses, and per
request TTFT, TPOT, status and error.

Prompts are words (the simulated engines count one word as one token), built so that a known
share of each prompt is a prefix shared with other requests of the same phase: the engines'
prefix caches then see real hits. The seed's three phases (chat, long documents, agents; see
docs/domain.md) are available scaled down in tokens and rate, so a run takes seconds.

A request counts as failed unless it got HTTP 200, streamed exactly the requested number of
tokens and ended with ``[DONE]``: the simulated engines always generate the full length, so a
short stream is a dropped request, not a shorter answer.

Loopback only: the target URL must be a 127.0.0.0/8 address; or, run in a pod (``--in-cluster``,
the kind tier), a cluster Service's name (``<service>.<namespace>.svc[.cluster.local]``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector


@dataclass(frozen=True)
class Phase:
    """A stretch of steady load. Lengths are means; each request draws around them."""

    name: str
    duration_seconds: float
    rate_rps: float
    mean_input_tokens: int
    mean_output_tokens: int
    #: share of each prompt that is a prefix shared with other requests of this phase
    prefix_share: float = 0.0


#: docs/domain.md's worked example, at full size (use :func:`scale_phases` to run it here)
SEED_PHASES = (
    Phase("chat", 600.0, 100.0, 2_000, 500, 0.6),
    Phase("long-documents", 600.0, 30.0, 16_000, 300, 0.2),
    Phase("agents", 600.0, 25.0, 6_000, 2_000, 0.8),
)


def scale_phases(
    phases: Iterable[Phase], *, token_scale: float, rate_scale: float, duration_seconds: float
) -> tuple[Phase, ...]:
    """Shrink lengths by ``token_scale`` and rates by ``rate_scale``; fix each duration."""
    return tuple(
        replace(
            p,
            duration_seconds=duration_seconds,
            rate_rps=p.rate_rps * rate_scale,
            mean_input_tokens=max(1, round(p.mean_input_tokens * token_scale)),
            mean_output_tokens=max(1, round(p.mean_output_tokens * token_scale)),
        )
        for p in phases
    )


@dataclass(frozen=True)
class RequestSpec:
    index: int
    phase: str
    #: when to send, seconds after the run starts
    at_seconds: float
    input_tokens: int
    output_tokens: int
    prompt: str
    #: the shared prefix this prompt starts with ("<phase>/<k>"), None when it shares none: a
    #: recording of the load names it so that a replay sees the same cache hits
    prefix_group: str | None = None
    #: leading tokens of the prompt taken from that shared prefix
    shared_prefix_tokens: int = 0
    #: a name for the requests a test reads together, sent as ``metadata.cohort`` (OpenAI's
    #: metadata map, chat and completions; the SGLang router passes it on, its ``user`` field
    #: it drops), None for none: the simulated engines count their modelled TPOT per cohort
    cohort: str | None = None


def draw_length(rng: random.Random, mean: int, spread: float = 0.5) -> int:
    """Uniform in mean * [1 - spread, 1 + spread], at least 1."""
    return max(1, round(mean * rng.uniform(1.0 - spread, 1.0 + spread)))


def make_prompt(rng: random.Random, n_tokens: int, shared_prefix: Sequence[str], share: float) -> str:
    """``n_tokens`` words whose first ``round(share * n_tokens)`` come from ``shared_prefix``
    (as far as it reaches) and the rest are unique to this request."""
    n_shared = min(round(share * n_tokens), len(shared_prefix))
    unique = [f"u{rng.getrandbits(40):x}" for _ in range(n_tokens - n_shared)]
    return " ".join([*shared_prefix[:n_shared], *unique])


def plan_requests(
    phases: Sequence[Phase],
    *,
    seed: int = 0,
    max_requests: int = 10_000,
    prefixes_per_phase: int = 4,
    spread: float = 0.5,
) -> list[RequestSpec]:
    """Poisson arrivals per phase, back to back, capped at ``max_requests``. Pure."""
    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    start = 0.0
    for phase in phases:
        longest = math.ceil(phase.mean_input_tokens * (1 + spread))
        # a small pool of shared prefixes per phase (system prompts, documents, agent context)
        pool = [
            [f"{phase.name[:1]}{k}p{i}" for i in range(longest)] for k in range(prefixes_per_phase)
        ]
        t = start
        while phase.rate_rps > 0 and len(specs) < max_requests:
            t += rng.expovariate(phase.rate_rps)
            if t >= start + phase.duration_seconds:
                break
            n_in = draw_length(rng, phase.mean_input_tokens, spread)
            n_out = draw_length(rng, phase.mean_output_tokens, spread)
            k = rng.randrange(len(pool))  # draws as rng.choice(pool) did: same seed, same load
            prompt = make_prompt(rng, n_in, pool[k], phase.prefix_share)
            n_shared = min(round(phase.prefix_share * n_in), len(pool[k]))
            specs.append(RequestSpec(len(specs), phase.name, t, n_in, n_out, prompt,
                                     f"{phase.name}/{k}" if n_shared else None, n_shared))
        start += phase.duration_seconds
    return specs


@dataclass(frozen=True)
class RequestRecord:
    index: int
    phase: str
    #: seconds after the run start when the request was sent
    sent_seconds: float
    input_tokens: int
    output_tokens_expected: int
    output_tokens: int
    status: int | None
    ttft_seconds: float | None
    #: mean time per output token after the first
    tpot_seconds: float | None
    e2e_seconds: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def request_body(api: str, spec: RequestSpec, model: str) -> tuple[str, dict]:
    """Path and JSON body for one request in the chosen API; always streaming."""
    if api == "generate":
        return "/generate", {
            "text": spec.prompt,
            "sampling_params": {"max_new_tokens": spec.output_tokens, "ignore_eos": True},
            "stream": True,
        }
    cohort = {} if spec.cohort is None else {"metadata": {"cohort": spec.cohort}}
    if api == "completions":
        return "/v1/completions", {
            "model": model, "prompt": spec.prompt, "max_tokens": spec.output_tokens,
            "stream": True, **cohort,
        }  # fmt: skip
    return "/v1/chat/completions", {
        "model": model,
        "messages": [{"role": "user", "content": spec.prompt}],
        "max_tokens": spec.output_tokens,
        "stream": True,
        **cohort,
    }


def tokens_in_chunk(api: str, chunk: dict, seen: int) -> int:
    """New output tokens carried by one streamed chunk (``seen`` so far, for cumulative APIs)."""
    if api == "generate":
        # SGLang streams cumulative text; meta_info carries the running count
        return max(int((chunk.get("meta_info") or {}).get("completion_tokens", seen)) - seen, 0)
    choices = chunk.get("choices") or []
    if not choices:
        return 0
    text = choices[0].get("delta", {}).get("content") if api == "chat" else choices[0].get("text")
    return len(text.split()) if text else 0


async def send_one(
    session: ClientSession, base_url: str, api: str, spec: RequestSpec, model: str,
    run_start: float, timeout_seconds: float,
) -> RequestRecord:  # fmt: skip
    path, body = request_body(api, spec, model)
    sent = time.monotonic()
    status: int | None = None
    stamps: list[float] = []
    tokens, done, error = 0, False, None
    try:
        async with session.post(
            base_url + path, json=body, timeout=ClientTimeout(total=timeout_seconds)
        ) as resp:
            status = resp.status
            if status != 200:
                error = f"http {status}: {(await resp.text())[:200]}"
            else:
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                        break
                    new = tokens_in_chunk(api, chunk, tokens)
                    if new:
                        tokens += new
                        stamps.append(time.monotonic())
    except (ClientError, TimeoutError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    end = time.monotonic()
    if error is None and not done:
        error = "stream ended without [DONE]"
    if error is None and tokens != spec.output_tokens:
        error = f"got {tokens} tokens, expected {spec.output_tokens}"
    ttft = stamps[0] - sent if stamps else None
    tpot = (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 and stamps else None
    return RequestRecord(
        spec.index, spec.phase, sent - run_start, spec.input_tokens, spec.output_tokens, tokens,
        status, ttft, tpot, end - sent, error,
    )  # fmt: skip


def require_loopback(url: str, *, in_cluster: bool = False) -> str:
    """``url`` without its trailing slash, when it is a loopback address, or with
    ``in_cluster`` (the generator runs in a pod) a cluster Service's name; else ValueError."""
    host = urlsplit(url).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    service = in_cluster and host.removesuffix(".cluster.local").endswith(".svc") and host.count(".") >= 2
    if not (loopback or service):
        raise ValueError(f"{url}: the load generator only targets loopback (127.0.0.0/8)"
                         + (" or a cluster Service (<name>.<namespace>.svc)" if in_cluster else ""))
    return url.rstrip("/")


async def run_load(
    base_url: str,
    specs: Sequence[RequestSpec],
    *,
    api: str = "chat",
    model: str = "sim-model",
    max_concurrency: int = 512,
    timeout_seconds: float = 120.0,
    max_seconds: float = 600.0,
    stop: threading.Event | None = None,
    in_cluster: bool = False,
) -> list[RequestRecord]:
    """Send ``specs`` open-loop at their times; at most ``max_concurrency`` in flight (later
    ones wait, and their TTFT includes that wait), nothing sent after ``max_seconds`` or once
    ``stop`` is set (a test ends a phase on a condition, not a clock); what was sent is
    awaited either way."""
    base_url = require_loopback(base_url, in_cluster=in_cluster)
    gate = asyncio.Semaphore(max_concurrency)
    async with ClientSession(connector=TCPConnector(limit=0)) as session:
        start = time.monotonic()
        stopped = asyncio.Event()

        async def watch() -> None:  # the thread's event, seen by this loop within 0.2 s
            while stop is not None and not stop.is_set():
                await asyncio.sleep(0.2)
            stopped.set()

        async def one(spec: RequestSpec) -> RequestRecord | None:
            delay = max(spec.at_seconds - (time.monotonic() - start), 0.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), delay)  # wakes early once stopped
            if time.monotonic() - start > max_seconds or stopped.is_set():
                return None
            async with gate:
                return await send_one(session, base_url, api, spec, model, start, timeout_seconds)

        watcher = asyncio.create_task(watch()) if stop is not None else None
        try:
            results = await asyncio.gather(*(one(s) for s in specs))
        finally:
            if watcher is not None:
                watcher.cancel()
    return [r for r in results if r is not None]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summarize(records: Iterable[RequestRecord]) -> dict:
    """Counts, failures and TTFT/TPOT quantiles (seconds) of a run. Pure."""
    records = list(records)
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_seconds for r in ok if r.ttft_seconds is not None]
    tpot = [r.tpot_seconds for r in ok if r.tpot_seconds is not None]
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            kind = r.error.split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    return {
        "requests": len(records),
        "failed": len(records) - len(ok),
        "errors": errors,
        "ttft_p50_seconds": percentile(ttft, 50),
        "ttft_p90_seconds": percentile(ttft, 90),
        "ttft_p99_seconds": percentile(ttft, 99),
        "ttft_mean_seconds": statistics.fmean(ttft) if ttft else None,
        "tpot_p50_seconds": percentile(tpot, 50),
        "tpot_p90_seconds": percentile(tpot, 90),
    }


def _watch_stop_file(path: str) -> threading.Event:
    """An event set once ``path`` exists (polled by a daemon thread)."""
    stop = threading.Event()

    def poll() -> None:
        while not os.path.exists(path):
            time.sleep(0.5)
        stop.set()

    threading.Thread(target=poll, daemon=True).start()
    return stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdscale.testbed.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--url", required=True, help="router base URL (loopback)")
    p.add_argument("--api", choices=("chat", "completions", "generate"), default="chat")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--token-scale", type=float, default=0.05, help="shrink the seed's lengths")
    p.add_argument("--rate-scale", type=float, default=0.1, help="shrink the seed's rates")
    p.add_argument("--phase-seconds", type=float, default=10.0)
    p.add_argument("--phases", default="chat,long-documents,agents")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=5_000)
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--max-concurrency", type=int, default=512)
    p.add_argument("--out", help="write one JSON record per request to this file")
    p.add_argument("--stop-file", help="send nothing more once this file exists (a test ends "
                   "the load when its steps are done), then await what was sent")
    p.add_argument("--in-cluster", action="store_true",
                   help="running in a pod: --url may name a cluster Service (<name>.<ns>.svc)")
    args = p.parse_args(argv)
    wanted = args.phases.split(",")
    chosen = [ph for name in wanted for ph in SEED_PHASES if ph.name == name]
    if len(chosen) != len(wanted):
        p.error(f"--phases: known phases are {[ph.name for ph in SEED_PHASES]}")
    phases = scale_phases(chosen, token_scale=args.token_scale, rate_scale=args.rate_scale,
                          duration_seconds=args.phase_seconds)  # fmt: skip
    specs = plan_requests(phases, seed=args.seed, max_requests=args.max_requests)
    stop = _watch_stop_file(args.stop_file) if args.stop_file else None
    try:
        records = asyncio.run(run_load(
            args.url, specs, api=args.api, model=args.model,
            max_concurrency=args.max_concurrency, max_seconds=args.max_seconds,
            stop=stop, in_cluster=args.in_cluster,
        ))  # fmt: skip
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            for r in records:
                f.write(json.dumps(asdict(r)) + "\n")
    for phase in phases:
        print(phase.name, json.dumps(summarize(r for r in records if r.phase == phase.name)))
    total = summarize(records)
    print("total", json.dumps(total))
    return 0 if total["failed"] == 0 else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
