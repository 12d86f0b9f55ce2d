"""A PDCluster's profile from a ConfigMap of its own namespace (spec.planner.profileConfigMap):
read with the loader's limits, every problem named by field and ConfigMap, parsed again only
when the ConfigMap's resourceVersion moves; status.planner.profile summarises its provenance and
the online calibration; ``pdscale profile export`` writes it with the calibration applied."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from pdscale.operator.api.pdcluster import PROFILE_CONFIGMAP_KEY, ProfileConfigMapRef
from pdscale.operator.loop.planning import planner_config
from pdscale.operator.loop.profile_source import (
    CALIBRATED_TERMS,
    FIELD,
    ProfileSources,
    ResolvedProfile,
    calibrated_profile,
    export_profile,
    profile_from_configmap,
    report_profile,
)
from pdscale.operator.reconciler.status import profile_status
from pdscale.operator.render.checklist import SpecError, parse
from pdscale.planner.model import Calibration, PerformanceModel, Slo
from pdscale.planner.profile import MAX_PROFILE_BYTES, ProfileError, parse_profile, shipped_profile
from pdscale.planner.profile_fit import Benchmark, DecodePoint, PrefillPoint, fit_profile

NS = "tenant-a"
TRUTH = shipped_profile("demo-sim")
MINIMAL = {
    "model": {"servedName": "m", "path": "org/model"},
    "engine": {"kind": "SGLang", "image": "img"},
    "router": {"image": "router-img"},
}


def fitted_yaml() -> str:
    """What ``pdscale profile fit`` writes: three prompt lengths, decode at one context only
    (so the per-context cost is not identified)."""
    model = PerformanceModel(TRUTH)
    prefill = tuple(PrefillPoint(n, model.prefill_seconds(n)) for n in (200, 1_000, 3_000, 6_000))
    decode = tuple(DecodePoint(b, 1_000, model.tpot_seconds(b, 1_000)) for b in (1, 4, 16, 32))
    result = fit_profile([Benchmark("c8/profile_export.jsonl", "aiperf", prefill, decode)], TRUTH,
                         name="mine", fitted_at="2026-12-01T10:00:00Z", slo=Slo(),
                         kv_transfer_in_ttft=False)
    return yaml.safe_dump(result.document, sort_keys=False)


def configmap(text: str | None, version: str = "7", name: str = "my-profile",
              key: str = PROFILE_CONFIGMAP_KEY) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "resourceVersion": version},
            "data": {} if text is None else {key: text}}


REF = ProfileConfigMapRef(name="my-profile")


# -- the loader's limits, named ----------------------------------------------------------------

def test_a_fitted_profile_in_a_configmap_loads_with_its_provenance():
    profile = profile_from_configmap(configmap(fitted_yaml()), REF, NS)
    assert profile.name == "mine"
    assert profile.provenance["sources"][0]["tool"] == "aiperf"


@pytest.mark.parametrize("stored, words", [
    (None, ["not found"]),
    (configmap(None), ["no key 'profile.yaml'"]),
    ({"metadata": {}, "binaryData": {"profile.yaml": "eA=="}}, ["binaryData"]),
    (configmap("a: [1, 2"), ["not YAML"]),
    (configmap("- just\n- a list\n"), ["top level must be a mapping"]),
    (configmap("[" * 5000 + "]" * 5000), ["nested too deep"]),
    (configmap(fitted_yaml().replace("tokens_per_second: ", "tokens_per_second: -", 1)),
     ["prefill.tokens_per_second"]),
    (configmap("name: x\n" + "#" * MAX_PROFILE_BYTES), [f"over the {MAX_PROFILE_BYTES // 1024} KiB"]),
])
def test_what_cannot_be_used_is_refused_naming_the_field_and_the_configmap(stored, words):
    with pytest.raises(ProfileError) as refused:
        profile_from_configmap(stored, REF, NS)
    message = str(refused.value)
    assert message.startswith(FIELD) and f"{NS}/my-profile" in message
    for word in words:
        assert word in message, message


def test_a_profile_at_the_size_limit_is_read():
    text = fitted_yaml()
    padded = text + "#" * (MAX_PROFILE_BYTES - len(text.encode()))
    assert profile_from_configmap(configmap(padded), REF, NS).name == "mine"


# -- the spec --------------------------------------------------------------------------------

def _spec(planner: dict[str, Any]):
    return parse({**copy.deepcopy(MINIMAL), "planner": planner})


def test_the_spec_names_a_configmap_with_a_default_key():
    spec = _spec({"profileConfigMap": {"name": "my-profile"}})
    assert spec.planner.profile_config_map == ProfileConfigMapRef(name="my-profile", key="profile.yaml")


@pytest.mark.parametrize("planner, field", [
    ({"profile": "demo-sim", "profileConfigMap": {"name": "p"}}, "spec.planner"),
    ({"profileConfigMap": {"name": "../etc/passwd"}}, "spec.planner.profileConfigMap.name"),
    ({"profileConfigMap": {"name": "/dev/zero"}}, "spec.planner.profileConfigMap.name"),
    ({"profileConfigMap": {"name": "p", "key": "a/b"}}, "spec.planner.profileConfigMap.key"),
    ({"profileConfigMap": {}}, "spec.planner.profileConfigMap.name"),
])
def test_the_spec_refuses_a_second_source_or_a_name_that_is_no_configmap_name(planner, field):
    with pytest.raises(SpecError) as refused:
        _spec(planner)
    assert field in [p.field for p in refused.value.problems], refused.value.problems


def test_the_crd_refuses_both_sources_too():
    from pdscale.operator.api import crd

    doc = yaml.safe_load(crd.render_yaml())
    planner = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["planner"]
    assert planner["x-kubernetes-validations"][0]["rule"] == (
        "!(has(self.profile) && has(self.profileConfigMap))")


def test_a_configmap_spec_is_never_planned_with_the_default_in_its_place():
    spec = _spec({"profileConfigMap": {"name": "my-profile"}})
    with pytest.raises(ProfileError, match=r"profileConfigMap.*my-profile"):
        planner_config(spec)
    mine = profile_from_configmap(configmap(fitted_yaml()), REF, NS)
    assert planner_config(spec, mine).model.profile.prefill == mine.prefill


# -- reading through the API server, level-based ----------------------------------------------

class FakeKube:
    def __init__(self, objects: dict[tuple[str, str, str], dict[str, Any]]):
        self.objects = objects
        self.gets: list[tuple[str, str, str]] = []
        self.patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append((kind, namespace, name))
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        return {}

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        self.events.append(event)
        return {}


def test_the_configmap_is_read_in_the_pdclusters_namespace_and_parsed_again_only_when_it_changes(
        monkeypatch):
    import pdscale.operator.loop.profile_source as source

    kube = FakeKube({("ConfigMap", NS, "my-profile"): configmap(fitted_yaml(), "7")})
    sources = ProfileSources(kube)  # type: ignore[arg-type]
    spec = _spec({"profileConfigMap": {"name": "my-profile"}})
    parsed = []
    real = source.profile_from_configmap
    monkeypatch.setattr(source, "profile_from_configmap",
                        lambda *a: parsed.append(1) or real(*a))
    first = sources.resolve(NS, spec)
    assert first.profile is not None and first.source == "ConfigMap my-profile@7"
    assert sources.resolve(NS, spec) == first and len(parsed) == 1  # same version: not parsed
    kube.objects[("ConfigMap", NS, "my-profile")] = configmap("name: [", "8")
    broken = sources.resolve(NS, spec)
    assert broken.profile is None and "not YAML" in broken.problem and len(parsed) == 2
    assert broken.source == "ConfigMap my-profile@8"
    assert {ns for _, ns, _ in kube.gets} == {NS}
    del kube.objects[("ConfigMap", NS, "my-profile")]
    gone = sources.resolve(NS, spec)
    assert gone.profile is None and "not found" in gone.problem


def test_without_a_configmap_the_shipped_profile_is_used_and_nothing_is_read():
    kube = FakeKube({})
    resolved = ProfileSources(kube).resolve(NS, _spec({"profile": "demo-sim"}))  # type: ignore[arg-type]
    assert resolved == ResolvedProfile(TRUTH, "shipped")
    assert kube.gets == []


# -- status.planner.profile ---------------------------------------------------------------------

def test_the_status_summarises_provenance_and_calibration():
    profile = profile_from_configmap(configmap(fitted_yaml()), REF, NS)
    cal = Calibration(prefill_headroom=1.234, decode_headroom=1.0, samples=3)
    status = profile_status(profile, "ConfigMap my-profile@7", cal)
    assert status["name"] == "mine" and status["source"] == "ConfigMap my-profile@7"
    prov = status["provenance"]
    assert prov["fittedBy"] == "pdscale profile fit" and prov["fittedAt"] == "2026-12-01T10:00:00Z"
    assert prov["tools"] == ["aiperf"] and prov["points"] == {"prefill": 4, "decode": 4}
    terms = profile.provenance["terms"]
    assert prov["notIdentified"] == sorted(k for k, t in terms.items() if not t["identified"])
    assert "decode.per_context_token_seconds" in prov["notIdentified"]  # one context only
    assert "prefill.tokens_per_second" not in prov["notIdentified"]
    assert set(prov["residualPercent"]) == {"prefill", "decode"}
    assert status["calibration"] == {"prefillTimePercent": 100, "decodeTimePercent": 100,
                                     "prefillHeadroomPercent": 123, "decodeHeadroomPercent": 100,
                                     "samples": 3}
    # integers and strings only: the API has no floats
    assert not any(isinstance(v, float) for v in _leaves(status))


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_a_provenance_of_the_wrong_shape_is_summarised_without_it():
    hostile = {"sources": "x", "terms": [1], "residuals": {"decode_itl": {"rms_relative": "NaN"}},
               "fitted_at": 5, "fitted_by": "y" * 10_000, "warnings": {"a": 1}}
    profile = TRUTH.model_copy(update={"provenance": hostile})
    prov = profile_status(profile, "ConfigMap x@1", None)["provenance"]
    assert prov == {"fittedBy": "y" * 120, "tools": [], "points": {"prefill": 0, "decode": 0},
                    "notIdentified": [], "warnings": 0}


def test_a_shipped_profile_has_no_provenance_and_an_unmoved_calibration():
    status = profile_status(TRUTH, "shipped", None)
    assert "provenance" not in status
    assert status["calibration"]["prefillHeadroomPercent"] == 100


def test_a_problem_is_reported_once_holds_the_planner_and_posts_one_warning():
    body = {"metadata": {"name": "pdc", "namespace": NS, "uid": "u"}, "status": {}}
    kube = FakeKube({})
    resolved = ResolvedProfile(None, "ConfigMap my-profile@8", f"{FIELD}: ConfigMap {NS}/x not found")
    summary = profile_status(None, resolved.source, None, resolved.problem)
    report_profile(kube, body, summary, resolved)  # type: ignore[arg-type]
    assert kube.patches == [{"planner": {"profile": summary, "held": True, "explanation":
                                         f"holding: the profile cannot be used: {resolved.problem}"}}]
    assert [e["reason"] for e in kube.events] == ["PlannerProfileInvalid"]
    body["status"] = {"planner": {"profile": summary}}
    report_profile(kube, body, summary, resolved)  # type: ignore[arg-type]
    assert len(kube.patches) == 1 and len(kube.events) == 1  # level-based: nothing new
    good = ResolvedProfile(TRUTH, "shipped")
    report_profile(kube, body, profile_status(TRUTH, "shipped", None), good)  # type: ignore[arg-type]
    assert [e["reason"] for e in kube.events] == ["PlannerProfileInvalid", "PlannerProfileLoaded"]
    cleared = kube.patches[-1]["planner"]
    assert "held" not in cleared  # the decision's own report sets it
    assert cleared["profile"]["problem"] is None  # merge patch: removed, not left behind
    assert cleared["profile"]["source"] == "shipped" and cleared["profile"]["name"] == TRUTH.name


# -- export: the calibration applied ------------------------------------------------------------

def test_the_exported_profile_predicts_what_the_calibrated_model_does():
    profile = profile_from_configmap(configmap(fitted_yaml()), REF, NS)
    cal = Calibration(prefill_factor=1.3, decode_factor=0.8, prefill_headroom=1.5, samples=9)
    exported = calibrated_profile(profile, cal, source="ConfigMap my-profile@7", exported_at="t")
    calibrated, plain = PerformanceModel(profile, cal), PerformanceModel(exported)
    for n in (100, 2_000, 8_000):
        assert plain.prefill_seconds(n, n / 4) == pytest.approx(calibrated.prefill_seconds(n, n / 4))
    for b, c in ((1, 100), (32, 4_000)):
        assert plain.tpot_seconds(b, c) == pytest.approx(calibrated.tpot_seconds(b, c))
    assert exported.decode.kv_capacity_tokens == profile.decode.kv_capacity_tokens
    block = exported.provenance["calibration"]
    assert block["applied_to"] == list(CALIBRATED_TERMS) and block["prefill_headroom"] == 1.5
    assert exported.provenance["sources"] == profile.provenance["sources"]  # the fit's kept
    # it loads where profiles are read
    again = parse_profile(yaml.safe_load(yaml.safe_dump(exported.model_dump(mode="json"))))
    assert again == exported


def test_export_reads_the_pdcluster_its_configmap_and_its_memory():
    from pdscale.operator.loop.planning import history_to_json
    from pdscale.planner.solve import History

    memory = history_to_json(History(calibration=Calibration(decode_factor=2.0, samples=1)), 0.0)
    body = {"metadata": {"name": "pdc", "namespace": NS},
            "spec": {**MINIMAL, "planner": {"profileConfigMap": {"name": "my-profile"}}}}
    kube = FakeKube({("PDCluster", NS, "pdc"): body,
                     ("ConfigMap", NS, "my-profile"): configmap(fitted_yaml(), "7"),
                     ("ConfigMap", NS, "pdc-planner"): {"metadata": {"resourceVersion": "3"},
                                                        "data": {"history": memory}}})
    from pdscale.operator.render.builders import PLANNER_MEMORY_KEY, planner_memory_name

    kube.objects[("ConfigMap", NS, planner_memory_name("pdc"))] = {
        "metadata": {"resourceVersion": "3"}, "data": {PLANNER_MEMORY_KEY: memory}}
    exported = export_profile(kube, NS, "pdc", now=10.0, exported_at="t")  # type: ignore[arg-type]
    source = profile_from_configmap(configmap(fitted_yaml()), REF, NS)
    assert exported.decode.step_seconds == pytest.approx(2 * source.decode.step_seconds)
    assert exported.provenance["calibration"]["exported_from"] == "ConfigMap my-profile@7"
    with pytest.raises(ProfileError, match=f"no PDCluster {NS}/other"):
        export_profile(kube, NS, "other", now=10.0, exported_at="t")  # type: ignore[arg-type]
    # a memory learned against another profile: its calibration is not applied, as the
    # planner would not plan with it
    other = history_to_json(History(calibration=Calibration(decode_factor=2.0, samples=1)), 0.0,
                            profile="another@sha256:0000000000000000")
    kube.objects[("ConfigMap", NS, planner_memory_name("pdc"))]["data"][PLANNER_MEMORY_KEY] = other
    exported = export_profile(kube, NS, "pdc", now=10.0, exported_at="t")  # type: ignore[arg-type]
    assert exported.decode.step_seconds == pytest.approx(source.decode.step_seconds)
    assert exported.provenance["calibration"]["decode_factor"] == 1.0


def test_the_export_command_wants_namespace_and_name(tmp_path, capsys):
    from pdscale.main import main

    assert main(["profile", "export", "just-a-name", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "want NAMESPACE/NAME" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()
