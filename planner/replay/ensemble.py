"""Replays of traces rebuilt from recorded aggregates (:mod:`.reconstruct`), over an ensemble
of seeds and length spreads: each figure's spread, and a what-if's paired difference from the
spec on the same rebuilt traces. ``pdscale replay --prometheus ... --simulate`` reads the
aggregates and prints; this is what it computes."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .reconstruct import IntervalAggregate, trace_from_aggregates
from .traces import TraceError

#: the figures compared, as ``run_policy``'s report names them (plus mean_instances)
FIGURES = ("slo_attainment", "ttft_at_percentile", "tpot_at_percentile", "gpu_hours",
           "mean_instances", "prefix_hit_rate")
#: what a rebuilt trace does not hold, said with every simulated figure
NOT_COVERED = ("a rebuilt trace: Poisson arrivals at each interval's mean rate (no bursts "
               "within an interval), lognormal lengths from the interval's means (the prompts' "
               "spread recorded where the engines export their prompt histogram, the outputs' "
               "assumed: varied over --length-sigmas), no conversation structure beyond the prefix hit "
               "rate; the fleet is the profile's, not the live one's engines")


def mean_decided_instances(times: Sequence[float], counts: Sequence[tuple[int, int]],
                           interval_seconds: float) -> float | None:
    """Prefill + decode decided, averaged over time (each count holds until the next, the
    last for one interval)."""
    if not times:
        return None
    spans = [b - a for a, b in itertools.pairwise(times)] + [interval_seconds]
    total = sum(spans)
    return sum((p + d) * s for (p, d), s in zip(counts, spans, strict=True)) / total if total else None


@dataclass(frozen=True)
class Ensemble:
    """The reconstruction's spread: each (seed, length sigma) is one rebuilt trace."""

    seeds: tuple[int, ...] = (0, 1, 2)
    length_sigmas: tuple[float, ...] = (0.5, 1.0)

    def members(self) -> list[tuple[int, float]]:
        return list(itertools.product(self.seeds, self.length_sigmas))


def simulate_once(aggregates: Sequence[IntervalAggregate], make_setup: Callable[[Any], Any],
                  *, seed: int, sigma: float, max_input_tokens: int | None) -> dict[str, Any]:
    """One rebuilt trace replayed under the pdscale policy: the report of ``run_policy``,
    with ``mean_instances`` decided added. The range's first warm-up is history (unscored,
    sizes the start fleet) when the range holds two."""
    from .run import run_policy, with_history

    trace = trace_from_aggregates(aggregates, seed=seed, length_sigma=sigma,
                                  max_input_tokens=max_input_tokens,
                                  name=f"reconstructed[seed={seed},sigma={sigma:g}]")
    if not len(trace):
        raise TraceError("the recorded rates give no request over the range")
    setup = make_setup(trace)
    history = None
    if trace.duration_seconds >= 2 * setup.model.profile.warmup.new_node_seconds:
        setup, history = with_history(setup)
    report = run_policy(setup, "pdscale", history=history)
    dec = report["decisions"]
    report["mean_instances"] = mean_decided_instances(
        [d["t"] for d in dec], [(d["prefill"], d["decode"]) for d in dec], setup.interval_seconds)
    report["seed"], report["length_sigma"] = seed, sigma
    report["rebuilt"] = rebuilt_figures(trace, aggregates)
    return report


def rebuilt_figures(trace: Any, aggregates: Sequence[IntervalAggregate]) -> dict[str, float]:
    """How close the rebuilt trace came to the recording, over the whole range: request rate,
    mean lengths, and the hit rate an unbounded cache would see (what the fleet's caches and
    routing make of it is the simulated ``prefix_hit_rate``)."""
    from .traces import donor_prefix_hits

    seconds = sum(a.seconds for a in aggregates)
    n = len(trace)
    prompt = sum(trace.input_tokens)
    cached = sum(min(h * trace.block_tokens, max(0, p - 1))
                 for h, p in zip(donor_prefix_hits(trace), trace.input_tokens, strict=True))
    return {"rate_rps": n / seconds, "mean_input_tokens": prompt / n,
            "mean_output_tokens": sum(trace.output_tokens) / n,
            "prefix_hit_rate": cached / prompt if prompt else 0.0}


def recorded_figures(aggregates: Sequence[IntervalAggregate]) -> dict[str, float]:
    """The recording's own figures over the range (requests weigh each interval's means)."""
    requests = [a.rate_rps * a.seconds for a in aggregates]
    n = sum(requests)
    prompt = sum(r * a.mean_input_tokens for r, a in zip(requests, aggregates, strict=True))
    return {"rate_rps": n / sum(a.seconds for a in aggregates),
            "mean_input_tokens": prompt / n if n else 0.0,
            "mean_output_tokens": (sum(r * a.mean_output_tokens for r, a in
                                       zip(requests, aggregates, strict=True)) / n) if n else 0.0,
            "prefix_hit_rate": (sum(r * a.mean_input_tokens * a.prefix_hit_rate for r, a in
                                    zip(requests, aggregates, strict=True)) / prompt) if prompt else 0.0}


def paired_difference(whatif: Sequence[dict[str, Any]],
                      spec: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per figure, the what-if minus the spec on the same rebuilt trace, spread over the
    traces: narrower than the two ranges apart, since both ran the same requests."""
    diffs = [{f: (w[f] - s[f] if w.get(f) is not None and s.get(f) is not None else None)
              for f in FIGURES} for w, s in zip(whatif, spec, strict=True)]
    return spread(diffs)


def spread(reports: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per figure: mean, min and max over the ensemble (a figure None in any member, such as a
    quantile that falls on a rejected request, is None in ``unknown_in``)."""
    out: dict[str, dict[str, float | None]] = {}
    for name in FIGURES:
        values = [r.get(name) for r in reports]
        got = [float(v) for v in values if v is not None]
        out[name] = {"mean": statistics.fmean(got) if got else None,
                     "min": min(got) if got else None, "max": max(got) if got else None,
                     "unknown_in": float(len(values) - len(got))}
    return out


def simulate_specs(aggregates: Sequence[IntervalAggregate], specs: dict[str, Callable[[Any], Any]],
                   ensemble: Ensemble, *, max_input_tokens: int | None,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    """Every spec (name -> setup builder; the first is the base) over every ensemble member:
    the reports' spread per spec, each member's figures, and for the others their difference
    from the base on the same traces."""
    out: dict[str, Any] = {}
    members = ensemble.members()
    base: list[dict[str, Any]] = []
    for name, make_setup in specs.items():
        reports = []
        for i, (seed, sigma) in enumerate(members, 1):
            progress(f"simulate {name}: trace {i} of {len(members)} (seed {seed}, length sigma {sigma:g})")
            reports.append(simulate_once(aggregates, make_setup, seed=seed, sigma=sigma,
                                         max_input_tokens=max_input_tokens))
        out[name] = {"spread": spread(reports),
                     "members": [{k: r.get(k) for k in ("seed", "length_sigma", "requests",
                                                        *FIGURES, "rebuilt")}
                                 for r in reports]}
        if base:
            out[name]["minus_base"] = paired_difference(reports, base)
        else:
            base = reports
    return out
