"""Status condition types and reasons (the one place they are named), and the pure helper
that keeps lastTransitionTime stable while a condition's status does not change."""

from __future__ import annotations

from typing import Any

# Condition types.
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SPEC_VALID = "SpecValid"
#: every child the spec asks for was accepted by the API server (False: one was refused)
CHILDREN_APPLIED = "ChildrenApplied"
#: only on a PDCluster naming a pool (spec.planner.pool): the pool lists it (False: refused,
#: the message names the field; its planner holds)
POOL_MEMBER = "PoolMember"
TYPES = (SPEC_VALID, CHILDREN_APPLIED, READY, PROGRESSING, DEGRADED, POOL_MEMBER)

# Reasons (CamelCase, stable: alerts and dashboards match on them).
SPEC_ACCEPTED = "SpecAccepted"
SPEC_INVALID = "SpecInvalid"
ALL_READY = "AllReplicasReady"
#: Ready stays True while the planner scales a fleet that already served this generation
SCALING = "Scaling"
WAITING_FOR_REPLICAS = "WaitingForReplicas"
ROLLING_OUT = "RollingOut"
ROLLOUT_COMPLETE = "RolloutComplete"
NAME_CONFLICT = "NameConflict"
DEPLOYMENT_STALLED = "DeploymentStalled"
POD_NOT_READY = "PodNotReady"
AS_EXPECTED = "AsExpected"
APPLIED = "Applied"
#: the API server refused a child (400, 403 incl. an admission policy, 422): retrying the same
#: manifest cannot help, so it is said, not only retried
APPLY_REFUSED = "ApplyRefused"

POOL_JOINED = "PoolJoined"
POOL_REFUSED = "PoolRefused"

# Event reasons.
EVENT_CREATED = "Created"
EVENT_UPDATED = "Updated"
EVENT_SCALED = "Scaled"
EVENT_NAME_CONFLICT = NAME_CONFLICT
EVENT_SPEC_INVALID = SPEC_INVALID
EVENT_READY = "Ready"
EVENT_NOT_READY = "NotReady"
EVENT_APPLY_REFUSED = APPLY_REFUSED
EVENT_POOL_REFUSED = POOL_REFUSED
#: a ConfigMap named like the planner memory is not controlled by the PDCluster: left alone
EVENT_PLANNER_MEMORY_FOREIGN = "PlannerMemoryForeign"


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def merge(previous: list[dict[str, Any]] | None, current: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """Conditions in TYPES order, with lastTransitionTime carried over from `previous` when a
    condition's status is unchanged and set to `now` (RFC 3339) when it flips."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in sorted(current, key=lambda c: TYPES.index(c["type"])):
        old = before.get(cond["type"])
        stamped = dict(cond)
        if old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            stamped["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            stamped["lastTransitionTime"] = now
        out.append(stamped)
    return out


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
