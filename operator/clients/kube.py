"""The operator's only door to the API server: get, server-side apply and status patch of the
few kinds a PDCluster owns, through the official client's REST layer.

Generic raw calls instead of one typed method per kind: every child goes through the same
apply path (one field manager, the same conflict handling), and the bodies stay plain dicts
as the builders made them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from pdscale.operator.api.names import MANAGER
from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION
from pdscale.operator.api.pdpool import POOL_PLURAL


@dataclass(frozen=True, order=True)
class Need:
    """One permission the API server's authorizer checks: API group ("" is the core group),
    resource (with ``/subresource``) and verb, as an RBAC rule and an audit event name them."""

    group: str
    resource: str
    verb: str


_HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def need_of(method: str, path: str, query: list[tuple[str, str]] | None = None) -> Need:
    """The permission a request to ``path`` needs, read the way the API server reads it:
    GET of a named object is get, of a collection list (watch with ``watch=true``); POST
    create, PUT update, PATCH patch, DELETE delete or deletecollection."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"{method} {path}: not a resource path")
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # the namespace scopes the request; the resource follows it
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    if method == "GET":
        verb = "get" if named else "watch" if ("watch", "true") in (query or []) else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    elif method in _HTTP_VERBS and (named or method == "POST"):
        verb = _HTTP_VERBS[method]
    else:
        raise ValueError(f"{method} {path}: no verb for this method and path")
    return Need(group, resource, verb)


#: Every request the operator's own code makes, as the permission it needs, and who makes it.
#: ``Kube._call`` refuses any other request before it leaves (``Undeclared``), so a new call
#: cannot reach the server without a line here; ``rbac`` grants exactly these, plus
#: ``IMPLIED`` and kopf's own (``rbac.KOPF_NEEDS``); tests/operator/test_rbac*.py hold the
#: three together and compare them with the API server's audit log.
REQUESTS: dict[Need, str] = {
    Need(GROUP, PLURAL, "get"): "Kube.get: reconcile, the resync's fresh read, deletion drain",
    Need(GROUP, PLURAL, "list"): "Kube.list_pdclusters: the resync, the planner loop",
    Need(GROUP, PLURAL, "patch"): "drain.patch_pdcluster: add and remove the finalizer",
    Need(GROUP, f"{PLURAL}/status", "patch"): "Kube.patch_status: conditions, planner status",
    Need(GROUP, POOL_PLURAL, "get"): "Kube.get: reconcile reads the PDPool a PDCluster's "
    "spec.planner.pool names (in its own namespace) to say whether it is a member",
    Need(GROUP, POOL_PLURAL, "list"): "Kube.list_pdpools: the planner loop, once a tick",
    Need(GROUP, f"{POOL_PLURAL}/status", "patch"): "Kube.patch_status: the pool's split, "
    "conditions",
    Need("", "nodes", "list"): "Kube.list_nodes: a PDPool without spec.nodes counts the nodes "
    "its gpuProduct and nodeSelector match",
    Need("apps", "deployments", "get"): "Kube.get: reconcile reads each child; drains read replicas",
    Need("apps", "deployments", "list"): "Kube.list_deployments: the planner loop, once a tick "
    "(whose are the pods it selects by label)",
    Need("apps", "deployments", "patch"): "Kube.apply: reconcile applies the engines and router",
    Need("leaderworkerset.x-k8s.io", "leaderworkersets", "get"): "Kube.get: reconcile reads "
    "the engines of a role whose instances span several nodes (nodesPerInstance > 1)",
    Need("leaderworkerset.x-k8s.io", "leaderworkersets", "patch"): "Kube.apply: reconcile "
    "applies those engines as LeaderWorkerSets",
    Need("", "services", "get"): "Kube.get: reconcile reads each child",
    Need("", "services", "patch"): "Kube.apply: reconcile",
    Need("", "serviceaccounts", "get"): "Kube.get: reconcile reads each child",
    Need("", "serviceaccounts", "patch"): "Kube.apply: reconcile (the router's identity)",
    Need("networking.k8s.io", "networkpolicies", "get"): "Kube.get: reconcile reads each child",
    Need("networking.k8s.io", "networkpolicies", "patch"): "Kube.apply: reconcile",
    Need("", "configmaps", "get"): "Kube.get: planner memory (planner_memory); the profile "
    "named by spec.planner.profileConfigMap, in the PDCluster's namespace (profile_source)",
    Need("", "configmaps", "patch"): "Kube.apply: planner memory, when it exists",
    Need("", "configmaps", "create"): "Kube.create: planner memory, the first time",
    Need("", "pods", "list"): "Kube.list_pods: ready counts, planner, router sync, drains",
    Need("", "pods", "patch"): "Kube.patch_pod: drain marks (annotation, deletion cost)",
    Need("", "events", "create"): "Kube.create_event: reconcile's and the planner's Events",
    Need("coordination.k8s.io", "leases", "get"): "leader.KubeLeases.get",
    Need("coordination.k8s.io", "leases", "create"): "leader.KubeLeases.create: first leader",
    Need("coordination.k8s.io", "leases", "update"): "leader.KubeLeases.update: renew, take, release",
}

#: Permissions the API server checks beyond a request's own verb (absent from its audit log).
IMPLIED: dict[Need, str] = {
    **{Need(group, resource, "create"): "Kube.apply of a missing object creates it: the server "
       "checks create as well as patch"
       for group, resource in [("apps", "deployments"), ("", "services"), ("", "serviceaccounts"),
                               ("networking.k8s.io", "networkpolicies"),
                               ("leaderworkerset.x-k8s.io", "leaderworkersets")]},
    Need(GROUP, f"{PLURAL}/finalizers", "update"): "children set blockOwnerDeletion: the "
    "OwnerReferencesPermissionEnforcement admission plugin, where on, checks this",
}


class Undeclared(RuntimeError):
    """A request missing from ``REQUESTS``: a programming error, refused before it is sent
    (the RBAC would refuse it too, later and less clearly)."""


@dataclass(frozen=True)
class Kind:
    api_version: str
    plural: str

    def path(self, namespace: str, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        out = f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{out}/{name}" if name else out


KINDS = {
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "Service": Kind("v1", "services"),
    "ConfigMap": Kind("v1", "configmaps"),
    "Deployment": Kind("apps/v1", "deployments"),
    "LeaderWorkerSet": Kind("leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "PDCluster": Kind(f"{GROUP}/{VERSION}", PLURAL),
    "PDPool": Kind(f"{GROUP}/{VERSION}", POOL_PLURAL),
}


def api_client_from_environment() -> client.ApiClient:
    """In a pod: its ServiceAccount. Elsewhere: $KUBECONFIG (read now, not at import: the
    client library fixes its default path when it is imported)."""
    # The client's config loaders carry no annotations (kubernetes 37); what they return is
    # documented: nothing, and an ApiClient.
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        configuration = client.Configuration.get_default_copy()
        configuration.retries = call_retries()
        return client.ApiClient(configuration)
    except config.ConfigException:
        configuration = client.Configuration()
        configuration.retries = call_retries()
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        return api


def call_retries() -> Retry:
    """A refused connection is retried (briefly: the API server restarting); a read that timed
    out is not. urllib3's default retries a read three more times, so that one call to a hung
    API server would take four read timeouts, not one."""
    return Retry(total=2, connect=2, read=0, status=0, other=0, backoff_factor=0.2,
                 raise_on_status=False)


def request_timeout_from_environment() -> tuple[float, float]:
    """(connect, read) seconds for every API call: ``PDSCALE_KUBE_TIMEOUT_SECONDS`` as
    "CONNECT,READ" (or one number for both); (5, 30) by default. Without one, a connection the
    API server dropped without a word (a restart, a paused process) hangs its caller for ever."""
    raw = os.environ.get("PDSCALE_KUBE_TIMEOUT_SECONDS", "").strip()
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT
    parts = [float(p) for p in raw.split(",")]
    connect, read = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    if not (0 < connect < math.inf and 0 < read < math.inf):
        raise ValueError(f"PDSCALE_KUBE_TIMEOUT_SECONDS={raw!r}: want positive seconds")
    return connect, read


DEFAULT_REQUEST_TIMEOUT = (5.0, 30.0)


class Kube:
    """Thin, synchronous wrapper over one ApiClient. Counts the writes it makes, which is what
    the no-op reconcile tests and the benchmark measure. Every call carries a (connect, read)
    timeout."""

    def __init__(self, api: client.ApiClient, request_timeout: tuple[float, float] | None = None):
        self.api = api
        self.writes = 0
        self.request_timeout = request_timeout or request_timeout_from_environment()

    def _call(self, method: str, path: str, *, body: Any = None,
              query: list[tuple[str, str]] | None = None,
              content_type: str | None = None) -> dict[str, Any]:
        need = need_of(method, path, query)
        if need not in REQUESTS:
            raise Undeclared(f"{method} {path} needs {need}, which kube.REQUESTS does not declare")
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [],
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*params, _request_timeout=self.request_timeout)
        # RESTResponse.read is unannotated (kubernetes 37); it returns the body's bytes.
        data: bytes | None = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        if not data:
            return {}
        parsed = json.loads(data)
        if not isinstance(parsed, dict):
            raise ValueError(f"{method} {path}: expected a JSON object, got {type(parsed).__name__}")
        return parsed

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", KINDS[kind].path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, manifest: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply under the operator's single field manager. force: the operator is
        the authority for every field it sets; another manager's edit of those is drift.
        Creation goes without force, so an object someone created since our GET conflicts
        (409) instead of being taken over."""
        meta = manifest["metadata"]
        self.writes += 1
        return self._call(
            "PATCH", KINDS[manifest["kind"]].path(meta["namespace"], meta["name"]),
            body=manifest, query=[("fieldManager", MANAGER), ("force", "true" if force else "false")],
            content_type="application/apply-patch+yaml",
        )

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create an object that must not exist yet: HTTP 409 (AlreadyExists) when it does,
        never a write over someone else's."""
        meta = manifest["metadata"]
        self.writes += 1
        return self._call("POST", KINDS[manifest["kind"]].path(meta["namespace"]), body=manifest,
                          query=[("fieldManager", MANAGER)], content_type="application/json")

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     kind: str = "PDCluster") -> dict[str, Any]:
        """Merge-patch the status subresource of a PDCluster (or a PDPool)."""
        self.writes += 1
        return self._call(
            "PATCH", KINDS[kind].path(namespace, name) + "/status",
            body={"status": status}, query=[("fieldManager", MANAGER)],
            content_type="application/merge-patch+json",
        )

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        ns = event["metadata"]["namespace"]
        return self._call("POST", f"/api/v1/namespaces/{ns}/events", body=event,
                          content_type="application/json")

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Strategic-merge-patch one pod (a ``None`` value removes the key): the drain marks."""
        self.writes += 1
        return self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=patch,
                          content_type="application/strategic-merge-patch+json")

    def list_pods(self, namespace: str | None, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Pods carrying ``labels``, in ``namespace`` or (None) in every watched namespace."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        query = [("labelSelector", selector)]
        if namespace is not None:
            return _items(self._call("GET", f"/api/v1/namespaces/{namespace}/pods", query=query))
        watched = watch_namespaces()
        if watched is None:
            return _items(self._call("GET", "/api/v1/pods", query=query))
        return [p for ns in watched
                for p in _items(self._call("GET", f"/api/v1/namespaces/{ns}/pods", query=query))]

    def list_deployments(self, namespace: str | None, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Deployments carrying ``labels``, in ``namespace`` or (None) every watched namespace."""
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items()))]
        kind = KINDS["Deployment"]
        if namespace is not None:
            return _items(self._call("GET", kind.path(namespace), query=query))
        watched = watch_namespaces()
        if watched is None:
            return _items(self._call("GET", f"/apis/{kind.api_version}/{kind.plural}", query=query))
        return [d for ns in watched for d in _items(self._call("GET", kind.path(ns), query=query))]

    def list_pdpools(self) -> list[dict[str, Any]]:
        """Every PDPool in the watched namespaces."""
        kind = KINDS["PDPool"]
        watched = watch_namespaces()
        if watched is None:
            return _items(self._call("GET", f"/apis/{kind.api_version}/{kind.plural}"))
        return [b for ns in watched for b in _items(self._call("GET", kind.path(ns)))]

    def list_nodes(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Nodes carrying ``labels`` (cluster-scoped)."""
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items()))]
        return _items(self._call("GET", "/api/v1/nodes", query=query))

    def list_pdclusters(self) -> list[dict[str, Any]]:
        """Every PDCluster in the watched namespaces."""
        kind = KINDS["PDCluster"]
        watched = watch_namespaces()
        if watched is None:
            return _items(self._call("GET", f"/apis/{kind.api_version}/{kind.plural}"))
        return [b for ns in watched for b in _items(self._call("GET", kind.path(ns)))]


def watch_namespaces(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The namespaces the operator watches (``PDSCALE_WATCH_NAMESPACES``, comma-separated, as
    the chart sets it next to kopf's ``--namespace`` flags); None: every namespace. With a list
    the operator's RBAC is a Role in each, so it must never list cluster-wide."""
    raw = (os.environ if environ is None else environ).get("PDSCALE_WATCH_NAMESPACES", "")
    names = tuple(sorted({n.strip() for n in raw.split(",") if n.strip()}))
    return names or None


def _items(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of a list answer; an answer without ``items`` lists nothing."""
    items = listing.get("items") or []
    return [item for item in items if isinstance(item, dict)]
