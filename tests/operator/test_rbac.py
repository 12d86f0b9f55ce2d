"""Every permission granted is needed, every request made is granted (pure).

The chain: ``Kube._call`` refuses a request missing from ``kube.REQUESTS`` before it leaves;
only ``kube`` talks to the API server (checked on the source); every declared request is made
by one of the door's methods for the kinds the builders make (checked by calling them against
a recording client); kopf's needs follow from the handlers it registers; and the rules granted
are exactly the needs. test_rbac_cluster.py holds the same against a real API server's audit
log.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pdc_cluster_helpers import ROOT

from pdscale.operator.api.names import Owner
from pdscale.operator.api.pdcluster import GROUP, PLURAL
from pdscale.operator.clients import kube as kube_module
from pdscale.operator.clients.kube import IMPLIED, REQUESTS, Kube, Need, Undeclared, need_of
from pdscale.operator.leader import KubeLeases, Record
from pdscale.operator.loop.drain import patch_pdcluster
from pdscale.operator.render import rbac
from pdscale.operator.render.builders import build_children, planner_memory
from pdscale.operator.render.checklist import validate

OPERATOR = ROOT / "operator"


@pytest.mark.parametrize(("method", "path", "query", "need"), [
    ("GET", "/api/v1/namespaces/a/pods/p", None, Need("", "pods", "get")),
    ("GET", "/api/v1/namespaces/a/pods", None, Need("", "pods", "list")),
    ("GET", "/api/v1/pods", [("labelSelector", "x=y")], Need("", "pods", "list")),
    ("GET", "/api/v1/pods", [("watch", "true")], Need("", "pods", "watch")),
    ("GET", "/api/v1/namespaces/a", None, Need("", "namespaces", "get")),
    ("GET", "/api/v1/namespaces", None, Need("", "namespaces", "list")),
    ("POST", "/api/v1/namespaces/a/events", None, Need("", "events", "create")),
    ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", None, Need("apps", "deployments", "patch")),
    ("PATCH", "/apis/pdscale.io/v1alpha1/namespaces/a/pdclusters/x/status", None,
     Need("pdscale.io", "pdclusters/status", "patch")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l", None,
     Need("coordination.k8s.io", "leases", "update")),
    ("DELETE", "/api/v1/namespaces/a/pods/p", None, Need("", "pods", "delete")),
    ("DELETE", "/api/v1/namespaces/a/pods", None, Need("", "pods", "deletecollection")),
    ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", None,
     Need("apiextensions.k8s.io", "customresourcedefinitions", "list")),
])
def test_a_request_needs_what_the_api_server_checks(method, path, query, need):
    assert need_of(method, path, query) == need


@pytest.mark.parametrize(("method", "path"), [("GET", "/version"), ("GET", "/apis"),
                                              ("PATCH", "/api/v1/namespaces/a/pods")])
def test_a_path_that_names_no_resource_is_refused(method, path):
    with pytest.raises(ValueError):
        need_of(method, path)


class RecordingApi:
    """Stands in for kubernetes.client.ApiClient: records each request, answers 200."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]]]] = []

    def param_serialize(self, *, method, resource_path, query_params, header_params, body,
                        auth_settings):
        return method, resource_path, list(query_params)

    def call_api(self, method, path, query, *, _request_timeout):
        self.requests.append((method, path, query))
        answer = {"metadata": {"resourceVersion": "1"}, "spec": {}, "items": []}
        return _Response(json.dumps(answer).encode())


class _Response:
    status = 200

    def __init__(self, data: bytes):
        self.data = data

    def read(self) -> bytes:
        return self.data


def _children() -> list[dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    spec, derived = validate(doc["spec"])
    owner = Owner("glm53", "team-a", "uid-1")
    # and a role of several nodes per instance: its engines as a LeaderWorkerSet
    doc = yaml.safe_load((ROOT / "examples" / "sglang-deepseek-multinode.yaml").read_text())
    spec_groups, derived_groups = validate(doc["spec"])
    groups = [c for c in build_children(owner, spec_groups, derived_groups)
              if c["kind"] == "LeaderWorkerSet"]
    assert groups, "the multi-node example renders no LeaderWorkerSet"
    return [*build_children(owner, spec, derived), *groups, planner_memory(owner, "{}")]


def _every_door(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of the door's calls, for every kind the builders make (reconcile reads and applies
    each child; the planner memory is read, created and applied)."""
    for child in _children():
        meta = child["metadata"]
        kube.get(child["kind"], meta["namespace"], meta["name"])
        kube.apply(child)
    kube.create(planner_memory(Owner("glm53", "team-a", "uid-1"), "{}"))
    kube.get("PDCluster", "team-a", "glm53")
    kube.patch_status("team-a", "glm53", {"conditions": []})
    kube.get("PDPool", "team-a", "shared")
    kube.patch_status("team-a", "shared", {"conditions": []}, kind="PDPool")
    kube.list_nodes({"nvidia.com/gpu.product": "NVIDIA-H200"})
    kube.create_event({"metadata": {"namespace": "team-a"}})
    kube.patch_pod("team-a", "p", {"metadata": {}})
    for watched in ("", "team-a,team-b"):
        monkeypatch.setenv("PDSCALE_WATCH_NAMESPACES", watched)
        kube.list_pods(None, {"a": "b"})
        kube.list_pods("team-a", {"a": "b"})
        kube.list_deployments(None, {"a": "b"})
        kube.list_deployments("team-a", {"a": "b"})
        kube.list_pdclusters()
        kube.list_pdpools()
    patch_pdcluster(kube, "team-a", "glm53", [{"op": "test", "path": "/metadata/finalizers"}])
    leases = KubeLeases(kube, "pdscale-system", "pdscale-operator-leader")
    leases.get()
    leases.create(Record("me", 15))
    leases.update(Record("me", 15), "1")


def test_every_declared_request_is_made_by_the_door_and_no_other(monkeypatch):
    api = RecordingApi()
    _every_door(Kube(api, request_timeout=(1, 1)), monkeypatch)  # type: ignore[arg-type]
    made = {need_of(*r) for r in api.requests}
    assert made - set(REQUESTS) == set()  # the door refused nothing: all are declared
    assert set(REQUESTS) - made == set(), "declared in kube.REQUESTS but no call makes it"


def test_an_undeclared_request_is_refused_before_it_is_sent():
    api = RecordingApi()
    kube = Kube(api, request_timeout=(1, 1))  # type: ignore[arg-type]
    with pytest.raises(Undeclared, match="pods"):
        kube._call("DELETE", "/api/v1/namespaces/a/pods/p")
    with pytest.raises(Undeclared, match="secrets"):
        kube._call("GET", "/api/v1/namespaces/a/secrets/s")
    assert api.requests == []


# Names through which a request could reach the API server without going through Kube._call.
_OTHER_DOORS = {"call_api", "param_serialize", "Watch", "ApiClient"}


def test_only_the_kube_module_talks_to_the_api_server():
    """No module but kube.py calls the client's request layer or a typed API class; the
    generic ``_call`` is used only by the door and the two that reuse it (the Lease, the
    finalizer patch). So every request passes the check in ``Kube._call``."""
    found: dict[str, set[str]] = {}
    for path in sorted(OPERATOR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                if name in _OTHER_DOORS or name == "_call" or (name.endswith("Api") and name[:1].isupper()):
                    names.add(name)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubernetes"):
                names |= {f"from {node.module} import {a.name}" for a in node.names
                          if a.name not in ("ApiException",)}
        if names:
            found[path.name] = names
    assert found.pop("kube.py") >= {"call_api", "param_serialize", "_call"}
    assert found == {"leader.py": {"_call"}, "drain.py": {"_call"}}


def _granted(rules: list[dict[str, Any]]) -> set[Need]:
    return {Need(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_the_grants_are_exactly_the_needs():
    granted = _granted(rbac.rules() + rbac.watching_rules() + rbac.leader_rules())
    assert granted == set(rbac.needs())
    assert set(REQUESTS) | set(IMPLIED) <= granted
    # the review's findings stay fixed: nothing reads single pods or watches them, nothing
    # patches Events, nothing reads the status subresource or a CRD by name
    for unused in [Need("", "pods", "get"), Need("", "pods", "watch"), Need("", "events", "patch"),
                   Need(GROUP, f"{PLURAL}/status", "get"),
                   Need("apiextensions.k8s.io", "customresourcedefinitions", "get")]:
        assert unused not in granted
    assert not any(v in ("*", "delete", "deletecollection", "escalate", "bind", "impersonate")
                   for n in granted for v in [n.verb])


def test_kopfs_watches_are_the_handlers_it_registers():
    """KOPF_NEEDS lists what each kopf event handler watches: a list, then watches."""
    import kopf

    from pdscale.operator import handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    watched = {(h.selector.group or "", h.selector.plural or h.selector.any_name) for h in
               registry._watching.get_all_handlers() if h.selector is not None}
    observers = {rbac.CRDS, rbac.NAMESPACES}
    kopf_watched = {(n.group, n.resource) for n in rbac.KOPF_NEEDS} - observers
    assert kopf_watched == watched
    assert {n.verb for n in rbac.KOPF_NEEDS} == {"list", "watch"}


def test_the_chart_holds_the_generated_rules():
    for part in ("namespaced", "cluster", "watching"):
        path = ROOT / "charts" / "pdscale" / f"rbac-{part}-rules.yaml"
        assert yaml.safe_load(path.read_text()) == getattr(rbac, f"{part}_rules")(), (
            f"{path.name}: run make chart-sync")


def test_every_need_says_who_needs_it():
    assert all(isinstance(why, str) and len(why) > 10 for why in rbac.needs().values())
    assert not set(REQUESTS) & set(IMPLIED)
    assert Path(kube_module.__file__).name == "kube.py"
