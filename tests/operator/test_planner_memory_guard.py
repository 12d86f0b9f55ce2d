"""The planner's memory is not trusted as read, and a write never clobbers a newer one: the
validation (pure), the loop starting afresh with a Warning Event, and the resourceVersion
precondition on the write (a 409 leaves the newer memory and is retried next tick); a
calibration learned against another profile reset, with an Event."""

from __future__ import annotations

import copy
import json
import math

from kubernetes.client.exceptions import ApiException
from test_planner_loop import NOW, NS, FakeKube, _cluster

from pdscale.operator.api import names
from pdscale.operator.loop.planner_loop import PlannerLoop
from pdscale.operator.loop.planner_memory import (
    MAX_CLOCK_SKEW_SECONDS,
    PlannerMemory,
    memory_problem,
)
from pdscale.operator.loop.planning import history_from_json, history_to_json, remembered_profile
from pdscale.operator.render.builders import PLANNER_MEMORY_KEY, planner_memory
from pdscale.planner.decision import Decision
from pdscale.planner.model import Calibration
from pdscale.planner.solve import History

OWNER = names.Owner(name="demo", namespace=NS, uid="uid-1")


def _decision(**changes: object) -> Decision:
    fields: dict = dict(at_seconds=NOW - 20, prefill=1, decode=2, predicted_ttft_seconds=0.5,
                        predicted_tpot_seconds=0.02, cost_gpu_hours=1.0, explanation="slo",
                        plan=((1, 2),), desired=(1, 2))
    fields.update(changes)
    return Decision(**fields)


def _good(last: float | None = NOW - 20) -> str:
    return history_to_json(History(decisions=(_decision(),)), last)


def _edited(edit) -> str:  # type: ignore[no-untyped-def]
    doc = json.loads(_good())
    edit(doc)
    return json.dumps(doc)


# -- validation (pure) --------------------------------------------------------------------------
def test_a_memory_the_loop_wrote_is_fit():
    assert memory_problem(_good(), NOW) is None
    assert memory_problem(_good(None), NOW) is None
    # a clock a little ahead (another replica's) is skew, not a future
    assert memory_problem(_good(NOW + MAX_CLOCK_SKEW_SECONDS - 1), NOW) is None


def test_a_future_last_plan_is_refused():
    problem = memory_problem(_good(NOW + 86400 * 365), NOW)
    assert problem is not None and "lastPlanAtSeconds" in problem and "future" in problem


def test_non_finite_and_negative_numbers_are_refused_naming_where():
    cases = {
        "lastPlanAtSeconds": lambda d: d.update(lastPlanAtSeconds=-5),
        "decisions[0].prefill": lambda d: d["decisions"][0].update(prefill=-1),
        "decisions[0].cost_gpu_hours": lambda d: d["decisions"][0].update(cost_gpu_hours=math.nan),
        "loads[0][0]": lambda d: d.update(loads=[[math.inf, 100, 40, 0.5]]),
        "calibration.prefill_factor": lambda d: d.update(calibration={"prefill_factor": -2.0}),
    }
    for where, edit in cases.items():
        problem = memory_problem(_edited(edit), NOW)
        assert problem is not None and where in problem, (where, problem)
    # JSON's own spellings of infinity and not-a-number
    assert "not finite" in (memory_problem(_good().replace('"version":1', '"version":NaN'), NOW) or "")
    assert "not finite" in (memory_problem(_good().replace('"version":1', '"version":-Infinity'), NOW) or "")


def test_a_corrupt_document_is_refused():
    for text, words in (("{not json", "not JSON"), ("[1, 2]", "not a JSON object"),
                        ('{"decisions": []}', "loads is not a list"),
                        ('{"loads": [], "decisions": {}}', "decisions is not a list"),
                        ('{"loads": [[1, 2]], "decisions": []}', "loads[0]"),
                        ('{"loads": [[1, null, 3, 4]], "decisions": []}', "loads[0]"),
                        ('{"loads": [], "decisions": [7]}', "decisions[0]"),
                        ('{"loads": [], "decisions": [], "lastPlanAtSeconds": "soon"}', "not a time"),
                        ("[" * 100_000 + "]" * 100_000, "")):
        problem = memory_problem(text, NOW)
        assert problem is not None and words in problem, (text[:40], problem)


# -- the loop: start afresh, say so -------------------------------------------------------------
def _memory(kube: FakeKube, text: str) -> None:
    cm = planner_memory(OWNER, text)
    cm["metadata"]["resourceVersion"] = "77"
    kube.objects[("ConfigMap", NS, "demo-planner")] = cm


def _ignored(kube: FakeKube) -> list[dict]:
    return [e for e in kube.events if e["reason"] == "PlannerMemoryIgnored"]


def test_a_future_timestamp_does_not_stop_planning_and_is_reported():
    kube, lists = _cluster("Recommend")
    _memory(kube, _good(4_000_000_000.0))  # the year 2096
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert kube.get("PDCluster", NS, "demo")["status"]["planner"]["recommended"]  # it planned
    [event] = _ignored(kube)
    assert event["type"] == "Warning" and "lastPlanAtSeconds" in event["message"]
    assert event["involvedObject"]["name"] == "demo"
    # the memory it wrote in its place is fit, and read back without another Event
    stored = kube.get("ConfigMap", NS, "demo-planner")["data"][PLANNER_MEMORY_KEY]
    assert memory_problem(stored, json.loads(stored)["lastPlanAtSeconds"]) is None
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert len(_ignored(kube)) == 1


def test_a_corrupt_memory_is_replaced_and_reported():
    kube, lists = _cluster("Recommend")
    _memory(kube, '{"loads": [[NaN, 1, 1, 1]], "decisions": []}')
    PlannerLoop(kube, worker_lists=lists).tick_all()
    [event] = _ignored(kube)
    assert "loads[0][0] is not finite" in event["message"]
    assert kube.status_patches, "no decision after the memory was ignored"


# -- the write: over the version read, never over a newer one -----------------------------------
class VersionedKube(FakeKube):
    """Applies honour ``metadata.resourceVersion`` as a precondition (as the API server does
    for server-side apply)."""

    def apply(self, manifest, *, force=True):  # type: ignore[no-untyped-def]
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        wanted = manifest["metadata"].get("resourceVersion")
        current = (self.objects.get(key) or {}).get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != current:
            raise ApiException(status=409, reason="Conflict")
        return super().apply(copy.deepcopy(manifest), force=force)


def test_a_write_carries_the_version_read_and_a_conflict_leaves_the_newer_memory():
    kube = VersionedKube()
    ours, theirs = PlannerMemory(kube), PlannerMemory(kube)
    assert ours.load(NS, "demo") is None
    assert ours.save(OWNER, _good(NOW - 30))          # a create
    assert ours.load(NS, "demo") == _good(NOW - 30)
    assert theirs.load(NS, "demo") is not None
    assert theirs.save(OWNER, _good(NOW - 10))        # another writer got there first
    assert not ours.save(OWNER, _good(NOW - 5))       # 409: not clobbered
    stored = kube.get("ConfigMap", NS, "demo-planner")["data"][PLANNER_MEMORY_KEY]
    assert stored == _good(NOW - 10)
    # the next tick reads the newer one and may write over it
    assert ours.load(NS, "demo") == _good(NOW - 10)
    assert ours.save(OWNER, _good(NOW))


def test_a_tick_that_loses_the_write_race_does_not_fail_and_plans_on_the_newer_memory():
    kube, lists = _cluster("Recommend")
    versioned = VersionedKube()
    versioned.objects, versioned.pods = kube.objects, kube.pods
    loop = PlannerLoop(versioned, worker_lists=lists)
    loaded = loop.memory.load

    def load_then_someone_writes(ns: str, name: str, *uid: str | None) -> str | None:
        text = loaded(ns, name, *uid)
        PlannerMemory(versioned).save(OWNER, _good(NOW))  # between our read and our write
        return text

    loop.memory.load = load_then_someone_writes  # type: ignore[method-assign]
    loop.tick_all()  # no exception escapes
    stored = versioned.get("ConfigMap", NS, "demo-planner")["data"][PLANNER_MEMORY_KEY]
    assert stored == _good(NOW)


# -- a new profile: what was learned against the old one is reset, and said ---------------------
def _reset(kube: FakeKube) -> list[dict]:
    return [e for e in kube.events if e["reason"] == "PlannerCalibrationReset"]


def test_a_calibration_learned_against_another_profile_is_reset_with_an_event():
    kube, lists = _cluster("Recommend")
    learned = Calibration(prefill_factor=1.4, decode_factor=0.8, prefill_headroom=1.5, samples=30)
    old = "deepseek-fp8-8xh200-sglang@sha256:0123456789abcdef"
    _memory(kube, history_to_json(History(decisions=(_decision(),), calibration=learned),
                                  None, profile=old))
    PlannerLoop(kube, worker_lists=lists).tick_all()
    [event] = _reset(kube)
    assert event["type"] == "Normal" and old in event["message"] and "x1.5" in event["message"]
    stored = kube.get("ConfigMap", NS, "demo-planner")["data"][PLANNER_MEMORY_KEY]
    history, _ = history_from_json(stored)
    assert history.calibration != learned  # planned from the profile's own numbers
    assert history.decisions[0] == _decision()  # the fleet's past is kept
    current = remembered_profile(stored)
    assert current is not None and current != old
    # the same profile on the next tick: nothing to reset, no second Event
    _memory(kube, history_to_json(History(calibration=learned), None, profile=current))
    PlannerLoop(kube, worker_lists=lists).tick_all()
    assert len(_reset(kube)) == 1
    assert history_from_json(kube.get("ConfigMap", NS, "demo-planner")["data"][PLANNER_MEMORY_KEY]
                             )[0].calibration is not None
