"""Pure: what the cluster admin lets a PDCluster author put into engine and router pods.

A PDCluster author is a tenant: creating a PDCluster creates pods, so without a policy it would
be creating arbitrary pods (any image, any host directory, any annotation). The admin sets the
policy once, in the chart's ``tenantPolicy`` values. It is enforced twice, with the same rules:
at admission by the chart's ValidatingAdmissionPolicy (CEL, templates/admission-policy.yaml),
and here, by the operator, before it renders anything (defence in depth: a cluster without the
admission policy, or a PDCluster admitted before the policy changed). A refusal names the field
and the policy key that refuses it.

Beyond the policy, some things no spec may do at all, whatever the policy says: override the
GPU request or set an annotation the operator owns (the checklist refuses those), or set an
environment variable the operator renders (refused here, as it depends on the rendering).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from .pdcluster import GPU_RESOURCE, PDClusterSpec

#: the environment variable the chart's Deployment sets to the policy (JSON); unset: DEFAULT
POLICY_ENV = "PDSCALE_TENANT_POLICY"
#: keys of the chart's tenantPolicy that are about installing it, not about specs
CHART_ONLY_KEYS = frozenset({"admission"})
#: "any value" in an allow-list; an admin writes it on purpose, it is never a default
ANY = "*"
#: network annotation domains (see TenantPolicy.denied_pod_annotation_prefixes)
NETWORK_ANNOTATION_PREFIXES: tuple[str, ...] = (
    "k8s.v1.cni.cncf.io/", "v1.multus-cni.io/", "cni.projectcalico.org/", "k8s.ovn.org/",
    "ovn.kubernetes.io/", "network.cilium.io/", "io.cilium/", "kubernetes.io/ingress-bandwidth",
    "kubernetes.io/egress-bandwidth",
)

@dataclass(frozen=True)
class TenantPolicy:
    """The admin's policy (the chart's ``tenantPolicy`` values, camelCase there)."""

    #: engine and router images must start with one of these (``"*"``: any image)
    allowed_image_prefixes: tuple[str, ...] = (
        "lmsysorg/sglang:", "docker.io/lmsysorg/sglang:",
        "vllm/vllm-openai:", "docker.io/vllm/vllm-openai:",
        "vllm/vllm-router:", "docker.io/vllm/vllm-router:",
        # smg, the default SGLang gateway: ghcr.io/lightseekorg/smg:<smg>-sglang-v<sglang>
        "ghcr.io/lightseekorg/smg:",
    )
    #: node directories weights may be mounted from (read-only), a directory and what is below
    #: it; empty: no hostPath at all (weights from a PersistentVolumeClaim only)
    allowed_host_path_prefixes: tuple[str, ...] = ("/raid/models", "/models")
    #: extra command-line arguments for the engines and the router
    allow_extra_args: bool = True
    #: extra environment variables for the engines
    allow_env: bool = True
    #: extra pod annotations on engine pods
    allow_pod_annotations: bool = True
    #: taint keys an engine pod may tolerate (``"*"``: any); the GPU taint is always tolerated
    allowed_toleration_keys: tuple[str, ...] = (ANY,)
    #: node affinity and anti-affinity beyond the operator's GPU pinning
    allow_affinity: bool = True
    #: environment variable names a spec may not set (besides those the operator renders)
    reserved_env_names: tuple[str, ...] = field(default_factory=tuple)
    #: pod annotation keys allowed (with allowPodAnnotations): a key, a prefix ending in "/"
    #: (every key of that domain), or "*" (any key except the denied prefixes below)
    allowed_pod_annotation_keys: tuple[str, ...] = (ANY,)
    #: annotation key prefixes "*" does not cover: they attach pods to networks or change
    #: their network identity (Multus, Calico, OVN, Cilium, bandwidth shaping); allowed only
    #: when allowedPodAnnotationKeys names the key or its prefix
    denied_pod_annotation_prefixes: tuple[str, ...] = NETWORK_ANNOTATION_PREFIXES
    #: ``model.trustRemoteCode`` for a model downloaded from a hub (no weights volume): it runs
    #: the hub repository's code in the engine
    allow_trust_remote_code: bool = False
    #: ``model.weights.pvc.readOnly: false`` (the engines may write the claim)
    allow_writable_weights: bool = False
    #: PersistentVolumeClaims weights may come from (``"*"``: any claim of the namespace)
    allowed_weights_claims: tuple[str, ...] = (ANY,)
    #: Prometheus servers ``spec.planner.prometheusURL`` may name: a URL (that URL and what is
    #: below it, ``http://prom.monitoring:9090``) or a host with or without its port
    #: (``prom.monitoring.svc``, ``prom.monitoring.svc:9090``); ``"*"``: any. Empty: a spec
    #: names none, and the operator's own (the chart's ``prometheus.url``) serves every
    #: PDCluster. The operator queries what a spec names, from inside the cluster.
    allowed_prometheus_urls: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_mapping(cls, data: Any) -> TenantPolicy:
        """From the chart's values (camelCase keys); unknown keys and wrong types are refused
        with the key's name, so a typo in values.yaml cannot silently open the policy."""
        if not isinstance(data, dict):
            raise ValueError(f"tenant policy must be a mapping, got {type(data).__name__}")
        by_camel = {_camel(f.name): f for f in fields(cls)}
        data = {k: v for k, v in data.items() if k not in CHART_ONLY_KEYS}
        unknown = sorted(set(data) - set(by_camel))
        if unknown:
            raise ValueError(f"tenant policy: unknown key(s) {unknown}; known: {sorted(by_camel)}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            f = by_camel[key]
            if f.type in ("bool",):
                if not isinstance(value, bool):
                    raise ValueError(f"tenant policy: {key} must be true or false, got {value!r}")
                values[f.name] = value
            else:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"tenant policy: {key} must be a list of strings, got {value!r}")
                values[f.name] = tuple(value)
        return cls(**values)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> TenantPolicy:
        """The policy the chart passed in ``PDSCALE_TENANT_POLICY``, or the default one."""
        raw = (os.environ if environ is None else environ).get(POLICY_ENV)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{POLICY_ENV} is not JSON: {exc}") from None
        return cls.from_mapping(data)


@functools.cache
def configured() -> TenantPolicy:
    """The operator process's policy: read once from its environment, so that every caller
    (the reconcile, the planner loop's reconciles) holds specs to the same rules. A malformed
    policy raises at the operator's start, never opens the policy."""
    return TenantPolicy.from_environment()


#: words spelled in capitals in the chart's keys, as in the spec (``prometheusURL``)
_ACRONYMS = {"urls": "URLs", "url": "URL"}


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(_ACRONYMS.get(part, part.capitalize()) for part in rest)


#: where an image reference's repository may end: a path, a tag, a digest
_IMAGE_BOUNDARIES = ("/", ":", "@")


def _image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """``image`` starts with a prefix that ends at a boundary of the reference: the prefix
    ends in ``/``, ``:`` or ``@``, or the image goes on with one of them (or is the prefix).
    ``registry.corp.example`` admits ``registry.corp.example/x`` but never
    ``registry.corp.example.attacker.io/x``."""
    return ANY in prefixes or any(
        image == p or (image.startswith(p) and p.endswith(_IMAGE_BOUNDARIES))
        or any(image.startswith(p + b) for b in _IMAGE_BOUNDARIES)
        for p in prefixes if p)


def annotation_allowed(key: str, policy: TenantPolicy) -> bool:
    """A pod annotation key the policy allows (with allowPodAnnotations): named, or under a
    named prefix, or covered by ``"*"`` and under no denied prefix."""
    allowed = policy.allowed_pod_annotation_keys
    if key in allowed or any(p.endswith("/") and key.startswith(p) for p in allowed):
        return True
    return ANY in allowed and not any(key.startswith(p) for p in policy.denied_pod_annotation_prefixes)


def _under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or below it, compared as directories (``/models-x`` is not under
    ``/models``; a trailing ``/`` on either changes nothing); a path that is not already
    normal (a ``.`` or ``..`` segment, ``//`` anywhere) is never under. The admission
    policy's rule says the same in CEL (templates/admission-policy.yaml)."""
    if "//" in path or any(part in (".", "..") for part in path.split("/")):
        return False
    prefix = prefix.rstrip("/") or "/"
    return (path == prefix or path == prefix + "/"
            or path.startswith(prefix if prefix == "/" else prefix + "/"))


def _authority(url: str) -> str:
    """``host[:port]`` of an ``http(s)://`` URL as the admission policy reads it: what follows
    ``://`` up to the first ``/``, ``?`` or ``#`` (string operations both enforcers share;
    userinfo and other oddities stay in it, and so match no entry)."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    return rest.split("/")[0].split("?")[0].split("#")[0]


def prometheus_url_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    """``url`` is one the admin listed in ``allowedPrometheusURLs`` (see ``TenantPolicy``):
    an entry with a scheme is the URL itself (one trailing ``/`` aside) or a prefix ending at
    a ``/``, so ``http://prom:9090`` admits neither ``http://prom:90901`` nor
    ``http://prom:9090@evil``; an entry without one is the URL's ``host[:port]``, and a host
    without a port admits it on any port. The chart's admission policy has the same rules."""
    if ANY in allowed:
        return True
    authority = _authority(url)
    for entry in allowed:
        if "://" in entry:
            whole = entry[:-1] if entry.endswith("/") else entry
            if url == whole or url.startswith(whole + "/"):
                return True
        elif authority == entry or (":" not in entry and authority.split(":")[0] == entry):
            return True
    return False


def prometheus_refusal(spec: PDClusterSpec, policy: TenantPolicy) -> str | None:
    """Why the spec's Prometheus URL is refused, or None (no URL, or an allowed one)."""
    url = spec.planner.prometheus_url
    if url is None or prometheus_url_allowed(url, policy.allowed_prometheus_urls):
        return None
    if not policy.allowed_prometheus_urls:
        return ("the tenant policy lets no spec name a Prometheus (allowedPrometheusURLs is "
                "empty): leave it unset to use the operator's (the chart's prometheus.url)")
    return (f"{url!r} is not allowed by the tenant policy (allowedPrometheusURLs: "
            f"{list(policy.allowed_prometheus_urls)})")


def refusals(spec: PDClusterSpec, policy: TenantPolicy, operator_env: frozenset[str] = frozenset()
             ) -> list[tuple[str, str]]:
    """(field, why) for every field of ``spec`` that ``policy`` (or the operator's ownership)
    refuses; the checklist reports them as its problems.

    ``operator_env`` are the environment variable names the operator renders for this spec; a
    spec may not set them (a duplicate name in a container takes the last value)."""
    out: list[tuple[str, str]] = []
    for path, image in (("spec.engine.image", spec.engine.image), ("spec.router.image", spec.router.image)):
        if not _image_allowed(image, policy.allowed_image_prefixes):
            out.append((path, f"image {image!r} is not allowed by the tenant policy "
                                     f"(allowedImagePrefixes: {list(policy.allowed_image_prefixes)})"))
    weights = spec.model.weights
    if spec.model.trust_remote_code and weights is None and not policy.allow_trust_remote_code:
        out.append(("spec.model.trustRemoteCode", "remote code of a hub model is not allowed by "
                    "the tenant policy (allowTrustRemoteCode: false); mount the weights instead"))
    if weights is not None and weights.pvc is not None:
        if not weights.pvc.read_only and not policy.allow_writable_weights:
            out.append(("spec.model.weights.pvc.readOnly", "writable weights are not allowed by "
                        "the tenant policy (allowWritableWeights: false)"))
        claims = policy.allowed_weights_claims
        if ANY not in claims and weights.pvc.claim_name not in claims:
            out.append(("spec.model.weights.pvc.claimName",
                        f"{weights.pvc.claim_name!r} is not allowed by the tenant policy "
                        f"(allowedWeightsClaims: {list(claims)})"))
    if weights is not None and weights.host_path is not None:
        host = weights.host_path.path
        if not any(_under(host, p) for p in policy.allowed_host_path_prefixes):
            out.append(("spec.model.weights.hostPath.path",
                               f"{host!r} is not under an allowed directory (tenant policy "
                               f"allowedHostPathPrefixes: {list(policy.allowed_host_path_prefixes)})"))
    if not policy.allow_extra_args:
        for path, args in (("spec.engine.extraArgs", spec.engine.extra_args),
                           ("spec.prefill.extraArgs", spec.prefill.extra_args),
                           ("spec.decode.extraArgs", spec.decode.extra_args),
                           ("spec.router.extraArgs", spec.router.extra_args)):
            if args:
                out.append((path, "extra arguments are not allowed by the tenant policy "
                                         "(allowExtraArgs: false)"))
    reserved_env = set(policy.reserved_env_names) | set(operator_env)
    for path, env in (("spec.engine.env", spec.engine.env), ("spec.prefill.env", spec.prefill.env),
                      ("spec.decode.env", spec.decode.env)):
        if env and not policy.allow_env:
            out.append((path, "extra environment is not allowed by the tenant policy "
                                     "(allowEnv: false)"))
            continue
        for i, var in enumerate(env):
            if var.name in reserved_env:
                owner = "the operator sets it" if var.name in operator_env else "reservedEnvNames"
                out.append((f"{path}[{i}].name", f"{var.name!r} is reserved ({owner})"))
    if spec.placement.pod_annotations and not policy.allow_pod_annotations:
        out.append(("spec.placement.podAnnotations", "pod annotations are not allowed by "
                                                            "the tenant policy (allowPodAnnotations: false)"))
    elif spec.placement.pod_annotations:
        for key in sorted(spec.placement.pod_annotations):
            if not annotation_allowed(key, policy):
                out.append((f"spec.placement.podAnnotations.{key}",
                            f"{key!r} is not allowed by the tenant policy (allowedPodAnnotationKeys: "
                            f"{list(policy.allowed_pod_annotation_keys)}; deniedPodAnnotationPrefixes "
                            f"need naming)"))
    if ANY not in policy.allowed_toleration_keys:
        for i, t in enumerate(spec.placement.tolerations):
            if t.key != GPU_RESOURCE and t.key not in policy.allowed_toleration_keys:
                what = repr(t.key) if t.key else "an empty key (it tolerates every taint)"
                out.append((f"spec.placement.tolerations[{i}].key",
                                   f"{what} is not allowed by the tenant policy "
                                   f"(allowedTolerationKeys: {list(policy.allowed_toleration_keys)})"))
    if spec.placement.affinity and not policy.allow_affinity:  # an empty one pins nothing
        out.append(("spec.placement.affinity", "affinity is not allowed by the tenant policy "
                                                      "(allowAffinity: false)"))
    if spec.placement.node_selector and not policy.allow_affinity:
        out.append(("spec.placement.nodeSelector", "a node selector pins pods like affinity does: "
                    "not allowed by the tenant policy (allowAffinity: false)"))
    if (why := prometheus_refusal(spec, policy)) is not None:
        out.append(("spec.planner.prometheusURL", why))
    return out
