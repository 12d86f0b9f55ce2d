"""One level-based reconcile of a PDCluster: read, build, apply what differs, report.

Whatever woke it (the PDCluster changed, a child changed, a periodic resync, an operator
restart), it compares every desired child with the live one and converges. It writes only
what differs: an unchanged PDCluster costs GETs and no write, so resourceVersions stay put.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from pdscale.operator.api import multinode, tenant_policy
from pdscale.operator.api.clock import epoch_seconds
from pdscale.operator.api.names import (
    ANNOTATION_APPLIED_HASH,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGER,
    Owner,
    base_name,
    child_name,
)
from pdscale.operator.api.pdcluster import GROUP, KIND, VERSION, PDClusterSpec
from pdscale.operator.api.pdpool import PDPoolSpec, pool_refusal
from pdscale.operator.clients.kube import Kube
from pdscale.operator.render import lws, network
from pdscale.operator.render.builders import (
    build_children,
    planned_replicas,
    unready_allowance_seconds,
)
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.operator.render.derived import Derived
from pdscale.planner.observe import Role

from . import conditions as c
from . import status as st


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    writes: int = 0
    events: list[Event] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    #: children the API server refused (``refusal``): retried with backoff, reported once
    refused: list[str] = field(default_factory=list)
    # (kind, name) -> resourceVersion of every child as this reconcile left it.
    seen: dict[tuple[str, str], str] = field(default_factory=dict)


#: HTTP codes of an apply that retrying the same manifest cannot heal: Bad Request, Forbidden
#: (RBAC, or an admission webhook or policy that denies), Invalid. Conflicts (409), throttling
#: (429) and server errors stay temporary and go up as ApiException.
REFUSED_STATUSES = frozenset({400, 403, 422})


def refusal(kind: str, name: str, status: int | None, reason: str | None, body: Any) -> str:
    """One line naming the refused child and what the API server said (its Status message
    when the body is one, which names the field and the policy)."""
    message = ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        parsed = json.loads(body) if isinstance(body, str | bytes) else body
        message = str(parsed.get("message") or "")
    said = message or reason or "no message"
    return f"{kind}/{name} refused by the API server (HTTP {status}): {said}"[:900]


def is_ours(live: dict[str, Any], uid: str) -> bool:
    """Controlled by this PDCluster (by uid: a recreated PDCluster of the same name does not
    inherit the orphans of the old one)."""
    for ref in live.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid") == uid:
            return True
    return False


def contains(live: Any, desired: Any) -> bool:
    """Every field set in `desired` has the same value in `live`. The API server adds defaults
    (probe timeouts, protocol, fieldRef.apiVersion...) and may turn integers into strings in
    int-or-string fields, so extra keys are fine and scalars compare by text; it also drops
    zero values, so a missing key matches a desired false/0/""."""
    if isinstance(desired, dict):
        # The API server omits zero values (false, 0, "", empty lists) of omitempty fields.
        return isinstance(live, dict) and all(
            contains(live[k], v) if k in live else _is_zero(v) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(a, b) for a, b in zip(live, desired, strict=True)))
    if isinstance(desired, bool) or isinstance(live, bool):
        return bool(live == desired)
    return bool(live == desired) or str(live) == str(desired)


def _is_zero(value: Any) -> bool:
    return value is None or value is False or value in (0, "", [], {})


def in_sync(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Live already holds what we would apply: same spec hash, and no drift in our fields."""
    live_hash = (live["metadata"].get("annotations") or {}).get(ANNOTATION_APPLIED_HASH)
    want_hash = desired["metadata"]["annotations"][ANNOTATION_APPLIED_HASH]
    if live_hash != want_hash:
        return False
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    return contains(live, body)


#: the kinds a role's engines run as: a Deployment, or a LeaderWorkerSet when one instance
#: spans several nodes (``nodesPerInstance`` > 1); status reads either (``status.compute``)
ENGINE_KINDS = ("Deployment", lws.KIND)


def _pod_template(spec: dict[str, Any]) -> dict[str, Any]:
    """A Deployment's pod template, or a LeaderWorkerSet's leader template."""
    group = spec.get("leaderWorkerTemplate")
    return dict((group.get("leaderTemplate") if group else spec.get("template")) or {})


def _describe_change(live: dict[str, Any], desired: dict[str, Any]) -> tuple[str, str]:
    kind, name = desired["kind"], desired["metadata"]["name"]
    if kind in ENGINE_KINDS:
        before, after = live.get("spec", {}), desired["spec"]
        if before.get("replicas") != after.get("replicas"):
            return c.EVENT_SCALED, f"{kind}/{name} replicas {before.get('replicas')} -> {after['replicas']}"
        old = [x.get("image") for x in _pod_template(before).get("spec", {}).get("containers", [])]
        new = [x.get("image") for x in _pod_template(after)["spec"]["containers"]]
        if old != new:
            return c.EVENT_UPDATED, f"{kind}/{name} image {', '.join(map(str, old))} -> {', '.join(new)}"
    return c.EVENT_UPDATED, f"{kind}/{name} updated to the current spec"


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(uid: str) -> threading.Lock:
    # Handlers for the PDCluster and for its children may run at once in kopf's thread pool;
    # one reconcile per PDCluster at a time keeps the status patches ordered.
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


def reconcile(kube: Kube, body: dict[str, Any], now: str) -> Outcome:
    """Converge one PDCluster (`body` as read from the API) and write its status."""
    meta = body["metadata"]
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    with _lock(owner.uid or ""):
        # Read again under the lock: another reconcile of this PDCluster may have written its
        # status since ``body`` was read, and conditions and Events follow from the status
        # as it is (a stale one says the same thing twice; a retried refusal did, 4 times).
        current = kube.get("PDCluster", owner.namespace, owner.name)
        if current is None or current["metadata"].get("uid") != owner.uid:
            return Outcome()  # gone, or another PDCluster of the same name now
        return _reconcile(kube, current, owner, now)


def reconcile_current(kube: Kube, namespace: str, name: str, now: str) -> Outcome | None:
    """Reconcile the PDCluster as it is now, not as a caller read it earlier (the planner loop
    asks after it wrote status); None when it is gone."""
    body = kube.get("PDCluster", namespace, name)
    return None if body is None else reconcile(kube, body, now)


def _reconcile(kube: Kube, body: dict[str, Any], owner: Owner, now: str) -> Outcome:
    out = Outcome()
    writes_before = kube.writes
    previous = body.get("status") or {}
    obs = st.ChildrenView(generation=int(body["metadata"].get("generation", 1)))
    # None when the spec is invalid: then nothing is built, only what runs is reported
    spec: PDClusterSpec | None
    derived: Derived | None
    try:
        spec, derived = validate(body.get("spec"), tenant_policy.configured())
    except SpecError as exc:
        out.problems = obs.problems = [str(p) for p in exc.problems]
        spec = derived = None

    if spec is not None:
        spec = _in_pool(kube, spec, owner, obs)
    if spec is not None and derived is not None:
        obs.derived = derived.as_status()
        obs.nodes_per_instance = {role: multinode.nodes_per_instance(spec, role)
                                  for role in st.ENGINE_ROLES}
        replicas = planned_replicas(spec, previous)
        for desired in build_children(owner, spec, derived, replicas, network.configured()):
            kind, name = desired["kind"], desired["metadata"]["name"]
            live = kube.get(kind, owner.namespace, name)
            if live is not None and not is_ours(live, owner.uid or ""):
                obs.conflicts.append(
                    f"{kind}/{name} exists and is not controlled by this PDCluster; left untouched")
                continue
            if obs.refused:
                # Children go in order (the NetworkPolicies first: no pod of ours runs
                # unfenced); after a refusal the rest wait for the retry, only read.
                if live is not None and kind in ENGINE_KINDS:
                    obs.deployments[desired["metadata"]["labels"]["pdscale.io/role"]] = live
                continue
            try:
                if live is None:
                    live = kube.apply(desired, force=False)
                    out.events.append(Event("Normal", c.EVENT_CREATED, f"{kind}/{name} created"))
                elif not in_sync(live, desired):
                    reason, message = _describe_change(live, desired)
                    live = kube.apply(desired)
                    out.events.append(Event("Normal", reason, message))
            except ApiException as exc:
                if exc.status not in REFUSED_STATUSES:
                    raise
                obs.refused.append(refusal(kind, name, exc.status, exc.reason, exc.body))
                if live is not None and kind in ENGINE_KINDS:
                    obs.deployments[desired["metadata"]["labels"]["pdscale.io/role"]] = live
                continue
            out.seen[(kind, name)] = live["metadata"].get("resourceVersion", "")
            if kind in ENGINE_KINDS:
                obs.deployments[desired["metadata"]["labels"]["pdscale.io/role"]] = live
    else:
        # Invalid spec: touch nothing, but keep reporting what runs.
        for role in st.COMPONENTS:
            live = kube.get("Deployment", owner.namespace, child_name(owner.name, role))
            if live is None and role != "router":  # an engine role of several nodes each
                live = kube.get(lws.KIND, owner.namespace, child_name(owner.name, role))
            if live is not None and is_ours(live, owner.uid or ""):
                obs.deployments[role] = live
    out.conflicts = obs.conflicts
    out.refused = obs.refused
    if spec is not None:
        pods = kube.list_pods(owner.namespace, {LABEL_INSTANCE: base_name(owner.name),
                                                LABEL_MANAGED_BY: MANAGER})
        allowance = {role: unready_allowance_seconds(spec, role) for role in Role}
        obs.unready = st.overdue_pods(pods, allowance, epoch_seconds(now) or 0.0)

    desired_status = st.compute(obs, previous, now)
    out.events += _condition_events(previous, desired_status)
    patch = st.patch_for(previous, desired_status)
    if patch is not None:
        kube.patch_status(owner.namespace, owner.name, patch)
    for event in out.events:
        post_event(kube, body, event, now)
    out.writes = kube.writes - writes_before
    return out


def _in_pool(kube: Kube, spec: PDClusterSpec, owner: Owner, obs: st.ChildrenView) -> PDClusterSpec:
    """Whether the pool spec.planner.pool names admits this PDCluster (``obs.pool_refusal``,
    reported as PoolMember); a member's engine pods are pinned to the pool's nodes: the
    pool's nodeSelector over the spec's own (the admin's labels win: a member cannot place
    engines outside the pool)."""
    ref = spec.planner.pool
    if ref is None:
        return spec
    obs.pool = f"{ref.namespace or owner.namespace}/{ref.name}"
    # never read a pool of another namespace: the refusal needs only its name
    pool = (kube.get("PDPool", owner.namespace, ref.name)
            if ref.namespace in (None, owner.namespace) else None)
    obs.pool_refusal = pool_refusal(owner.namespace, owner.name, ref, spec.placement.gpu_product,
                                    pool)
    if obs.pool_refusal is not None or pool is None:
        return spec
    labels = PDPoolSpec.model_validate(pool.get("spec") or {}).node_selector
    if all(spec.placement.node_selector.get(k) == v for k, v in labels.items()):
        return spec
    placement = spec.placement.model_copy(
        update={"node_selector": {**spec.placement.node_selector, **labels}})
    return spec.model_copy(update={"placement": placement})


def _condition_events(previous: dict[str, Any], current: dict[str, Any]) -> list[Event]:
    """Events for condition changes a user cares about (and not on every reconcile)."""
    events = []
    before = {x["type"]: x for x in previous.get("conditions") or []}
    for cond in current["conditions"]:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"] and old.get("message") == cond["message"]
        if same:
            continue
        if cond["type"] == c.SPEC_VALID and cond["status"] == "False":
            events.append(Event("Warning", c.EVENT_SPEC_INVALID, cond["message"]))
        elif cond["type"] == c.CHILDREN_APPLIED and cond["reason"] == c.APPLY_REFUSED:
            # once per refusal (the message is the server's, the same on every retry)
            events.append(Event("Warning", c.EVENT_APPLY_REFUSED, cond["message"]))
        elif cond["type"] == c.POOL_MEMBER and cond["status"] == "False":
            events.append(Event("Warning", c.EVENT_POOL_REFUSED, cond["message"]))
        elif cond["type"] == c.DEGRADED and cond["status"] == "True":
            reason = c.EVENT_NAME_CONFLICT if cond["reason"] == c.NAME_CONFLICT else cond["reason"]
            events.append(Event("Warning", reason, cond["message"]))
        elif cond["type"] == c.READY and (old is None or old.get("status") != cond["status"]):
            if cond["status"] == "True":
                events.append(Event("Normal", c.EVENT_READY, cond["message"]))
            elif old is not None and cond["reason"] != c.APPLY_REFUSED:  # said once, above
                events.append(Event("Warning", c.EVENT_NOT_READY, cond["message"]))
    return events


def post_event(kube: Kube, body: dict[str, Any], event: Event, now: str) -> None:
    """A core/v1 Event on the PDCluster, or the object ``body`` is (a PDPool's carries its
    kind): what `kubectl describe` lists."""
    meta = body["metadata"]
    manifest = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": body.get("apiVersion") or f"{GROUP}/{VERSION}",
                           "kind": body.get("kind") or KIND, "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"],
                           "resourceVersion": meta.get("resourceVersion")},
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "reportingInstance": MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    # An Event is best effort; losing one must not fail the reconcile.
    with contextlib.suppress(ApiException):
        kube.create_event(manifest)
