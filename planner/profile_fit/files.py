"""Fit a profile from benchmark files and write it: what ``pdscale profile fit`` and
``pdscale profile run`` share (the command line parses flags and prints)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pdscale.planner.model import Slo
from pdscale.planner.profile import Profile, load_profile

from .document import FittedProfile, fit_profile
from .read import read_benchmark


def fit_files(files: Sequence[Path], base: Profile, *, name: str, base_name: str | None,
              fmt: str | None, slo: Slo, kv_transfer_in_ttft: bool | None,
              fitted_at: str) -> FittedProfile:
    """Read every benchmark file and fit (``profile fit``, and ``profile run`` on its runs),
    stamped ``fitted_at`` (RFC 3339, the caller's clock): raises BenchmarkError, FitError or
    ProfileError, each naming what it refuses."""
    benchmarks = [read_benchmark(path, fmt) for path in files]
    return fit_profile(benchmarks, base, name=name, base_name=base_name, fitted_at=fitted_at,
                       slo=slo, kv_transfer_in_ttft=kv_transfer_in_ttft)


def profile_text(header: str, document: dict[str, Any]) -> str:
    return header + yaml.safe_dump(document, sort_keys=False, width=100)


def write_profile(path: Path, header: str, document: dict[str, Any]) -> str:
    """Write a fitted profile; returns the text written (it loads where profiles are read)."""
    text = profile_text(header, document)
    path.write_text(text, encoding="utf-8")
    load_profile(path)  # what we write must load where profiles are read
    return text


def fitted_summary(path: Path, result: FittedProfile) -> str:
    """One line on what was written: the fitted terms and their residuals."""
    p, d = result.profile.prefill, result.profile.decode
    residuals = result.document["provenance"]["residuals"]
    return (f"wrote {path}: prefill {p.tokens_per_second:.6g} tokens/s, doubling "
            f"{p.attention_doubling_tokens}, overhead {p.overhead_seconds:.4g} s; decode step "
            f"{d.step_seconds:.4g} s + {d.per_sequence_seconds:.4g} s/sequence + "
            f"{d.per_context_token_seconds:.4g} s/context token; residuals {residuals}")
