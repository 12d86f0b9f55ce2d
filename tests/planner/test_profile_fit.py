"""Dynamo-format profiler arrays generated from a known profile (through the model's own
functions) are fitted back to it; the fit says which terms the points cannot identify and
warns when they stop short of the SLO region; ``pdscale profile fit`` writes a profile that
loads, and refuses what it cannot read with exit status 2."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from pdscale.main import main
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import Profile, load_profile, shipped_profile
from pdscale.planner.profile_fit import (
    MAX_RMS_RESIDUAL,
    READERS,
    Benchmark,
    BenchmarkError,
    DecodePoint,
    PrefillPoint,
    fit_decode,
    fit_prefill,
    fit_profile,
    read_benchmark,
)
from pdscale.profile_cmd import FORMATS

TRUTH = shipped_profile()
BASE = shipped_profile("demo-sim")  # far from the truth: a term kept from it fails the checks
TERMS = {"prefill": ("tokens_per_second", "attention_doubling_tokens", "overhead_seconds"),
         "decode": ("step_seconds", "per_sequence_seconds", "per_context_token_seconds",
                    "kv_capacity_tokens")}


def dynamo_arrays(profile: Profile, *, noise: float = 0.0, seed: int = 0,
                  contexts: tuple[float, ...] = (350, 2_250, 6_250, 12_250)) -> dict[str, np.ndarray]:
    """The arrays Dynamo's profiler saves, made by the model: the profiler's own grids (input
    lengths from 100 up, osl 500, concurrency swept to the KV limit), TTFT and ITL in ms, with
    multiplicative measurement noise."""
    model = PerformanceModel(profile)
    rng = np.random.default_rng(seed)
    kv = profile.decode.kv_capacity_tokens
    isl = np.linspace(100, 16_000, 16)  # the profiler's default granularity, to a 16k context
    ttft_ms = np.array([model.prefill_seconds(n) for n in isl]) * 1000
    ttft_ms *= 1 + noise * rng.standard_normal(len(isl))
    usage, context, itl_ms = [], [], []
    for ctx in contexts:
        for batch in (1, 16, 48, 96, 160, 256):
            usage.append(ctx * batch / kv)
            context.append(ctx)
            itl_ms.append(model.tpot_seconds(batch, ctx) * 1000 * (1 + noise * rng.standard_normal()))
    return {"prefill_isl": isl, "prefill_ttft": ttft_ms, "prefill_thpt_per_gpu": isl / ttft_ms,
            "max_kv_tokens": np.array([kv]), "x_kv_usage": np.array(usage),
            "y_context_length": np.array(context), "z_itl": np.array(itl_ms),
            "z_thpt_per_gpu": np.array(usage)}


def save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def relative_error(fitted: Profile, truth: Profile, role: str, term: str) -> float:
    got, want = getattr(getattr(fitted, role), term), getattr(getattr(truth, role), term)
    return abs(got - want) / want


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_dynamo_arrays_from_a_known_profile_are_fitted_back_within_10_percent(tmp_path, noise):
    arrays = dynamo_arrays(TRUTH, noise=noise)
    # Dynamo writes one raw_data.npz per role; both are read
    prefill = save(tmp_path / "prefill.npz", {k: v for k, v in arrays.items() if k.startswith("prefill")})
    decode = save(tmp_path / "decode.npz", {k: v for k, v in arrays.items() if not k.startswith("prefill")})
    result = fit_profile([read_benchmark(prefill), read_benchmark(decode)], BASE,
                         name="fitted", fitted_at="2026-12-02T00:00:00Z")
    for role, terms in TERMS.items():
        for term in terms:
            assert relative_error(result.profile, TRUTH, role, term) < 0.10, (role, term)
    # what the arrays cannot say stays the base's, and the provenance lists it
    assert result.profile.decode.max_batch == BASE.decode.max_batch
    assert result.profile.kv_transfer == BASE.kv_transfer
    kept = result.document["provenance"]["kept_from_base"]
    assert "decode.max_batch" in kept and "kv_transfer" in kept
    residuals = result.document["provenance"]["residuals"]
    assert residuals["prefill_compute"]["points"] == len(arrays["prefill_isl"])
    assert residuals["decode_itl"]["rms_relative"] < max(2 * noise, 1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_the_reported_standard_error_covers_the_fit_error(tmp_path, seed):
    # At 3% noise the curvature of a sweep up to 16k tokens (L = 24k) is loose: the fit must
    # say so through its relative_stderr rather than look precise.
    arrays = dynamo_arrays(TRUTH, noise=0.03, seed=seed)
    result = fit_profile([read_benchmark(save(tmp_path / "d.npz", arrays))], BASE, name="f",
                         fitted_at="-")
    terms = result.document["provenance"]["terms"]
    for role, names in TERMS.items():
        for term in names[:3]:
            stderr = terms[f"{role}.{term}"]["relative_stderr"]
            assert relative_error(result.profile, TRUTH, role, term) < 4 * stderr + 1e-3, term


def test_a_flat_prefill_is_written_flat(tmp_path):
    truth = shipped_profile("demo-sim")  # attention_doubling_tokens: null
    result = fit_profile([read_benchmark(save(tmp_path / "d.npz", dynamo_arrays(truth, noise=0.01)))],
                         TRUTH, name="f", fitted_at="-")
    assert result.profile.prefill.attention_doubling_tokens is None
    assert relative_error(result.profile, truth, "prefill", "tokens_per_second") < 0.10
    term = result.document["provenance"]["terms"]["prefill.attention_doubling_tokens"]
    assert term["identified"] is False and "flat" in term["note"]


def test_one_context_cannot_separate_per_context_from_per_sequence_cost():
    model = PerformanceModel(TRUTH)
    points = [DecodePoint(b, 2_000, model.tpot_seconds(b, 2_000)) for b in (1, 8, 32, 128)]
    fit = fit_decode(points, BASE)
    kept = fit.terms["per_context_token_seconds"]
    assert not kept.identified and "context never varies" in kept.note
    assert kept.value == BASE.decode.per_context_token_seconds
    # the slope is still right at the measured context: the fitted ITL follows the points
    assert fit.residuals.max_relative < 1e-6


def test_two_input_lengths_fit_the_linear_cost_and_keep_the_curvature():
    model = PerformanceModel(TRUTH)
    fit = fit_prefill([PrefillPoint(n, model.prefill_seconds(n)) for n in (1_000, 1_000, 4_000)], BASE)
    assert fit.terms["tokens_per_second"].identified
    assert not fit.terms["attention_doubling_tokens"].identified
    assert fit.terms["attention_doubling_tokens"].value == BASE.prefill.attention_doubling_tokens


def test_points_short_of_the_tpot_target_are_warned():
    arrays = dynamo_arrays(TRUTH)
    model = PerformanceModel(TRUTH)
    low = [DecodePoint(b, 2_000, model.tpot_seconds(b, 2_000)) for b in (1, 2, 4, 8)]
    wide = [DecodePoint(b, c, model.tpot_seconds(b, c)) for b in (1, 64, 200) for c in (500, 2_000)]
    prefill = [PrefillPoint(n, model.prefill_seconds(n)) for n in arrays["prefill_isl"]]
    slo = Slo(tpot_seconds=0.05)
    short = fit_profile([Benchmark("a", "t", tuple(prefill), tuple(low))], TRUTH, name="x",
                        fitted_at="-", slo=slo)
    assert any("no decode batch near the TPOT target" in w for w in short.warnings)
    covered = fit_profile([Benchmark("a", "t", tuple(prefill), tuple(wide))], TRUTH, name="x",
                          fitted_at="-", slo=slo)
    assert not any("TPOT" in w for w in covered.warnings)


def test_a_prefill_with_a_step_the_form_cannot_follow_is_warned_and_recorded(tmp_path, capsys):
    # A prefill that takes twice the model's time past 8k tokens (a kernel or memory regime
    # change): no overhead + (n + n^2/2L)/R follows it, and the fit must say so, naming the role
    arrays = dynamo_arrays(TRUTH, noise=0.01)
    arrays["prefill_ttft"] = np.where(arrays["prefill_isl"] > 8_000, 2.0, 1.0) * arrays["prefill_ttft"]
    npz = save(tmp_path / "raw_data.npz", arrays)
    out = tmp_path / "knee.yaml"
    assert main(["profile", "fit", str(npz), "--base", "demo-sim", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: prefill: the model's form" in err and "cannot follow the points" in err
    prov = load_profile(out).provenance
    assert prov is not None
    rms = prov["residuals"]["prefill_compute"]["rms_relative"]
    assert rms > MAX_RMS_RESIDUAL and f"{rms:.1%}" in err
    assert prov["residuals"]["prefill_compute"]["form_follows"] is False
    assert prov["residuals"]["decode_itl"]["form_follows"] is True  # decode was fine
    assert prov["residual_bound"] == {"rms_relative": MAX_RMS_RESIDUAL}
    assert any(w.startswith("prefill: the model's form") for w in prov["warnings"])


@pytest.mark.parametrize("seed", range(3))
def test_noise_on_a_form_that_holds_is_not_called_a_misfit(tmp_path, seed):
    result = fit_profile([read_benchmark(save(tmp_path / "d.npz", dynamo_arrays(TRUTH, noise=0.03,
                                                                                 seed=seed)))],
                         BASE, name="f", fitted_at="-")
    assert not any("cannot follow" in w for w in result.warnings)
    assert all(r["form_follows"] for r in result.document["provenance"]["residuals"].values())


# -- refusals of the .npz reader ----------------------------------------------------------------

def test_a_truncated_npz_is_refused_by_name(tmp_path):
    path = save(tmp_path / "raw_data.npz", dynamo_arrays(TRUTH))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(path)
    assert err.value.file == str(path) and str(path) in str(err.value)


def test_a_corrupted_member_of_the_npz_is_refused_naming_the_array(tmp_path):
    path = save(tmp_path / "raw_data.npz", dynamo_arrays(TRUTH))
    broken = tmp_path / "broken.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            payload = src.read(item)
            if item.filename == "z_itl.npy":
                payload = payload[: len(payload) - 16]  # the array's data cut short
            dst.writestr(item, payload)
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(broken)
    assert err.value.field == "z_itl"


@pytest.mark.parametrize(("change", "field"), [
    (lambda a: a.update(z_itl=a["z_itl"][:-1]), "z_itl"),
    (lambda a: a.update(prefill_ttft=np.where(np.arange(len(a["prefill_ttft"])) == 2, np.nan,
                                              a["prefill_ttft"])), "prefill_ttft[2]"),
    (lambda a: a.pop("max_kv_tokens"), "max_kv_tokens"),
    (lambda a: a.update(max_kv_tokens=np.array([0])), "max_kv_tokens"),
])
def test_an_inconsistent_npz_is_refused_naming_the_field(tmp_path, change, field):
    arrays = dynamo_arrays(TRUTH)
    change(arrays)
    path = save(tmp_path / "raw_data.npz", arrays)
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(path)
    assert err.value.field == field and f"field '{field}'" in str(err.value)


def test_a_pickled_object_array_is_never_unpickled(tmp_path):
    path = tmp_path / "raw_data.npz"
    np.savez(path, prefill_isl=np.array([object()], dtype=object), prefill_ttft=np.array([1.0]))
    with pytest.raises(BenchmarkError) as err:
        read_benchmark(path)
    assert err.value.field == "prefill_isl"


# -- the command --------------------------------------------------------------------------------

def test_the_command_writes_a_profile_that_loads_with_its_provenance(tmp_path, capsys):
    npz = save(tmp_path / "raw_data.npz", dynamo_arrays(TRUTH, noise=0.02))
    out = tmp_path / "mine.yaml"
    assert main(["profile", "fit", str(npz), "--base", "demo-sim", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert profile.name == "mine"
    assert relative_error(profile, TRUTH, "decode", "step_seconds") < 0.10
    assert profile.provenance is not None
    assert profile.provenance["base"] == "demo-sim"
    assert profile.provenance["sources"][0]["tool"] == "dynamo-profiler"
    assert profile.provenance["sources"][0]["decode_points"] == len(dynamo_arrays(TRUTH)["z_itl"])
    assert wrote_within_size_limit(out)


def wrote_within_size_limit(path: Path) -> bool:
    from pdscale.planner.profile import MAX_PROFILE_BYTES
    return path.stat().st_size < MAX_PROFILE_BYTES


def test_the_command_refuses_an_unreadable_file_with_status_2(tmp_path, capsys):
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text('{"metadata": {"request_start_ns": 1}, "metrics": {"input_seq\n')
    out = tmp_path / "mine.yaml"
    assert main(["profile", "fit", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err
    assert not out.exists()


def test_the_command_line_lists_every_reader():
    assert set(FORMATS) == set(READERS)
