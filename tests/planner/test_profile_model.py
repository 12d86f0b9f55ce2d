from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pdscale.planner.model import Load, PerformanceModel, Slo, calibrate
from pdscale.planner.profile import ProfileError, load_profile, parse_profile

SHIPPED = Path(__file__).parents[2] / "planner" / "profiles" / "deepseek-fp8-8xh200-sglang.yaml"


def _data() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


def test_shipped_profiles_load_and_cite_sources() -> None:
    p = load_profile()
    assert p.gpus_per_instance == 8
    text = SHIPPED.read_text()
    # every capacity number is scaled from a cited measurement
    for source in ("LMSYS", "H800", "vLLM issue #43189"):
        assert source in text
    assert load_profile("article-xpyd").prefill.tokens_per_second == 20000


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("prefill", "tokens_per_second"), -5, "prefill.tokens_per_second"),
        (("decode", "max_batch"), "lots", "decode.max_batch"),
        (("warmup", "new_node_seconds"), None, "warmup.new_node_seconds"),
        (("kv_transfer", "gigabytes_per_second"), 0, "kv_transfer.gigabytes_per_second"),
    ],
)
def test_invalid_field_is_named(path: tuple[str, str], value: object, field: str) -> None:
    data = _data()
    data[path[0]][path[1]] = value
    with pytest.raises(ProfileError, match=rf"field '{field}'"):
        parse_profile(data)


def test_missing_and_misspelt_fields_are_named() -> None:
    data = _data()
    del data["decode"]["step_seconds"]
    data["prefill"]["tokens_per_sec"] = 1
    with pytest.raises(ProfileError) as exc:
        parse_profile(data, source="x.yaml")
    msg = str(exc.value)
    assert "x.yaml" in msg
    assert "decode.step_seconds" in msg
    assert "prefill.tokens_per_sec" in msg


def test_a_decode_step_that_takes_no_time_is_refused_naming_its_fields() -> None:
    """Each decode term may be 0, not all three: every decode sizing divides by the TPOT."""
    data = _data()
    data["decode"].update(step_seconds=0, per_sequence_seconds=0, per_context_token_seconds=0)
    with pytest.raises(ProfileError, match=r"field 'decode': .*step_seconds, per_sequence_seconds "
                                           r"and per_context_token_seconds are all 0"):
        parse_profile(data)
    data["decode"]["per_sequence_seconds"] = 0.001
    assert parse_profile(data).decode.per_sequence_seconds == 0.001


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("prefill: [unclosed\n")
    with pytest.raises(ProfileError, match="not YAML"):
        load_profile(bad)


def test_prefill_time_counts_only_uncached_tokens(model: PerformanceModel) -> None:
    full = model.prefill_seconds(8000, 0)
    half = model.prefill_seconds(8000, 4000)
    assert half < full
    assert model.prefill_seconds(8000, 8000) == pytest.approx(model.profile.prefill.overhead_seconds)


@given(st.floats(1, 500), st.floats(1, 500), st.floats(0, 100_000))
def test_tpot_grows_with_batch(b1: float, b2: float, ctx: float) -> None:
    m = PerformanceModel(load_profile())
    lo, hi = sorted((b1, b2))
    assert m.tpot_seconds(lo, ctx) <= m.tpot_seconds(hi, ctx)


def test_decode_batch_at_slo_meets_the_target(model: PerformanceModel) -> None:
    b = model.decode_batch_at_slo(0.05, 3000)
    assert model.tpot_seconds(b, 3000) <= 0.05 < model.tpot_seconds(b + 1, 3000)


def test_predicted_ttft_falls_with_more_instances(model: PerformanceModel) -> None:
    load = Load(30, 8000, 300, 0.5)
    ttfts = [model.predicted_ttft_seconds(load, c, 0.99) for c in range(1, 30)]
    assert math.isinf(ttfts[0])
    finite = [t for t in ttfts if math.isfinite(t)]
    assert finite == sorted(finite, reverse=True)


def test_calibration_follows_observations_but_skips_warm_up(model: PerformanceModel) -> None:
    slow = 1.5 * model.tpot_seconds(100, 3000)
    kwargs = dict(
        observed_tpot_seconds=slow, decode_batch=100.0, decode_context_tokens=3000.0,
        observed_prefill_seconds=None, prefill_input_tokens=None, prefill_cached_tokens=None,
    )
    # a new instance's first passes (JIT, graphs) must not teach the model the fleet is slow
    assert calibrate(model, instances_warming_up=1, **kwargs) is model
    m = model
    for _ in range(30):
        m = calibrate(m, instances_warming_up=0, **kwargs)
    assert m.calibration.decode_factor == pytest.approx(1.5, rel=0.01)
    assert m.decode_batch_at_slo(0.05, 3000) < model.decode_batch_at_slo(0.05, 3000)
    # unknown readings change nothing
    same = calibrate(model, instances_warming_up=0, **{**kwargs, "observed_tpot_seconds": None})
    assert same is model


def test_instances_needed_rounds_up_and_honours_caps(model: PerformanceModel) -> None:
    load = Load(50, 6000, 400, 0.3)
    p1, d1 = model.instances_needed(load, Slo())
    p2, d2 = model.instances_needed(load, Slo(), prefill_utilization=0.5, decode_utilization=0.5)
    assert p2 >= 2 * p1 - 1 and d2 >= 2 * d1 - 1


def test_slo_feedback_raises_headroom_on_misses_only_when_settled(model: PerformanceModel) -> None:
    from pdscale.planner.model import calibrate_slo

    slo = Slo(ttft_seconds=2.0, tpot_seconds=0.05)
    load = Load(40, 8000, 300, 0.4)
    base = model.instances_needed(load, slo)
    # a miss on roles the caller does not call settled teaches nothing
    assert calibrate_slo(model, ttft_at_percentile_seconds=6.0, tpot_at_percentile_seconds=0.2, slo=slo, prefill_settled=False, decode_settled=False) is model
    m = model
    for _ in range(5):
        m = calibrate_slo(m, ttft_at_percentile_seconds=3.0, tpot_at_percentile_seconds=0.04, slo=slo, prefill_settled=True, decode_settled=True)
    assert m.calibration.prefill_headroom > 1.2
    assert m.calibration.decode_headroom == 1.0  # TPOT was met: decode untouched
    assert m.instances_needed(load, slo)[0] > base[0]
    for _ in range(500):
        m = calibrate_slo(m, ttft_at_percentile_seconds=0.1, tpot_at_percentile_seconds=None, slo=slo, prefill_settled=True, decode_settled=True)
    assert m.calibration.prefill_headroom == 1.0  # decays back, never below the model


def test_a_random_router_needs_more_prefill_for_the_same_ttft_than_a_pooling_one() -> None:
    """Behind a router that picks prefill instances at random (sglang-router 0.3.2 in PD mode)
    each instance is its own M/G/1 queue: no instance takes another's work, so the same TTFT
    percentile needs a lower utilisation than one M/G/c pool. Checked against the M/G/1 tail
    rho exp(-(1 - rho) budget / (service x Kingman)) at the count returned and one fewer."""
    import math

    from pdscale.planner.model import Load, PerformanceModel, Slo
    from pdscale.planner.profile import load_profile

    model = PerformanceModel(load_profile())
    load = Load(rate_rps=12.0, mean_input_tokens=8000, mean_output_tokens=300, prefix_hit_rate=0.0)
    slo = Slo(ttft_seconds=4.0, tpot_seconds=0.05, percentile=0.99)
    pooled = model.prefill_instances_for_ttft(load, slo, service_cv=1.5)
    split = model.prefill_instances_for_ttft(load, slo, service_cv=1.5, pooled=False)
    assert split > pooled
    service = model.prefill_seconds(8000, 0.0)
    a, kingman = 12.0 * service, (1 + 1.5**2) / 2
    budget = 4.0 - service - model.kv_transfer_seconds(8000)

    def late(c: int) -> float:
        rho = a / c
        return rho * math.exp(-(1 - rho) * budget / (service * kingman))

    assert late(split) <= 0.01 < late(split - 1)
