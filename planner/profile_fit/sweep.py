"""What a profile sweep measures and when it stops: the rows of aiperf runs (prefill lengths at
concurrency 1, then concurrencies per decode context), the coverage rule that stops a row
(``profile fit``'s own), the record the fitted profile's provenance keeps, its progress
lines, and the driver that runs the rows in order (:func:`execute`). Pure: no process, no
clock, no cluster of its own: the driver is handed the runner, the fit and the clock;
``pdscale profile run`` runs aiperf with them and prints (``pdscale.profile_sweep`` writes
its commands and manifests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdscale.planner.model import Slo
    from pdscale.planner.profile import Profile

    from . import FittedProfile
    from .points import Benchmark


PREFILL, DECODE = "prefill", "decode"


#: the shortest rows that may stop early: three prompt lengths separate the prefill curvature
#: from the per-token cost and the overhead; two batch sizes the decode step from the
#: per-sequence cost (planner/profile_fit/fit.py)
MIN_RUNS = {PREFILL: 3, DECODE: 2}


class SweepError(ValueError):
    """A sweep that cannot start as asked; the message names the flag or field."""


@dataclass(frozen=True)
class Grid:
    """What a sweep measures. Lengths in tokens; requests per run."""

    #: prompt lengths of the prefill row, sent one at a time; up to past the TTFT target's
    #: length on most engines (the row stops once a prompt takes 80% of the target)
    prefill_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    #: requests per prompt length (repeats average the noise out of the curvature)
    prefill_requests: int = 8
    #: output tokens of a prefill request: the row measures time to first token, but its
    #: requests are batch-1 decode points too, and a short one reads fast (through the
    #: sglang-router, 8 tokens read 15-19% under the model's step, 64 within 2%: the closed
    #: loop, tests/planner/test_profile_run_closed.py); 32 keeps that to a few percent
    prefill_output_tokens: int = 32
    #: input lengths of the decode rows: the per-context cost needs at least two
    decode_contexts: tuple[int, ...] = (256, 2048, 8192)
    #: concurrencies of each decode row, growing (the row stops once the batch is covered)
    decode_concurrencies: tuple[int, ...] = (2, 8, 16, 32, 64, 128, 256)
    #: output tokens of a decode request: enough that it decodes alongside the others
    decode_output_tokens: int = 128
    #: requests per decode run, per unit of concurrency (3: each of the C clients sends three)
    decode_requests_per_client: int = 3


@dataclass(frozen=True)
class Run:
    """One aiperf run: a fixed concurrency of identical requests."""

    stage: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    requests: int

    @property
    def name(self) -> str:
        return f"{self.stage}-isl{self.input_tokens}-c{self.concurrency}"

    def describe(self) -> str:
        return (f"{self.stage} {self.input_tokens} tokens in, {self.output_tokens} out, "
                f"concurrency {self.concurrency}, {self.requests} requests")


@dataclass(frozen=True)
class Row:
    """Runs stopped together: the prefill lengths, or one context's concurrencies."""

    stage: str
    runs: tuple[Run, ...]

    @property
    def label(self) -> str:
        return PREFILL if self.stage == PREFILL else f"decode at {self.runs[0].input_tokens} tokens"


@dataclass(frozen=True)
class Target:
    """What aiperf sends requests to: the router (or gateway) of a PD deployment."""

    url: str
    #: the served model name requests carry
    model: str
    #: aiperf's --tokenizer: a hub id or a local directory; None = aiperf's default (the model)
    tokenizer: str | None = None
    endpoint_type: str = "completions"


def rows(grid: Grid, max_context_tokens: int | None = None) -> list[Row]:
    """The sweep's rows in the order they run: prefill first (its fit is what the decode rows'
    prompts queue behind), then one decode row per context, shortest first. A run whose
    prompt and output would pass ``max_context_tokens`` is left out (the engines refuse it)."""
    problems = grid_problems(grid)
    if problems:
        raise SweepError("; ".join(problems))

    def fits(isl: int, osl: int) -> bool:
        return max_context_tokens is None or isl + osl <= max_context_tokens

    out = [Row(PREFILL, tuple(
        Run(PREFILL, n, grid.prefill_output_tokens, 1, grid.prefill_requests)
        for n in sorted(grid.prefill_lengths) if fits(n, grid.prefill_output_tokens)))]
    for ctx in sorted(grid.decode_contexts):
        if fits(ctx, grid.decode_output_tokens):
            out.append(Row(DECODE, tuple(
                Run(DECODE, ctx, grid.decode_output_tokens, c, c * grid.decode_requests_per_client)
                for c in sorted(grid.decode_concurrencies))))
    out = [r for r in out if r.runs]
    if not out:
        raise SweepError(f"no run fits the model's context of {max_context_tokens} tokens")
    return out


def grid_problems(grid: Grid) -> list[str]:
    """Each grid flag's problem, named by the flag."""
    out = []
    for flag, values in (("--prefill-lengths", grid.prefill_lengths),
                         ("--decode-contexts", grid.decode_contexts),
                         ("--decode-concurrencies", grid.decode_concurrencies)):
        if any(v < 1 for v in values):
            out.append(f"{flag}: every value must be a positive integer")
        elif len(set(values)) != len(values):
            out.append(f"{flag}: a value is repeated")
    for flag, count in (("--prefill-requests", grid.prefill_requests),
                        ("--decode-requests-per-client", grid.decode_requests_per_client)):
        if count < 1:
            out.append(f"{flag}: must be at least 1")
    for flag, tokens in (("--prefill-output-tokens", grid.prefill_output_tokens),
                         ("--decode-output-tokens", grid.decode_output_tokens)):
        if tokens < 2:  # a request of one output token has no inter-token latency
            out.append(f"{flag}: must be at least 2")
    if grid.prefill_lengths and len(grid.prefill_lengths) < 2:
        out.append("--prefill-lengths: the prefill fit needs at least two lengths")
    return out


def row_shortfall(row: Row, fitted: Profile, row_benchmarks: Sequence[Benchmark], base: Profile,
                  slo: Slo, *, kv_transfer_in_ttft: bool | None = None) -> str | None:
    """What ``profile fit``'s coverage rule still finds missing in the runs of ``row`` so far
    (None: covered). Prefill: the longest prompt's compute time (its TTFT less the base's KV
    hand-off, as the fit sees it) against the TTFT target; decode: the largest batch of the
    row against the batch ``fitted`` runs at the TPOT target, at the row's context."""
    from .document import prefill_compute_points
    from .fit import decode_coverage, prefill_coverage

    if row.stage == PREFILL:
        points, _ = prefill_compute_points(row_benchmarks, base, kv_transfer_in_ttft)
        if not points:
            return "no prompt ran alone in prefill yet"
        return prefill_coverage(points, slo)
    decode = [p for b in row_benchmarks for p in b.decode]
    if not decode:
        return "no decode point yet"
    return decode_coverage(fitted, decode, slo)


def stops_after(row: Row, runs_done: int, shortfall: str | None) -> bool:
    """Whether ``row`` stops after its first ``runs_done`` runs: covered, and enough runs for
    the fit to separate the row's terms (:data:`MIN_RUNS`)."""
    return shortfall is None and runs_done >= MIN_RUNS[row.stage] and runs_done < len(row.runs)


@dataclass
class RunRecord:
    """One run as the provenance lists it."""

    run: Run
    status: str  # done | failed
    seconds: float
    artifacts: str


@dataclass
class SweepRecord:
    """What the sweep did: its target, grid, runs, early stops and, if it stopped, why."""

    target: Target
    grid: Grid
    runs: list[RunRecord] = field(default_factory=list)
    early_stops: list[str] = field(default_factory=list)
    failed: str | None = None


def sweep_provenance(record: SweepRecord) -> dict[str, Any]:
    """The ``provenance.sweep`` block of a profile ``profile run`` fitted (small: the profile's
    points are already under ``provenance.points``)."""
    g = record.grid
    return {
        "target": {"url": record.target.url, "model": record.target.model,
                   "tokenizer": record.target.tokenizer,
                   "endpoint_type": record.target.endpoint_type},
        "grid": {"prefill_lengths": list(g.prefill_lengths),
                 "prefill_requests": g.prefill_requests,
                 "prefill_output_tokens": g.prefill_output_tokens,
                 "decode_contexts": list(g.decode_contexts),
                 "decode_concurrencies": list(g.decode_concurrencies),
                 "decode_output_tokens": g.decode_output_tokens,
                 "decode_requests_per_client": g.decode_requests_per_client},
        "runs": [{"name": r.run.name, "status": r.status, "seconds": round(r.seconds, 1),
                  "requests": r.run.requests} for r in record.runs],
        "early_stop": list(record.early_stops),
        "stopped": record.failed,
    }


# -- progress ---------------------------------------------------------------------------------

def clock_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress_start(i: int, n: int, run: Run, elapsed: float) -> str:
    return f"[{i}/{n} {clock_text(elapsed)}] {run.describe()} ..."


def progress_done(i: int, n: int, run: Run, seconds: float, elapsed: float,
                  shortfall: str | None) -> str:
    state = "SLO region covered" if shortfall is None else f"not covered yet: {shortfall}"
    return f"[{i}/{n} {clock_text(elapsed)}] {run.name} done in {seconds:.1f} s; {state}"


def progress_skip(row: Row, skipped: Sequence[Run]) -> str:
    what = ", ".join(str(r.input_tokens if row.stage == PREFILL else r.concurrency)
                     for r in skipped)
    unit = "tokens" if row.stage == PREFILL else "concurrency"
    return f"{row.label}: SLO region covered, early stop: skipping {unit} {what}"


# -- the driver: rows in order, each stopped once covered ----------------------------------------

@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    #: why it failed: aiperf's exit status and its stderr's last lines
    problem: str = ""


def execute(plan: Sequence[Row], workdir: Path, *, runner: Callable[[Run, Path], Outcome],
            fit_now: Callable[[Sequence[Path]], tuple[FittedProfile, list[Benchmark]]],
            slo: Slo, base: Profile, record: SweepRecord, say: Callable[[str], None],
            clock: Callable[[], float]) -> list[Path]:
    """Run the rows in order, each stopped once covered; returns the finished runs'
    ``profile_export.jsonl``. A failed run ends the sweep (``record.failed`` says why)."""
    began, i = clock(), 0
    files: list[Path] = []
    total = sum(len(r.runs) for r in plan)
    for row in plan:
        row_files: list[Path] = []
        for k, one in enumerate(row.runs):
            i += 1
            shortfall = _one_run(i, total, one, workdir / f"{i:02d}-{one.name}", runner=runner,
                                 fit_now=fit_now, files=files, row=row, row_files=row_files,
                                 slo=slo, base=base, record=record, say=say,
                                 elapsed=lambda: clock() - began)
            if record.failed is not None:
                return files
            if stops_after(row, k + 1, shortfall):
                skipped = row.runs[k + 1:]
                total -= len(skipped)
                record.early_stops.append(progress_skip(row, skipped))
                say(record.early_stops[-1])
                break
    return files


def _one_run(i: int, total: int, one: Run, directory: Path, *,
             runner: Callable[[Run, Path], Outcome],
             fit_now: Callable[[Sequence[Path]], tuple[FittedProfile, list[Benchmark]]],
             files: list[Path], row: Row, row_files: list[Path], slo: Slo, base: Profile,
             record: SweepRecord, say: Callable[[str], None], elapsed: Callable[[], float]
             ) -> str | None:
    """Run one, fit everything so far, say how it went; returns what the row still misses of
    the SLO region (None: covered). A failure is written into ``record.failed``."""
    from pdscale.planner.profile_fit import BenchmarkError, FitError

    say(progress_start(i, total, one, elapsed()))
    try:
        outcome = runner(one, directory)
    except KeyboardInterrupt:
        outcome = Outcome(False, 0.0, "interrupted")
    record.runs.append(RunRecord(one, "done" if outcome.ok else "failed", outcome.seconds,
                                 str(directory)))
    export = directory / "profile_export.jsonl"
    problem = None if outcome.ok else outcome.problem
    shortfall: str | None = None
    if problem is None:
        try:
            fitted, benchmarks = fit_now([*files, export])
        except BenchmarkError as exc:  # every request of the run failed, or a broken file
            problem = str(exc)
        except FitError as exc:
            files.append(export)
            row_files.append(export)
            shortfall = f"nothing to fit yet ({exc})"
        else:
            files.append(export)
            row_files.append(export)
            shortfall = row_shortfall(row, fitted.profile, benchmarks[-len(row_files):], base, slo)
    if problem is not None:
        record.runs[-1].status = "failed"
        record.failed = f"run {i} ({one.name}) failed: {problem}"
        say(f"[{i}/{total}] {one.name} FAILED: {problem}")
        return None
    say(progress_done(i, total, one, outcome.seconds, elapsed(), shortfall))
    return shortfall
