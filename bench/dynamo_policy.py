"""The real NVIDIA Dynamo 1.6.1 planner as a replay policy (``dynamo``), across a process boundary.

Dynamo pins an older kubernetes client and pydantic than pdscale, so it lives in a virtual
environment of its own (``bench/dynamo/setup_venv.sh``) and runs as a child process
(``bench/dynamo/driver.py``) that speaks JSON lines. This module is pdscale's side: it gives
Dynamo the same knowledge our planner has and applies its decisions in our simulator.

- The profile: our :class:`~pdscale.planner.model.PerformanceModel` converted to the format
  Dynamo's perf model learns from, forward-pass metrics (FPMs), on the grid Dynamo's own
  offline replay sweeps with AI Configurator (``dynamo/replay/planner.py``,
  granularity 8): prefill passes of one request of 100..max_num_batched_tokens tokens, decode
  passes of 1..max_num_seqs requests at contexts 500/2000/4000/8000 tokens. Each pass's wall
  time is our model's (``prefill_seconds``, ``tpot_seconds``).
- Engine limits (``EngineCapabilities``): GPUs per instance, the prefill chunk the simulated
  engines use, the profile's batch cap and KV capacity.
- The configuration (``DynamoSettings``): the same TTFT target, node budget (as a GPU budget)
  and minimum replicas; ``DEFAULTS`` keeps every other knob at Dynamo's default (throughput
  interval 180 s, load-based scaling off, the TPOT target as its mean-ITL target); ``TUNED``
  is configured as its planner guide recommends for bursty traffic (load-based scaling on
  beside the 180 s throughput loop, ITL 0.8 x the TPOT target). Listed in
  docs/dynamo-baseline.md.
- Each tick: what Dynamo's offline replay hands its adapter (the snapshot
  ``ReplayPlannerAdapter.on_tick`` reads): ready (active) workers per role, non-draining =
  ready + warming (as its replay bridge counts), each ready instance's latest forward pass as
  its FPM (the simulator's :class:`~pdscale.planner.replay.simulate.ForwardPass`), and the
  traffic window since its last tick (request count, duration, mean ISL/OSL, KV hit rate).

Its decisions are absolute targets per role (or none: keep), applied by the simulator with the
same warm-up, drain and node budget as every other policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdscale.planner.config import PlannerConfig
from pdscale.planner.model import PerformanceModel
from pdscale.planner.observe import Observation
from pdscale.planner.replay.prefill_batches import ENGINES
from pdscale.planner.replay.run import ReplaySetup, initial_fleet, simulate_fleet, summarize
from pdscale.planner.replay.simulate import ForwardPass

DRIVER = Path(__file__).with_name("dynamo") / "driver.py"
SETUP_SCRIPT = Path(__file__).with_name("dynamo") / "setup_venv.sh"
#: where bench/dynamo/setup_venv.sh puts it by default (PDSCALE_CACHE, as the control plane)
DEFAULT_VENV = Path(os.environ.get("PDSCALE_CACHE") or Path.home() / ".cache" / "pdscale") / "dynamo-venv"
#: the grid of Dynamo's own AIC bootstrap sweep (dynamo/replay/planner.py)
FPM_GRANULARITY = 8
DECODE_CONTEXTS_TOKENS = (500, 2000, 4000, 8000)
#: the first prefill length of that sweep
PREFILL_MIN_TOKENS = 100


class DynamoDriverError(RuntimeError):
    """The Dynamo driver failed or answered out of protocol; the message says what it said."""


def venv_python(venv: Path | None = None) -> Path:
    """The Dynamo venv's interpreter (``PDSCALE_DYNAMO_VENV`` or the default); raises naming
    the setup script when it is missing."""
    root = Path(venv or os.environ.get("PDSCALE_DYNAMO_VENV") or DEFAULT_VENV)
    python = root / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(
            f"no Dynamo virtual environment at {root} (looked for {python}); create it with "
            f"{SETUP_SCRIPT}")
    return python


# -- the profile, in Dynamo's format ------------------------------------------------------------


def fpm(wall_seconds: float, **scheduled: int) -> dict[str, Any]:
    """One forward-pass metric as Dynamo's ``ForwardPassMetrics`` serialises (msgspec)."""
    return {"version": 1, "worker_id": "profile", "dp_rank": 0, "wall_time": wall_seconds,
            "scheduled_requests": dict(scheduled), "queued_requests": {}}


def benchmark_fpms(model: PerformanceModel, prefill_chunk_tokens: int,
                   granularity: int = FPM_GRANULARITY) -> dict[str, list[dict[str, Any]]]:
    """Our profile as the benchmark FPMs Dynamo bootstraps its perf model from.

    Prefill: one request of ``n`` uncached tokens per pass, ``n`` from 100 to the chunk;
    decode: ``b`` requests at context ``c`` per pass, stopping where ``b * c`` exceeds the KV
    capacity. Wall times are our model's, so Dynamo plans with what our planner knows."""
    if prefill_chunk_tokens < PREFILL_MIN_TOKENS:
        raise ValueError(f"prefill_chunk_tokens must be >= {PREFILL_MIN_TOKENS}, got {prefill_chunk_tokens}")
    step = max(1, (prefill_chunk_tokens - PREFILL_MIN_TOKENS) // granularity)
    prefill = [fpm(model.prefill_seconds(n), num_prefill_requests=1, sum_prefill_tokens=n)
               for n in range(PREFILL_MIN_TOKENS, prefill_chunk_tokens + 1, step)]
    d = model.profile.decode
    decode = []
    for context in DECODE_CONTEXTS_TOKENS:
        for batch in range(1, d.max_batch + 1, max(1, d.max_batch // granularity)):
            if batch * context > d.kv_capacity_tokens:
                break
            decode.append(fpm(model.tpot_seconds(batch, context), num_decode_requests=batch,
                              sum_decode_kv_tokens=batch * context))
    return {"prefill": prefill, "decode": decode}


def capabilities(model: PerformanceModel, prefill_chunk_tokens: int) -> dict[str, dict[str, int]]:
    """Per-role engine limits (Dynamo's ``EngineCapabilities``) from the profile."""
    p = model.profile
    common = {"num_gpu": p.gpus_per_instance, "max_num_batched_tokens": prefill_chunk_tokens,
              "max_num_seqs": p.decode.max_batch}
    return {"prefill": {**common, "max_kv_tokens": p.prefill.prefix_cache_tokens},
            "decode": {**common, "max_kv_tokens": p.decode.kv_capacity_tokens}}


#: Dynamo 1.6.1's default throughput interval (``SLAPlannerDefaults``), which its docs ask to be
#: long enough for a scaling to complete before the next is issued
DYNAMO_THROUGHPUT_INTERVAL_SECONDS = 180
#: the tuned run's mean-ITL target as a share of the p99 TPOT target: Dynamo sizes decode so
#: that a step at the planned batch takes ``itl_ms`` (a mean), our SLO bounds the p99 of each
#: request's TPOT; 0.8 (ITL 40 ms for TPOT 50 ms) is our margin, not a Dynamo figure
TUNED_ITL_SHARE = 0.8


@dataclass(frozen=True)
class DynamoSettings:
    """How Dynamo is configured: ``name`` is the policy's row.

    ``throughput_interval_seconds``: its throughput (predictive) loop; None = Dynamo's default
    (180 s). ``load_scaling``: its load-based (FPM-driven, reactive) loop, off by default for
    the SLA target. ``itl_share``: the ``itl_ms`` target as a share of our TPOT target."""

    name: str
    throughput_interval_seconds: int | None = None
    load_scaling: bool = False
    itl_share: float = 1.0


#: Dynamo as documented defaults: the SLA target, our SLO passed as is, every knob its default
DEFAULTS = DynamoSettings("dynamo")
#: Dynamo as its planner guide recommends for bursty traffic: both loops (throughput a floor,
#: load-based for bursts, the throughput interval the longer), and a mean-ITL target with a
#: margin under our p99 TPOT
TUNED = DynamoSettings("dynamo:tuned", load_scaling=True, itl_share=TUNED_ITL_SHARE)


def settings_for(policy: str) -> DynamoSettings:
    """``dynamo`` (documented defaults), ``dynamo:tuned``, or ``dynamo@Ns`` (defaults with a
    throughput interval of N whole seconds, a what-if)."""
    if policy == DEFAULTS.name:
        return DEFAULTS
    if policy == TUNED.name:
        return TUNED
    if policy.startswith("dynamo@") and policy.endswith("s"):
        return DynamoSettings(policy, int(policy.removeprefix("dynamo@").removesuffix("s")))
    raise ValueError(f"unknown Dynamo policy {policy!r}: dynamo, dynamo:tuned or dynamo@<seconds>s")


def dynamo_config(config: PlannerConfig, settings: DynamoSettings = DEFAULTS) -> dict[str, Any]:
    """The PlannerConfig fields we set; everything else keeps Dynamo's default.

    Its pipeline ticks at our interval (the replay calls a controller once an interval), which
    is also its load loop's interval (FPM tuning and, when on, load-based scaling; Dynamo's
    default is 5 s); its throughput loop every ``settings.throughput_interval_seconds``."""
    interval = round(config.interval_seconds)
    if interval <= 0 or abs(interval - config.interval_seconds) > 1e-9:
        raise ValueError(f"Dynamo takes whole-second intervals, got {config.interval_seconds}")
    throughput = settings.throughput_interval_seconds or DYNAMO_THROUGHPUT_INTERVAL_SECONDS
    if throughput % interval:
        raise ValueError(f"Dynamo's throughput interval ({throughput} s) must be a multiple of "
                         f"its tick cadence, our interval ({interval} s)")
    if settings.load_scaling and throughput <= interval:
        raise ValueError(f"with load-based scaling, Dynamo's throughput interval ({throughput} s) "
                         f"must be longer than its load interval, our interval ({interval} s)")
    gpus = config.model.profile.gpus_per_instance
    return {
        "environment": "virtual",  # no cluster: decisions come back to us
        "mode": "disagg",
        "backend": "sglang",
        "optimization_target": "sla",  # the SLA planner: sizes from the perf model and targets
        "ttft_ms": 1000.0 * config.slo.ttft_seconds,
        "itl_ms": 1000.0 * config.slo.tpot_seconds * settings.itl_share,
        "throughput_adjustment_interval_seconds": throughput,
        "load_adjustment_interval_seconds": interval,
        "enable_load_scaling": settings.load_scaling,
        "scheduling": {"scale_interval_seconds": float(interval)},
        "max_gpu_budget": config.nodes * gpus,
        "prefill_engine_num_gpu": gpus,
        "decode_engine_num_gpu": gpus,
        "prefill_min_endpoint": max(1, config.min_prefill),
        "decode_min_endpoint": max(1, config.min_decode),
        # no listening sockets from a replay
        "control_api_port": 0,
        "live_dashboard_port": 0,
        "metric_reporting_prometheus_port": 0,
    }


# -- observations, in Dynamo's format -----------------------------------------------------------


@dataclass
class TrafficWindow:
    """Traffic accumulated since Dynamo's last tick, merged as its replay merges windows:
    counts and durations summed, lengths and hit rate weighted by requests."""

    duration_seconds: float = 0.0
    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    hit_weighted: float = 0.0
    hit_requests: float = 0.0

    def add(self, obs: Observation, span_seconds: float) -> None:
        """Count the interval ``obs`` closes; an interval whose load is unknown (the first, or
        a failed reading) adds nothing, as a scrape that failed would."""
        now = obs.now_seconds
        rate = obs.rate_rps.fresh(now, span_seconds) if obs.rate_rps else None
        if rate is None:
            return
        n = rate * span_seconds
        self.duration_seconds += span_seconds
        self.requests += n
        isl = obs.mean_input_tokens.fresh(now, span_seconds) if obs.mean_input_tokens else None
        osl = obs.mean_output_tokens.fresh(now, span_seconds) if obs.mean_output_tokens else None
        if n > 0 and isl is not None and osl is not None:
            self.input_tokens += isl * n
            self.output_tokens += osl * n
        hit = obs.prefix_hit_rate.fresh(now, span_seconds) if obs.prefix_hit_rate else None
        if n > 0 and hit is not None:
            self.hit_weighted += hit * n
            self.hit_requests += n

    def as_traffic(self) -> dict[str, Any] | None:
        """The ``traffic`` of a replay snapshot, or None when nothing was measured."""
        if self.duration_seconds <= 0:
            return None
        shaped = self.requests if self.input_tokens > 0 else 0.0
        return {
            "duration_s": self.duration_seconds,
            "num_req": self.requests,
            "shape_count": shaped,
            "avg_isl": self.input_tokens / shaped if shaped else 0.0,
            "avg_osl": self.output_tokens / shaped if shaped else 0.0,
            "hit_rate_count": self.hit_requests,
            "avg_kv_hit_rate": self.hit_weighted / self.hit_requests if self.hit_requests else 0.0,
            # Dynamo 1.6.1 reads mean TTFT/ITL only for its diagnostics report; our
            # observations carry quantiles, not means, so none is sent
            "ttft_count": 0,
            "itl_count": 0,
        }


def fpm_snapshot(p: ForwardPass) -> dict[str, Any]:
    """One replay pass as Dynamo's replay bridge hands it to ``ReplayPlannerAdapter.on_tick``
    (a flat record per worker, ``fpm_snapshots_to_json``; the adapter builds the
    ``ForwardPassMetrics`` from it). Variances are not tracked by the replay: 0."""
    return {"worker_id": p.instance, "dp_rank": 0, "wall_time": p.wall_seconds,
            "num_prefill_requests": p.prefill_requests, "sum_prefill_tokens": p.prefill_tokens,
            "var_prefill_length": 0.0, "sum_prefill_kv_tokens": p.prefill_kv_tokens,
            "num_decode_requests": p.decode_requests, "sum_decode_kv_tokens": p.decode_kv_tokens,
            "var_decode_kv_tokens": 0.0,
            "num_queued_prefill": p.queued_prefill_requests,
            "sum_queued_prefill_tokens": p.queued_prefill_tokens, "var_queued_prefill_length": 0.0,
            "num_queued_decode": p.queued_decode_requests,
            "sum_queued_decode_kv_tokens": p.queued_decode_kv_tokens,
            "var_queued_decode_kv_tokens": 0.0}


def snapshot(obs: Observation, rel_seconds: float, traffic: dict[str, Any] | None,
             ordinal: int, passes: Sequence[ForwardPass] | None = None) -> dict[str, Any]:
    """What Dynamo's offline replay passes ``ReplayPlannerAdapter.on_tick`` for tick number
    ``ordinal``: active workers are the ready ones, warming ones its "starting" workers and
    draining ones its "draining" ones; the non-draining count is active + starting, as its
    replay bridge counts it. ``passes``: each ready instance's latest forward pass, sent as its
    FPM snapshot, the active ids then the instances' own (None: ids are positions, no FPMs)."""
    p, d = obs.prefill, obs.decode
    fpms: dict[str, list[ForwardPass]] = {"prefill": [], "decode": []}
    for fp in passes or ():
        fpms[fp.role].append(fp)
    # ids for workers without a pass: above every instance id, distinct within the snapshot
    ids = iter(range(1 + max((fp.instance for fp in passes or ()), default=-1), 10**9))

    def take(n: int) -> list[int]:
        return [next(ids) for _ in range(n)]

    if passes is None:
        active_p, active_d = take(p.ready), take(d.ready)
    else:
        active_p = [fp.instance for fp in fpms["prefill"]]
        active_d = [fp.instance for fp in fpms["decode"]]
    starting_p, starting_d = take(len(p.warming)), take(len(d.warming))
    snap: dict[str, Any] = {
        "tick_ordinal": ordinal,
        "now_ms": 1000.0 * rel_seconds,
        "active_prefill_count": len(active_p), "active_decode_count": len(active_d),
        "non_draining_prefill_count": len(active_p) + len(starting_p),
        "non_draining_decode_count": len(active_d) + len(starting_d),
        "active_prefill_ids": active_p, "active_decode_ids": active_d,
        "starting_prefill_ids": starting_p, "starting_decode_ids": starting_d,
        "draining_prefill_ids": take(p.draining), "draining_decode_ids": take(d.draining),
        "prefill_fpm_snapshots": [fpm_snapshot(fp) for fp in fpms["prefill"]],
        "decode_fpm_snapshots": [fpm_snapshot(fp) for fp in fpms["decode"]],
    }
    if traffic is not None:
        snap["traffic"] = traffic
    return snap


# -- the process boundary ---------------------------------------------------------------------


class DriverClient:
    """A running driver: one JSON line out, one JSON line back."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None) -> None:
        # read back only to explain a failure; closed in close()
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        # the driver's own temp dir, removed in close(): Dynamo writes a logging config
        # (tmp*.json) there at every import and never removes it
        self.scratch = tempfile.TemporaryDirectory(prefix="pdscale-dynamo-")
        env = {**(os.environ if env is None else env), "TMPDIR": self.scratch.name}
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env,
                                     # a neutral folder: nothing of a checkout importable, and
                                     # any report Dynamo writes lands in the scratch dir
                                     cwd=self.scratch.name)

    @classmethod
    def start(cls, venv: Path | None = None) -> DriverClient:
        """The real driver in the Dynamo venv, with none of pdscale's paths in its way."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONSAFEPATH"] = "1"
        return cls([str(venv_python(venv)), str(DRIVER)], env)

    def request(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise DynamoDriverError(f"driver exited before {message['type']!r}: {self.stderr_tail()}") from None
        line = self.proc.stdout.readline()
        if not line:
            raise DynamoDriverError(f"driver closed its output after {message['type']!r}: {self.stderr_tail()}")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise DynamoDriverError(f"driver answered {message['type']!r} with a non-JSON line: {line[:200]!r}") from None
        if answer.get("type") == "error":
            raise DynamoDriverError(f"driver failed on {message['type']!r}: {answer.get('message')}\n"
                                    f"driver stderr: {self.stderr_tail()}")
        if answer.get("type") != expect:
            raise DynamoDriverError(f"driver answered {message['type']!r} with {answer.get('type')!r}, expected {expect!r}")
        return answer

    def stderr_tail(self, chars: int = 2000) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-chars:] or "(no stderr)"

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(DynamoDriverError):  # it may have died already: we stop it below
                self.request({"type": "finalize"}, "bye")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        self.scratch.cleanup()


@dataclass
class DynamoController:
    """Dynamo's planner as a replay controller ``Observation -> (prefill, decode)``.

    Our simulator calls every ``interval_seconds``; Dynamo is ticked when its own schedule
    (``next_tick_seconds``, from the start of the replay) is due, with the traffic of every
    interval since its previous tick. A target it leaves unset keeps the last one."""

    client: DriverClient
    interval_seconds: float
    first_tick_seconds: float
    origin_seconds: float | None = None
    window: TrafficWindow = field(default_factory=TrafficWindow)
    targets: tuple[int, int] | None = None
    log: list[dict[str, Any]] = field(default_factory=list)
    #: each ready instance's latest forward pass at this tick (the simulator hands them over
    #: before calling); None: none seen, the snapshot carries no FPMs
    passes: list[ForwardPass] | None = None

    def see_forward_passes(self, now_seconds: float, passes: list[ForwardPass]) -> None:
        """The simulator's per-pass metrics for the tick at ``now_seconds`` (sent to Dynamo
        with it, as its engines publish them on a deployment)."""
        self.passes = list(passes)

    def __call__(self, obs: Observation) -> tuple[int, int]:
        if self.origin_seconds is None:
            self.origin_seconds = obs.now_seconds
        if self.targets is None:
            self.targets = (obs.prefill.committed, obs.decode.committed)
        rel = obs.now_seconds - self.origin_seconds
        self.window.add(obs, self.interval_seconds)
        # 1 ms of slack: the simulator's clock and Dynamo's tick times are both sums of floats
        if self.first_tick_seconds is None or rel + 1e-3 < self.first_tick_seconds:
            return self.targets
        answer = self.client.request(
            {"type": "tick", "snapshot": snapshot(obs, rel, self.window.as_traffic(), len(self.log),
                                                  self.passes)},
            "decision")
        self.window = TrafficWindow()
        p, d = self.targets
        p = p if answer["target_prefill"] is None else int(answer["target_prefill"])
        d = d if answer["target_decode"] is None else int(answer["target_decode"])
        self.targets = (p, d)
        self.first_tick_seconds = answer["next_tick_seconds"]
        self.log.append({"t": round(rel, 1), "prefill": p, "decode": d,
                         **{k: v for k, v in answer.get("diagnostics", {}).items() if v is not None}})
        return self.targets


def start_session(setup: ReplaySetup, client: DriverClient, settings: DynamoSettings = DEFAULTS
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send the init message for ``setup``; returns (what was sent, the driver's ready reply)."""
    chunk = setup.prefill_chunk_tokens or ENGINES[setup.engine]
    if chunk is None:
        raise ValueError(f"the {setup.engine!r} engine has no prefill chunk; Dynamo needs max_num_batched_tokens")
    init = {"type": "init", "planner_config": dynamo_config(setup.planner, settings),
            "capabilities": capabilities(setup.model, chunk),
            "benchmark_fpms": benchmark_fpms(setup.model, chunk)}
    return init, client.request(init, "ready")


def run_dynamo(setup: ReplaySetup, *, venv: Path | None = None, client: DriverClient | None = None,
               settings: DynamoSettings = DEFAULTS,
               history: list[Any] | None = None) -> dict[str, Any]:
    """Replay ``setup.trace`` under Dynamo's planner: the report ``run_policy`` gives, plus the
    inputs Dynamo got and its decisions with their reasons. ``history``: the loads before the
    trace (``run.with_history``), which size its start fleet as they size ours."""
    started = time.perf_counter()
    client = client or DriverClient.start(venv)
    try:
        init, ready = start_session(setup, client, settings)
        ctl = DynamoController(client, setup.interval_seconds, ready["first_tick_seconds"])
        start = initial_fleet(setup, history)
        result = simulate_fleet(setup, start, ctl, None)
    finally:
        client.close()
    report = summarize(setup, settings.name, result)
    report["wall_seconds"] = round(time.perf_counter() - started, 2)
    report["initial_fleet"] = {"prefill": start[0], "decode": start[1]}
    report["dynamo"] = {
        "config_sent": init["planner_config"], "capabilities": init["capabilities"],
        "benchmark_fpms": {k: len(v) for k, v in init["benchmark_fpms"].items()},
        "planner_config": ready.get("planner_config"), "perf_model": ready.get("perf_model"),
        "ticks": ctl.log,
    }
    return report
