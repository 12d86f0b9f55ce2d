"""The router's prefill admission derived from the profile and the TTFT target
(operator/render/admission.py, docs/admission.md): on by default in front of smg, explicit values
winning, one switch turning it off, and the same values in the flags, status.derived and the
note ``pdscale render`` prints."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from pdscale.operator.render import admission, router
from pdscale.operator.render.checklist import validate
from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import shipped_profile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _spec(*, ttft_ms=2000, replicas=1, admission_=None, extra=None, profile=None):
    raw = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]
    raw["router"]["replicas"] = replicas
    raw["slo"]["ttftMilliseconds"] = ttft_ms
    if admission_ is not None:
        raw["router"]["admission"] = admission_
    if extra is not None:
        raw["prefill"]["extraArgs"] = extra
    if profile is not None:
        raw["planner"]["profile"] = profile
    return validate(raw)


def test_the_cap_is_the_full_passes_in_half_the_target_and_the_timeout_what_is_left():
    pass_seconds = PerformanceModel(shipped_profile(None)).prefill_seconds(8192)
    assert pass_seconds == pytest.approx(0.3936, abs=1e-3)
    for ttft_ms, cap, timeout in ((2000, 2, 1), (15_000, 19, 7), (60_000, 76, 30)):
        spec, derived = _spec(ttft_ms=ttft_ms)
        adm = router.admission(spec)
        assert adm is not None
        assert (adm.prefill_inflight_per_worker, adm.queue_timeout_seconds) == (cap, timeout), ttft_ms
        # what the cap holds is through prefill in half the target; the wait takes the rest
        assert cap * pass_seconds <= ttft_ms / 2000 < (cap + 1) * pass_seconds
        assert timeout + cap * pass_seconds <= ttft_ms / 1000
        assert derived.as_status()["prefillInflightPerWorker"] == cap
        assert derived.as_status()["prefillQueueTimeoutSeconds"] == timeout
        assert derived.as_status()["prefillQueueSize"] == 256


def test_a_pass_of_its_own_size_and_a_slower_profile_hold_fewer():
    base = router.admission(_spec(ttft_ms=15_000)[0])
    bigger = router.admission(_spec(ttft_ms=15_000, extra=["--chunked-prefill-size", "16384"])[0])
    assert admission.pass_tokens(_spec(extra=["--chunked-prefill-size=4096"])[0]) == 4096
    slower = router.admission(_spec(ttft_ms=15_000, profile="article-xpyd")[0])
    assert base and bigger and slower
    assert bigger.prefill_inflight_per_worker < base.prefill_inflight_per_worker
    assert "16384-token passes" in bigger.reason
    assert "profile article-xpyd" in slower.reason


def test_a_prefill_slower_than_the_target_holds_one_and_waits_half_the_target():
    """demo-sim computes 250 tokens/s: a full pass (33 s) is far past its 5 s target."""
    spec, _ = _spec(ttft_ms=5000, profile="demo-sim")
    adm = router.admission(spec)
    assert adm is not None and (adm.prefill_inflight_per_worker, adm.queue_timeout_seconds) == (1, 2)


def test_router_pods_share_the_cap_since_each_counts_its_own():
    one = router.admission(_spec(ttft_ms=15_000, replicas=1)[0])
    three = router.admission(_spec(ttft_ms=15_000, replicas=3)[0])
    assert one and three
    assert three.prefill_inflight_per_worker == one.prefill_inflight_per_worker // 3
    assert "shared by 3 router pods" in three.reason


def test_explicit_values_win_field_by_field_and_enabled_false_turns_it_off():
    adm = router.admission(_spec(ttft_ms=15_000, admission_={"prefillInflightPerWorker": 8})[0])
    assert adm and adm.prefill_inflight_per_worker == 8
    assert adm.queue_timeout_seconds == 11  # 15 s less 8 x 0.394 s
    adm = router.admission(_spec(admission_={"queueTimeoutSeconds": 5, "queueSize": 9})[0])
    assert adm and (adm.prefill_inflight_per_worker, adm.queue_size, adm.queue_timeout_seconds) == (2, 9, 5)
    spec, derived = _spec(admission_={"enabled": False})
    assert router.admission(spec) is None
    assert "admission off" in router.gateway_note(spec)
    assert not {"prefillInflightPerWorker", "prefillQueueTimeoutSeconds"} & set(derived.as_status())


def test_render_says_which_gateway_it_rendered_and_why():
    spec, _ = _spec()
    note = router.gateway_note(spec)
    assert note.startswith("router: smg (the default gateway (router.gateway unset)); admission 2 per prefill")
    assert "derived: 2 in flight per prefill" in note
    raw = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]
    raw["router"]["gateway"] = "SGLangRouter"
    spec, _ = validate(raw)
    assert router.gateway_note(spec).startswith("router: sglang-router 0.3.2 (router.gateway SGLangRouter)")
