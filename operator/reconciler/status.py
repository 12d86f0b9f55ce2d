"""Pure: the PDCluster status from what the operator observed (the live Deployments, the
validation result, name conflicts). Time is passed in, never read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdscale.operator.api import names
from pdscale.operator.api.clock import epoch_seconds
from pdscale.operator.api.names import DRAINING_ANNOTATION
from pdscale.planner.model import Calibration
from pdscale.planner.observe import Role
from pdscale.planner.profile import Profile

from . import conditions as c

# what status reports on: the two engine roles and the router
ENGINE_ROLES = (Role.PREFILL.value, Role.DECODE.value)
COMPONENTS = (*ENGINE_ROLES, "router")


@dataclass
class ChildrenView:
    """What one reconcile saw. `deployments` maps role -> the live Deployment (None when it
    does not exist or is not ours)."""

    generation: int
    problems: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    deployments: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    derived: dict[str, int] | None = None
    #: engine pods not Ready past their allowance (see ``overdue_pods``)
    unready: list[UnreadyPod] = field(default_factory=list)
    #: children the API server refused to apply, one line each (``reconcile.refusal``)
    refused: list[str] = field(default_factory=list)
    #: role -> the spec's nodes per instance (a role whose child is not there yet)
    nodes_per_instance: dict[str, int] = field(default_factory=dict)
    #: the PDPool spec.planner.pool names (None: it names none), and why it may not plan in
    #: it (``pdpool.pool_refusal``; None: a member)
    pool: str | None = None
    pool_refusal: str | None = None


@dataclass(frozen=True)
class UnreadyPod:
    name: str
    role: str
    allowance_seconds: float


def overdue_pods(pods: list[dict[str, Any]], allowance_seconds: Mapping[Role, float],
                 now_seconds: float) -> list[UnreadyPod]:
    """Engine pods (API dicts) that are not Ready, and have not been for longer than their
    role's allowance: since creation for a pod that never served, since it turned unready
    for one that did. Deleting and draining pods are leaving anyway and do not count.

    Such a pod is never in the router (only Ready pods are workers); this makes it visible
    (Degraded) instead of a silent hole in capacity."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        label = (meta.get("labels") or {}).get(names.LABEL_ROLE, "")
        # the router, and any role the caller gave no allowance, is not an engine to watch
        if label not in allowance_seconds or meta.get("deletionTimestamp"):
            continue
        role = Role(label)
        if (meta.get("annotations") or {}).get(DRAINING_ANNOTATION):
            continue
        ready = next((x for x in status.get("conditions") or [] if x.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") == "True":
            continue
        # Since the Ready condition last turned (False since start, or since it stopped
        # serving); a pod with no condition yet counts from its creation.
        since = epoch_seconds((ready or {}).get("lastTransitionTime") or meta.get("creationTimestamp"))
        if since is not None and now_seconds - since > allowance_seconds[role]:
            out.append(UnreadyPod(meta.get("name", ""), role, allowance_seconds[role]))
    return sorted(out, key=lambda p: p.name)


def unready_message(pod: UnreadyPod) -> str:
    # Stable text (no running counter): a status write and an Event when the set changes,
    # not on every reconcile.
    return (f"{pod.role} pod {pod.name} not Ready within its allowance of "
            f"{pod.allowance_seconds:.0f} s; kept out of the router")


def role_counts(deployment: dict[str, Any] | None) -> dict[str, int]:
    """A child's counts: instances (a Deployment's pods, a LeaderWorkerSet's groups)."""
    if deployment is None:
        return {"desiredReplicas": 0, "readyReplicas": 0, "updatedReplicas": 0}
    st = deployment.get("status") or {}
    return {
        "desiredReplicas": int((deployment.get("spec") or {}).get("replicas", 1)),
        "readyReplicas": int(st.get("readyReplicas", 0)),
        "updatedReplicas": int(st.get("updatedReplicas", 0)),
    }


def node_counts(deployment: dict[str, Any] | None, counts: dict[str, int],
                spec_nodes: int = 1) -> dict[str, int]:
    """An engine role's nodes beside its instances: each of a Deployment's pods is one node,
    each of a LeaderWorkerSet's groups ``leaderWorkerTemplate.size`` nodes (the live set's:
    what runs; ``spec_nodes`` only while there is no child yet). Ready nodes are those of
    whole ready groups: a group with a pod down serves nothing (RecreateGroupOnPodRestart)."""
    if deployment is None:
        size = spec_nodes
    elif deployment.get("kind") == "LeaderWorkerSet":
        value = ((deployment.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1)
        size = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    else:
        size = 1
    return {"nodesPerInstance": size, "desiredNodes": counts["desiredReplicas"] * size,
            "readyNodes": counts["readyReplicas"] * size}


def _rolled_out(deployment: dict[str, Any] | None) -> bool:
    """Deployment's own rollout-complete test (what `kubectl rollout status` waits for). A
    LeaderWorkerSet (instances of several nodes) counts groups, and has no available count:
    a group is whole when every pod of it is Ready (its status.readyReplicas)."""
    if deployment is None:
        return False
    meta, spec, st = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    group = deployment.get("kind") == "LeaderWorkerSet"
    serving = "readyReplicas" if group else "availableReplicas"
    # (an LWS older than its observedGeneration field reports none: its counts then stand)
    observed = st.get("observedGeneration", meta.get("generation", 0) if group else 0)
    return (
        int(observed) >= int(meta.get("generation", 0))
        and int(st.get("updatedReplicas", 0)) == desired
        and int(st.get("replicas", 0)) == desired
        and int(st.get(serving, 0)) == desired
    )


def _stalled(deployment: dict[str, Any] | None) -> str | None:
    for cond in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return cond.get("message") or "progress deadline exceeded"
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return cond.get("message") or "replica failure"
    return None


def _pool_condition(obs: ChildrenView) -> list[dict[str, Any]]:
    """PoolMember, on a PDCluster naming a pool only."""
    if obs.pool is None:
        return []
    return [c.condition(c.POOL_MEMBER, obs.pool_refusal is None,
                        c.POOL_JOINED if obs.pool_refusal is None else c.POOL_REFUSED,
                        obs.pool_refusal or f"a member of PDPool {obs.pool}: its replicas "
                        "follow the pool's joint plan", obs.generation)]


def _applied_condition(obs: ChildrenView, valid: bool) -> dict[str, Any]:
    """ChildrenApplied: whether the API server took every child of this generation."""
    if not valid:
        reason, message = c.SPEC_INVALID, "the spec is invalid; nothing was applied"
    elif obs.refused:
        reason, message = c.APPLY_REFUSED, "; ".join(obs.refused)
    else:
        reason, message = c.APPLIED, "the API server refused no child"
    return c.condition(c.CHILDREN_APPLIED, valid and not obs.refused, reason, message,
                       obs.generation)


def compute(obs: ChildrenView, previous: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """The whole status object. `previous` is the current status (for transition times)."""
    gen = obs.generation
    counts = {role: role_counts(obs.deployments.get(role)) for role in COMPONENTS}
    nodes = {role: node_counts(obs.deployments.get(role), counts[role],
                               obs.nodes_per_instance.get(role, 1)) for role in ENGINE_ROLES}
    valid = not obs.problems
    conds = [
        c.condition(c.SPEC_VALID, valid, c.SPEC_ACCEPTED if valid else c.SPEC_INVALID,
                    "; ".join(obs.problems) if obs.problems else "spec passes the P/D checklist",
                    gen),
    ]
    conds.append(_applied_condition(obs, valid))
    stalled = {role: m for role in COMPONENTS if (m := _stalled(obs.deployments.get(role)))}
    rolling = [role for role in COMPONENTS if not _rolled_out(obs.deployments.get(role))]
    # Once this generation has rolled out, the planner's scaling (replicas from
    # status.planner, not the spec) keeps Ready True while every role still serves: an Auto
    # scale-up is capacity arriving, not the model going away.
    before = c.find((previous or {}).get("conditions"), c.READY)
    served = (before is not None and before.get("status") == "True"
              and before.get("observedGeneration") == gen)
    serving = all(counts[role]["readyReplicas"] >= min(1, counts[role]["desiredReplicas"])
                  for role in COMPONENTS)
    scaling = bool(rolling) and served and serving and not stalled
    ready = valid and not obs.refused and not obs.conflicts and (not rolling or scaling)
    if not valid:
        ready_reason, ready_msg = c.SPEC_INVALID, "the spec is invalid; children were left as they were"
    elif obs.refused:
        # what runs is not this generation, and retrying the same manifests will not make it so
        ready_reason, ready_msg = c.APPLY_REFUSED, "the API server refused a child (ChildrenApplied)"
    elif obs.conflicts:
        ready_reason, ready_msg = c.NAME_CONFLICT, "; ".join(obs.conflicts)
    elif scaling:
        ready_reason = c.SCALING
        ready_msg = "serving; " + ", ".join(
            f"{role} {counts[role]['readyReplicas']}/{counts[role]['desiredReplicas']} ready"
            for role in rolling)
    elif rolling:
        ready_reason = c.WAITING_FOR_REPLICAS
        ready_msg = ", ".join(
            f"{role} {counts[role]['readyReplicas']}/{counts[role]['desiredReplicas']} ready"
            for role in rolling)
    else:
        ready_reason = c.ALL_READY
        ready_msg = ", ".join(
            f"{role} {counts[role]['readyReplicas']}/{counts[role]['desiredReplicas']}" for role in COMPONENTS)
    conds.append(c.condition(c.READY, ready, ready_reason, ready_msg, gen))
    progressing = valid and not obs.refused and not obs.conflicts and bool(rolling) and not stalled
    conds.append(c.condition(
        c.PROGRESSING, progressing,
        c.ROLLING_OUT if progressing else c.ROLLOUT_COMPLETE,
        f"rolling out: {', '.join(rolling)}" if progressing else "no rollout in progress", gen))
    # Every cause is listed; the reason names the most severe.
    problems = [*obs.conflicts, *(f"{role}: {m}" for role, m in sorted(stalled.items())),
                *map(unready_message, obs.unready)]
    reason = (c.NAME_CONFLICT if obs.conflicts else c.DEPLOYMENT_STALLED if stalled
              else c.POD_NOT_READY if obs.unready else c.AS_EXPECTED)
    conds.append(c.condition(
        c.DEGRADED, bool(problems), reason,
        "; ".join(problems) if problems else "no conflicts, no stalled rollouts, no pod overdue", gen))
    conds += _pool_condition(obs)

    status: dict[str, Any] = {
        "observedGeneration": gen,
        "conditions": c.merge((previous or {}).get("conditions"), conds, now),
        **counts,
    }
    for role in ENGINE_ROLES:
        status[role] = {**counts[role], **nodes[role]}
    if obs.derived is not None:
        status["derived"] = obs.derived
    elif previous and "derived" in previous:
        status["derived"] = previous["derived"]  # keep the last valid derivation visible
    return status


def patch_for(previous: dict[str, Any] | None, desired: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch turning `previous` into `desired` for the keys the operator owns, or None
    when nothing changed (so a no-op reconcile writes nothing). The planner's keys are left
    alone."""
    previous = previous or {}
    patch = {k: v for k, v in desired.items() if previous.get(k) != v}
    return patch or None


# -- status.planner.profile: the profile in use, where it came from, how far it has moved ------
#: a provenance is a tenant's YAML: status quotes at most this much of any string in it
_MAX_QUOTED = 120
#: ... and names at most this many terms
_MAX_TERMS = 20


def profile_status(profile: Profile | None, source: str, calibration: Calibration | None,
                   problem: str | None = None) -> dict[str, Any]:
    """``status.planner.profile`` (pure): the profile's name and source (``shipped`` or
    ``ConfigMap NAME@RESOURCEVERSION``), a summary of its provenance when it has one (who
    fitted it and when, from which tools, how many points per role, which terms the points
    could not identify, the fit's RMS residual per role in percent), and how far the online
    calibration has moved it, in percent of the profile (100 = unmoved): ``prefillTimePercent``
    scales prefill compute time, ``decodeTimePercent`` TPOT, and the headrooms the instances
    each role is sized for. Integers only (no floats in the API); a provenance field of the
    wrong type is left out, never an error."""
    out: dict[str, Any] = {"source": source}
    if problem is not None:
        out["problem"] = problem
    if profile is None:
        return out
    out["name"] = _quoted(profile.name)
    if profile.provenance:
        out["provenance"] = _provenance_summary(profile.provenance)
    cal = calibration or Calibration()
    out["calibration"] = {
        "prefillTimePercent": _percent(cal.prefill_factor),
        "decodeTimePercent": _percent(cal.decode_factor),
        "prefillHeadroomPercent": _percent(cal.prefill_headroom),
        "decodeHeadroomPercent": _percent(cal.decode_headroom),
        "samples": int(cal.samples),
    }
    return out


def _percent(factor: float) -> int | None:
    return round(factor * 100) if math.isfinite(factor) else None


def _quoted(value: object) -> str | None:
    return value[:_MAX_QUOTED] if isinstance(value, str) else None


def _mapping(value: object) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _provenance_summary(prov: Mapping[str, Any]) -> dict[str, Any]:
    sources = [s for s in prov.get("sources") or [] if isinstance(s, dict)] \
        if isinstance(prov.get("sources"), list) else []
    terms, residuals = _mapping(prov.get("terms")), _mapping(prov.get("residuals"))
    out: dict[str, Any] = {
        "fittedBy": _quoted(prov.get("fitted_by")),
        "fittedAt": _quoted(prov.get("fitted_at")),
        "base": _quoted(prov.get("base")),
        "tools": sorted({t for s in sources if (t := _quoted(s.get("tool")))})[:_MAX_TERMS],
        "points": {"prefill": sum(_count(s.get("prefill_points")) for s in sources),
                   "decode": sum(_count(s.get("decode_points")) for s in sources)},
        "notIdentified": sorted(str(k)[:_MAX_QUOTED] for k, t in terms.items()
                                if isinstance(t, dict) and t.get("identified") is False)[:_MAX_TERMS],
    }
    for role, key in (("prefill", "prefill_compute"), ("decode", "decode_itl")):
        rms = _mapping(residuals.get(key)).get("rms_relative")
        if isinstance(rms, (int, float)) and not isinstance(rms, bool) and math.isfinite(rms):
            out.setdefault("residualPercent", {})[role] = round(rms * 100)
    warnings = prov.get("warnings")
    out["warnings"] = len(warnings) if isinstance(warnings, list) else 0
    return {k: v for k, v in out.items() if v is not None}
