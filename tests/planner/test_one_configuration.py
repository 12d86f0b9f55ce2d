"""One planner configuration: the operator, ``pdscale replay`` and the benchmarks derive it
from a PDCluster spec by the same mapping (operator/loop/planning.py: planner_config), and the
spec's SLO percentile is the one used everywhere: the solver, the PromQL quantiles, the
latencies calibration compares with the targets, and the replay's report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pdscale.main import main
from pdscale.operator.api.pdcluster import PDClusterSpec, SLOSpec
from pdscale.operator.loop.planning import PLANNER_SPEC_FIELDS, planner_config
from pdscale.operator.render.checklist import validate
from pdscale.operator.render.engines import decode_batch_cap
from pdscale.planner.model import Slo, calibrate_slo
from pdscale.planner.prometheus import render_queries
from pdscale.planner.replay import run as replay_run
from pdscale.planner.replay.fleet import Events, Fleet
from pdscale.planner.replay.interval_stats import IntervalStats
from pdscale.planner.replay.prefix_index import PrefixIndex
from pdscale.planner.replay.run import ReplaySetup, run_policy
from pdscale.planner.replay.traces import Trace, load_trace
from pdscale.replay import add_arguments, configuration_from, configure, read_spec

ROOT = Path(__file__).resolve().parents[2]
AZURE = "/work/shared/traces/azure2023/AzureLLMInferenceTrace_code.csv"
SPECS = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "bench" / "policy_bench_pdcluster.yaml"]
EMPTY = Trace(name="empty", arrival_seconds=[], input_tokens=[], output_tokens=[], hash_ids=[],
              block_tokens=512)


def operator_spec(path: Path) -> PDClusterSpec:
    """The spec as the operator reads it from the API server (defaults filled; the demo's gets
    its Prometheus URL when it is applied, which the planner's configuration does not read)."""
    raw = yaml.safe_load(path.read_text())["spec"]
    raw["planner"].setdefault("prometheusURL", "http://prometheus:9090")
    return validate(raw)[0]


def replay_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--trace", "unused", "--policy", "pdscale", *argv])


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_operator_and_the_replay_build_the_same_configuration(path: Path) -> None:
    live = planner_config(operator_spec(path))
    configured = configuration_from(replay_args("-f", str(path)))
    assert configured.config == live
    # what the replay's planner runs with (the controller's configuration) is that one too
    assert replay_run.planner_config(ReplaySetup(trace=EMPTY, planner=configured.config)) == live
    # and the output says every field came from the file or the CRD's defaults
    assert {source for _, _, source in configured.sources} <= {f"file {path}", "default"}
    # one row per field, and one for a decode batch cap in the engines' arguments
    # (sglang-glm-4p8d.yaml's decode runs --max-running-requests 128)
    capped = decode_batch_cap(configured.spec) is not None
    assert len(configured.sources) == len(PLANNER_SPEC_FIELDS) + capped


def test_a_flag_is_the_field_edited_in_the_file(tmp_path: Path) -> None:
    """The benchmark sets each trace's TTFT target as a flag on its PDCluster: the planner it
    runs is the one the operator runs for that PDCluster with the field edited."""
    bench = ROOT / "bench" / "policy_bench_pdcluster.yaml"
    doc = yaml.safe_load(bench.read_text())
    doc["spec"]["slo"]["ttftMilliseconds"] = 2000
    doc["spec"]["prefill"]["warmupSeconds"] = doc["spec"]["decode"]["warmupSeconds"] = 120
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    flagged = configure(read_spec(str(bench)), spec_source="file",
                        overrides={"--slo-ttft": 2.0, "--warmup": 120})
    assert flagged.config == planner_config(operator_spec(edited))
    # the derived values follow the flag as they follow the field
    assert flagged.config.stabilization_seconds == 300 + 120
    assert flagged.config.horizon_intervals == 10
    assert flagged.config != planner_config(operator_spec(bench))


def test_the_output_says_where_each_value_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich fits its tables to the terminal
    demo = ROOT / "examples" / "demo-sim.yaml"
    out = tmp_path / "report.json"
    code = main(["replay", "-f", str(demo), "--trace", AZURE, "--policy", "static:6P4D",
                 "--percentile", "95", "--max-decode", "12", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    fields = report["configuration"]
    assert fields["slo.percentile"] == {"value": 95, "from": "flag --percentile"}
    assert fields["decode.maxReplicas"] == {"value": 12, "from": "flag --max-decode"}
    assert fields["slo.ttftMilliseconds"] == {"value": 5000, "from": f"file {demo}"}
    assert fields["planner.profile"] == {"value": "demo-sim", "from": f"file {demo}"}
    assert fields["decode.preStopDrainSeconds"] == {"value": 10, "from": f"file {demo}"}
    assert report["slo"] == {"ttft_seconds": 5.0, "tpot_seconds": 0.05, "percentile": 0.95}
    err = capsys.readouterr().err
    row = next(line for line in err.splitlines() if "slo.percentile" in line)
    assert "95" in row and "flag --percentile" in row
    row = next(line for line in err.splitlines() if "slo.ttftMilliseconds" in line)
    assert "5000" in row and f"file {demo}" in row


def test_a_value_the_crd_refuses_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--percentile", "100"]) == 2
    assert "--percentile" in capsys.readouterr().err
    assert main(["replay", "--trace", AZURE, "--policy", "pdscale", "--slo-tpot", "0.0505"]) == 2
    assert "--slo-tpot: must be a whole number of milliseconds" in capsys.readouterr().err


def test_without_a_file_the_replay_plans_as_a_pdcluster_of_the_crd_defaults() -> None:
    configured = configuration_from(replay_args())
    assert {source for _, _, source in configured.sources} == {"default"}
    assert configured.config.slo.percentile == SLOSpec().percentile / 100
    # and a bare Slo, as the planner's own default, is the CRD's too
    assert Slo().percentile == SLOSpec().percentile / 100


# -- the percentile, everywhere ----------------------------------------------------------------
P90 = ROOT / "examples" / "demo-sim.yaml"  # slo.percentile: 90


def test_a_p90_spec_asks_prometheus_for_the_p90() -> None:
    cfg = planner_config(operator_spec(P90))
    assert cfg.slo.percentile == 0.9
    for engine in ("sglang", "vllm"):
        q = render_queries(engine, namespace="ns", pdcluster="demo", window_seconds=10,
                           percentile=cfg.slo.percentile)
        for name in ("ttft_at_percentile_seconds", "tpot_at_percentile_seconds"):
            assert q[name].startswith("histogram_quantile(0.9, "), q[name]
        assert not any("0.99" in text for text in q.values())
    with pytest.raises(ValueError, match="percentile: must be a share in"):
        render_queries("sglang", namespace="ns", pdcluster="demo", window_seconds=10, percentile=90)


def test_a_p90_spec_calibrates_on_the_p90() -> None:
    """The replay's observations carry the interval's latency at the SLO's percentile, as the
    live reader's PromQL does; a fleet whose p90 meets the target while its p99 misses it is
    not short at p90, so calibration leaves its headroom alone (at p99 it would raise it)."""
    cfg = planner_config(operator_spec(P90))
    ttfts = [0.5] * 95 + [20.0] * 5  # p90 0.5 s, p99 20 s; the target is 5 s
    fleet = Fleet(PrefixIndex(100), Events(), switch_seconds=30.0)

    def observed(percentile: float) -> float:
        stats = IntervalStats(60.0, percentile)
        stats.observe(0.0, fleet, waiting_decode=0, queued_prefill=0)
        stats.ttft.extend(ttfts)
        reading = stats.observe(60.0, fleet, waiting_decode=0,
                                queued_prefill=0).ttft_at_percentile_seconds
        assert reading is not None
        return reading.value

    at_spec = observed(cfg.slo.percentile)
    assert at_spec == pytest.approx(float(np.quantile(ttfts, 0.9)))
    kept = calibrate_slo(cfg.model, ttft_at_percentile_seconds=at_spec,
                         tpot_at_percentile_seconds=None, slo=cfg.slo, prefill_settled=True,
                         decode_settled=True)
    assert kept.calibration.prefill_headroom == 1.0
    raised = calibrate_slo(cfg.model, ttft_at_percentile_seconds=observed(0.99),
                           tpot_at_percentile_seconds=None, slo=cfg.slo, prefill_settled=True,
                         decode_settled=True)
    assert raised.calibration.prefill_headroom > 1.0


def test_a_p90_spec_reports_at_the_p90() -> None:
    configured = configuration_from(replay_args("-f", str(P90)))
    trace = load_trace(AZURE)
    report = run_policy(ReplaySetup(trace=trace, planner=configured.config), "static:6P4D")
    assert report["slo"]["percentile"] == 0.9
    assert report["ttft_at_percentile"] == report["ttft_p90"]
    assert report["tpot_at_percentile"] == report["tpot_p90"]
    assert report["slo_met"] == (report["slo_attainment"] >= 0.9)
    # static:best aims at the SLO's share of requests
    assert ReplaySetup(trace=trace, planner=configured.config).attainment_target == 0.9
