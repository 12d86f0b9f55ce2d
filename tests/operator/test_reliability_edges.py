"""Edges where one written value would stop or stall the operator for good: a Lease written to
hold for decades, a deletion held for days by a long drain, a rendered argument the kernel
refuses to exec."""

from __future__ import annotations

import pathlib

import pydantic
import pytest
import yaml
from test_leader import Clock, MemoryLeases, elector

from pdscale.operator.api.pdcluster import MAX_EXEC_STRING_CHARS, PDClusterSpec
from pdscale.operator.leader import MAX_LEASE_DURATION_FACTOR, Record, micro_time
from pdscale.operator.loop import drain
from pdscale.planner.observe import Role

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNEL_MAX_ARG_STRLEN = 131_072  # bytes, with the terminating NUL (32 pages of 4 KiB)


def _spec_doc() -> dict:
    return yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())["spec"]


# -- leases -------------------------------------------------------------------------------------
def test_a_lease_written_to_hold_for_decades_is_taken_after_a_bounded_wait():
    store, clock = MemoryLeases(), Clock()
    store.record = Record(holder="intruder", lease_duration_seconds=10**9,
                          renew_time=micro_time(1.7e9), acquire_time=micro_time(1.7e9))
    b = elector(store, clock, "b")
    assert not b.try_acquire_or_renew()  # first seen now
    clock.now += 15 * MAX_LEASE_DURATION_FACTOR
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b"


def test_a_renew_time_in_the_far_future_does_not_hold_the_lease():
    store, clock = MemoryLeases(), Clock()
    store.record = Record(holder="intruder", lease_duration_seconds=60,
                          renew_time=micro_time(1.7e9 + 86400 * 365 * 30))
    b = elector(store, clock, "b")  # its wall clock reads 1.7e9
    assert not b.try_acquire_or_renew()
    clock.now += 15  # its own lease duration, not the record's 60 s
    assert b.try_acquire_or_renew()


def test_a_leader_a_little_ahead_in_time_keeps_its_lease():
    store, clock = MemoryLeases(), Clock()
    store.record = Record(holder="a", lease_duration_seconds=15, renew_time=micro_time(1.7e9 + 30))
    b = elector(store, clock, "b")
    assert not b.try_acquire_or_renew()
    clock.now += 14
    assert not b.try_acquire_or_renew()


# -- drains -------------------------------------------------------------------------------------
def test_the_drain_setting_is_capped_in_the_spec_and_the_deletion_wait_is_bounded():
    doc = _spec_doc()
    doc["decode"]["preStopDrainSeconds"] = 86_400
    doc["decode"]["terminationGracePeriodSeconds"] = 86_400
    with pytest.raises(pydantic.ValidationError, match=r"preStopDrainSeconds|pre_stop_drain_seconds"):
        PDClusterSpec.model_validate(doc)
    doc["decode"]["preStopDrainSeconds"] = 3600
    spec = PDClusterSpec.model_validate(doc)
    assert drain.drain_timeout_seconds(spec, Role.DECODE) <= drain.MAX_DRAIN_TIMEOUT_SECONDS
    assert drain.deletion_timeout_seconds({"spec": doc}) <= 2 * 3600


def test_the_crd_caps_the_drain_setting_too():
    crd = yaml.safe_load((ROOT / "crds" / "pdclusters.pdscale.io.yaml").read_text())
    role = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["decode"]["properties"]
    assert role["preStopDrainSeconds"]["maximum"] == 3600


# -- exec sizes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["engine.extraArgs", "prefill.extraArgs", "router.extraArgs",
                                   "decode.env", "engine.env", "model.servedName", "model.path"])
def test_a_string_too_long_to_exec_is_refused_naming_the_field(where):
    doc = _spec_doc()
    section, key = where.split(".")
    huge = "x" * 300_000
    if key == "extraArgs":
        doc.setdefault(section, {})[key] = ["--flag", huge]
    elif key == "env":
        doc.setdefault(section, {})[key] = [{"name": "BIG", "value": huge}]
    else:
        doc[section][key] = huge
    with pytest.raises(pydantic.ValidationError) as refused:
        PDClusterSpec.model_validate(doc)
    assert key in str(refused.value) or key.replace("N", "_n") in str(refused.value)


def test_the_longest_accepted_string_fits_the_kernel_limit_in_utf8():
    assert 4 * MAX_EXEC_STRING_CHARS + len("NAME=") + 1024 < KERNEL_MAX_ARG_STRLEN
    doc = _spec_doc()
    doc["engine"]["extraArgs"] = ["é" * MAX_EXEC_STRING_CHARS]
    PDClusterSpec.model_validate(doc)  # at the bound: accepted


def test_a_vllm_model_path_that_reads_as_a_flag_is_refused():
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl-2p4d.yaml").read_text())["spec"]
    doc["model"]["path"] = "--trust-remote-code"
    with pytest.raises(pydantic.ValidationError, match="path"):
        PDClusterSpec.model_validate(doc)


# -- profiles: read with bounds -----------------------------------------------------------------
PROFILE = (ROOT / "planner" / "profiles" / "deepseek-fp8-8xh200-sglang.yaml").read_text()


@pytest.mark.parametrize(("label", "text", "field"), [
    ("infinity", PROFILE.replace("tokens_per_second:", "tokens_per_second: .inf #", 1), "tokens_per_second"),
    ("1e308", PROFILE.replace("bytes_per_token:", "bytes_per_token: 1e308 #", 1), "bytes_per_token"),
    ("1e-300", PROFILE.replace("tokens_per_second:", "tokens_per_second: 1e-300 #", 1), "tokens_per_second"),
    ("5,000 digits", PROFILE + "\nprovenance: {n: " + "9" * 5000 + "}\n", "cannot be read"),
    ("no such date", PROFILE + "\nprovenance: {d: 2001-13-45}\n", "cannot be read"),
])
def test_a_profile_configmap_is_read_with_bounds(label, text, field):
    from pdscale.operator.api.pdcluster import ProfileConfigMapRef
    from pdscale.operator.loop.profile_source import profile_from_configmap
    from pdscale.planner.profile import ProfileError

    ref = ProfileConfigMapRef(name="p", key="profile.yaml")
    with pytest.raises(ProfileError) as refused:  # never another exception, never accepted
        profile_from_configmap({"data": {"profile.yaml": text}}, ref, "ns")
    assert field in str(refused.value) and "spec.planner.profileConfigMap" in str(refused.value), label


def test_every_shipped_profile_is_within_the_bounds():
    from pdscale.planner.profile import shipped_profile, shipped_profiles

    for name in shipped_profiles():
        shipped_profile(name)
