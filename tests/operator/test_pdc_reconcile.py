"""reconcile() against an in-memory API: writes only what differs, never takes over objects
that are not ours, and reports conditions and Events."""

from __future__ import annotations

import copy
import pathlib

import yaml

from pdscale.operator.reconciler import conditions as c
from pdscale.operator.reconciler.reconcile import contains, reconcile
from pdscale.operator.reconciler.status import ChildrenView, compute
from pdscale.operator.render import rbac

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = "2026-11-30T12:00:00Z"
LATER = "2026-11-30T12:05:00Z"


class FakeKube:
    """Stores objects by (kind, ns, name); bumps resourceVersion on every write, adds a
    server-side default to Deployments (as the API server does) to exercise `contains`."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.writes = 0
        self.events: list[dict] = []
        self.rv = 0
        self.pods: list[dict] = []

    def list_pods(self, namespace, labels):
        return [copy.deepcopy(p) for p in self.pods
                if p["metadata"]["namespace"] == namespace
                and all(p["metadata"]["labels"].get(k) == v for k, v in labels.items())]

    def _bump(self, obj):
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def get(self, kind, namespace, name):
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def apply(self, manifest, *, force=True):
        self.writes += 1
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        obj = copy.deepcopy(manifest)
        if manifest["kind"] == "Deployment":
            obj["spec"]["progressDeadlineSeconds"] = obj["spec"].get("progressDeadlineSeconds", 600)
            for container in obj["spec"]["template"]["spec"]["containers"]:
                container.setdefault("terminationMessagePath", "/dev/termination-log")
            old = self.objects.get(key)
            obj["status"] = (old or {}).get("status", {})
            obj["metadata"]["generation"] = (old or {}).get("metadata", {}).get("generation", 0) + 1
        self._bump(obj)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def patch_status(self, namespace, name, patch):
        self.writes += 1
        obj = self.objects[("PDCluster", namespace, name)]
        obj.setdefault("status", {}).update(copy.deepcopy(patch))
        self._bump(obj)

    def create_event(self, event):
        self.writes += 1
        self.events.append(event)

    def versions(self):
        return {k: v["metadata"]["resourceVersion"] for k, v in self.objects.items()}

    def make_ready(self):
        for (kind, _, _), obj in self.objects.items():
            if kind == "Deployment":
                n = obj["spec"]["replicas"]
                obj["status"] = {"observedGeneration": obj["metadata"]["generation"], "replicas": n,
                                 "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}


def _serving() -> FakeKube:
    """A PDCluster whose children exist and are all Ready, status caught up."""
    kube = FakeKube()
    _pdc(kube)
    reconcile(kube, _body(kube), NOW)
    kube.make_ready()
    reconcile(kube, _body(kube), NOW)
    return kube


def _pdc(kube: FakeKube, sample="sglang-glm-4p8d.yaml") -> dict:
    doc = yaml.safe_load((ROOT / "examples" / sample).read_text())
    doc["metadata"].update(namespace="serving", uid="uid-1", generation=1, resourceVersion="1")
    kube.objects[("PDCluster", "serving", doc["metadata"]["name"])] = doc
    return doc


def _body(kube, name="glm53"):
    return kube.get("PDCluster", "serving", name)


def test_first_reconcile_creates_every_child_then_a_noop_writes_nothing():
    kube = FakeKube()
    _pdc(kube)
    first = reconcile(kube, _body(kube), NOW)
    kinds = sorted(k for (k, _, _) in kube.objects)
    assert kinds == ["Deployment"] * 3 + ["NetworkPolicy"] * 2 + ["PDCluster"] + ["Service"] * 3 + ["ServiceAccount"]
    assert [e.reason for e in first.events].count("Created") == 9
    kube.make_ready()
    reconcile(kube, _body(kube), NOW)  # status catches up with readiness
    before = kube.versions()
    again = reconcile(kube, _body(kube), LATER)
    assert again.writes == 0 and again.events == []
    assert kube.versions() == before


def test_status_counts_and_conditions_follow_the_deployments():
    kube = FakeKube()
    _pdc(kube)
    reconcile(kube, _body(kube), NOW)
    status = _body(kube)["status"]
    assert status["observedGeneration"] == 1
    assert status["prefill"] == {"desiredReplicas": 4, "readyReplicas": 0, "updatedReplicas": 0,
                                 "nodesPerInstance": 1, "desiredNodes": 4, "readyNodes": 0}
    ready = c.find(status["conditions"], c.READY)
    assert (ready["status"], ready["reason"]) == ("False", c.WAITING_FOR_REPLICAS)
    assert c.find(status["conditions"], c.PROGRESSING)["status"] == "True"
    assert status["derived"]["bootstrapTimeoutSeconds"] == 787
    kube.make_ready()
    out = reconcile(kube, _body(kube), LATER)
    status = _body(kube)["status"]
    assert status["decode"] == {"desiredReplicas": 8, "readyReplicas": 8, "updatedReplicas": 8,
                                "nodesPerInstance": 1, "desiredNodes": 8, "readyNodes": 8}
    ready = c.find(status["conditions"], c.READY)
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == ("True", c.ALL_READY, LATER)
    assert c.find(status["conditions"], c.SPEC_VALID)["lastTransitionTime"] == NOW  # unchanged
    assert [e.reason for e in out.events] == ["Ready"]


def test_changing_replicas_applies_only_that_deployment_with_a_scaled_event():
    kube = _serving()
    before = kube.versions()
    pdc = kube.objects[("PDCluster", "serving", "glm53")]
    pdc["spec"]["decode"]["replicas"] = 10
    pdc["metadata"]["generation"] = 2
    out = reconcile(kube, _body(kube), LATER)
    after = kube.versions()
    changed = sorted(k for k in after if after[k] != before[k])
    assert changed == [("Deployment", "serving", "glm53-decode"), ("PDCluster", "serving", "glm53")]
    assert ("Normal", "Scaled", "Deployment/glm53-decode replicas 8 -> 10") in [
        (e.type, e.reason, e.message) for e in out.events]


def test_drift_in_our_fields_is_repaired():
    kube = FakeKube()
    _pdc(kube)
    reconcile(kube, _body(kube), NOW)
    dep = kube.objects[("Deployment", "serving", "glm53-prefill")]
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    reconcile(kube, _body(kube), NOW)
    image = kube.objects[("Deployment", "serving", "glm53-prefill")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "lmsysorg/sglang:v0.5.23"


def test_an_object_that_is_not_ours_is_never_overwritten():
    kube = FakeKube()
    _pdc(kube)
    foreign = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "glm53-router", "namespace": "serving", "resourceVersion": "77"},
               "spec": {"ports": [{"port": 80}]}}
    kube.objects[("Service", "serving", "glm53-router")] = copy.deepcopy(foreign)
    out = reconcile(kube, _body(kube), NOW)
    assert kube.objects[("Service", "serving", "glm53-router")] == foreign
    status = _body(kube)["status"]
    degraded = c.find(status["conditions"], c.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", c.NAME_CONFLICT)
    assert "Service/glm53-router exists and is not controlled by this PDCluster" in degraded["message"]
    assert c.find(status["conditions"], c.READY)["reason"] == c.NAME_CONFLICT
    warnings = [e for e in out.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["NameConflict"]
    # The warning is not repeated on every reconcile.
    assert [e for e in reconcile(kube, _body(kube), LATER).events if e.type == "Warning"] == []


def test_invalid_spec_touches_no_child_and_reports_the_field():
    kube = FakeKube()
    _pdc(kube)
    reconcile(kube, _body(kube), NOW)
    children_before = {k: v for k, v in kube.versions().items() if k[0] != "PDCluster"}
    pdc = kube.objects[("PDCluster", "serving", "glm53")]
    pdc["spec"]["kvTransfer"]["waitingTimeoutSeconds"] = 60
    pdc["metadata"]["generation"] = 2
    out = reconcile(kube, _body(kube), LATER)
    assert {k: v for k, v in kube.versions().items() if k[0] != "PDCluster"} == children_before
    status = _body(kube)["status"]
    valid = c.find(status["conditions"], c.SPEC_VALID)
    assert (valid["status"], valid["reason"]) == ("False", c.SPEC_INVALID)
    assert valid["message"].startswith("spec.kvTransfer.waitingTimeoutSeconds: 60 s is too short")
    assert status["observedGeneration"] == 2
    assert status["prefill"]["desiredReplicas"] == 4  # still reporting what runs
    assert ("Warning", "SpecInvalid") in [(e.type, e.reason) for e in out.events]


def test_contains_tolerates_server_defaults_and_int_or_string():
    assert contains({"a": 1, "b": {"c": "8", "d": 2}}, {"b": {"c": 8}})
    assert not contains({"a": [1, 2]}, {"a": [1]})
    assert not contains({"a": {"c": "x"}}, {"a": {"c": "y"}})
    assert not contains({"a": "true"}, {"a": True})
    assert contains({"b": 1}, {"a": False, "c": 0, "d": []})  # omitted zero values
    assert not contains({"b": 1}, {"a": True})


def test_compute_degraded_on_a_stalled_rollout():
    stalled = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
               "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
                          "conditions": [{"type": "Progressing", "status": "False",
                                          "reason": "ProgressDeadlineExceeded",
                                          "message": "ReplicaSet x has timed out progressing."}]}}
    status = compute(ChildrenView(generation=3, deployments={"prefill": stalled}), None, NOW)
    degraded = c.find(status["conditions"], c.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", c.DEPLOYMENT_STALLED)
    assert degraded["message"] == "prefill: ReplicaSet x has timed out progressing."
    assert c.find(status["conditions"], c.PROGRESSING)["status"] == "False"


def _scale_decode(kube: FakeKube, replicas: int) -> None:
    """What the planner does in Auto: replicas from status.planner, the spec unchanged."""
    pdc = kube.objects[("PDCluster", "serving", "glm53")]
    pdc["spec"]["planner"] = {"mode": "Auto"}  # the operator's Prometheus serves it
    pdc["status"]["planner"] = {"replicas": {"prefill": 4, "decode": replicas}}


def test_ready_stays_true_while_the_planner_scales_a_serving_fleet():
    kube = _serving()
    _scale_decode(kube, 12)
    out = reconcile(kube, _body(kube), LATER)
    ready = c.find(_body(kube)["status"]["conditions"], c.READY)
    assert (ready["status"], ready["reason"]) == ("True", c.SCALING)
    assert ready["message"] == "serving; decode 8/12 ready"
    assert ready["lastTransitionTime"] == NOW  # no flip, no NotReady Event
    assert not [e for e in out.events if e.reason in (c.EVENT_READY, c.EVENT_NOT_READY)]


def test_ready_turns_false_when_a_role_stops_serving_or_a_new_generation_rolls_out():
    kube = _serving()
    decode = kube.objects[("Deployment", "serving", "glm53-decode")]
    decode["status"].update(readyReplicas=0, availableReplicas=0)
    out = reconcile(kube, _body(kube), LATER)
    ready = c.find(_body(kube)["status"]["conditions"], c.READY)
    assert (ready["status"], ready["reason"]) == ("False", c.WAITING_FOR_REPLICAS)
    assert [e.reason for e in out.events] == [c.EVENT_NOT_READY]
    kube.make_ready()
    reconcile(kube, _body(kube), LATER)
    pdc = kube.objects[("PDCluster", "serving", "glm53")]
    pdc["spec"]["engine"]["image"] += "-next"
    pdc["metadata"]["generation"] = 2
    reconcile(kube, _body(kube), LATER)
    ready = c.find(_body(kube)["status"]["conditions"], c.READY)
    assert (ready["status"], ready["reason"]) == ("False", c.WAITING_FOR_REPLICAS)


def _pod(name, role, *, created, ready=None, draining=False, deleting=False):
    meta = {"name": name, "namespace": "serving", "creationTimestamp": created,
            "labels": {"app.kubernetes.io/instance": "glm53", "pdscale.io/role": role,
                       "app.kubernetes.io/managed-by": "pdscale-operator"},
            "annotations": {"pdscale.io/draining-since": "1.0"} if draining else {}}
    if deleting:
        meta["deletionTimestamp"] = LATER
    conds = [] if ready is None else [{"type": "Ready", "status": ready[0], "lastTransitionTime": ready[1]}]
    return {"metadata": meta, "status": {"conditions": conds}}


def test_a_pod_not_ready_past_its_allowance_is_degraded_and_named_once():
    kube = FakeKube()
    _pdc(kube)  # decode warm-up 900 s: allowance 2700 s
    reconcile(kube, _body(kube), NOW)
    kube.make_ready()
    kube.pods = [
        _pod("glm53-decode-stuck", "decode", created="2026-11-30T11:00:00Z",
             ready=("False", "2026-11-30T11:00:05Z")),
        _pod("glm53-decode-new", "decode", created="2026-11-30T11:50:00Z"),  # within allowance
        _pod("glm53-decode-ok", "decode", created="2026-11-30T10:00:00Z",
             ready=("True", "2026-11-30T10:10:00Z")),
        _pod("glm53-prefill-leaving", "prefill", created="2026-11-30T10:00:00Z",
             ready=("False", "2026-11-30T10:00:00Z"), deleting=True),
        _pod("glm53-prefill-drained", "prefill", created="2026-11-30T10:00:00Z",
             ready=("False", "2026-11-30T10:00:00Z"), draining=True),
    ]
    out = reconcile(kube, _body(kube), NOW)
    degraded = c.find(_body(kube)["status"]["conditions"], c.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", c.POD_NOT_READY)
    assert degraded["message"] == ("decode pod glm53-decode-stuck not Ready within its allowance "
                                   "of 2700 s; kept out of the router")
    assert [e.reason for e in out.events if e.type == "Warning"] == [c.POD_NOT_READY]
    # Still stuck a minute later: no new write, no new Event.
    before = kube.versions()
    again = reconcile(kube, _body(kube), "2026-11-30T12:01:00Z")
    assert again.writes == 0 and kube.versions() == before
    # It becomes Ready: Degraded clears.
    kube.pods[0]["status"]["conditions"][0]["status"] = "True"
    reconcile(kube, _body(kube), "2026-11-30T12:02:00Z")
    degraded = c.find(_body(kube)["status"]["conditions"], c.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("False", c.AS_EXPECTED)


def test_rbac_is_least_privilege():
    role = rbac.cluster_role()
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert all("*" not in v and "delete" not in v and "escalate" not in v and "bind" not in v
               for v in verbs.values())
    # patch: the finalizer only (a JSON patch of /metadata/finalizers); no update, no delete
    assert verbs[("pdscale.io", "pdclusters")] == {"get", "list", "watch", "patch"}
    assert verbs[("pdscale.io", "pdclusters/status")] == {"patch"}
    assert verbs[("apps", "deployments")] == {"get", "list", "watch", "create", "patch"}
    assert ("", "secrets") not in verbs
    binding = rbac.cluster_role_binding()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pdscale-operator",
                                    "namespace": "pdscale-system"}]


def test_in_auto_mode_the_planners_replicas_drive_the_deployments_raised_to_min():
    kube = FakeKube()
    pdc = _pdc(kube)
    pdc["spec"]["planner"] = {"mode": "Auto"}  # the operator's Prometheus serves it
    pdc["status"] = {"planner": {"replicas": {"prefill": 6, "decode": 0}}}
    out = reconcile(kube, _body(kube), NOW)
    deployments = {n: o["spec"]["replicas"] for (k, _, n), o in kube.objects.items() if k == "Deployment"}
    min_decode = pdc["spec"]["decode"]["minReplicas"]
    assert deployments == {"glm53-prefill": 6, "glm53-decode": min_decode, "glm53-router": 2}
    assert out.problems == []
    assert _body(kube)["status"]["planner"] == {"replicas": {"prefill": 6, "decode": 0}}  # untouched


def test_a_lowered_max_is_left_to_the_planners_drains_not_cut_by_the_replicaset():
    kube = FakeKube()
    pdc = _pdc(kube)
    pdc["spec"]["planner"] = {"mode": "Auto"}  # the operator's Prometheus serves it
    pdc["spec"]["decode"].update(maxReplicas=4, replicas=4)
    pdc["status"] = {"planner": {"replicas": {"prefill": 4, "decode": 8}}}
    reconcile(kube, _body(kube), NOW)
    assert kube.objects[("Deployment", "serving", "glm53-decode")]["spec"]["replicas"] == 8


def test_outside_auto_mode_the_spec_replicas_win():
    kube = FakeKube()
    pdc = _pdc(kube)
    pdc["spec"]["planner"] = {"mode": "Recommend"}  # the operator's Prometheus serves it
    pdc["status"] = {"planner": {"replicas": {"prefill": 6, "decode": 10}}}
    reconcile(kube, _body(kube), NOW)
    assert kube.objects[("Deployment", "serving", "glm53-prefill")]["spec"]["replicas"] == 4


def test_failed_reconciles_back_off_exponentially_up_to_a_cap():
    from pdscale.operator.handlers import RETRY_MAX_SECONDS, Retries

    r = Retries()
    key = ("ns", "pdc")
    delays = [r.failed(key, now=100.0) for _ in range(10)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == RETRY_MAX_SECONDS
    assert r.ready(100.0 + RETRY_MAX_SECONDS - 1) == []
    assert r.ready(100.0 + RETRY_MAX_SECONDS) == [key]
    r.succeeded(key)
    assert r.ready(1e9) == []


def test_the_tenant_policy_refuses_a_spec_with_spec_valid_false_naming_field_and_policy(monkeypatch):
    from pdscale.operator.api import tenant_policy

    # an admin whose policy allows only their own registry; the operator reads it at start
    monkeypatch.setenv(tenant_policy.POLICY_ENV, '{"allowedImagePrefixes": ["registry.corp/"]}')
    tenant_policy.configured.cache_clear()
    try:
        kube = FakeKube()
        _pdc(kube)
        out = reconcile(kube, _body(kube), NOW)
    finally:
        tenant_policy.configured.cache_clear()
    assert [k for k in kube.objects if k[0] != "PDCluster"] == []  # nothing rendered
    valid = c.find(_body(kube)["status"]["conditions"], c.SPEC_VALID)
    assert valid["status"] == "False"
    assert "spec.engine.image" in valid["message"] and "allowedImagePrefixes" in valid["message"]
    assert "spec.router.image" in " ".join(out.problems)
    assert ("Warning", "SpecInvalid") in [(e.type, e.reason) for e in out.events]


def _pool(kube: FakeKube, members: list[str]) -> None:
    kube.objects[("PDPool", "serving", "shared")] = {
        "apiVersion": "pdscale.io/v1alpha1", "kind": "PDPool",
        "metadata": {"name": "shared", "namespace": "serving", "uid": "uid-pool"},
        "spec": {"nodes": 24, "nodeSelector": {"pool": "shared"},
                 "members": [{"name": m} for m in members]}}


def _engine_selector(kube: FakeKube) -> dict:
    return kube.objects[("Deployment", "serving", "glm53-prefill")]["spec"]["template"]["spec"]["nodeSelector"]


def test_a_pool_member_is_pinned_to_the_pools_nodes_and_said_so():
    kube = FakeKube()
    doc = _pdc(kube)
    doc["spec"]["planner"]["pool"] = {"name": "shared"}
    doc["spec"].setdefault("placement", {})["nodeSelector"] = {"pool": "elsewhere", "zone": "a"}
    _pool(kube, ["glm53"])
    reconcile(kube, _body(kube), NOW)
    # the pool's labels win over the member's own: its engines never leave the pool
    assert _engine_selector(kube)["pool"] == "shared"
    assert _engine_selector(kube)["zone"] == "a"
    cond = c.find(_body(kube)["status"]["conditions"], c.POOL_MEMBER)
    assert cond["status"] == "True" and "serving/shared" in cond["message"]


def test_a_pdcluster_the_pool_does_not_list_is_refused_naming_the_field_and_not_pinned():
    kube = FakeKube()
    doc = _pdc(kube)
    doc["spec"]["planner"]["pool"] = {"name": "shared"}
    _pool(kube, ["someone-else"])
    out = reconcile(kube, _body(kube), NOW)
    assert "pool" not in _engine_selector(kube)
    cond = c.find(_body(kube)["status"]["conditions"], c.POOL_MEMBER)
    assert (cond["status"], cond["reason"]) == ("False", c.POOL_REFUSED)
    assert cond["message"].startswith("spec.planner.pool.name: ")
    assert [e.message for e in out.events if e.reason == "PoolRefused"] == [cond["message"]]
