"""A child the API server refuses (400, 403, 422) is said, not only retried: ChildrenApplied
and Ready turn False naming the child and the server's message, one Warning Event per refusal
(not one per retry), a retry with backoff all the same, and True again once an apply passes.
Against an in-memory API here; test_apply_refusal_cluster.py holds it against a real one."""

from __future__ import annotations

import json

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from test_pdc_reconcile import NOW, FakeKube, _body, _pdc

from pdscale.operator import handlers
from pdscale.operator.reconciler import conditions as c
from pdscale.operator.reconciler.reconcile import Outcome, reconcile, refusal

LATER = "2026-11-30T12:05:00Z"
SERVER_SAYS = ('Deployment.apps "glm53-decode" is invalid: spec.template.spec.containers[0]'
               '.resources.limits: Invalid value: "9": must be less than or equal to 8')


def refused(status: int, message: str = SERVER_SAYS) -> ApiException:
    exc = ApiException(status=status, reason="Refused")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message,
                           "code": status})
    return exc


class RefusingKube(FakeKube):
    """FakeKube whose apply of the named children fails as the API server would."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: dict[tuple[str, str], ApiException] = {}

    def apply(self, manifest, *, force=True):
        key = (manifest["kind"], manifest["metadata"]["name"])
        if key in self.refuse:
            raise self.refuse[key]
        return super().apply(manifest, force=force)


def _conditions(kube):
    return {x["type"]: x for x in _body(kube)["status"]["conditions"]}


def _warnings(kube, reason):
    return [e for e in kube.events if e["type"] == "Warning" and e["reason"] == reason]


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_refused_child_is_a_condition_and_one_warning_event_until_an_apply_passes(status):
    kube = RefusingKube()
    _pdc(kube)
    kube.refuse[("Deployment", "glm53-decode")] = refused(status)

    out = reconcile(kube, _body(kube), NOW)
    assert out.refused == [f"Deployment/glm53-decode refused by the API server (HTTP {status}): "
                           + SERVER_SAYS]
    conds = _conditions(kube)
    applied = conds[c.CHILDREN_APPLIED]
    assert (applied["status"], applied["reason"]) == ("False", c.APPLY_REFUSED)
    assert "Deployment/glm53-decode" in applied["message"] and SERVER_SAYS in applied["message"]
    assert applied["observedGeneration"] == 1
    assert (conds[c.READY]["status"], conds[c.READY]["reason"]) == ("False", c.APPLY_REFUSED)
    assert conds[c.PROGRESSING]["status"] == "False"
    assert [e["message"] for e in _warnings(kube, c.EVENT_APPLY_REFUSED)] == [applied["message"]]
    # in order: what comes before the refused child exists, what comes after waits
    assert ("Deployment", "serving", "glm53-prefill") in kube.objects
    assert ("Deployment", "serving", "glm53-router") not in kube.objects

    # the retries: refused again, and nothing new said or written
    for _ in range(3):
        again = reconcile(kube, _body(kube), LATER)
        assert again.refused == out.refused
        assert again.writes == 0
    assert len(_warnings(kube, c.EVENT_APPLY_REFUSED)) == 1
    assert not _warnings(kube, c.EVENT_NOT_READY)

    # the cause goes (a policy relaxed, a quota raised): applied, and said so
    del kube.refuse[("Deployment", "glm53-decode")]
    healed = reconcile(kube, _body(kube), LATER)
    assert healed.refused == []
    conds = _conditions(kube)
    assert (conds[c.CHILDREN_APPLIED]["status"], conds[c.CHILDREN_APPLIED]["reason"]) == (
        "True", c.APPLIED)
    assert conds[c.CHILDREN_APPLIED]["lastTransitionTime"] == LATER
    assert ("Deployment", "serving", "glm53-router") in kube.objects


def test_an_update_refused_keeps_reporting_what_runs():
    kube = RefusingKube()
    _pdc(kube)
    reconcile(kube, _body(kube), NOW)
    kube.make_ready()
    reconcile(kube, _body(kube), NOW)
    assert _conditions(kube)[c.READY]["status"] == "True"
    pdc = kube.objects[("PDCluster", "serving", "glm53")]
    pdc["spec"]["engine"]["image"] = "lmsysorg/sglang:v9"
    pdc["metadata"]["generation"] = 2
    kube.refuse[("Deployment", "glm53-prefill")] = refused(403, 'deployments.apps "glm53-prefill" '
                                                           "is forbidden: ValidatingAdmissionPolicy "
                                                           "'images' denied request")
    reconcile(kube, _body(kube), LATER)
    status = _body(kube)["status"]
    assert status["prefill"]["readyReplicas"] > 0  # the running fleet, still counted
    applied = _conditions(kube)[c.CHILDREN_APPLIED]
    assert applied["observedGeneration"] == 2 and "ValidatingAdmissionPolicy" in applied["message"]
    assert len(_warnings(kube, c.EVENT_APPLY_REFUSED)) == 1
    assert not _warnings(kube, c.EVENT_NOT_READY)  # the refusal is said once, not twice


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_what_a_retry_can_heal_stays_an_api_error(status):
    kube = RefusingKube()
    _pdc(kube)
    kube.refuse[("Deployment", "glm53-decode")] = refused(status)
    with pytest.raises(ApiException):
        reconcile(kube, _body(kube), NOW)


def test_refusal_names_the_child_and_what_the_server_said():
    assert refusal("Service", "s", 422, "Unprocessable Entity", '{"message": "bad port"}') == (
        "Service/s refused by the API server (HTTP 422): bad port")
    # a body that is not a Status: the HTTP reason
    assert refusal("Service", "s", 400, "Bad Request", "<html>") == (
        "Service/s refused by the API server (HTTP 400): Bad Request")
    assert len(refusal("Service", "s", 422, None, json.dumps({"message": "x" * 5000}))) <= 900


def test_the_handler_retries_a_refusal_with_backoff(monkeypatch):
    said = ["Deployment/x refused by the API server (HTTP 422): no"]
    monkeypatch.setattr(handlers, "reconcile", lambda kube, body, now: Outcome(refused=said))
    monkeypatch.setattr(handlers, "finalizer_added", lambda body: None)
    memo = kopf.Memo(api=None, retries=handlers.Retries(), seen={})
    body = {"metadata": {"namespace": "ns", "name": "x", "uid": "u"}}
    delays = []
    for _ in range(3):
        with pytest.raises(kopf.TemporaryError, match="HTTP 422") as raised:
            handlers._run(memo, body)
        delays.append(raised.value.delay)
    assert delays == sorted(delays) and delays[0] < delays[-1]  # backing off
    assert ("ns", "x") in memo.retries.due


def test_a_reconcile_woken_with_a_stale_body_says_nothing_twice():
    """kopf hands each handler the body of its own event, maybe from before another
    reconcile wrote the status; on the real API server a refusal was posted 4 times so."""
    kube = RefusingKube()
    _pdc(kube)
    kube.refuse[("Deployment", "glm53-decode")] = refused(422)
    stale = _body(kube)  # no status yet
    reconcile(kube, _body(kube), NOW)
    again = reconcile(kube, stale, NOW)
    assert again.writes == 0
    assert len(_warnings(kube, c.EVENT_APPLY_REFUSED)) == 1


def test_a_reconcile_of_a_pdcluster_gone_or_replaced_does_nothing():
    kube = RefusingKube()
    _pdc(kube)
    body = _body(kube)
    kube.objects[("PDCluster", "serving", "glm53")]["metadata"]["uid"] = "uid-2"  # recreated
    assert reconcile(kube, body, NOW) == Outcome()
    del kube.objects[("PDCluster", "serving", "glm53")]
    assert reconcile(kube, body, NOW) == Outcome()
    assert kube.writes == 0
