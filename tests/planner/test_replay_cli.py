"""``pdscale replay`` as a user runs it: a trace in, a table out, the JSON and the plot on disk,
and bad input refused with a message that names the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdscale.main import main

AZURE = "/work/shared/traces/azure2023/AzureLLMInferenceTrace_code.csv"
MOONCAKE = "/work/shared/traces/mooncake/conversation_trace.jsonl"


def test_replay_writes_the_report_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r" / "report.json", tmp_path / "plot.png"
    code = main(["replay", "--trace", AZURE, "--policy", "static:10P2D", "--slo-ttft", "2",
                 "--start-from", "hindsight", "--json", str(out), "--plot", str(png)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["policy"] == "static:10P2D" and report["requests"] == 8819
    assert report["rate_scale"] == 1.0 and report["time_scale"] == 1.0
    assert {d["prefill"] for d in report["decisions"]} == {10}
    assert sum(report["misses"].values()) == round(8819 * (1 - report["slo_attainment"]))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "slo_attainment" in table and "gpu_hours" in table and "slow decode" in table


def test_replay_refuses_a_bad_trace_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rates.csv"
    bad.write_text("window_start_s,total_rate_rps\n0,1.5\n600,lots\n")
    code = main(["replay", "--trace", str(bad), "--lengths", AZURE, "--policy", "pdscale"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{bad}:3" in err.replace("\n", "") and "total_rate_rps" in err


def test_replay_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", AZURE, "--policy", "magic"]) == 2
    assert "policy must be one of" in capsys.readouterr().err


def test_replay_stands_for_the_deployed_stack_unless_told(tmp_path: Path) -> None:
    """The default is what a PDCluster renders by default (batching engines, smg's cache-aware
    PD prefill choice, its prefill admission derived from the profile and the TTFT target);
    the ideal router is a labelled what-if; the flag's names are the replay's stacks."""
    from pdscale.planner.replay.run import STACKS
    from pdscale.replay import STACK_NAMES

    assert set(STACK_NAMES) == set(STACKS)
    stacks = {}
    for extra in ([], ["--stack", "ideal-router"], ["--router", "random"]):
        out = tmp_path / f"r{len(stacks)}.json"
        assert main(["replay", "--trace", AZURE, "--policy", "static:10P2D", "--slo-ttft", "2",
                     "--json", str(out), *extra]) == 0
        stacks[" ".join(extra)] = json.loads(out.read_text())["stack"]
    # 2 s TTFT, the default profile: 2 full passes in half the target, 1 s left to wait
    assert stacks[""] == {"name": "deployed", "engine": "sglang", "router": "smg-cache-aware",
                          "decode_router": "round-robin", "early_rejection": False,
                          "prefill_admission": {"inflight_per_instance": 2, "queue_size": 256,
                                                "queue_timeout_seconds": 1.0}}
    assert stacks["--stack ideal-router"]["router"] == "predicted-ttft"
    assert stacks["--stack ideal-router"]["early_rejection"] is True
    assert stacks["--router random"]["router"] == "random"


def test_replay_of_a_pdcluster_routes_as_its_router_is_rendered(tmp_path: Path) -> None:
    import yaml

    bench = Path(__file__).resolve().parents[2] / "bench" / "policy_bench_pdcluster.yaml"
    doc = yaml.safe_load(bench.read_text())
    doc["spec"]["router"].update(prefillPolicy="PowerOfTwo", decodePolicy="CacheAware")
    spec = tmp_path / "p2.yaml"
    spec.write_text(yaml.safe_dump(doc))
    stacks = {}
    for extra in ([], ["--decode-router", "random"], ["--stack", "ideal-router"]):
        out = tmp_path / f"r{len(stacks)}.json"
        assert main(["replay", "-f", str(spec), "--trace", AZURE, "--policy", "static:10P2D",
                     "--slo-ttft", "2", "--json", str(out), *extra]) == 0
        stacks[" ".join(extra)] = json.loads(out.read_text())["stack"]
    assert (stacks[""]["router"], stacks[""]["decode_router"]) == ("power-of-two", "cache-aware")
    assert stacks["--decode-router random"]["decode_router"] == "random"
    # a what-if stack keeps its own routing whatever the spec renders
    assert stacks["--stack ideal-router"]["decode_router"] == "least-loaded"


def test_replay_of_a_pdcluster_behind_smg_admission_replays_that_admission(tmp_path: Path) -> None:
    import yaml

    bench = Path(__file__).resolve().parents[2] / "bench" / "policy_bench_pdcluster.yaml"
    doc = yaml.safe_load(bench.read_text())
    doc["spec"]["router"].update(gateway="SMG", admission={"prefillInflightPerWorker": 4})
    spec = tmp_path / "smg.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "smg.json"
    assert main(["replay", "-f", str(spec), "--trace", AZURE, "--policy", "static:1P1D",
                 "--slo-ttft", "2.5", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    # the queue timeout as the operator derives it: 2.5 s less the engine's share (4 passes
    # of 0.39 s, at most half the target), whole seconds
    assert report["stack"]["prefill_admission"] == {
        "inflight_per_instance": 4, "queue_size": 256, "queue_timeout_seconds": 1.0}
    assert report["rejected"] > 0  # one prefill instance at 4 in flight sheds at the peaks


def test_replay_starts_from_history_and_replays_synthetic_shapes(tmp_path: Path) -> None:
    """By default the first warm-up is history, not scored, and sizes the start fleet; a
    synthetic shape replays like a trace; served-only quantiles sit beside the others."""
    out = tmp_path / "ramp.json"
    assert main(["replay", "--synthetic", "ramp", "--base-rps", "1", "--lengths", MOONCAKE,
                 "--policy", "pdscale", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["trace"].startswith("synthetic-ramp@1rps")
    assert "history" in report["initial_fleet"]["sized_from"]
    # 70 minutes at 1 req/s rising to 1.5: the scored window leaves the first 10 minutes out
    assert 3000 < report["requests"] < 70 * 60 * 1.5 - 500
    assert report["served_only"]["requests"] == report["requests"] - report["rejected"]
    assert main(["replay", "--synthetic", "ramp", "--policy", "pdscale"]) == 2  # no --lengths


def test_replay_ticks_at_a_stated_phase_of_the_interval(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A live loop's recording replays on that loop's schedule: every tick falls the stated
    seconds after a multiple of the interval; a negative phase is refused, naming the flag."""
    ticks = {}
    for phase in (None, "23"):
        out = tmp_path / f"phase{phase}.json"
        extra = [] if phase is None else ["--tick-phase-seconds", phase]
        assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--start-from", "spec",
                     "--interval", "60", "--json", str(out), *extra]) == 0
        ticks[phase] = [e["t"] for e in json.loads(out.read_text())["explanations"]]
    assert len(ticks["23"]) > 10
    assert {round(t % 60.0, 1) for t in ticks["23"]} == {23.0}
    assert {round(t % 60.0, 1) for t in ticks[None]} != {23.0}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["replay", "--trace", AZURE, "--policy", "pdscale", "--tick-phase-seconds", "-1"])
    assert "--tick-phase-seconds" in capsys.readouterr().err


def test_replay_adds_the_stacks_join_delay_to_every_new_instance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--join-delay-seconds``: every instance the planner adds serves that long after its
    warm-up (a live stack creates, schedules and lists its pod first), so it warms longer; a
    negative delay is refused, naming the flag."""
    warming = {}
    for delay in ("0", "120"):
        out = tmp_path / f"join{delay}.json"
        assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--start-from", "spec",
                     "--interval", "60", "--json", str(out), "--join-delay-seconds", delay]) == 0
        warming[delay] = json.loads(out.read_text())["instance_hours_by_state"]["warming"]
    assert warming["120"] > warming["0"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["replay", "--trace", AZURE, "--policy", "pdscale", "--join-delay-seconds", "-1"])
    assert "--join-delay-seconds" in capsys.readouterr().err


def test_replay_reads_counters_as_of_a_scrape_a_stated_lag_before_each_tick(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--scrape-seconds`` / ``--scrape-lag-seconds``: the planner reads counters as
    Prometheus last scraped them, so counters read half a minute late decide otherwise than
    counters read at the tick; a lag of a whole scrape interval, or a scrape interval of zero,
    is refused, naming the flag."""
    decided = {}
    for lag in ("0", "30"):
        out = tmp_path / f"lag{lag}.json"
        assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--start-from", "spec",
                     "--interval", "60", "--json", str(out), "--scrape-seconds", "60",
                     "--scrape-lag-seconds", lag]) == 0
        decided[lag] = [(d["prefill"], d["decode"]) for d in json.loads(out.read_text())["decisions"]]
    assert decided["0"] != decided["30"]
    capsys.readouterr()
    assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--scrape-seconds", "5",
                 "--scrape-lag-seconds", "5"]) == 2
    assert "--scrape-lag-seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", "--trace", AZURE, "--policy", "pdscale", "--scrape-seconds", "0"])
    assert "--scrape-seconds" in capsys.readouterr().err
