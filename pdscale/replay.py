"""Replay a recorded trace through a scaling policy on a simulated PD fleet.

The planner runs the configuration the operator would run for a PDCluster: ``-f FILE`` names
the PDCluster, and its SLOs, percentile, interval, warm-ups, decode drain, instance bounds,
node budget, scale-down window and profile become the planner's configuration through the
operator's own mapping (``operator/loop/planning.py: planner_config``). Without ``-f`` the spec is
the CRD's defaults. Flags override single fields; the output lists every field with its value
and where it came from (flag, file or default). Router, early rejection and decode admission
are the simulated fleet's, not the planner's.

Prints a summary table and optionally writes the full report as JSON and a plot of load,
prefill and decode counts and SLO attainment per interval. Examples:

    pdscale replay -f examples/demo-sim.yaml --trace conversation_trace.jsonl --policy pdscale
    pdscale replay --trace conversation_trace.jsonl --rate-scale 5 --policy pdscale --slo-ttft 15
    pdscale replay --trace m-mid_rate.csv --lengths conversation_trace.jsonl --policy oracle
    pdscale replay --trace conversation_trace.jsonl --policy pdscale --fleet-speed prefill=0.8

``--fleet-profile`` and ``--fleet-speed`` make the simulated fleet differ from the profile the
planner plans with (a model-error what-if, docs/replay.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdscale.replay_setup import Configured, fleet_setup, spec_replicas

if TYPE_CHECKING:
    from pdscale.operator.api.pdcluster import PDClusterSpec
    from pdscale.planner.config import PlannerConfig
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import Profile


def _milliseconds(seconds: float) -> int:
    """The spec counts the SLO targets in integer milliseconds; the flags keep seconds."""
    ms = round(seconds * 1000.0)
    if abs(ms - seconds * 1000.0) > 1e-6:
        raise ValueError(f"must be a whole number of milliseconds, got {seconds!r} s")
    return ms


def _sigmas(text: str) -> tuple[float, ...]:
    """``--length-sigmas``: comma-separated non-negative numbers."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers such as 0.5,1.0, got {text!r}") from None
    if not values or any(not 0.0 <= v < 10.0 for v in values):
        raise argparse.ArgumentTypeError(f"each spread must be in [0, 10), got {text!r}")
    return values


@dataclass(frozen=True)
class SpecFlag:
    """A flag that overrides PDCluster spec fields for the replay."""

    flag: str
    #: (spec section, field) pairs it sets, snake_case as in operator/api/pdcluster.py
    fields: tuple[tuple[str, str], ...]
    #: flag value -> the field's value in the spec's units
    to_spec: Callable[[Any], Any]
    type: Callable[[str], Any]
    help: str


SPEC_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag("--slo-ttft", (("slo", "ttft_milliseconds"),), _milliseconds, float,
             "TTFT target, seconds (spec.slo.ttftMilliseconds)"),
    SpecFlag("--slo-tpot", (("slo", "tpot_milliseconds"),), _milliseconds, float,
             "TPOT target, seconds (spec.slo.tpotMilliseconds)"),
    SpecFlag("--percentile", (("slo", "percentile"),), int, int,
             "share of requests, in percent, that must meet both targets (spec.slo.percentile)"),
    SpecFlag("--nodes", (("planner", "node_budget"),), int, int,
             "node budget, 8xH200 nodes (spec.planner.nodeBudget)"),
    SpecFlag("--interval", (("planner", "interval_seconds"),), int, int,
             "planning interval, seconds (spec.planner.intervalSeconds)"),
    SpecFlag("--stabilization-window", (("planner", "stabilization_window_seconds"),), int, int,
             "scale-down window, seconds (spec.planner.stabilizationWindowSeconds)"),
    SpecFlag("--warmup", (("prefill", "warmup_seconds"), ("decode", "warmup_seconds")), int, int,
             "seconds from instance start to serving, both roles (spec.*.warmupSeconds)"),
    SpecFlag("--decode-drain", (("decode", "pre_stop_drain_seconds"),), int, int,
             "seconds a removed decode instance drains (spec.decode.preStopDrainSeconds)"),
    SpecFlag("--load-percentile", (("planner", "load_percentile"),), int, int,
             "percentile of the load one lead ahead capacity is sized and released for, 0-99 "
             "(spec.planner.loadPercentile)"),
    SpecFlag("--min-prefill", (("prefill", "min_replicas"),), int, int, "spec.prefill.minReplicas"),
    SpecFlag("--max-prefill", (("prefill", "max_replicas"),), int, int, "spec.prefill.maxReplicas"),
    SpecFlag("--min-decode", (("decode", "min_replicas"),), int, int, "spec.decode.minReplicas"),
    SpecFlag("--max-decode", (("decode", "max_replicas"),), int, int, "spec.decode.maxReplicas"),
)


class ConfigurationError(ValueError):
    """A spec field, flag or profile the planner cannot run with; the message names it."""


def _percentiles(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected percentiles such as 0,75,90,95, got {text!r}") from None
    if not values or any(not 0 <= v <= 99 for v in values):
        raise argparse.ArgumentTypeError(f"each percentile must be in [0, 99], got {text!r}")
    return values


def parse_fleet_speed(text: str) -> tuple[float, float]:
    """``--fleet-speed``: ``0.8`` (both roles) or ``prefill=0.8,decode=1.25`` (a role not
    named keeps 1) -> (prefill speed, decode speed), each how many times as fast as the
    profile says. Raises ConfigurationError naming what is wrong."""
    speeds = {"prefill": 1.0, "decode": 1.0}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if len(parts) == 1 and "=" not in parts[0]:
            speeds["prefill"] = speeds["decode"] = float(parts[0])
        else:
            for part in parts:
                role, _, value = part.partition("=")
                if role.strip() not in speeds:
                    raise ConfigurationError(
                        f"--fleet-speed: {role.strip()!r} is not a role (prefill, decode)")
                speeds[role.strip()] = float(value)
    except ValueError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            f"--fleet-speed: expected 0.8 or prefill=0.8,decode=1.25, got {text!r}") from None
    for role, v in speeds.items():
        if not 0.0 < v < float("inf"):
            raise ConfigurationError(f"--fleet-speed: {role} speed must be positive, got {v:g}")
    return speeds["prefill"], speeds["decode"]


def fleet_model(config: PlannerConfig, *, profile_path: str | None = None,
                speed: str | None = None, decode_batch_cap: int | None = None
                ) -> PerformanceModel | None:
    """The simulated fleet's true model for ``--fleet-profile`` / ``--fleet-speed`` (None: the
    fleet is what the planner believes). The speed scales the fleet profile's compute (the
    planner's profile when no file is named). The warm-ups stay the planner's: they are the
    deployment's figures (spec ``warmupSeconds``), and this what-if is about compute; so does
    the engines' ``decode_batch_cap`` (``engines.decode_batch_cap``), an argument they run with."""
    if profile_path is None and speed is None:
        return None
    from pdscale.planner.model import PerformanceModel
    from pdscale.planner.profile import ProfileError, capped_profile, load_profile, scaled_profile

    believed = config.model.profile
    try:
        profile = believed if profile_path is None else load_profile(profile_path).model_copy(
            update={"warmup": believed.warmup})
        if speed is not None:
            prefill_speed, decode_speed = parse_fleet_speed(speed)
            profile = scaled_profile(profile, prefill_speed=prefill_speed, decode_speed=decode_speed)
        profile = capped_profile(profile, decode_batch_cap)
    except ProfileError as exc:
        raise ConfigurationError(f"--fleet-profile: {exc}") from None
    return PerformanceModel(profile)


def read_spec(path: str) -> PDClusterSpec:
    """The one PDCluster in FILE, parsed by the CRD's model (``checklist.parse``: every field's
    type, range and default). The checks that concern the children the operator would create
    (a Prometheus URL to read, grace periods, images) are not the replay's: a spec applied
    with its URL set elsewhere, such as the demo's, replays as it is."""
    from pdscale.operator.api.pdcluster import GROUP, KIND
    from pdscale.operator.render.checklist import SpecError, parse
    from pdscale.spec_file import SpecFileError, read

    try:
        docs = [d for d in read(path) if d.data is not None]
    except (OSError, SpecFileError) as exc:
        raise ConfigurationError(f"{path}: {exc}") from None
    found = [d for d in docs if isinstance(d.data, dict) and d.data.get("kind") == KIND
             and str(d.data.get("apiVersion", "")).startswith(f"{GROUP}/")]
    if len(found) != 1:
        raise ConfigurationError(f"{path}: expected one {KIND} document, found {len(found)}")
    try:
        spec = parse(found[0].data.get("spec"))
    except SpecError as exc:
        raise ConfigurationError(f"{path}: document {found[0].number}: {exc}") from None
    return spec


def default_spec() -> PDClusterSpec:
    """A PDCluster of the CRD's defaults, for a replay without ``-f``. Only the fields the
    planner reads are filled (the model, engine and router it needs no image for)."""
    from pdscale.operator.api.pdcluster import PDClusterSpec

    return PDClusterSpec.model_construct()


def configure(
    spec: PDClusterSpec,
    *,
    spec_source: str,
    overrides: Mapping[str, Any] | None = None,
    profile: Profile | None = None,
    profile_source: str = "",
) -> Configured:
    """The planner's configuration for ``spec`` with ``overrides`` (flag -> value, flags of
    :data:`SPEC_FLAGS`) applied to its fields, through the operator's mapping; ``profile``
    (from ``profile_source``) replaces the spec's ``planner.profile``.

    The overrides change the spec, not the configuration, so that everything the mapping
    derives from a field (the horizon and the scale-down window from the warm-up, the node
    budget from the maxima) follows the flag as it would follow the field. A value the CRD
    refuses is refused here, naming the flag. Raises :class:`ConfigurationError`."""
    import pydantic

    from pdscale.operator.loop.planning import PLANNER_SPEC_FIELDS, planner_config
    from pdscale.operator.render.engines import decode_batch_cap
    from pdscale.planner.profile import ProfileError

    by_flag = {f.flag: f for f in SPEC_FLAGS}
    chosen: dict[tuple[str, str], str] = {}
    values: dict[str, dict[str, Any]] = {}
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        known = by_flag.get(flag)
        if known is None:
            raise ConfigurationError(f"{flag}: not a flag that sets a spec field")
        try:
            converted = known.to_spec(value)
        except ValueError as exc:
            raise ConfigurationError(f"{flag}: {exc}") from None
        for section, name in known.fields:
            chosen[(section, name)] = flag
            values.setdefault(section, getattr(spec, section).model_dump())[name] = converted
    update: dict[str, Any] = {}
    for section, fields in values.items():
        if section in ("prefill", "decode"):
            # the replicas now are no input of the planner; keep them within the new bounds
            fields["replicas"] = min(max(fields["replicas"], fields["min_replicas"]),
                                     fields["max_replicas"])
        try:
            update[section] = type(getattr(spec, section)).model_validate(fields)
        except pydantic.ValidationError as exc:
            flags = sorted({flag for (sec, _), flag in chosen.items() if sec == section})
            reason = "; ".join(e["msg"] for e in exc.errors())
            raise ConfigurationError(f"{', '.join(flags)}: {reason}") from None
    spec = spec.model_copy(update=update)
    try:
        config = planner_config(spec, profile)
    except (ProfileError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None

    rows = []
    for section, name in PLANNER_SPEC_FIELDS:
        part = getattr(spec, section)
        alias = type(part).model_fields[name].alias or name
        if section == "planner" and name == "profile" and profile is not None:
            rows.append((f"{section}.{alias}", profile.name, profile_source))
            continue
        value = getattr(part, name)
        if isinstance(value, list):  # planner.schedules: as written in a spec, for the JSON
            value = [v.model_dump(mode="json", by_alias=True) if hasattr(v, "model_dump") else v
                     for v in value]
        if (section, name) in chosen:
            source = f"flag {chosen[(section, name)]}"
        elif section in spec.model_fields_set and name in part.model_fields_set:
            source = spec_source
        else:
            source = "default"
        rows.append((f"{section}.{alias}", "unset" if value is None else value, source))
    cap = decode_batch_cap(spec)
    if cap is not None:  # read from the engines' extra arguments (planner_config)
        rows.append(("decode batch cap (extraArgs), sequences per instance", str(cap), spec_source))
    return Configured(spec, config, tuple(rows))


#: planner.replay.run.STACKS' names, spelled out so that building the command line imports no
#: numerical library (tests/planner/test_replay_cli.py keeps them equal)
STACK_NAMES = ("deployed", "ideal-router", "article")


def _add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a replay from Prometheus (``--prometheus``) and its ``--simulate``."""
    parser.add_argument("--prometheus", metavar="URL",
                        help="instead of a trace: re-run the planner on what it read from this "
                             "Prometheus over --start..--end, next to the live decisions; with "
                             "spec flags, also the what-if's decisions and instance-hours")
    parser.add_argument("--simulate", action="store_true",
                        help="--prometheus: also rebuild a trace from the recorded rates, mean "
                             "lengths and prefix hit rates and replay it on the simulator for "
                             "the spec and the what-if (attainment, latencies, GPU-hours), over "
                             "--simulate-seeds x --length-sigmas traces (docs/replay.md)")
    parser.add_argument("--simulate-seeds", type=int, default=3, metavar="N",
                        help="--simulate: rebuilt traces per length spread (default 3)")
    parser.add_argument("--length-sigmas", type=_sigmas, default=(0.5, 1.0), metavar="S,S",
                        help="--simulate: the lengths' lognormal log-space spreads tried, "
                             "comma-separated (default 0.5,1.0)")
    parser.add_argument("--pdcluster", metavar="NS/NAME", help="the PDCluster replayed (--prometheus)")
    parser.add_argument("--start", help="--prometheus: range start, Unix seconds or RFC 3339")
    parser.add_argument("--end", help="--prometheus: range end, Unix seconds or RFC 3339")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("-f", "--filename", dest="spec_file", metavar="PDCLUSTER.yaml",
                        help="the PDCluster whose planner to replay (default: the CRD's defaults)")
    parser.add_argument("--trace", help="Mooncake .jsonl, Azure CSV or rate-series CSV")
    _add_prometheus_arguments(parser)
    parser.add_argument("--synthetic", metavar="SHAPE", choices=["steady", "ramp", "step", "spike", "surge"],
                        help="instead of --trace, a load shape (planner/replay/workloads.py): "
                             "steady hour, 30 min at --base-rps then +50%% ramp, 2x step, 2.5x "
                             "spike; surge: 12 min, +70%% over 9, 1.05x; lengths from --lengths")
    parser.add_argument("--base-rps", type=float, default=12.0,
                        help="--synthetic: the base request rate (default 12)")
    parser.add_argument("--start-from", choices=["history", "running", "hindsight", "spec"], default="history",
                        help="history: the first warm-up is unscored history sizing the start; running: "
                             "every policy runs it on the fleet, unscored (a planner already running); "
                             "hindsight: start sized from the scored trace's first warm-up; spec: from "
                             "the spec's replicas, as the operator starts (default: history)")
    add_tick_phase(parser)
    parser.add_argument("--trace-start", metavar="TIME",
                        help="the wall-clock time of the trace's first second, Unix seconds or "
                             "RFC 3339 (2026-12-07T08:00:00+01:00): spec.planner.schedules are "
                             "read on it; default 0 (1970-01-01T00:00:00Z, a Thursday)")
    parser.add_argument("--lengths", help="trace to draw lengths from (needed for a rate series)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="replicate arrivals K times")
    parser.add_argument("--time-scale", type=float, default=1.0, help="compress time K times")
    parser.add_argument(
        "--policy",
        help="pdscale | static:xPyD (e.g. static:4P17D) | static:best | reactive | sla-interp | oracle "
             "| oracle:now (knows each interval's load once it ends, nothing ahead) | oracle:next "
             "(and the interval beginning at the tick)",
    )
    parser.add_argument("--profile", help="profile YAML or shipped name (default: spec.planner.profile)")
    parser.add_argument("--fleet-profile", metavar="FILE",
                        help="the simulated fleet's true profile (YAML or shipped name), apart "
                             "from the one the planner plans with; warm-ups stay the planner's. "
                             "The oracle and static:best size from it (default: the planner's)")
    parser.add_argument("--fleet-speed", metavar="X|prefill=X,decode=Y",
                        help="the simulated fleet runs X times as fast as its profile says "
                             "(0.8: every prefill and decode step takes 1.25x as long; 1.25: "
                             "0.8x), for both roles or per role, e.g. prefill=0.8,decode=1.25")
    for f in SPEC_FLAGS:
        parser.add_argument(f.flag, type=f.type, default=None, help=f"{f.help}; overrides the spec")
    parser.add_argument("--stack", choices=STACK_NAMES, default="deployed",
                        help="what the replay stands for (docs/replay.md): deployed = batching "
                             "engines behind the spec's router as rendered (by default smg, cache-"
                             "aware, derived admission); ideal-router = predicted-TTFT routing with "
                             "early rejection (a what-if); article = the article's model (default: deployed)")
    parser.add_argument("--router", default=None,
                        choices=["random", "round-robin", "power-of-two", "least-queue",
                                 "cache-aware", "smg-cache-aware", "predicted-ttft"],
                        help="the prefill routing (default: the stack's; on the deployed stack, "
                             "the spec's router.prefillPolicy)")
    parser.add_argument("--decode-router", default=None,
                        choices=["round-robin", "random", "power-of-two", "cache-aware",
                                 "least-loaded"],
                        help="the decode routing (default: the stack's; on the deployed stack, "
                             "the spec's router.decodePolicy)")
    parser.add_argument("--early-rejection", action="store_true", default=None,
                        help="the router rejects a request whose predicted TTFT breaks the "
                             "target (overrides the stack's admission)")
    parser.add_argument("--decode-admission", choices=["off", "queue", "shed"], default="off",
                        help="off: decode takes every request; queue: decode caps its batch at the "
                             "TPOT target (--max-running-requests sized to the SLO) and the rest "
                             "wait; shed: and drops what would wait past the TTFT target, and the "
                             "planner drops its decode hedge (default: off)")
    parser.add_argument("--sweep-load-percentile", type=_percentiles, default=None, metavar="P,P",
                        help="replay pdscale at each spec.planner.loadPercentile and print the "
                             "trade curve (attainment vs GPU-hours) beside static:best, oracle and "
                             "oracle:now on the same fleet (instead of --policy)")
    parser.add_argument("--json", dest="json_out", help="write the report here")
    parser.add_argument("--plot", help="write a PNG of load, x, y and attainment per interval")


def configuration_from(args: argparse.Namespace) -> Configured:
    """The command line's spec, flags and profile, through :func:`configure`."""
    from pdscale.planner.profile import ProfileError, load_profile

    if args.spec_file:
        spec, source = read_spec(args.spec_file), f"file {args.spec_file}"
    else:
        spec, source = default_spec(), "default"
    profile = None
    if args.profile:
        try:
            profile = load_profile(args.profile)
        except ProfileError as exc:
            raise ConfigurationError(str(exc)) from None
    overrides = {f.flag: getattr(args, f.flag.lstrip("-").replace("-", "_")) for f in SPEC_FLAGS}
    return configure(spec, spec_source=source, overrides=overrides, profile=profile,
                     profile_source="flag --profile")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    if args.prometheus:
        return _run_prometheus(args, console)
    if args.simulate:
        console.print("[red]error:[/red] --simulate replays a range read with --prometheus")
        return 2
    if not (args.trace or args.synthetic) or not (args.policy or args.sweep_load_percentile):
        console.print("[red]error:[/red] --trace (or --synthetic) and --policy (or "
                      "--sweep-load-percentile) are needed (or --prometheus)")
        return 2
    if args.sweep_load_percentile:
        return run_sweep(args)
    return run_trace(args)


def _trace_from(args: argparse.Namespace) -> Any:
    """The trace the command line names: ``--synthetic`` SHAPE or ``--trace`` FILE."""
    from pdscale.planner.replay.traces import TraceError, load_trace
    from pdscale.planner.replay.workloads import synthetic_trace

    if args.synthetic:
        if not args.lengths:
            raise TraceError("--synthetic draws lengths from a trace: give --lengths")
        return synthetic_trace(args.synthetic, args.base_rps, load_trace(args.lengths))
    return load_trace(args.trace, rate_scale=args.rate_scale, time_scale=args.time_scale,
                      lengths_from=args.lengths)


def _start(args: argparse.Namespace, setup: Any, console: Any) -> tuple[Any, Any]:
    """(the setup to score, the history before it or None) for ``--start-from``."""
    from pdscale.planner.replay.run import start_from, with_history

    warm = setup.model.profile.warmup.new_node_seconds
    long_enough = setup.trace.duration_seconds >= 2 * warm
    if args.start_from == "history" and long_enough:
        setup, history = with_history(setup)
        console.print(f"start: the first {len(history)} interval(s) are history (not scored) and "
                      "size every dynamic policy's start fleet")
        return setup, history
    if args.start_from == "running" and long_enough:
        setup, _ = start_from(setup, "running")
        head = setup.scored_from_seconds - setup.trace.arrival_seconds[0]
        console.print(f"start: every policy runs the trace's first {head:g} s "
                      "on the fleet, unscored (the planner learns the fleet there); the rest is "
                      "scored")
        return setup, None
    if args.start_from == "spec":
        console.print("start: every dynamic policy starts from the spec's replicas, ready, with "
                      "no history (as the operator starts)")
    elif args.start_from in ("history", "running"):
        console.print(f"start: the trace is shorter than two warm-ups ({2 * warm:g} s): no history "
                      "split off, the start fleet is sized from its first warm-up (hindsight)")
    return setup, None


def add_tick_phase(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tick-phase-seconds", type=_phase_seconds, metavar="S",
                        help="the planner ticks S s after each multiple of its interval, as a live "
                             "loop's plans (lastPlanAtSeconds); default: at the first arrival")
    parser.add_argument("--join-delay-seconds", type=_phase_seconds, metavar="S", default=0.0,
                        help="a new instance serves S s after its warm-up ends: the time your "
                             "control plane takes to create and schedule its pod and your router "
                             "to list it once Ready (warmupSeconds counts from pod start); "
                             "default 0")
    parser.add_argument("--scrape-seconds", type=_positive_seconds, metavar="S", default=5.0,
                        help="your Prometheus' scrape interval: the planner reads counters as of "
                             "the last scrape before each tick; default 5")
    parser.add_argument("--scrape-lag-seconds", type=_phase_seconds, metavar="S", default=0.0,
                        help="the last scrape falls S s before each tick (below --scrape-seconds; "
                             "a live tick lands anywhere between two scrapes: half the scrape "
                             "interval on average); default 0, read right after a scrape")


def _phase_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _flags_refused(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run together (None: they can)."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib: pip install 'pdscale[plot]'"
    if args.scrape_lag_seconds >= args.scrape_seconds:
        return (f"--scrape-lag-seconds {args.scrape_lag_seconds:g} must be below --scrape-seconds "
                f"{args.scrape_seconds:g} (the last scrape before a tick is less than one scrape "
                "interval old)")
    return None


def _on_trace_clock(configured: Configured, trace_start: str | None) -> Configured:
    """``configured`` with the planner's clock origin at ``--trace-start`` (Unix seconds or
    RFC 3339; None: 0), where the spec's schedules are read. ValueError names the flag."""
    if trace_start is None:
        return configured
    from pdscale.prometheus_replay import parse_time

    origin = parse_time(trace_start, "--trace-start")
    if not math.isfinite(origin):
        raise ValueError(f"--trace-start: {trace_start!r} is not a finite time")
    return dataclasses.replace(configured, config=dataclasses.replace(
        configured.config, clock_origin_unix_seconds=origin))


def _prepared(args: argparse.Namespace, console: Any, trace: Any = None) -> Any:
    """(configured, trace, fleet model, setup to score, history) for the command line, or the
    exit code after printing why not. ``trace``: the one already read (a sweep reads it once)."""
    from pdscale.operator.render.engines import decode_batch_cap
    from pdscale.planner.replay.traces import TraceError

    if (refused := _flags_refused(args)) is not None:
        console.print(f"[red]error:[/red] {refused}")
        return 2
    try:
        configured = configuration_from(args)
        trace = _trace_from(args) if trace is None else trace
    except (ConfigurationError, TraceError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    try:
        configured = _on_trace_clock(configured, args.trace_start)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    config = configured.config
    if config.schedules:
        start = datetime.fromtimestamp(config.clock_origin_unix_seconds, UTC)
        console.print(f"schedules: {len(config.schedules)} window(s) read on the trace's clock, its "
                      f"first second at {start.isoformat()} (--trace-start)")
    try:
        truth = fleet_model(configured.config, profile_path=args.fleet_profile, speed=args.fleet_speed,
                            decode_batch_cap=decode_batch_cap(configured.spec))
    except ConfigurationError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    setup = fleet_setup(args, trace, configured, truth)
    setup, history = _start(args, setup, console)
    return configured, trace, truth, setup, history


#: the baselines a sweep prints beside the trade curve: the best fixed fleet in hindsight, the
#: planner with the future known, and with each interval known once it ends
SWEEP_BASELINES = ("static:best", "oracle", "oracle:now")


def run_sweep(args: argparse.Namespace) -> int:
    """``--sweep-load-percentile``: pdscale at each percentile, then :data:`SWEEP_BASELINES`,
    on one fleet and one start (``run_policy``, as ``--policy`` runs each), as one table: the
    trade curve of attainment against GPU-hours, and whether static:best dominates each point
    (:func:`pdscale.planner.replay.run.dominated`)."""
    import copy

    from rich.console import Console
    from rich.table import Table

    from pdscale.planner.replay.run import dominated, run_policy

    console = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    trace = None
    baselines: Any = None
    for percentile in args.sweep_load_percentile:
        point = copy.copy(args)
        point.load_percentile = percentile
        prepared = _prepared(point, console, trace)
        if isinstance(prepared, int):
            return prepared
        _, trace, _, setup, history = prepared
        baselines = baselines or prepared
        console.print(f"replay pdscale at loadPercentile {percentile}")
        report = run_policy(setup, "pdscale", history=history)
        rows.append({"policy": "pdscale", "load_percentile": percentile, **_curve_point(report)})
    assert baselines is not None
    _, trace, _, setup, history = baselines
    for policy in SWEEP_BASELINES:
        console.print(f"replay {policy}")
        report = run_policy(setup, policy, history=history)
        rows.append({"policy": report.get("policy", policy), "load_percentile": None,
                     **_curve_point(report)})
    best = next(r for r in rows if r["policy"].startswith("static"))
    table = Table(title=f"trade curve on {trace.name}: attainment vs GPU-hours")
    for column in ("policy", "loadPercentile", "attainment", "GPU-h", "role changes",
                   "dominated by static:best"):
        table.add_column(column, justify="right")
    for r in rows:
        r["dominated_by_static_best"] = (r["policy"] == "pdscale" and dominated(r, best))
        table.add_row(r["policy"], "" if r["load_percentile"] is None else str(r["load_percentile"]),
                      f"{100 * r['slo_attainment']:.2f}%", f"{r['gpu_hours']:.1f}",
                      str(r["role_changes"]), "yes" if r["dominated_by_static_best"] else "")
    Console().print(table)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"trace": trace.name, "rows": rows}, indent=1))
        console.print(f"wrote {args.json_out}")
    return 0


def _curve_point(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("slo_attainment", "gpu_hours", "role_changes")}


def run_trace(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from pdscale.planner.replay.run import run_policy

    console = Console(stderr=True)
    prepared = _prepared(args, console)
    if isinstance(prepared, int):
        return prepared
    configured, trace, truth, setup, history = prepared
    config = configured.config
    console.print(
        f"{trace.name}: {len(trace):,} requests over {trace.duration_seconds / 60:.0f} min "
        f"(rate x{args.rate_scale:g}, time /{args.time_scale:g}), profile {config.model.profile.name}"
        + ("" if truth is None else f"; the fleet really runs {truth.profile.name} (the oracle "
           "and static:best size from it, the planner from its profile)")
    )
    fields = Table(title="planner configuration (spec fields)")
    for column in ("field", "value", "from"):
        fields.add_column(column)
    for name, value, source in configured.sources:
        fields.add_row(name, str(value), source)
    console.print(fields)
    console.print(
        f"derived: horizon {config.horizon_intervals} intervals, node budget {config.nodes}, "
        f"scale-down window {config.stabilization_seconds:g} s, "
        f"warm-up {config.model.profile.warmup.new_node_seconds:g} s, prefill queue "
        f"{config.prefill_queue} (from the router's prefill choice)"
    )
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"replay {args.policy}", total=1.0)
        try:
            report = run_policy(
                setup, args.policy,
                progress=lambda share: bar.update(task, completed=share),
                log=lambda msg: bar.console.print(msg),
                history=history, start_fleet=spec_replicas(configured.spec)
                if args.start_from == "spec" else None,
            )
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
    report["rate_scale"] = args.rate_scale
    report["time_scale"] = args.time_scale
    report["configuration"] = configured.as_json()
    report["stack"] = {"name": args.stack, "engine": setup.engine, "router": setup.router,
                       "decode_router": setup.decode_router,
                       "early_rejection": setup.early_rejection,
                       "prefill_admission": (None if setup.prefill_admission is None
                                             else dataclasses.asdict(setup.prefill_admission))}
    Console().print(_report_table(report, config))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))
        console.print(f"wrote {args.json_out}")
    if args.plot:
        plot_report(report, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _report_table(report: dict[str, Any], config: Any) -> Any:
    """The report's headline measures as a table, the latencies at the SLO percentile first."""
    from rich.table import Table

    pct = f"p{100 * config.slo.percentile:g}"
    table = Table(title=f"replay {report['policy']} on {report['trace']}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    if report.get("fleet_profile") != report.get("planner_profile"):
        table.add_row("planner plans with / fleet runs",
                      f"{report['planner_profile']} / {report['fleet_profile']}")
    table.add_row(f"slo_attainment (SLO: {config.slo.percentile:.0%} of requests)",
                  f"{_fmt(report['slo_attainment'])} ({'met' if report['slo_met'] else 'NOT met'})")
    table.add_row(f"ttft_{pct} / target", f"{_fmt(report['ttft_at_percentile'])} / "
                  f"{config.slo.ttft_seconds:g}")
    table.add_row(f"tpot_{pct} / target", f"{_fmt(report['tpot_at_percentile'])} / "
                  f"{config.slo.tpot_seconds:g}")
    for key in ("requests", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50",
                "tpot_p90", "tpot_p99", "rejected", "gpu_hours", "role_changes"):
        table.add_row(key, _fmt(report[key]))
    served = report["served_only"]
    table.add_row(f"served only ({served['requests']}): ttft_{pct} / ttft_p99",
                  f"{_fmt(served['ttft_at_percentile'])} / {_fmt(served['ttft_p99'])}")
    m = report["misses"]
    table.add_row("missed: late first token / slow decode / both",
                  f"{m['ttft_only']} / {m['tpot_only']} / {m['both']}")
    return table


def _run_prometheus(args: argparse.Namespace, console: Any) -> int:
    """``--prometheus``: the spec (``-f``, else the live PDCluster's) re-run over a recorded
    range; the spec flags make a what-if next to it."""
    from pdscale import prometheus_replay

    if not (args.pdcluster and args.start and args.end):
        console.print("[red]error:[/red] --prometheus needs --pdcluster NS/NAME, --start and --end")
        return 2
    if args.simulate and args.simulate_seeds < 1:
        console.print("[red]error:[/red] --simulate-seeds: at least 1")
        return 2
    try:
        if args.spec_file:
            spec, source = read_spec(args.spec_file), f"file {args.spec_file}"
        else:
            namespace, _, name = args.pdcluster.partition("/")
            spec, source = prometheus_replay.spec_from_cluster(namespace, name), f"PDCluster {args.pdcluster}"
        profile = None
        if args.profile:
            from pdscale.planner.profile import load_profile
            profile = load_profile(args.profile)
        configured = configure(spec, spec_source=source, profile=profile, profile_source="flag --profile")
        overrides = {f.flag: getattr(args, f.flag.lstrip("-").replace("-", "_")) for f in SPEC_FLAGS}
        whatif = (configure(spec, spec_source=source, overrides=overrides, profile=profile,
                            profile_source="flag --profile")
                  if any(v is not None for v in overrides.values()) else None)
    except Exception as exc:  # a spec, profile or cluster read that failed: say which
        console.print(f"[red]error:[/red] {exc}")
        return 2
    return prometheus_replay.run(args, configured, whatif)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def plot_report(report: dict[str, Any], path: str) -> None:
    """Load, commanded x and y, and SLO attainment per interval, on a shared time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = report["per_interval"]
    dec = report["decisions"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    t = [p["t"] / 60 for p in per]
    axes[0].plot(t, [p["rate_rps"] for p in per], color="black")
    axes[0].set_ylabel("load (req/s)")
    td = [d["t"] / 60 for d in dec]
    axes[1].step(td, [d["prefill"] for d in dec], where="post", label="prefill (x)")
    axes[1].step(td, [d["decode"] for d in dec], where="post", label="decode (y)")
    axes[1].set_ylabel("instances")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [p["attainment"] if p["attainment"] is not None else float("nan") for p in per])
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(0, 1.02)
    axes[2].set_xlabel("minutes")
    fig.suptitle(
        f"{report['policy']} on {report['trace']}: attainment {report['slo_attainment']:.3f}, "
        f"{report['gpu_hours']:.1f} GPU-h"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
