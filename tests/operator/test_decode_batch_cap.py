"""A decode batch cap in the engines' arguments is part of the instance the planner sizes and the
replay simulates: SGLang's ``--max-running-requests`` and vLLM's ``--max-num-seqs``, read from
``extraArgs`` as each engine reads them (operator/render/engines.py: decode_batch_cap)."""

from __future__ import annotations

import copy

import pytest
from test_pdc_checklist import SGLANG  # DP attention over 8 ranks, as the shipped example
from test_pdc_checklist import VLLM as VLLM_TP8

from pdscale.operator.loop.planning import planner_config
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.operator.render.engines import decode_batch_cap
from pdscale.planner.profile import capped_profile, shipped_profile
from pdscale.planner.replay.run import ReplaySetup
from pdscale.planner.replay.traces import Trace
from pdscale.replay import configure, fleet_model

#: vLLM with 2 DP ranks of TP 4
VLLM = {**VLLM_TP8, "parallelism": {"prefill": {"tensorParallelSize": 4, "dataParallelSize": 2},
                                    "decode": {"tensorParallelSize": 4, "dataParallelSize": 2}}}
EMPTY = Trace(name="empty", arrival_seconds=[], input_tokens=[], output_tokens=[], hash_ids=[],
              block_tokens=512)


def spec_with(base: dict, engine_args=(), decode_args=(), prefill_args=()):
    raw = copy.deepcopy(base)
    raw["engine"]["extraArgs"] = list(engine_args)
    raw["decode"] = {"extraArgs": list(decode_args)}
    raw["prefill"] = {"extraArgs": list(prefill_args)}
    return validate(raw)[0]


def test_no_flag_no_cap():
    assert decode_batch_cap(spec_with(SGLANG, engine_args=["--mem-fraction-static", "0.8"])) is None
    assert decode_batch_cap(spec_with(VLLM)) is None


def test_sglang_caps_the_instance_rounded_down_to_its_dp_ranks():
    assert decode_batch_cap(spec_with(SGLANG, decode_args=["--max-running-requests", "64"])) == 64
    # SGLang splits it among the 8 DP ranks and drops the remainder
    assert decode_batch_cap(spec_with(SGLANG, decode_args=["--max-running-requests=100"])) == 96


def test_vllm_caps_each_dp_rank():
    # every DP rank is an engine core with its own scheduler: 2 ranks run 2 x 16
    assert decode_batch_cap(spec_with(VLLM, decode_args=["--max-num-seqs", "16"])) == 32
    # SGLang's name means nothing to vLLM (and the reverse)
    assert decode_batch_cap(spec_with(VLLM, decode_args=["--max-running-requests", "16"])) is None


def test_the_last_one_wins_and_the_decode_role_comes_after_the_engine():
    both = spec_with(SGLANG, engine_args=["--max-running-requests", "256"],
                     decode_args=["--max-running-requests", "64"])
    assert decode_batch_cap(both) == 64  # rendered as engine args, then the role's
    twice = spec_with(SGLANG, decode_args=["--max-running-requests", "64",
                                           "--max-running-requests", "128"])
    assert decode_batch_cap(twice) == 128


def test_a_prefill_only_flag_does_not_cap_decode():
    assert decode_batch_cap(spec_with(SGLANG, prefill_args=["--max-running-requests", "8"])) is None


@pytest.mark.parametrize("args, reason", [
    (["--max-running-requests", "many"], "needs a whole number above 0, got 'many'"),
    (["--max-running-requests", "0"], "needs a whole number above 0, got '0'"),
    (["--max-running-requests"], "needs a whole number above 0, got ''"),
    (["--max-running-requests", "4"], "4 is below parallelism.decode.dataParallelSize 8"),
])
def test_a_cap_the_engine_cannot_run_is_refused_naming_the_field(args, reason):
    raw = copy.deepcopy(SGLANG)
    raw["decode"] = {"extraArgs": args}
    with pytest.raises(SpecError) as info:
        validate(raw)
    assert any(p.field == "spec.decode.extraArgs" and reason in p.message
               for p in info.value.problems), info.value.problems


def test_the_planner_sizes_decode_with_the_cap():
    plain = planner_config(spec_with(SGLANG))
    capped = planner_config(spec_with(SGLANG, decode_args=["--max-running-requests", "32"]))
    assert plain.model.profile.decode.max_batch == shipped_profile().decode.max_batch
    assert capped.model.profile.decode.max_batch == 32
    # at short contexts the TPOT target would allow far more than 32 sequences per instance
    assert plain.model.decode_batch_at_slo(plain.slo.tpot_seconds, 2000.0) > 32
    assert capped.model.decode_batch_at_slo(capped.slo.tpot_seconds, 2000.0) == 32
    # the rest of the configuration is the same
    assert capped.model.profile.model_copy(update={"decode": plain.model.profile.decode}) == \
        plain.model.profile


def test_a_cap_above_the_profiles_batch_changes_nothing():
    profile = shipped_profile()
    assert capped_profile(profile, profile.decode.max_batch * 2) == profile
    assert capped_profile(profile, None) == profile


def test_the_replayed_fleet_runs_with_the_cap_and_the_replay_says_where_it_came_from(tmp_path):
    spec = spec_with(SGLANG, decode_args=["--max-running-requests", "32"])
    configured = configure(spec, spec_source="file x.yaml")
    assert ("decode batch cap (extraArgs), sequences per instance", "32", "file x.yaml") \
        in configured.sources
    # the simulated instances are the planner's: they queue behind the same cap
    assert ReplaySetup(trace=EMPTY, planner=configured.config).fleet.profile.decode.max_batch == 32
    # a fleet of another speed, or from another profile file, runs the same engine arguments
    faster = fleet_model(configured.config, speed="1.25", decode_batch_cap=32)
    assert faster is not None and faster.profile.decode.max_batch == 32
    other = tmp_path / "other.yaml"
    other.write_text(shipped_profile().model_dump_json())
    from_file = fleet_model(configured.config, profile_path=str(other), decode_batch_cap=32)
    assert from_file is not None and from_file.profile.decode.max_batch == 32
