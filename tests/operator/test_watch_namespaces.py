"""With watchNamespaces, the operator's own listings stay inside them: its RBAC is a Role in
each, so a cluster-wide list would be refused (and would read other tenants' objects)."""

from __future__ import annotations

from typing import Any

from pdscale.operator.clients.kube import Kube, watch_namespaces


class Recording(Kube):
    def __init__(self) -> None:  # no API client: the calls are recorded, not sent
        self.paths: list[str] = []

    def _call(self, method: str, path: str, **_: Any) -> dict[str, Any]:  # type: ignore[override]
        self.paths.append(path)
        return {"items": [{"path": path}]}


def test_the_watched_namespaces_come_from_the_environment():
    assert watch_namespaces({}) is None
    assert watch_namespaces({"PDSCALE_WATCH_NAMESPACES": ""}) is None
    assert watch_namespaces({"PDSCALE_WATCH_NAMESPACES": "team-b, team-a,,team-a"}) == ("team-a", "team-b")


def test_listings_go_namespace_by_namespace_when_namespaces_are_watched(monkeypatch):
    monkeypatch.setenv("PDSCALE_WATCH_NAMESPACES", "team-a,team-b")
    kube = Recording()
    kube.list_pdclusters()
    kube.list_pods(None, {"app": "x"})
    assert kube.paths == [
        "/apis/pdscale.io/v1alpha1/namespaces/team-a/pdclusters",
        "/apis/pdscale.io/v1alpha1/namespaces/team-b/pdclusters",
        "/api/v1/namespaces/team-a/pods", "/api/v1/namespaces/team-b/pods"]
    monkeypatch.delenv("PDSCALE_WATCH_NAMESPACES")
    kube.paths.clear()
    kube.list_pdclusters()
    kube.list_pods(None, {"app": "x"})
    assert kube.paths == ["/apis/pdscale.io/v1alpha1/pdclusters", "/api/v1/pods"]
