"""The fitted profile as a document: the base profile's fields, the fitted terms in their
place, and a ``provenance`` block saying where each number came from and how well the form
followed the points (pure: the caller writes it and supplies the date)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model import PerformanceModel, Slo
from ..profile import Profile, parse_profile
from .fit import (
    MAX_RMS_RESIDUAL,
    FitError,
    RoleFit,
    coverage_warnings,
    fit_decode,
    fit_prefill,
    form_warnings,
)
from .points import Benchmark, DecodePoint, PrefillPoint

#: points kept in the provenance per role (evenly thinned beyond): enough to re-fit or plot,
#: small enough for the profile's size limit
MAX_POINTS_KEPT = 300


@dataclass(frozen=True)
class FittedProfile:
    profile: Profile
    document: dict[str, Any]
    warnings: tuple[str, ...]


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def _terms(fit: RoleFit | None, role: str) -> dict[str, Any]:
    if fit is None:
        return {}
    out = {}
    for name, term in fit.terms.items():
        entry: dict[str, Any] = {"value": _round(term.value), "identified": term.identified}
        if term.relative_stderr is not None:
            entry["relative_stderr"] = _round(term.relative_stderr, 3)
        if term.note:
            entry["note"] = term.note
        out[f"{role}.{name}"] = entry
    return out


def _residuals(fit: RoleFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    r = fit.residuals
    return {"points": r.points, "rms_relative": _round(r.rms_relative, 4),
            "max_relative": _round(r.max_relative, 4), "rms_seconds": _round(r.rms_seconds, 4),
            # False: the RMS is over MAX_RMS_RESIDUAL, the form cannot follow the points
            "form_follows": r.rms_relative <= MAX_RMS_RESIDUAL}


def _thin(rows: list[list[float | None]]) -> list[list[float | None]]:
    if len(rows) <= MAX_POINTS_KEPT:
        return rows
    step = len(rows) / MAX_POINTS_KEPT
    return [rows[int(i * step)] for i in range(MAX_POINTS_KEPT)]


def prefill_compute_points(benchmarks: Sequence[Benchmark], base: Profile,
                            kv_transfer_in_ttft: bool | None) -> tuple[list[PrefillPoint], int]:
    """The prefill points as compute time: the TTFT less the base's KV hand-off where the TTFT
    includes it (the model adds the hand-off itself, so fitting it into the prefill would count
    it twice). Returns the points and how many were dropped for falling to zero or below."""
    transfer = PerformanceModel(base).kv_transfer_seconds
    points, dropped = [], 0
    for b in benchmarks:
        subtract = b.ttft_includes_kv_transfer if kv_transfer_in_ttft is None else kv_transfer_in_ttft
        for p in b.prefill:
            seconds = p.ttft_seconds - (transfer(p.input_tokens) if subtract else 0.0)
            if seconds > 0:
                points.append(PrefillPoint(p.input_tokens, seconds))
            else:
                dropped += 1
    return points, dropped


def _provenance(benchmarks: Sequence[Benchmark], prefill: RoleFit | None, decode: RoleFit | None,
                kv_term: dict[str, Any] | None, prefill_pts: Sequence[PrefillPoint],
                decode_pts: Sequence[DecodePoint], warnings: Sequence[str], *, fitted_at: str,
                base: str, slo: Slo, kv_transfer_in_ttft: bool | None) -> dict[str, Any]:
    """Where every number of the fitted profile came from, and how far its form is from them."""
    terms = {**_terms(prefill, "prefill"), **_terms(decode, "decode")}
    if kv_term:
        terms["decode.kv_capacity_tokens"] = kv_term
    not_identified = sorted(k for k, t in terms.items() if not t["identified"])
    not_identified += [f"decode.{k}" for k in ("kv_capacity_tokens", "max_batch")
                       if f"decode.{k}" not in terms]
    return {
        "fitted_by": "pdscale profile fit",
        "fitted_at": fitted_at,
        "base": base,
        "slo": {"ttft_seconds": slo.ttft_seconds, "tpot_seconds": slo.tpot_seconds},
        "sources": [{"file": b.source, "tool": b.tool, "prefill_points": len(b.prefill),
                     "decode_points": len(b.decode),
                     "ttft_less_kv_transfer": (b.ttft_includes_kv_transfer if kv_transfer_in_ttft is None
                                               else kv_transfer_in_ttft),
                     "recorded": b.recorded} for b in benchmarks],
        "terms": terms,
        "kept_from_base": [*not_identified, "kv_transfer", "warmup", "prefill.prefix_cache_tokens",
                           "prefill.block_tokens"],
        "residuals": {"prefill_compute": _residuals(prefill), "decode_itl": _residuals(decode)},
        # a role above it is warned: the model's form cannot follow its points
        "residual_bound": {"rms_relative": MAX_RMS_RESIDUAL},
        "warnings": list(warnings),
        "points": {
            # prefill: the TTFT less the KV hand-off where the source's TTFT included it
            "prefill_input_tokens_compute_seconds": _thin(
                [[_round(p.input_tokens), _round(p.ttft_seconds)] for p in prefill_pts]),
            "decode_batch_context_tokens_itl_seconds": _thin(
                [[_round(p.batch, 4), _round(p.mean_context_tokens), _round(p.itl_seconds)]
                 for p in decode_pts]),
        },
    }


def fit_profile(benchmarks: Sequence[Benchmark], base: Profile, *, name: str, fitted_at: str,
                slo: Slo | None = None, base_name: str | None = None,
                kv_transfer_in_ttft: bool | None = None) -> FittedProfile:
    """Fit every term the points identify; the rest come from ``base``.

    ``kv_transfer_in_ttft`` says whether the measured TTFTs include the KV hand-off (then the
    base's ``kv_transfer`` time is taken off before the prefill fit); None = as each format
    implies (a benchmark client through a PD router: yes; Dynamo's profiler: no).
    Raises :class:`FitError` when the files hold no point of either role."""
    slo = slo or Slo()
    prefill_pts, dropped = prefill_compute_points(benchmarks, base, kv_transfer_in_ttft)
    decode_pts = [p for b in benchmarks for p in b.decode]
    if not prefill_pts and not decode_pts:
        raise FitError("no prefill and no decode point in " + ", ".join(b.source for b in benchmarks))
    warnings = []
    if dropped:
        warnings.append(f"{dropped} prefill points were shorter than the base's KV transfer time "
                        "and were left out: is kv_transfer right, or were the TTFTs measured "
                        "without a PD hand-off (--no-kv-transfer-in-ttft)?")
    prefill = fit_prefill(prefill_pts, base) if prefill_pts else None
    decode = fit_decode(decode_pts, base) if decode_pts else None
    if prefill is None:
        warnings.append("no prefill point (no request alone in prefill, or none left once the KV "
                        "hand-off was taken off): prefill kept from the base")
    if decode is None:
        warnings.append("no decode point: decode kept from the base")

    data = base.model_dump(mode="json", exclude={"provenance"})
    data["name"] = name
    for role, fit in (("prefill", prefill), ("decode", decode)):
        if fit is not None:
            data[role].update({k: _round(t.value) for k, t in fit.terms.items()})
    capacities = {b.kv_capacity_tokens for b in benchmarks if b.kv_capacity_tokens is not None}
    kv_term = None
    if capacities:
        data["decode"]["kv_capacity_tokens"] = min(capacities)  # the smallest engine binds
        kv_term = {"value": min(capacities), "identified": True,
                   "note": "measured by the profiler (max_kv_tokens)"}
    fitted = parse_profile(data, source="the fitted profile")
    warnings += form_warnings({"prefill": prefill, "decode": decode})
    warnings += coverage_warnings(fitted, decode_pts, prefill_pts, slo)

    data["provenance"] = _provenance(
        benchmarks, prefill, decode, kv_term, prefill_pts, decode_pts, warnings,
        fitted_at=fitted_at, base=base_name or base.name, slo=slo,
        kv_transfer_in_ttft=kv_transfer_in_ttft)
    profile = parse_profile(data, source="the fitted profile")
    return FittedProfile(profile, data, tuple(warnings))
