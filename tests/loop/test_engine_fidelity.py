"""The replay against the HTTP simulated engines behind the real router (issue 15's check,
bench/engine_fidelity.py): the same recording, profile and fixed fleet.

What a user would notice: a replay of what the deployed stack served predicts its TTFT, TPOT
and attainment. How closely is a measurement, and load on the machine moves it: the live run
is time-compressed (4x), so a busy CPU slows it and only it (measured with about ten runnable
processes on two cores: one prefill replayed +9.9 pp in attainment and -12% in TPOT p50, two
prefills routed as live +24.7 pp and -36%; on an idle machine within 2 pp and 10%). The
figures are the benchmark's (``make bench-fidelity``: a table and out/engine_fidelity.json).
What holds on a busy machine is checked here: every request is served and replayed, the routes
are read back, the replay is never slower than the live run beyond the targets (load can only
slow the live side), and a fleet off by a little moves a replayed figure past a target (replay
against replay of the same recording: deterministic). Measured on one prefill (so that the
router has no choice to make) and two decodes, with a queue that grows over the run; the
routers' own choice of a prefill is checked apart, as the fact the replay's routing model must
follow."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest
from loop_harness import SGLANG_ROUTER, SMG

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile, scaled_profile
from pdscale.testbed.loadgen import RequestSpec, make_prompt, run_load

pytestmark = pytest.mark.slow

PROFILE, COMPRESSION, CHUNK = "demo-sim", 4.0, 8192


def bench() -> ModuleType:
    """bench/engine_fidelity.py as module ``engine_fidelity`` (bench/ is not a package)."""
    name = "engine_fidelity"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def live_then_replayed(tmp_path_factory, name: str, replay: str = "replay"):
    """The bench's case ``name`` run live, then replayed (``replay``: the report's entry
    printed beside the live figures): the module, the case, the report, the recording."""
    ef = bench()
    case = next(c for c in ef.CASES if c.name == name)
    tmp = tmp_path_factory.mktemp(f"fidelity-{name}")
    (tmp / "logs").mkdir()
    report = ef.run_case(case, profile=PROFILE, compression=COMPRESSION, chunk_tokens=CHUNK,
                         workdir=tmp / "logs", recording=tmp / "recording",
                         log=lambda msg: print(msg))  # fmt: skip
    print({k: (report["live"][k], report[replay][k]) for k in ("attainment", *ef.QUANTILES)})
    return ef, case, report, tmp / "recording" / "trace.jsonl"


@pytest.fixture(scope="module")
def one_prefill(tmp_path_factory):
    """The bench's short fleet (1 prefill, 2 decodes, about 110% prefill load, 182 requests
    over 100 model s; 25 s of wall time), live then replayed."""
    return live_then_replayed(tmp_path_factory, "1p2d-short")


TARGETS = ("attainment_pp", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
#: the targets (issue 15) with the idle machine's run-to-run noise: 1.5x, as measured (four runs
#: of two prefills routed as live: attainment -1.1 to +2.2 pp, TPOT p90 up to +10.9%)
ATTAINMENT_PP, LATENCY = 1.5 * 2.0, 1.5 * 0.10


def assert_not_slower_than_live(diff: dict, context: object) -> None:
    """The replay (replay - live) neither misses more nor runs slower than the live run beyond
    the targets. Only this side: load on the machine slows the live run alone, so the other
    side is the benchmark's to measure, not a test's to hold."""
    assert diff["attainment_pp"]["difference"] >= -ATTAINMENT_PP, context
    for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
        assert diff[key]["difference"] <= LATENCY, (key, context)


def test_replay_of_one_prefill_serves_every_request_no_slower_than_live(one_prefill):
    # idle (2026-12-02): attainment +1.6 pp, TTFT p50/p90 -1.4%/-0.6%, TPOT -1.1%/-0.5%
    _, _, report, _ = one_prefill
    live, replayed, diff = report["live"], report["replay"], report["difference"]
    assert live["failed"] == 0 and replayed["failed"] == 0
    assert replayed["requests"] == live["requests"]
    assert_not_slower_than_live(diff, (live, replayed))
    # the same prompts reach the one prefill in the same order: timing does not move this
    assert abs(diff["prefix_hit_rate_pp"]["difference"]) <= 2.0


@pytest.mark.parametrize("prefill_speed, decode_speed", [(0.9, 1.0), (1.1, 1.0), (1.0, 0.8), (1.0, 1.25)])
def test_a_replay_of_a_fleet_off_by_a_little_misses_a_target(one_prefill, prefill_speed, decode_speed):
    # the control: the same recording replayed on a fleet 10% off at prefill or 20-25% off at
    # decode moves at least one figure past its target against the replay on the true fleet,
    # so a target met is not met by luck on a case this size (measured against live:
    # prefill x0.9 -> TTFT p50 +110%; decode x1.25 -> attainment +4.9 pp). Replay against
    # replay of one recording: no live timing in the comparison, so no load either.
    from pdscale.planner.replay.traces import read_mooncake

    ef, case, report, trace_path = one_prefill
    profile = load_profile(PROFILE)
    trace = read_mooncake(trace_path, block_tokens=profile.prefill.block_tokens)
    model = PerformanceModel(scaled_profile(profile, prefill_speed=prefill_speed,
                                            decode_speed=decode_speed))  # fmt: skip
    off = ef.replay_figures(case, ef.replay(case, trace, profile=PROFILE, chunk_tokens=CHUNK,
                                            model=model), trace.output_tokens)  # fmt: skip
    missed = ef.compare(report["replay"], off)
    assert not all(missed[key]["within"] for key in TARGETS), missed


@pytest.fixture(scope="module")
def two_prefills(tmp_path_factory):
    """The bench's 2P2D case behind sglang-router (random prefill choice), live then
    replayed, once with the replay's own routers and once on the instances the live routers
    chose (read from the engines' request logs)."""
    return live_then_replayed(tmp_path_factory, "2p2d", replay="replay_routed_as_live")[2]


def test_replay_routed_as_live_of_two_prefills_is_no_slower_than_live(two_prefills):
    # Two prefills behind sglang-router, which picks one at random: the replay's own random
    # draw is one of many (20 seeds span 13 pp), so it is compared on the live draw. What is
    # left is the engines' model and the HTTP path's delay. Four idle runs (replay - live):
    # attainment -1.1 / +0.5 / +2.2 / +0.0 pp, TTFT p50 -2.7% to -5.0%, p90 -1.3% to -3.3%,
    # TPOT p50 -2.0% to +0.5%, p90 -1.8% to +10.9%; replayed with its own random router the
    # same runs were +4.4 to +18.1 pp, TTFT p90 -10% to -43%, TPOT p90 -18% to -33%.
    report = two_prefills
    routed, diff = report["replay_routed_as_live"], report["difference_routed_as_live"]
    assert report["live"]["failed"] == 0 and routed["failed"] == 0
    assert routed["requests_routed_as_live"] == routed["requests"] == report["live"]["requests"]
    # both prefills served: the routes are not one instance's by accident
    assert min(report["live"]["requests_per_prefill"]) >= 0.2 * routed["requests"]
    assert_not_slower_than_live(diff, (report["live"], routed))


def _prefills_chosen(fleet, gateway: str, n: int) -> list[int]:
    """Which of two prefills served each of ``n`` sequential requests that share a prefix."""
    ef = bench()
    extra = ef.engine_args(PROFILE, compression=20.0, chunk_tokens=CHUNK)
    prefill = [fleet.start_engine("prefill", *extra) for _ in range(2)]
    decode = [fleet.start_engine("decode", *extra)]
    fleet.start_router(prefill, decode, "--policy", "cache_aware", "--prefill-policy",
                       "cache_aware", "--decode-policy", "round_robin", gateway=gateway)  # fmt: skip
    rng = random.Random(5)
    shared = [f"s{i}" for i in range(300)]
    chosen, before = [], [0.0, 0.0]
    for k in range(n):
        spec = RequestSpec(k, "p", 0.0, 300, 2, make_prompt(rng, 300, shared, 0.7))
        (record,) = asyncio.run(run_load(fleet.router_url, [spec], timeout_seconds=30.0))
        assert record.ok, record.error
        after = [e.metric("sglang:num_requests_total") for e in prefill]
        chosen.append(next(i for i in range(2) if after[i] > before[i]))
        before = after
    return chosen


def test_sglang_router_picks_pd_prefills_at_random(fleet):
    # sglang-router 0.3.2 in PD mode with --prefill-policy cache_aware finds no prefix tree
    # for the workers' model and picks a prefill at random (its debug log: "No tree found
    # for model ..., using random worker selection"): requests of one prefix are spread.
    # The replay's deployed stack routes cache-aware (docs/replay.md); when this fails, the
    # router keeps prefixes together and the replay's rule holds for it again.
    #
    # Whether the policy gets a tree is a startup race in the router: the model's policy is
    # assigned when its first worker registers, and on a loaded machine (the full suite, two
    # cores) it was once assigned with one worker registered, after which the tree kept all
    # ten requests on one prefill. So a run that lands on one prefill is tried once more on
    # a fresh router: the race lost twice, or cache-aware routing for good, fails.
    chosen = _prefills_chosen(fleet, SGLANG_ROUTER, 10)
    if len(set(chosen)) == 1:
        chosen = _prefills_chosen(fleet, SGLANG_ROUTER, 10)
    assert len(set(chosen)) == 2, chosen  # all on one by chance: 2 / 2**10


def test_smg_keeps_a_prefix_on_one_prefill(fleet):
    # smg 1.13 does route on its approximate tree: every request of a prefix follows the
    # first (the match covers 70% of each prompt, over the 30% threshold)
    chosen = _prefills_chosen(fleet, SMG, 6)
    assert len(set(chosen)) == 1, chosen
