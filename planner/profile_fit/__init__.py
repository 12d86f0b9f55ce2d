"""A performance profile fitted to the user's own benchmark results.

One reader per benchmark format (``dynamo_npz``, ``aiperf``, ``guidellm``, ``inference_perf``,
``sglang_bench``, ``vllm_bench``)
turns a file into points in the planner's units (:mod:`.points`); :mod:`.fit` least-squares
fits the model's parametric terms to them (pure); :mod:`.document` makes the profile document with
its provenance. ``pdscale profile fit`` is the command.
"""

from .document import FittedProfile, fit_profile, prefill_compute_points
from .fit import (
    MAX_RMS_RESIDUAL,
    FitError,
    RoleFit,
    TermFit,
    coverage_warnings,
    decode_coverage,
    fit_decode,
    fit_prefill,
    form_warnings,
    prefill_coverage,
)
from .points import Benchmark, BenchmarkError, DecodePoint, PrefillPoint, RequestRecord
from .read import READERS, detect_format, read_benchmark

__all__ = [
    "MAX_RMS_RESIDUAL",
    "READERS",
    "Benchmark",
    "BenchmarkError",
    "DecodePoint",
    "FitError",
    "FittedProfile",
    "PrefillPoint",
    "RequestRecord",
    "RoleFit",
    "TermFit",
    "coverage_warnings",
    "decode_coverage",
    "detect_format",
    "fit_decode",
    "fit_prefill",
    "fit_profile",
    "form_warnings",
    "prefill_compute_points",
    "prefill_coverage",
    "read_benchmark",
]
