"""Replay from Prometheus against a real one: a live planning loop reads SGLang-named engines
through Prometheus at its plan times and exports its decisions and role states through the
operator's gauges (scraped by the same Prometheus); the replay over the run's time range reads
them back and reproduces every live decision exactly, and a tighter TTFT target asks for more,
re-planned on the live readings and simulated on a trace rebuilt from them alike.

The live loop is the operator's planning tick (``planner_loop._plan_if_due``: a fresh memory
reads the rates before its first plan, then read at now,
join the fleet's role states, ``step``, ``Reporter.decision``) driven here at a 10 s interval,
on a fleet that follows its decisions with the spec's warm-up (no API server: the role states
are what the operator would have counted from pods)."""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client import start_http_server
from test_prometheus_replay import ROOT, _Fleet, _NoKube, _spec

from pdscale.main import main
from pdscale.operator.loop.telemetry import Reporter
from pdscale.planner.prometheus import (
    observation_from,
    prometheus_client,
    rates_on_grid,
    read_metrics,
    read_rate_history,
    render_queries,
)
from pdscale.planner.recording.from_prometheus import read_recording, replay_range
from pdscale.planner.replay.ensemble import mean_decided_instances
from pdscale.planner.replay.recorded import instance_hours, matches
from pdscale.planner.solve import History, step
from pdscale.replay import configure
from pdscale.testbed.shape_change_engines import start_engines

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

NAME = "replayed"
EXAMPLE = ROOT / "examples" / "demo-sim.yaml"
SWITCH_SECONDS = 60.0  # the load's shape changes this long after the engines start


def test_replay_over_a_live_run_reproduces_its_decisions(prometheus, capsys, tmp_path):
    engines = start_engines(SWITCH_SECONDS)
    servers = list(engines.values())
    for role, server in engines.items():
        prometheus.set_targets(f"replay-{role}", [f"127.0.0.1:{server.server_address[1]}"],
                               {"namespace": "ns", "pdcluster": NAME, "role": role})
    operator_metrics, _ = start_http_server(0, addr="127.0.0.1")
    prometheus.set_targets("replay-operator", [f"127.0.0.1:{operator_metrics.server_port}"])
    try:
        spec = _spec()
        configured = configure(spec, spec_source="test", overrides={"--interval": 10})
        spec, config = configured.spec, configured.config
        queries = render_queries("sglang", namespace="ns", pdcluster=NAME,
                                 window_seconds=max(spec.planner.interval_seconds, 10),
                                 percentile=config.slo.percentile)
        client = prometheus_client(prometheus.url)
        deadline = time.monotonic() + 40
        while read_metrics(client, queries, 0.0).readings["mean_output_tokens"] is None:
            assert time.monotonic() < deadline, "Prometheus never scraped the engines"
            time.sleep(1)
        time.sleep(12)  # a whole rate window and two scrapes more

        fleet = _Fleet(warmup=float(spec.prefill.warmup_seconds))
        report = Reporter(_NoKube())  # type: ignore[arg-type]
        body = {"metadata": {"namespace": "ns", "name": NAME, "uid": "u"}}
        history, previous, live = History(), None, []
        for _ in range(8):
            now = time.time()
            if not history.loads:  # a fresh memory's first plan reads the rates before it
                points = read_rate_history(client, queries["rate_rps"], now_seconds=now,
                                           span_seconds=config.rise_history_intervals * config.interval_seconds,
                                           step_seconds=config.interval_seconds)
                history = History(earlier_rates=rates_on_grid(
                    points, now_seconds=now, step_seconds=config.interval_seconds,
                    intervals=config.rise_history_intervals))
                seeded = sum(r is not None for r in history.earlier_rates)
            snap = read_metrics(client, queries, now, at_seconds=now)  # as planner_loop reads
            obs = observation_from(snap, now, fleet.state("prefill", now), fleet.state("decode", now))
            decision, history = step(obs, config=config, history=history, now=now)
            report.decision(body, spec, decision, previous, snap, obs)
            fleet.move("prefill", decision.prefill, now)
            fleet.move("decode", decision.decode, now)
            previous = decision
            live.append(decision)
            time.sleep(max(0.0, now + config.interval_seconds - time.time()))
        time.sleep(3)  # the last decision's gauges scraped
        start, end = live[0].at_seconds - 1.0, live[-1].at_seconds + 2.0
        assert all(d.prefill and d.decode for d in live) and not all(d.held for d in live)

        recorded, ready, before = read_recording(client, "ns", NAME, start, end)
        assert [t.at_seconds for t in recorded] == [d.at_seconds for d in live]
        assert [t.live for t in recorded] == [(d.prefill, d.decode) for d in live]
        assert any(t.prefill.warming or t.decode.warming for t in recorded)
        assert not before
        replayed = replay_range(client, engine="sglang", namespace="ns", name=NAME,
                                pdcluster_label=NAME, config=config,
                                start=start, end=end, recorded=recorded, ready=ready,
                                live_interval_seconds=float(spec.planner.interval_seconds))
        assert replayed.caveats == ()
        assert seeded > 0  # the rates Prometheus held before the first plan, read both times
        assert list(replayed.decisions) == live  # every field, not only the counts
        assert matches(replayed.decisions, recorded) == (len(live), len(live))

        tight = configure(spec, spec_source="test", overrides={"--slo-ttft": 3.0}).config
        whatif = replay_range(client, engine="sglang", namespace="ns", name=NAME,
                                pdcluster_label=NAME, config=tight,
                              start=start, end=end, recorded=recorded, ready=ready,
                              live_interval_seconds=float(spec.planner.interval_seconds))
        times = [t.at_seconds for t in recorded]
        base_h = instance_hours(times, [(d.prefill, d.decode) for d in live], config.interval_seconds)
        tight_h = instance_hours(times, [(d.prefill, d.decode) for d in whatif.decisions],
                                 tight.interval_seconds)
        assert tight_h > base_h

        # the command a user runs says the same
        capsys.readouterr()
        assert main(["replay", "--prometheus", prometheus.url, "--pdcluster", f"ns/{NAME}",
                     "--start", f"{start:.3f}", "--end", f"{end:.3f}",
                     "-f", str(EXAMPLE), "--slo-ttft", "3"]) == 0
        out = " ".join(capsys.readouterr().err.split())
        assert f"replayed = live in {len(live)} of {len(live)} decisions" in out
        assert "instance-hours decided: what-if" in out and "not predicted" in out

        # and simulated: a trace rebuilt from the same readings, replayed on the simulator for
        # the spec and the what-if, says the tighter target needs more instances too
        report = tmp_path / "simulated.json"
        assert main(["replay", "--prometheus", prometheus.url, "--pdcluster", f"ns/{NAME}",
                     "--start", f"{start:.3f}", "--end", f"{end:.3f}",
                     "-f", str(EXAMPLE), "--slo-ttft", "3", "--simulate", "--json", str(report)]) == 0
        out = " ".join(capsys.readouterr().err.split())
        assert f"replayed = live in {len(live)} of {len(live)} decisions" in out
        assert "rebuilt traces against the recording" in out and "lognormal lengths" in out
        simulated = json.loads(report.read_text())
        assert simulated["replan"]["matched"] == simulated["replan"]["with_live_counts"] == len(live)
        sim = simulated["simulate"]
        assert len(sim["spec"]["members"]) == len(sim["what-if"]["members"]) == 6  # 3 seeds x 2
        assert sim["live"]["mean_instances"] == pytest.approx(mean_decided_instances(
            [d.at_seconds for d in live], [(d.prefill, d.decode) for d in live],
            config.interval_seconds))
        assert sim["recorded"]["prefix_hit_rate"] == pytest.approx(0.3, abs=0.01)
        assert (sim["what-if"]["spread"]["mean_instances"]["mean"]
                > sim["spec"]["spread"]["mean_instances"]["mean"])
        assert sim["what-if"]["minus_base"]["mean_instances"]["mean"] > 0  # on the same traces
    finally:
        operator_metrics.shutdown()
        for server in servers:
            server.shutdown()
        for job in ("replay-prefill", "replay-decode", "replay-operator"):
            prometheus.set_targets(job, [])
