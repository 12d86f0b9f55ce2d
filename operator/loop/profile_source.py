"""Where a PDCluster's performance profile comes from: a shipped profile by name
(``spec.planner.profile``) or a ConfigMap of the PDCluster's own namespace
(``spec.planner.profileConfigMap``), holding a profile YAML such as ``pdscale profile fit``
writes.

A ConfigMap is a tenant's input, so it is read as the command line reads a file: at most
``MAX_PROFILE_BYTES``, UTF-8, YAML, then the profile loader's own validation. Whatever is
wrong (no such ConfigMap, no such key, too large, not a profile) becomes a problem that names
the spec field and the ConfigMap; the planner then holds (``planner_loop``) rather than plan
with a profile the user did not choose: the shipped default can be off by a factor of ten for
other hardware, and an Auto fleet sized by it would move far, on a guess.

Level-based: every planning interval the ConfigMap is read again, and its resourceVersion
decides whether it is parsed again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pdscale.operator.api import multinode
from pdscale.operator.api.clock import now_rfc3339
from pdscale.operator.api.pdcluster import PDClusterSpec, ProfileConfigMapRef
from pdscale.operator.clients.kube import Kube
from pdscale.operator.reconciler.reconcile import Event, post_event
from pdscale.planner.model import Calibration
from pdscale.planner.profile import (
    MAX_PROFILE_BYTES,
    Profile,
    ProfileError,
    parse_profile_text,
    shape_problem,
    shipped_profile,
)

log = logging.getLogger(__name__)

#: the spec field a ConfigMap problem is reported against
FIELD = "spec.planner.profileConfigMap"

SHIPPED = "shipped"


@dataclass(frozen=True)
class ResolvedProfile:
    """The profile a PDCluster plans with, and where it came from: ``shipped`` or
    ``ConfigMap NAME@RESOURCEVERSION``. ``profile`` is None when it cannot be used; ``problem``
    then says why, naming the field and the ConfigMap."""

    profile: Profile | None
    source: str
    problem: str | None = None


def configmap_source(ref: ProfileConfigMapRef, resource_version: str | None) -> str:
    return f"ConfigMap {ref.name}" + (f"@{resource_version}" if resource_version else "")


def profile_from_configmap(configmap: dict[str, Any] | None, ref: ProfileConfigMapRef,
                           namespace: str) -> Profile:
    """The profile a ConfigMap (the API object, or None when there is none) holds under
    ``ref.key`` (pure).

    Raises
    ------
    ProfileError
        Naming ``spec.planner.profileConfigMap`` and ``NAMESPACE/NAME``: missing ConfigMap or
        key, the key only in ``binaryData``, over ``MAX_PROFILE_BYTES``, not YAML, or a field
        the profile loader refuses (named by its dotted path)."""
    where = f"{FIELD}: ConfigMap {namespace}/{ref.name}"
    if configmap is None:
        raise ProfileError(f"{where} not found")
    data = configmap.get("data") or {}
    text = data.get(ref.key) if isinstance(data, dict) else None
    if not isinstance(text, str):
        if ref.key in (configmap.get("binaryData") or {}):
            raise ProfileError(f"{where}: key {ref.key!r} is in binaryData; put the YAML in data")
        keys = sorted(k for k in data if isinstance(k, str))[:5] if isinstance(data, dict) else []
        raise ProfileError(f"{where} has no key {ref.key!r} in data (keys: {keys})")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(f"{where}: key {ref.key!r} holds {size} bytes, over the "
                           f"{MAX_PROFILE_BYTES // 1024} KiB a profile may have")
    try:
        # the one bounded reader (planner.profile): finite, sane numbers; no exception but
        # ProfileError
        return parse_profile_text(text, source=f"in ConfigMap {namespace}/{ref.name} key {ref.key!r}")
    except ProfileError as exc:
        raise ProfileError(f"{FIELD}: {exc}") from None


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


class ProfileSources:
    """Resolves each PDCluster's profile through one Kube; a ConfigMap is parsed again only
    when its resourceVersion changed (a profile with 300 points per role is a few hundred
    KiB of YAML; the planning interval may be 10 s)."""

    def __init__(self, kube: Kube):
        self.kube = kube
        #: (namespace, ConfigMap, key) -> (resourceVersion, what it resolved to)
        self.parsed: dict[tuple[str, str, str], tuple[str, ResolvedProfile]] = {}

    def resolve(self, namespace: str, spec: PDClusterSpec) -> ResolvedProfile:
        """The spec's profile, or why there is none it can plan with (a ConfigMap's problem,
        or a profile stating another instance shape than the spec's nodesPerInstance)."""
        resolved = self._resolve(namespace, spec)
        if resolved.profile is not None:
            shape = (multinode.nodes_per_instance(spec, "prefill"),
                     multinode.nodes_per_instance(spec, "decode"))
            problem = shape_problem(resolved.profile, shape)
            if problem is not None:
                return ResolvedProfile(None, resolved.source, problem)
        return resolved

    def _resolve(self, namespace: str, spec: PDClusterSpec) -> ResolvedProfile:
        ref = spec.planner.profile_config_map
        if ref is None:
            try:
                return ResolvedProfile(shipped_profile(spec.planner.profile), SHIPPED)
            except ProfileError as exc:  # the checklist refuses such a spec first
                return ResolvedProfile(None, SHIPPED, f"spec.planner.profile: {exc}")
        # only the PDCluster's own namespace: a tenant names a ConfigMap, never another's
        configmap = self.kube.get("ConfigMap", namespace, ref.name)
        version = ((configmap or {}).get("metadata") or {}).get("resourceVersion")
        version = version if isinstance(version, str) and version else None
        key = (namespace, ref.name, ref.key)
        cached = self.parsed.get(key)
        if version is not None and cached is not None and cached[0] == version:
            return cached[1]
        try:
            resolved = ResolvedProfile(profile_from_configmap(configmap, ref, namespace),
                                       configmap_source(ref, version))
        except ProfileError as exc:
            resolved = ResolvedProfile(None, configmap_source(ref, version), str(exc))
        if version is None:
            self.parsed.pop(key, None)
        else:
            self.parsed[key] = (version, resolved)
        return resolved


def report_profile(kube: Kube, body: dict[str, Any], summary: dict[str, Any],
                   resolved: ResolvedProfile) -> None:
    """``status.planner.profile`` when it changed, and an Event when its problem changed or a
    ConfigMap's profile took effect (level-based: compared with the status the PDCluster
    carries). A profile
    that cannot be used also marks the planner held, with the problem as its explanation."""
    meta = body["metadata"]
    before = ((body.get("status") or {}).get("planner") or {}).get("profile") or {}
    if before == summary:
        return
    patch: dict[str, Any] = {"profile": _merge_patch(before, summary)}
    if resolved.problem is not None:
        patch.update(held=True, explanation=f"holding: the profile cannot be used: {resolved.problem}")
    kube.patch_status(meta["namespace"], meta["name"], {"planner": patch})
    if resolved.problem is not None and before.get("problem") != resolved.problem:
        log.warning("profile of %s/%s: %s", meta["namespace"], meta["name"], resolved.problem)
        post_event(kube, body, Event("Warning", "PlannerProfileInvalid",
                                     f"planner holds: {resolved.problem}"), now_rfc3339())
    elif resolved.problem is None and (before.get("source"), before.get("name")) != (
            summary.get("source"), summary.get("name")) and (
            resolved.source != SHIPPED or "problem" in before):
        # a ConfigMap's profile (or a new version of it) taking effect, or a problem cleared;
        # the shipped profile a PDCluster started with is no news
        post_event(kube, body, Event("Normal", "PlannerProfileLoaded",
                                     f"planning with profile {summary.get('name')!r} "
                                     f"({summary.get('source')})"), now_rfc3339())


def _merge_patch(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning ``before`` into ``after``: a key ``after`` lacks is written
    null (removed), so a cleared problem or a lost provenance does not linger in status."""
    out: dict[str, Any] = {k: None for k in before if k not in after}
    for key, value in after.items():
        old = before.get(key)
        out[key] = (_merge_patch(old, value) if isinstance(old, dict) and isinstance(value, dict)
                    else value)
    return out


#: the terms the online calibration's time factors scale (``model.PerformanceModel``): prefill
#: compute time is ``(overhead + work / R) x prefill_factor``, TPOT ``(step + B x (per_sequence
#: + C x per_context_token)) x decode_factor``. The headrooms multiply instance counts, not a
#: term: they are reported with the profile, never folded into it.
CALIBRATED_TERMS = ("prefill.overhead_seconds", "prefill.tokens_per_second",
                    "decode.step_seconds", "decode.per_sequence_seconds",
                    "decode.per_context_token_seconds")


def calibrated_profile(profile: Profile, calibration: Calibration | None, *,
                       source: str, exported_at: str) -> Profile:
    """``profile`` with the calibration's time factors applied to :data:`CALIBRATED_TERMS`
    (pure): the same model predictions as the profile under that calibration. Its provenance
    gains ``calibration``: the factors and headrooms, which terms were scaled, where the
    profile came from and when it was exported."""
    cal = calibration or Calibration()
    p, d = profile.prefill, profile.decode
    fp, fd = cal.prefill_factor, cal.decode_factor
    provenance = dict(profile.provenance or {})
    provenance["calibration"] = {
        "exported_from": source,
        "exported_at": exported_at,
        "prefill_factor": fp,
        "decode_factor": fd,
        "prefill_headroom": cal.prefill_headroom,
        "decode_headroom": cal.decode_headroom,
        "samples": cal.samples,
        "applied_to": list(CALIBRATED_TERMS),
        "not_applied": "the headrooms multiply the instances each role is sized for; they "
                       "are learned from latency misses at the SLO percentile, not a term",
    }
    return profile.model_copy(update={
        "prefill": p.model_copy(update={"overhead_seconds": p.overhead_seconds * fp,
                                        "tokens_per_second": p.tokens_per_second / fp}),
        "decode": d.model_copy(update={"step_seconds": d.step_seconds * fd,
                                       "per_sequence_seconds": d.per_sequence_seconds * fd,
                                       "per_context_token_seconds": d.per_context_token_seconds * fd}),
        "provenance": provenance,
    })


def export_profile(kube: Kube, namespace: str, name: str, *, now: float,
                   exported_at: str) -> Profile:
    """The profile a PDCluster plans with, calibrated as its planner memory has it
    (:func:`calibrated_profile`), read from the API server (``pdscale profile export``).

    Raises
    ------
    ProfileError
        No such PDCluster, a spec that does not parse, or a profile that cannot be used (the
        problem the operator reports in ``status.planner.profile``)."""
    from .planner_memory import ForeignMemory, PlannerMemory, memory_problem
    from .planning import (
        calibration_for_profile,
        history_from_json,
        profile_identity,
        remembered_profile,
    )

    body = kube.get("PDCluster", namespace, name)
    if body is None:
        raise ProfileError(f"no PDCluster {namespace}/{name}")
    try:
        spec = PDClusterSpec.model_validate(body.get("spec") or {})
    except ValueError as exc:
        raise ProfileError(f"PDCluster {namespace}/{name}: the spec does not parse: "
                           f"{_first_line(exc)}") from None
    resolved = ProfileSources(kube).resolve(namespace, spec)
    if resolved.profile is None:
        raise ProfileError(f"PDCluster {namespace}/{name}: {resolved.problem}")
    try:
        stored = PlannerMemory(kube).load(namespace, name, (body.get("metadata") or {}).get("uid"))
    except ForeignMemory:
        stored = None  # not this PDCluster's memory: it teaches nothing
    if stored is not None and memory_problem(stored, now) is not None:
        stored = None  # as the planner does: a memory unfit to plan from teaches nothing
    history, _ = history_from_json(stored)
    # as the planner would: a calibration learned against another profile is not applied
    history, _ = calibration_for_profile(history, remembered_profile(stored),
                                         profile_identity(resolved.profile))
    return calibrated_profile(resolved.profile, history.calibration,
                              source=resolved.source, exported_at=exported_at)
