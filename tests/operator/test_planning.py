"""The planner's pure edges in the operator: spec -> config, decision -> status/Event,
and the planner's memory surviving a restart as JSON."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import yaml

from pdscale.operator.api.pdcluster import PDClusterSpec, PlannerMode, PlannerSchedule
from pdscale.operator.loop.planning import (
    calibration_for_profile,
    decision_event,
    decision_status,
    history_from_json,
    history_keep,
    history_to_json,
    planner_config,
    profile_identity,
    remembered_profile,
)
from pdscale.planner.decision import Decision
from pdscale.planner.model import Calibration, Load
from pdscale.planner.observe import Observation, Reading, RoleState
from pdscale.planner.profile import shipped_profile
from pdscale.planner.prometheus import MetricsSnapshot
from pdscale.planner.seasonal import SeasonalMemory
from pdscale.planner.solve import History, lead_intervals, plan, step

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
    # the scale-down window: unset, HPA's 300 s plus this deployment's warm-up; set, as given
    assert spec.planner.stabilization_window_seconds is None
    assert cfg.stabilization_seconds == 300 + warm
    spec.planner.stabilization_window_seconds = 120
    assert planner_config(spec).stabilization_seconds == 120


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
    assert s["metrics"] == "no metrics read (no data)"


def test_events_only_when_something_changed():
    assert decision_event(decision(), decision()) is None
    kind, reason, msg = decision_event(decision(5, 8), decision())
    assert (kind, reason) == ("Normal", "PlannerDecision") and msg.startswith("4P8D -> 5P8D")
    assert decision_event(decision(held=True), decision())[1] == "PlannerHolding"
    assert decision_event(decision(shortfall=True), decision())[0] == "Warning"


def test_history_survives_a_round_trip():
    h = History(loads=(Load(10, 2000, 500, 0.6), Load(10, 2000, 500, 0.6, peak_rate_rps=42.0), None,
                       Load(10, 2000, 500, 0.6, input_tokens_square_ratio=2.7)),
                decisions=(decision(ttft=math.inf),),
                calibration=Calibration(decode_headroom=1.3, samples=4))
    back, last = history_from_json(history_to_json(h, 120.0))
    assert last == 120.0
    assert back.loads == h.loads
    assert back.calibration == h.calibration  # a restarted operator keeps what it learned
    assert back.decisions[0].prefill == 4 and math.isinf(back.decisions[0].predicted_ttft_seconds)
    assert back.decisions[0].plan == ((4, 8), (5, 8))


def test_the_memory_keeps_every_history_field_the_planner_reads():
    # the operator plans from its stored memory every tick (planner_loop): a History field the
    # JSON drops is one the live planner never has, while the replays (simulated and from
    # Prometheus) carry History in process and do. A new field fails here until it is stored
    h = History(loads=(Load(10, 2000, 500, 0.6, peak_rate_rps=30.0, input_tokens_square_ratio=2.0),),
                decisions=(decision(),),
                calibration=Calibration(prefill_factor=1.2, decode_factor=0.9, samples=3,
                                        prefill_headroom=1.1, decode_headroom=1.3),
                prefill_queue=Reading(512.0, 115.0),
                season=SeasonalMemory(start_seconds=600.0, rates=(12.5, None, 13.25), count=2,
                                      seeded=True),
                earlier_rates=(8.0, None, 9.5))
    unset = [f.name for f in fields(History) if getattr(h, f.name) == getattr(History(), f.name)]
    assert unset == ["max_len"]  # (a limit of the process, not something learned)
    back, _ = history_from_json(history_to_json(h, 120.0, rates_keep=10))
    assert back == h


def test_the_memory_keeps_a_day_of_rates_and_the_loads_it_plans_with_whole():
    # loads older than the memory keeps whole leave their rate behind: the risk over the lead
    # is learned from a day of them live, as the replay (which keeps every load) learns it
    h = History(earlier_rates=(1.0, None))
    for k in range(10):
        h = h.record(Load(float(10 + k), 2000, 500, 0.6), decision())
    back, _ = history_from_json(history_to_json(h, 0.0, 4, rates_keep=9))
    assert [x.rate_rps for x in back.loads] == [16.0, 17.0, 18.0, 19.0] and len(back.decisions) == 4
    assert back.earlier_rates == (11.0, 12.0, 13.0, 14.0, 15.0)
    assert back.rates() == h.rates()[-9:]
    # room for every rate: the seeded ones are kept before the loads'
    back, _ = history_from_json(history_to_json(h, 0.0, 4, rates_keep=100))
    assert back.rates() == h.rates() and back.rates()[:3] == (1.0, None, 10.0)
    # without rates_keep, the loads alone (as before)
    back, _ = history_from_json(history_to_json(h, 0.0, 4))
    assert back.earlier_rates == () and len(back.loads) == 4
    # stored rates that are not rates are dropped, never the loads with them
    bad = history_to_json(h, 0.0, 4, rates_keep=9).replace('"earlierRates":[11.0', '"earlierRates":[-1')
    back, _ = history_from_json(bad)
    assert back.earlier_rates == () and len(back.loads) == 4


def test_a_saturated_prefill_teaches_its_speed_through_the_memory_as_in_process():
    # the throughput reading compares the prefill queue with the previous tick's: the live loop
    # gets that previous reading only from its memory
    spec = sample_spec()
    cfg = planner_config(spec)
    queue = 64.0 * 4 * 3  # three times the saturation threshold on 4 ready prefills

    def obs(t: float) -> Observation:
        r = lambda v: Reading(v, t)  # noqa: E731
        return Observation(now_seconds=t, rate_rps=r(40.0), mean_input_tokens=r(4000.0),
                           mean_output_tokens=r(300.0), prefix_hit_rate=r(0.0),
                           ttft_at_percentile_seconds=r(30.0), tpot_p50_seconds=r(0.03),
                           prefill=RoleState(ready=4, queue_depth=r(queue)),
                           decode=RoleState(ready=8, running_requests=r(100.0)))

    in_process, stored = History(), None
    for t in (0.0, cfg.interval_seconds):
        _, in_process = step(obs(t), config=cfg, history=in_process, now=t)
        remembered, _ = history_from_json(stored)
        _, after = step(obs(t), config=cfg, history=remembered, now=t)
        stored = history_to_json(after, t)
    through_memory, _ = history_from_json(stored)
    assert in_process.calibration.prefill_factor != 1.0  # learned: 40 req/s outruns 4 prefills
    assert through_memory.calibration == in_process.calibration


def test_history_keeps_the_whole_scale_down_window_and_reads_older_memories():
    spec = sample_spec()
    spec.planner.interval_seconds = 10
    cfg = planner_config(spec)  # the derived window: 300 s + 600 s warm-up = 90 intervals
    keep = history_keep(cfg)
    assert keep * cfg.interval_seconds > cfg.stabilization_seconds
    h = History()
    for k in range(keep + 10):
        h = h.record(Load(float(k), 2000, 500, 0.6), decision())
    back, _ = history_from_json(history_to_json(h, 0.0, keep))
    assert len(back.loads) == len(back.decisions) == keep and back.loads[-1].rate_rps == keep + 9
    # a memory written before the burst peak was kept
    old = '{"version":1,"lastPlanAtSeconds":5,"loads":[[1,2,3,0.5]],"decisions":[]}'
    assert history_from_json(old)[0].loads == (Load(1, 2, 3, 0.5),)
    assert history_from_json(old)[0].calibration is None  # ... and before calibration was
    # and one written before the prompts' spread was: every prompt priced at the mean
    older = '{"version":1,"lastPlanAtSeconds":5,"loads":[[1,2,3,0.5,7]],"decisions":[]}'
    assert history_from_json(older)[0].loads == (Load(1, 2, 3, 0.5, peak_rate_rps=7.0),)


def test_history_keeps_what_the_risk_over_the_lead_is_learned_from():
    # 60 s intervals, 600 s warm-up: a lead of 11 intervals; 10 leads one lead apart and the
    # forecast window before them, so that a restarted operator has learned the risk already
    # (the memory kept 64 intervals: under six leads, nothing learned after a restart)
    cfg = planner_config(sample_spec())
    lead = lead_intervals(cfg)
    assert history_keep(cfg) >= lead * (cfg.rise_min_samples + 1) + cfg.forecast_window


def test_unreadable_history_is_forgotten_not_fatal():
    assert history_from_json("{not json") == (History(), None)
    assert history_from_json(None) == (History(), None)
    short_queue = '{"version":1,"loads":[],"decisions":[],"prefillQueue":[3]}'
    assert history_from_json(short_queue) == (History(), None)


# -- the spec fields the configuration is made of ----------------------------------------------
def _moved(value: object, section: str, name: str) -> object:
    """Another valid value for a spec field (for a field of ``profile``: another shipped one)."""
    if name == "profile":
        return "article-xpyd"
    if value is None:
        return 100
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value - 1 if name == "percentile" else value + 1
    if isinstance(value, str):
        return "http://elsewhere:9090" if "url" in name else value + "-other"
    if name == "schedules":
        return [*value, PlannerSchedule(name="other", start="0 9 * * *", end="0 18 * * *",
                                        min_prefill_replicas=1)]
    if isinstance(value, list):
        return [*value, "--other"]
    raise AssertionError(f"no other value for {section}.{name} ({value!r})")


def test_the_configuration_reads_exactly_the_listed_spec_fields():
    """Each field of PLANNER_SPEC_FIELDS moves the configuration (pdscale replay lists them
    with their sources); the other fields of the same sections do not (a field read but not
    listed would go unreported in a replay)."""
    from pdscale.operator.loop.planning import PLANNER_SPEC_FIELDS

    spec = sample_spec()
    base = planner_config(spec)
    for section in ("slo", "planner", "prefill", "decode"):
        part = getattr(spec, section)
        for name in type(part).model_fields:
            value = getattr(part, name)
            if not isinstance(value, (int, str, list, type(None))) or hasattr(value, "value"):
                continue  # planner.mode and the resources: an enum and nested models
            if name == "profile_config_map":
                continue  # where the profile is, read by the operator (profile_source), not a value
            other = spec.model_copy(update={section: part.model_copy(update={
                name: _moved(value, section, name)})})
            if name == "nodes_per_instance":
                # the shipped profile states one node per instance and refuses another shape:
                # the field's effect is read through the same numbers without that statement
                free = shipped_profile(spec.planner.profile).model_copy(
                    update={"nodes_per_instance": None})
                moved = planner_config(other, free) != planner_config(spec, free)
            else:
                moved = planner_config(other) != base
            assert moved == ((section, name) in PLANNER_SPEC_FIELDS), f"{section}.{name}"


# -- the calibration belongs to the profile it was learned against -----------------------------
def test_a_profile_is_identified_by_its_numbers_not_by_where_they_came_from():
    base = shipped_profile()
    same = profile_identity(base)
    assert same.startswith(f"{base.name}@sha256:")
    assert profile_identity(base.model_copy(update={"provenance": {"fitted_at": "later"}})) == same
    refit = base.model_copy(update={"prefill": base.prefill.model_copy(update={"tokens_per_second": 24_000})})
    assert profile_identity(refit) != same  # a re-fitted file under the same name
    assert profile_identity(shipped_profile("demo-sim")) != same  # another shipped profile


def test_a_calibration_learned_against_another_profile_is_dropped_and_the_rest_kept():
    learned = Calibration(prefill_factor=1.3, decode_factor=0.9, decode_headroom=1.4, samples=12)
    h = History(loads=(Load(10, 2000, 500, 0.6),), decisions=(decision(),), calibration=learned)
    stored = history_to_json(h, 60.0, profile="a@sha256:1")
    assert remembered_profile(stored) == "a@sha256:1"
    back, _ = history_from_json(stored)
    kept, why = calibration_for_profile(back, remembered_profile(stored), "a@sha256:1")
    assert why is None and kept.calibration == learned
    reset, why = calibration_for_profile(back, remembered_profile(stored), "b@sha256:2")
    assert reset.calibration is None and reset.loads == back.loads and reset.decisions == back.decisions
    assert why is not None and "a@sha256:1 -> b@sha256:2" in why and "x1.4" in why and "12 samples" in why


def test_an_older_memory_without_a_profile_keeps_its_calibration():
    # written before the identity was kept: learned against the profile the PDCluster named
    # then, which an operator upgrade does not change; the next save records the identity
    old = ('{"version":1,"lastPlanAtSeconds":5,"loads":[],"decisions":[],'
           '"calibration":{"prefill_factor":1.2,"decode_factor":1.0,"samples":3}}')
    assert remembered_profile(old) is None
    history, _ = history_from_json(old)
    kept, why = calibration_for_profile(history, remembered_profile(old), "x@sha256:0")
    assert why is None and kept.calibration == Calibration(prefill_factor=1.2, samples=3)
    assert remembered_profile("{not json") is None and remembered_profile(None) is None
