"""The planner's pure edges in the operator: spec -> config, decision -> status/Event,
and the planner's memory surviving a restart as JSON."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from pdscale.operator.pdcluster import PDClusterSpec, PlannerMode
from pdscale.operator.planning import (
    decision_event,
    decision_status,
    history_from_json,
    history_to_json,
    planner_config,
)
from pdscale.planner.decision import Decision
from pdscale.planner.model import Load
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.prometheus import MetricsSnapshot
from pdscale.planner.solve import History, plan

ROOT = Path(__file__).resolve().parents[2]


def sample_spec() -> PDClusterSpec:
    body = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    return PDClusterSpec.model_validate(body["spec"])


def decision(p=4, d=8, held=False, shortfall=False, ttft=1.2) -> Decision:
    return Decision(at_seconds=60.0, prefill=p, decode=d, predicted_ttft_seconds=ttft,
                    predicted_tpot_seconds=0.03, cost_gpu_hours=1.5, explanation="because",
                    held=held, shortfall=shortfall, plan=((4, 8), (5, 8)), desired=(4, 8))


def test_config_follows_the_spec():
    spec = sample_spec()
    cfg = planner_config(spec)
    assert cfg.slo.ttft_seconds == spec.slo.ttft_milliseconds / 1000
    assert cfg.slo.percentile == spec.slo.percentile / 100
    assert cfg.min_decode == spec.decode.min_replicas and cfg.max_prefill == spec.prefill.max_replicas
    warm = max(spec.prefill.warmup_seconds, spec.decode.warmup_seconds)
    assert cfg.model.profile.warmup.new_node_seconds == warm
    # the horizon sees a new instance come online
    assert cfg.horizon_intervals * cfg.interval_seconds > warm
    assert cfg.nodes == (spec.planner.node_budget or spec.prefill.max_replicas + spec.decode.max_replicas)


def test_config_plans_for_real():
    cfg = planner_config(sample_spec())
    obs = Observation(now_seconds=0.0, rate_rps=Reading(30.0, 0.0),
                      mean_input_tokens=Reading(16000.0, 0.0),
                      mean_output_tokens=Reading(300.0, 0.0), prefix_hit_rate=Reading(0.2, 0.0),
                      prefill=RoleState(ready=4), decode=RoleState(ready=8))
    d = plan(obs, config=cfg, now=0.0)
    assert d.prefill >= 1 and d.decode >= 1 and d.explanation


def test_status_has_integer_milliseconds_and_null_for_overload():
    s = decision_status(decision(ttft=math.inf), PlannerMode.RECOMMEND,
                        MetricsSnapshot({"rate_rps": None}, {"rate_rps": "no data"}), "t")
    assert s["lastDecision"] == "4P8D" and s["recommended"] == {"prefill": 4, "decode": 8}
    assert s["predictedTTFTMilliseconds"] is None and s["predictedTPOTMilliseconds"] == 30
    assert "rate_rps: no data" in s["metrics"]


def test_events_only_when_something_changed():
    assert decision_event(decision(), decision()) is None
    kind, reason, msg = decision_event(decision(5, 8), decision())
    assert (kind, reason) == ("Normal", "PlannerDecision") and msg.startswith("4P8D -> 5P8D")
    assert decision_event(decision(held=True), decision())[1] == "PlannerHolding"
    assert decision_event(decision(shortfall=True), decision())[0] == "Warning"


def test_history_survives_a_round_trip():
    h = History(loads=(Load(10, 2000, 500, 0.6), None), decisions=(decision(ttft=math.inf),))
    back, last = history_from_json(history_to_json(h, 120.0))
    assert last == 120.0
    assert back.loads == h.loads
    assert back.decisions[0].prefill == 4 and math.isinf(back.decisions[0].predicted_ttft_seconds)
    assert back.decisions[0].plan == ((4, 8), (5, 8))


def test_unreadable_history_is_forgotten_not_fatal():
    assert history_from_json("{not json") == (History(), None)
    assert history_from_json(None) == (History(), None)
