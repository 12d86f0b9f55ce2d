"""The real Dynamo planner as a baseline (bench/dynamo_policy.py): what it is given.

Pure and fast: the profile as Dynamo's benchmark FPMs, the configuration, an Observation as the
snapshot its offline replay passes its adapter, and the JSON-lines protocol against a fake
driver. One test runs the real driver in Dynamo's virtual environment
(bench/dynamo/setup_venv.sh). ``make test`` builds that venv first and requires it
(PDSCALE_REQUIRE_DYNAMO=1: missing, the test fails); a bare ``pytest`` skips it, saying so."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from planner_replay_helpers import bench_module

from pdscale.planner.config import PlannerConfig
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Observation, Reading, RoleState, Warming

dp = bench_module("dynamo_policy")


# -- the profile --------------------------------------------------------------------------------


def test_prefill_fpms_are_the_profile_on_dynamos_grid(model: PerformanceModel):
    fpms = dp.benchmark_fpms(model, 8192)["prefill"]
    tokens = [f["scheduled_requests"]["sum_prefill_tokens"] for f in fpms]
    assert tokens[0] == 100 and tokens[-1] <= 8192 and len(tokens) == 9  # granularity 8
    for f, n in zip(fpms, tokens, strict=True):
        assert f["scheduled_requests"]["num_prefill_requests"] == 1
        assert f["wall_time"] == pytest.approx(model.prefill_seconds(n))


def test_decode_fpms_recover_the_profile_by_dynamos_regression_features(model: PerformanceModel):
    """Dynamo regresses decode wall time on (requests, KV tokens) with an intercept; our TPOT is
    linear in exactly those, so a least-squares fit on the FPMs gives back the profile."""
    fpms = dp.benchmark_fpms(model, 8192)["decode"]
    b = np.array([f["scheduled_requests"]["num_decode_requests"] for f in fpms], float)
    kv = np.array([f["scheduled_requests"]["sum_decode_kv_tokens"] for f in fpms], float)
    y = np.array([f["wall_time"] for f in fpms])
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(b), b, kv]), y, rcond=None)
    d = model.profile.decode
    assert coef == pytest.approx([d.step_seconds, d.per_sequence_seconds, d.per_context_token_seconds],
                                 rel=1e-6)
    assert {int(k / n) for k, n in zip(kv, b, strict=True)} == set(dp.DECODE_CONTEXTS_TOKENS)


def test_decode_fpms_stop_at_the_kv_capacity(model: PerformanceModel):
    small = model.profile.model_copy(
        update={"decode": model.profile.decode.model_copy(update={"kv_capacity_tokens": 100_000})})
    fpms = dp.benchmark_fpms(PerformanceModel(small), 8192)["decode"]
    assert fpms and all(f["scheduled_requests"]["sum_decode_kv_tokens"] <= 100_000 for f in fpms)


def test_a_chunk_below_the_sweeps_first_length_is_refused(model: PerformanceModel):
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        dp.benchmark_fpms(model, 50)


def test_capabilities_carry_the_profiles_limits(model: PerformanceModel):
    caps = dp.capabilities(model, 8192)
    p = model.profile
    assert caps["decode"] == {"num_gpu": 8, "max_num_batched_tokens": 8192,
                              "max_num_seqs": p.decode.max_batch, "max_kv_tokens": p.decode.kv_capacity_tokens}
    assert caps["prefill"]["max_num_batched_tokens"] == 8192


# -- the configuration --------------------------------------------------------------------------


def test_config_carries_our_slo_budget_and_floors_and_dynamos_own_interval(model: PerformanceModel):
    """As documented defaults: Dynamo's 180 s throughput interval (SLAPlannerDefaults), not
    ours; its load loop (FPM tuning) at our tick; load-based scaling off; the TPOT target as
    its ITL target. (Before issue 48 the throughput loop ran at our 60 s.)"""
    cfg = PlannerConfig(model=model, slo=Slo(ttft_seconds=2.0, tpot_seconds=0.05), nodes=30,
                        interval_seconds=60.0, min_prefill=2, min_decode=3)
    c = dp.dynamo_config(cfg)
    assert (c["ttft_ms"], c["itl_ms"]) == (2000.0, 50.0)
    assert c["throughput_adjustment_interval_seconds"] == 180 == dp.DYNAMO_THROUGHPUT_INTERVAL_SECONDS
    assert c["load_adjustment_interval_seconds"] == 60 and c["enable_load_scaling"] is False
    assert c["scheduling"] == {"scale_interval_seconds": 60.0}
    assert c["max_gpu_budget"] == 30 * 8 and c["prefill_engine_num_gpu"] == 8
    assert (c["prefill_min_endpoint"], c["decode_min_endpoint"]) == (2, 3)
    assert c["optimization_target"] == "sla" and c["mode"] == "disagg"


def test_tuned_config_turns_load_scaling_on_with_a_mean_itl_margin(model: PerformanceModel):
    """Tuned as Dynamo's planner guide recommends for bursty traffic: both loops, the
    throughput one the longer (180 s), and ITL 40 ms for a 50 ms p99 TPOT."""
    cfg = PlannerConfig(model=model, slo=Slo(ttft_seconds=2.0, tpot_seconds=0.05), interval_seconds=60.0)
    c = dp.dynamo_config(cfg, dp.TUNED)
    assert dp.settings_for("dynamo:tuned") is dp.TUNED and dp.settings_for("dynamo") is dp.DEFAULTS
    assert c["enable_load_scaling"] is True and c["itl_ms"] == pytest.approx(40.0)
    assert c["ttft_ms"] == 2000.0
    assert (c["throughput_adjustment_interval_seconds"], c["load_adjustment_interval_seconds"]) == (180, 60)


def test_dynamos_own_cadence_is_a_multiple_of_ours(model: PerformanceModel):
    cfg = PlannerConfig(model=model, interval_seconds=60.0)
    what_if = dp.settings_for("dynamo@120s")
    assert dp.dynamo_config(cfg, what_if)["throughput_adjustment_interval_seconds"] == 120
    assert dp.dynamo_config(cfg, what_if)["scheduling"] == {"scale_interval_seconds": 60.0}
    with pytest.raises(ValueError, match="multiple"):
        dp.dynamo_config(cfg, dp.settings_for("dynamo@90s"))
    # the load loop must be the faster one (Dynamo's validator refuses otherwise)
    with pytest.raises(ValueError, match="longer than its load interval"):
        dp.dynamo_config(cfg, dp.DynamoSettings("x", 60, load_scaling=True))
    with pytest.raises(ValueError, match="unknown Dynamo policy"):
        dp.settings_for("dynamo-ish")


def test_a_fractional_interval_is_refused(model: PerformanceModel):
    with pytest.raises(ValueError, match="whole-second"):
        dp.dynamo_config(PlannerConfig(model=model, interval_seconds=30.5))


# -- observations -------------------------------------------------------------------------------


def obs(now: float, rate: float | None = 10.0, isl: float = 1000.0, osl: float = 100.0,
        hit: float = 0.5, ready=(4, 6), warming=(0, 0), draining=(0, 0)) -> Observation:
    def r(v):
        return None if v is None else Reading(v, now)

    def role(k):
        return RoleState(ready=ready[k], warming=tuple(Warming(now + 300) for _ in range(warming[k])),
                         draining=draining[k])

    return Observation(now_seconds=now, rate_rps=r(rate), mean_input_tokens=r(isl),
                       mean_output_tokens=r(osl), prefix_hit_rate=r(hit),
                       prefill=role(0), decode=role(1))


def test_traffic_window_merges_intervals_as_dynamos_replay_does():
    w = dp.TrafficWindow()
    w.add(obs(60, rate=10, isl=1000, osl=100, hit=0.2), 60)
    w.add(obs(120, rate=30, isl=2000, osl=300, hit=0.6), 60)
    t = w.as_traffic()
    assert t["duration_s"] == 120 and t["num_req"] == pytest.approx(2400)
    assert t["avg_isl"] == pytest.approx((600 * 1000 + 1800 * 2000) / 2400)
    assert t["avg_osl"] == pytest.approx((600 * 100 + 1800 * 300) / 2400)
    assert t["avg_kv_hit_rate"] == pytest.approx((600 * 0.2 + 1800 * 0.6) / 2400)


def test_an_interval_of_unknown_load_adds_nothing():
    w = dp.TrafficWindow()
    w.add(obs(0, rate=None), 60)
    assert w.as_traffic() is None
    w.add(obs(60, rate=0.0), 60)  # measured idle is a measurement
    assert w.as_traffic()["duration_s"] == 60 and w.as_traffic()["num_req"] == 0


def test_snapshot_counts_non_draining_as_active_plus_starting():
    """As Dynamo's replay bridge does (non_draining = active + starting); before issue 48 the
    harness counted ready only, so a warming worker looked missing and Dynamo re-ordered it."""
    s = dp.snapshot(obs(90, ready=(3, 5), warming=(2, 0), draining=(0, 1)), 90.0, None, 4)
    assert (s["active_prefill_count"], s["active_decode_count"]) == (3, 5)
    assert (s["non_draining_prefill_count"], s["non_draining_decode_count"]) == (5, 5)
    assert len(s["starting_prefill_ids"]) == 2 and len(s["draining_decode_ids"]) == 1
    ids = [i for k, v in s.items() if k.endswith("_ids") for i in v]
    assert len(ids) == len(set(ids)) == 11
    assert s["tick_ordinal"] == 4 and s["now_ms"] == 90_000 and "traffic" not in s
    assert s["prefill_fpm_snapshots"] == [] and s["decode_fpm_snapshots"] == []


def passes() -> list:
    return [dp.ForwardPass("prefill", 7, 0.25, prefill_requests=2, prefill_tokens=8192,
                           prefill_kv_tokens=1024, queued_prefill_requests=3, queued_prefill_tokens=30_000),
            dp.ForwardPass("prefill", 9, 0.0),
            dp.ForwardPass("decode", 8, 0.03, decode_requests=40, decode_kv_tokens=200_000,
                           queued_decode_requests=1, queued_decode_kv_tokens=4000)]


def test_snapshot_sends_each_ready_instances_pass_as_its_fpm():
    """The replay's passes as the FPM records Dynamo's bridge hands the adapter (the fields of
    ``fpm_snapshots_to_json``), each worker its instance id, those ids the active ones."""
    s = dp.snapshot(obs(60, ready=(2, 1), warming=(1, 0)), 60.0, None, 0, passes())
    assert s["active_prefill_ids"] == [7, 9] and s["active_decode_ids"] == [8]
    assert s["non_draining_prefill_count"] == 3
    assert not set(s["starting_prefill_ids"]) & {7, 8, 9}
    p7, p9 = s["prefill_fpm_snapshots"]
    assert p7 == {"worker_id": 7, "dp_rank": 0, "wall_time": 0.25, "num_prefill_requests": 2,
                  "sum_prefill_tokens": 8192, "var_prefill_length": 0.0, "sum_prefill_kv_tokens": 1024,
                  "num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.0,
                  "num_queued_prefill": 3, "sum_queued_prefill_tokens": 30_000,
                  "var_queued_prefill_length": 0.0, "num_queued_decode": 0,
                  "sum_queued_decode_kv_tokens": 0, "var_queued_decode_kv_tokens": 0.0}
    assert p9["wall_time"] == 0.0 and p9["num_prefill_requests"] == 0  # idle: the heartbeat
    (d8,) = s["decode_fpm_snapshots"]
    assert (d8["num_decode_requests"], d8["sum_decode_kv_tokens"], d8["num_queued_decode"]) == (40, 200_000, 1)


def test_the_replay_hands_each_ready_instances_latest_pass_at_every_tick(model: PerformanceModel):
    """A controller with ``see_forward_passes`` gets, before each tick, one pass per ready
    instance, priced as the replay prices it (a decode step at the model's TPOT)."""
    from planner_replay_helpers import replay_setup

    from pdscale.planner.replay.run import simulate_fleet
    from pdscale.planner.replay.traces import Trace

    n = 4000  # 3 req/s for 22 minutes, past the first warm-up
    trace = Trace(name="flat", arrival_seconds=[i / 3 for i in range(n)], input_tokens=[8000] * n,
                  output_tokens=[200] * n, hash_ids=[()] * n, block_tokens=512)
    seen: list[tuple[float, list, Observation]] = []

    class Probe:
        def see_forward_passes(self, now, ps):
            seen.append((now, list(ps), None))

        def __call__(self, o):
            now, ps, _ = seen[-1]
            seen[-1] = (now, ps, o)
            return (1, 2)

    simulate_fleet(replay_setup(trace, ttft_seconds=5.0), (1, 2), Probe(), None)
    assert len(seen) >= 4
    busy = [p for _, ps, _ in seen for p in ps if p.wall_seconds > 0]
    for now, ps, o in seen:
        assert o is not None and o.now_seconds == now
        assert sum(p.role == "prefill" for p in ps) == o.prefill.ready
        assert sum(p.role == "decode" for p in ps) == o.decode.ready
    prefill = [p for p in busy if p.role == "prefill"]
    decode = [p for p in busy if p.role == "decode"]
    assert prefill and decode
    for p in prefill:
        assert 0 < p.prefill_tokens <= 8192 and p.prefill_requests >= 1
    for p in decode:
        assert p.wall_seconds == pytest.approx(model.tpot_seconds(p.decode_requests,
                                                                  p.decode_kv_tokens / p.decode_requests), rel=1e-3)


# -- the protocol, against a fake driver ------------------------------------------------------------

FAKE_DRIVER = textwrap.dedent("""
    import json, sys
    log = open(sys.argv[1], "w")
    for line in sys.stdin:
        msg = json.loads(line)
        log.write(line); log.flush()
        if msg["type"] == "init":
            print(json.dumps({"type": "ready", "first_tick_seconds": 60.0}), flush=True)
        elif msg["type"] == "tick":
            snap = msg["snapshot"]
            if snap["tick_ordinal"] == 0:   # scale prefill up, decode unset; next tick in 120 s
                print(json.dumps({"type": "decision", "target_prefill": snap["active_prefill_count"] + 2,
                                  "target_decode": None, "next_tick_seconds": 180.0}), flush=True)
            elif snap["tick_ordinal"] == 1:
                print(json.dumps({"type": "error", "message": "planner exploded"}), flush=True)
        elif msg["type"] == "finalize":
            print(json.dumps({"type": "bye"}), flush=True)
            break
""")


@pytest.fixture
def fake(tmp_path: Path):
    script = tmp_path / "fake_driver.py"
    script.write_text(FAKE_DRIVER)
    log = tmp_path / "received.jsonl"
    client = dp.DriverClient([sys.executable, str(script), str(log)])
    yield client, log
    client.close()


def test_controller_ticks_on_dynamos_schedule_with_the_traffic_since_its_last_tick(fake):
    client, log = fake
    ready = client.request({"type": "init"}, "ready")
    ctl = dp.DynamoController(client, 60.0, ready["first_tick_seconds"])
    assert ctl(obs(1000.0, rate=None)) == (4, 6)          # t = 0: before its first tick
    ctl.see_forward_passes(1060.0, passes())              # what the replay hands over first
    assert ctl(obs(1060.0, rate=10, ready=(2, 1))) == (4, 6)  # t = 60: first tick, prefill +2
    assert ctl(obs(1120.0, rate=20)) == (4, 6)            # t = 120: not due (next at 180)
    with pytest.raises(dp.DynamoDriverError, match="planner exploded"):
        ctl(obs(1180.0, rate=40))                         # t = 180: due, window of 2 intervals
    ticks = [json.loads(x) for x in log.read_text().splitlines() if '"tick"' in x]
    assert [t["snapshot"]["now_ms"] for t in ticks] == [60_000, 180_000]
    assert ticks[0]["snapshot"]["traffic"]["num_req"] == pytest.approx(600)
    # the passes went with the tick (the harness sent no FPMs before issue 48)
    assert [f["worker_id"] for f in ticks[0]["snapshot"]["prefill_fpm_snapshots"]] == [7, 9]
    assert ticks[0]["snapshot"]["active_decode_ids"] == [8]
    second = ticks[1]["snapshot"]["traffic"]
    assert second["duration_s"] == 120 and second["num_req"] == pytest.approx(1200 + 2400)


def test_a_driver_that_dies_is_reported_with_its_stderr(tmp_path: Path):
    script = tmp_path / "dies.py"
    script.write_text("import sys; sys.stderr.write('no module named dynamo'); sys.exit(3)\n")
    client = dp.DriverClient([sys.executable, str(script)])
    with pytest.raises(dp.DynamoDriverError, match="no module named dynamo"):
        client.request({"type": "init"}, "ready")
    client.close()


def test_what_the_driver_leaves_in_its_temp_dir_goes_with_it(tmp_path: Path):
    # as Dynamo does at import: a logging config in the temp dir, never removed
    script = tmp_path / "leaves.py"
    script.write_text("import sys, tempfile\n"
                      "sys.stderr.write(tempfile.mkstemp(suffix='.json')[1]); sys.exit(3)\n")
    client = dp.DriverClient([sys.executable, str(script)])
    with pytest.raises(dp.DynamoDriverError):
        client.request({"type": "init"}, "ready")
    left = Path(client.stderr_tail())
    client.close()
    assert left.parent == Path(client.scratch.name) and not left.parent.exists()


def test_a_missing_venv_names_the_setup_script(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"setup_venv\.sh"):
        dp.venv_python(tmp_path / "nowhere")


# -- the real driver (opt-in) ----------------------------------------------------------------------


def _venv_or_skip() -> Path:
    """The venv, or a skip where it is not set up; under ``make test``
    (PDSCALE_REQUIRE_DYNAMO=1, the venv built first) a failure, so CI cannot skip them."""
    try:
        return dp.venv_python()
    except FileNotFoundError as e:
        if os.environ.get("PDSCALE_REQUIRE_DYNAMO") == "1":
            pytest.fail(f"PDSCALE_REQUIRE_DYNAMO=1 but Dynamo's venv is not set up ({e})")
        pytest.skip(f"Dynamo's venv is not set up ({e})")


@pytest.mark.slow
def test_the_real_dynamo_planner_sizes_from_our_profile(model: PerformanceModel):
    """Dynamo 1.6.1 in its venv, bootstrapped with our profile, one tick of known traffic: its
    per-engine capacities are our model's (decode exact: its regression is our TPOT's form;
    prefill within 15%: it prices a long prompt as chunks, without attention growth), and its
    targets are the load over those capacities."""
    _venv_or_skip()
    cfg = PlannerConfig(model=model, slo=Slo(ttft_seconds=15.0, tpot_seconds=0.05), nodes=200,
                        interval_seconds=60.0)
    from pdscale.planner.replay.run import ReplaySetup
    from pdscale.planner.replay.traces import Trace

    setup = ReplaySetup(trace=Trace.__new__(Trace), planner=cfg)
    client = dp.DriverClient.start()
    try:
        # its throughput loop at our interval, so that the first tick sizes from traffic
        _, ready = dp.start_session(setup, client, dp.settings_for("dynamo@60s"))
        assert ready["perf_model"]["decode"]["readiness"] == "ready"
        assert ready["planner_config"]["ttft_ms"] == 15000.0
        ctl = dp.DynamoController(client, 60.0, ready["first_tick_seconds"])
        ctl(obs(0.0, rate=None, ready=(10, 10)))
        p, d = ctl(obs(60.0, rate=20.0, isl=4000.0, osl=500.0, hit=0.0, ready=(10, 10)))
    finally:
        client.close()
    tick = ctl.log[-1]
    assert tick["engine_rps_prefill"] == pytest.approx(1.0 / model.prefill_seconds(4000), rel=0.15)
    ctx = 4000 + 500 // 2
    b = model.decode_batch_at_slo(0.05, ctx)
    assert tick["engine_rps_decode"] == pytest.approx(b / (500 * model.tpot_seconds(b, ctx)), rel=0.02)
    # targets: the predicted load over those capacities, at most 8 replicas from the current
    # 10 per step (max_throughput_scaling_replicas, a Dynamo default)
    demand_rps = tick["predicted_num_req"] / 60.0
    assert p == min(18, max(2, math.ceil(demand_rps / tick["engine_rps_prefill"])))
    assert d == min(18, max(2, math.ceil(demand_rps / tick["engine_rps_decode"])))


@pytest.mark.slow
def test_the_real_dynamo_planners_load_loop_reads_the_fpms_we_send(model: PerformanceModel):
    """Tuned (load-based scaling on), Dynamo 1.6.1 reads the passes as FPMs: a prefill queue
    far past the TTFT target scales prefill up at the first tick, before its throughput loop
    (180 s) has run; the same tick without FPMs has nothing to go on ("no_fpm_data")."""
    _venv_or_skip()
    from pdscale.planner.replay.run import ReplaySetup
    from pdscale.planner.replay.traces import Trace

    cfg = PlannerConfig(model=model, slo=Slo(ttft_seconds=2.0, tpot_seconds=0.05), nodes=200,
                        interval_seconds=60.0)
    setup = ReplaySetup(trace=Trace.__new__(Trace), planner=cfg)
    queued = [dp.ForwardPass("prefill", i, 0.4, prefill_requests=1, prefill_tokens=8192,
                             queued_prefill_requests=40, queued_prefill_tokens=400_000) for i in (0, 1)]
    decode = [dp.ForwardPass("decode", i, 0.02, decode_requests=10, decode_kv_tokens=40_000) for i in (2, 3)]
    outcomes = []
    for sent in (queued + decode, None):
        client = dp.DriverClient.start()
        try:
            _, ready = dp.start_session(setup, client, dp.TUNED)
            assert ready["planner_config"]["enable_load_scaling"] is True
            assert ready["planner_config"]["itl_ms"] == pytest.approx(40.0)
            ctl = dp.DynamoController(client, 60.0, ready["first_tick_seconds"])
            ctl(obs(0.0, rate=None, ready=(2, 2)))
            if sent is not None:
                ctl.see_forward_passes(60.0, sent)
            outcomes.append(ctl(obs(60.0, rate=5.0, isl=8000.0, osl=200.0, hit=0.0, ready=(2, 2))))
        finally:
            client.close()
        outcomes.append(ctl.log[-1])
    (p_fpm, _), with_fpm, unchanged, without = outcomes
    assert p_fpm > 2 and with_fpm["load_reason_prefill"] == "scale_up"
    assert unchanged == (2, 2) and without["load_reason"] == "no_fpm_data"


@pytest.mark.slow
def test_the_real_dynamo_planner_runs_a_replay_and_follows_a_step(model: PerformanceModel):
    """Dynamo 1.6.1 through a whole replay (``run_dynamo``, as bench/dynamo_bench.py runs it):
    15 minutes at 1 req/s then 15 at 3 req/s of Mooncake lengths. It ticks every interval,
    its targets are what the simulator applies, it stays within the budget, and the tripled
    load reaches it: after the step it orders more prefill than at any tick before it.
    Run tuned (load-based scaling on): with the documented defaults alone, the 180 s
    throughput loop and its ARIMA predictor had not raised prefill 15 minutes after the step."""
    _venv_or_skip()
    from pdscale.planner.replay.run import STACKS, ReplaySetup
    from pdscale.planner.replay.traces import read_mooncake, synthesize_from_rates

    donor = read_mooncake(Path("/work/shared/traces/mooncake/conversation_trace.jsonl"))
    trace = synthesize_from_rates([(0.0, 1.0), (900.0, 3.0), (1800.0, 0.0)], donor, seed=3)
    cfg = PlannerConfig(model=model, slo=Slo(ttft_seconds=15.0, tpot_seconds=0.05), nodes=40,
                        interval_seconds=60.0)
    # tuned: with the documented defaults alone (a 180 s throughput loop, its ARIMA
    # predictor) the step had not reached its prefill count 15 minutes later
    report = dp.run_dynamo(ReplaySetup(trace=trace, planner=cfg, **STACKS["deployed"]),
                           settings=dp.TUNED)
    ticks = report["dynamo"]["ticks"]
    assert [t["t"] for t in ticks] == [60.0 * k for k in range(1, len(ticks) + 1)]
    assert len(ticks) >= 28
    applied = {round(d["t"]): (d["prefill"], d["decode"]) for d in report["decisions"]}
    for t in ticks:
        assert applied[round(t["t"])] == (t["prefill"], t["decode"])
        assert t["prefill"] + t["decode"] <= cfg.nodes
    before = max(t["prefill"] for t in ticks if t["t"] <= 900.0)
    after = max(t["prefill"] for t in ticks if t["t"] > 900.0)
    assert after > before
    assert report["requests"] == len(trace.arrival_seconds)


# -- the comparison at matched GPU-hours ---------------------------------------------------------


def test_the_matched_row_is_pdscale_under_the_largest_budget_within_dynamos_gpu_hours() -> None:
    from planner_replay_helpers import replay_setup
    from rich.console import Console

    from pdscale.planner.replay.run import run_policy
    from pdscale.planner.replay.traces import Trace

    db = bench_module("dynamo_bench")
    n = 3000
    trace = Trace(name="flat", arrival_seconds=[1 + i / 3 for i in range(n)], input_tokens=[8000] * n,
                  output_tokens=[300] * n, hash_ids=[()] * n, block_tokens=512)

    def setup_for(nodes: int) -> tuple[None, object, None]:
        return None, replay_setup(trace, ttft_seconds=2.0, nodes=nodes), None

    spent = {b: run_policy(setup_for(b)[1], "pdscale")["gpu_hours"] for b in range(2, 9)}
    assert spent[3] < spent[6]  # the budget binds over this range
    row = db.budget_matched(setup_for, spent[5] + 1e-6, 8, Console(quiet=True))
    assert row is not None and row["gpu_hours"] <= spent[5] + 1e-6
    assert row["node_budget"] == max(b for b, g in spent.items() if g <= spent[5] + 1e-6)
    assert row["policy"].startswith("pdscale@budget")
    # even two nodes spend more: no row, rather than one that spends more than Dynamo
    assert db.budget_matched(setup_for, spent[2] / 2, 8, Console(quiet=True)) is None
    checked = db.check_against_dynamo({"pdscale": {"gpu_hours": 99.0, "slo_attainment": 0.9, "policy": "pdscale"},
                                       "dynamo": {"gpu_hours": 50.0, "slo_attainment": 0.1},
                                       row["policy"]: {**row, "gpu_hours": 49.0, "slo_attainment": 0.5}})
    assert checked["met"] and row["policy"] in checked["value"]


@pytest.mark.slow
def test_the_drivers_estimate_is_dynamos_fitted_line(model: PerformanceModel, tmp_path: Path):
    """The substitute estimator computes the line Dynamo's regression classes fit as their
    ``predict`` would (it skips sklearn's per-call validation, three quarters of a tick)."""
    python = _venv_or_skip()
    fpms = tmp_path / "fpms.json"
    fpms.write_text(json.dumps(dp.benchmark_fpms(model, 8192)))
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(dp.DRIVER.parent)!r})
        import driver
        fpms = json.load(open({str(fpms)!r}))
        worst = 0.0
        for role in ("prefill", "decode"):
            f = driver.RegressionForwardPass(role, {{}})
            f.tune_with_fpms([[x] for x in fpms[role]])
            assert f.regression._ensure_fitted()
            xs = ([[t] for t in range(1, 20000, 997)] if role == "prefill"
                  else [[b, b * c] for b in range(1, 512, 37) for c in (300, 3000, 9000)])
            for x in xs:
                ours = f._predict([float(v) for v in x])
                theirs = (f.regression._predict_wall_time(*x) if role == "prefill"
                          else f.regression._predict_2d(*x))
                worst = max(worst, abs(ours - theirs) / theirs)
        print(worst)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TMPDIR"] = str(tmp_path)  # what Dynamo's import leaves there goes with the test's dir
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-12
