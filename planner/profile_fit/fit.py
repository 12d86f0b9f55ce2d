"""Least-squares fit of a profile's parametric terms to measured points (pure: no I/O).

The forms are exactly those of :mod:`pdscale.planner.model`:

* prefill, a prompt of ``n`` uncached tokens alone in prefill:
  ``TTFT(n) = overhead + n / R + n**2 / (2 L R)``, linear in ``a = overhead``, ``b = 1/R`` and
  ``c = 1/(2 L R)``, so ``R = 1/b`` and ``L = b / (2c)``;
* decode, a batch of ``B`` sequences of mean context ``C``:
  ``ITL(B, C) = step + B * per_sequence + B * C * per_context_token``, linear in its three terms.

Each is a bounded linear least squares (``scipy.optimize.lsq_linear``, every coefficient >= 0)
on relative residuals (each point weighted by 1/measured), so that a 20 ms TTFT and a 2 s one
count alike. A term the points cannot separate (too few distinct input lengths, batches that
never vary, contexts that never vary) is not fitted: it keeps the base profile's value, and the
fit says so. The relative standard error of each fitted coefficient comes from the residual
variance and the design, s**2 (X'X)**-1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from ..model import PerformanceModel, Slo
from ..profile import Profile
from .points import DecodePoint, PrefillPoint

#: a design whose normalised columns have a condition number above this cannot separate them
MAX_CONDITION = 1e6
#: a curvature whose relative standard error is above this is noise: the prefill is written flat
MAX_CURVATURE_STDERR = 1.0
#: the fitted points must reach this share of the batch the fitted model predicts at the TPOT
#: target, else the batch at the SLO is an extrapolation (warned)
SLO_COVERAGE = 0.8
#: a role whose RMS relative residual is above this: the model's form cannot follow its points
#: (warned, and recorded in the provenance). Measured (bench/profile_error_bench.py, 3%
#: lognormal noise): a form that holds leaves 1.7-2.6% on Dynamo's grids and 3.2-3.5% on
#: per-request records; a prefill that doubles its cost past 16k tokens leaves 12.4%. The real
#: client through a router (docs/profiles.md) left 11-12% on TTFT: flagged, and rightly, its
#: overhead came out 100-150% off. The largest residual is not bounded: with hundreds of
#: per-request points it follows the noise's tail (20% at 3% noise with the right form).
MAX_RMS_RESIDUAL = 0.10


class FitError(ValueError):
    """The points cannot determine the profile (too few, or none of a role)."""


@dataclass(frozen=True)
class TermFit:
    """One profile field after the fit."""

    value: float | None
    #: fitted from the points (else kept from the base profile, or written flat)
    identified: bool
    #: standard error of the fitted coefficient over its value; None when not fitted
    relative_stderr: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Residuals:
    """How far the fitted form is from the points it was fitted to."""

    points: int
    rms_relative: float
    max_relative: float
    rms_seconds: float


@dataclass(frozen=True)
class RoleFit:
    terms: dict[str, TermFit]
    residuals: Residuals


def _solve(columns: dict[str, np.ndarray], y: np.ndarray, fixed: dict[str, float],
           drop_order: Sequence[str], *, pinned: Sequence[str] = ()
           ) -> tuple[dict[str, float], dict[str, float | None], np.ndarray]:
    """Bounded weighted least squares of ``y`` on ``columns``; the columns of ``drop_order`` are
    fixed at ``fixed`` (moved to the left side), in that order, until the rest are separable
    (``pinned`` ones from the start). Returns the coefficients, their relative standard errors
    (None when fixed) and the predictions."""
    w = 1.0 / y
    free = [c for c in columns if c not in pinned]
    for name in [None, *(d for d in drop_order if d not in pinned)]:
        if name is not None:
            free.remove(name)
        x = np.column_stack([columns[c] for c in free]) * w[:, None]
        scale = np.linalg.norm(x, axis=0)
        if len(y) >= len(free) and np.all(scale > 0) and np.linalg.cond(x / scale) < MAX_CONDITION:
            break
    else:
        raise FitError("the points cannot separate any term")
    target = y - sum((columns[c] * fixed[c] for c in columns if c not in free), np.zeros_like(y))
    xs = x / scale
    result = lsq_linear(xs, target * w, bounds=(0.0, np.inf), method="bvls")
    coef = result.x / scale
    values = dict(fixed)
    values.update(zip(free, (float(v) for v in coef), strict=True))
    prediction = sum((columns[c] * values[c] for c in columns), np.zeros_like(y))
    dof = len(y) - len(free)
    stderr: dict[str, float | None] = dict.fromkeys(columns)
    if dof > 0:
        s2 = float(np.sum(((prediction - y) * w) ** 2)) / dof
        cov = s2 * np.linalg.pinv(xs.T @ xs)
        for i, c in enumerate(free):
            se = math.sqrt(max(cov[i, i], 0.0)) / scale[i]
            stderr[c] = se / values[c] if values[c] > 0 else math.inf
    else:
        stderr.update(dict.fromkeys(free, 0.0))
    return values, stderr, prediction


def _residuals(y: np.ndarray, prediction: np.ndarray) -> Residuals:
    rel = (prediction - y) / y
    return Residuals(points=len(y), rms_relative=float(np.sqrt(np.mean(rel**2))),
                     max_relative=float(np.max(np.abs(rel))),
                     rms_seconds=float(np.sqrt(np.mean((prediction - y) ** 2))))


def fit_prefill(points: Sequence[PrefillPoint], base: Profile) -> RoleFit:
    """Fit ``tokens_per_second``, ``attention_doubling_tokens`` and ``overhead_seconds``.

    Needs two distinct input lengths for R and the overhead, three for the curvature ``L``; a
    curvature that is zero or within its own standard error is written flat (null), as the
    points show no growth of the per-token cost up to their longest prompt."""
    pts = [p for p in points if p.ttft_seconds > 0 and p.input_tokens > 0]
    if not pts:
        raise FitError("no prefill point: no request ran alone in prefill (needs a run at concurrency 1)")
    n = np.array([p.input_tokens for p in pts])
    y = np.array([p.ttft_seconds for p in pts])
    bp = base.prefill
    fixed = {"overhead": bp.overhead_seconds, "linear": 1.0 / bp.tokens_per_second,
             "quadratic": 0.0 if bp.attention_doubling_tokens is None
             else 1.0 / (2.0 * bp.attention_doubling_tokens * bp.tokens_per_second)}
    columns = {"overhead": np.ones_like(n), "linear": n, "quadratic": n * n}
    drop = ["quadratic", "overhead"]
    values, stderr, prediction = _solve(columns, y, fixed, drop)
    c_err = stderr["quadratic"]
    flat = c_err is not None and (values["quadratic"] <= 0 or c_err > MAX_CURVATURE_STDERR)
    if flat:  # refit the other two without a curvature the points do not show
        values, stderr, prediction = _solve(columns, y, {**fixed, "quadratic": 0.0}, drop,
                                            pinned=["quadratic"])
    a, b, c = values["overhead"], values["linear"], values["quadratic"]
    if b <= 0:
        raise FitError("prefill time does not grow with the input length: tokens/s cannot be fitted")
    top = int(n.max())
    terms = {
        "tokens_per_second": TermFit(1.0 / b, stderr["linear"] is not None, stderr["linear"]),
        "overhead_seconds": TermFit(a, stderr["overhead"] is not None, stderr["overhead"],
                                    "" if stderr["overhead"] is not None
                                    else "needs two distinct input lengths: kept from the base"),
    }
    if c_err is None:
        terms["attention_doubling_tokens"] = TermFit(
            bp.attention_doubling_tokens, False, None,
            "needs three distinct input lengths: kept from the base")
    elif flat:
        terms["attention_doubling_tokens"] = TermFit(
            None, False, c_err, f"no growth of the per-token cost distinguishable up to {top} "
            "tokens: written flat (null)")
    else:
        terms["attention_doubling_tokens"] = TermFit(b / (2.0 * c), True, c_err)
    return RoleFit(terms, _residuals(y, prediction))


def fit_decode(points: Sequence[DecodePoint], base: Profile) -> RoleFit:
    """Fit ``step_seconds``, ``per_sequence_seconds`` and ``per_context_token_seconds``.

    The batch must vary to separate the step from the per-sequence cost, and the context must
    vary independently of the batch to separate the per-sequence from the per-context cost;
    what the points cannot separate keeps the base's value."""
    pts = [p for p in points if p.itl_seconds > 0 and p.batch > 0]
    if not pts:
        raise FitError("no decode point (needs requests of two or more output tokens)")
    bsz = np.array([p.batch for p in pts])
    ctx = np.array([p.mean_context_tokens for p in pts])
    y = np.array([p.itl_seconds for p in pts])
    bd = base.decode
    fixed = {"step_seconds": bd.step_seconds, "per_sequence_seconds": bd.per_sequence_seconds,
             "per_context_token_seconds": bd.per_context_token_seconds}
    columns = {"step_seconds": np.ones_like(bsz), "per_sequence_seconds": bsz,
               "per_context_token_seconds": bsz * ctx}
    values, stderr, prediction = _solve(columns, y, fixed,
                                        ["per_context_token_seconds", "step_seconds"])
    why = {"per_context_token_seconds": "the context never varies apart from the batch",
           "step_seconds": "the batch never varies", "per_sequence_seconds": ""}
    terms = {k: TermFit(values[k], stderr[k] is not None, stderr[k],
                        "" if stderr[k] is not None else f"{why[k]}: kept from the base")
             for k in columns}
    return RoleFit(terms, _residuals(y, prediction))


def decode_coverage(profile: Profile, decode: Sequence[DecodePoint], slo: Slo) -> str | None:
    """Why the decode points stop short of the SLO region, or None when they reach it: the
    largest batch measured is under :data:`SLO_COVERAGE` of the batch ``profile`` runs at the
    TPOT target, at the points' median context (no point: None, nothing to judge)."""
    if not decode:
        return None
    context = float(np.median([p.mean_context_tokens for p in decode]))
    at_slo = PerformanceModel(profile).decode_batch_at_slo(slo.tpot_seconds, context)
    top = max(p.batch for p in decode)
    if at_slo > 0 and top < SLO_COVERAGE * at_slo:
        return (f"no decode batch near the TPOT target: the fitted profile runs {at_slo} sequences "
                f"at {slo.tpot_seconds * 1000:g} ms (context {context:.0f} tokens), the points reach "
                f"{top:.1f}; the batch at the SLO is extrapolated")
    return None


def prefill_coverage(prefill: Sequence[PrefillPoint], slo: Slo) -> str | None:
    """Why the prefill points stop short of the SLO region, or None when they reach it: the
    longest prefill measured took under :data:`SLO_COVERAGE` of the TTFT target."""
    if not prefill:
        return None
    top_ttft = max(p.ttft_seconds for p in prefill)
    if top_ttft < SLO_COVERAGE * slo.ttft_seconds:
        longest = max(p.input_tokens for p in prefill)
        return (f"no prefill near the TTFT target: the longest prompt measured ({longest:.0f} "
                f"tokens) took {top_ttft:.3f} s of a {slo.ttft_seconds:g} s target; longer "
                "prompts are extrapolated")
    return None


def coverage_warnings(profile: Profile, decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint],
                      slo: Slo) -> list[str]:
    """Where the fitted profile is an extrapolation of the points in the SLO region (the rule
    ``pdscale profile run`` also stops its grids by)."""
    found = (decode_coverage(profile, decode, slo), prefill_coverage(prefill, slo))
    return [w for w in found if w is not None]


def form_warnings(fits: dict[str, RoleFit | None]) -> list[str]:
    """A warning per role whose residuals exceed :data:`MAX_RMS_RESIDUAL`: the model's form
    (``overhead + (n + n^2/2L)/R``; ``step + B (per_sequence + C per_context)``) cannot follow
    those points, so the planner would plan with a curve that misses them."""
    forms = {"prefill": "overhead + (n + n^2/2L)/R", "decode": "step + B x (per_sequence + C x per_context)"}
    warnings = []
    for role, fit in fits.items():
        if fit is None or fit.residuals.rms_relative <= MAX_RMS_RESIDUAL:
            continue
        r = fit.residuals
        warnings.append(
            f"{role}: the model's form ({forms[role]}) cannot follow the points: RMS relative "
            f"residual {r.rms_relative:.1%} (largest {r.max_relative:.1%}) over {r.points} points, "
            f"above the {MAX_RMS_RESIDUAL:.0%} bound; the planner would plan with a curve that "
            "misses them (a step or knee? see provenance.points)")
    return warnings
