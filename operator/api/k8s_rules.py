"""Kubernetes' own validation rules, for what a PDCluster passes into its children.

The pydantic model (``pdcluster.py``) checks types and our bounds, the checklist the P/D
rules; this module checks what the API server (and the kubelet, for image names) would refuse
in the rendered Deployments and Services: names, label keys and values, annotation keys,
quantities and resource names, environment variable names, image references, tolerations,
the affinity passed through as-is, and integers that must fit in int64. A spec that passes
all three renders children that the API server accepts, so ``pdscale render`` and the
operator refuse a bad spec up front, naming the field, instead of the API server refusing a
child later with a message about a Deployment the user never wrote.

Pure: strings and dicts in, ``(field path, message)`` pairs out. The rules are written from
the Kubernetes API conventions and the messages follow the API server's wording.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

from . import names
from .pdcluster import EngineKind, PDClusterSpec, RouterKind, Toleration

# (field path, message); checklist.validate turns these into Problems.
Finding = tuple[str, str]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
QUALIFIED_NAME_MAX = 63
IMAGE_NAME_MAX = 255
# The API server's limit on all annotations of one object together (keys plus values).
ANNOTATIONS_TOTAL_MAX_BYTES = 256 * 1024
# Room kept in the pod template's annotations for the ones the operator adds itself.
OPERATOR_ANNOTATIONS_RESERVE_BYTES = 1024
# Longer than any real quantity; keeps the arithmetic on a user's string bounded.
QUANTITY_MAX_CHARS = 64
# Where vLLM's NIXL side channel listens in every engine pod (engines.NIXL_SIDE_CHANNEL_PORT;
# not imported: engines imports the checklist, which imports this module).
NIXL_SIDE_CHANNEL_PORT = 5600
SHM_MOUNT_PATH = "/dev/shm"

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
# The portable rule (every Kubernetes version; 1.34 also accepts any printable ASCII but '=',
# older API servers and most shells do not).
_ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

# An image reference, from the OCI distribution grammar: [domain[:port]/]path[:tag][@digest].
_IMG_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMG_DOMAIN = rf"(?:{_IMG_DOMAIN_PART}(?:\.{_IMG_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMG_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMG_NAME = rf"(?:{_IMG_DOMAIN}/)?{_IMG_PATH_PART}(?:/{_IMG_PATH_PART})*"
_IMG_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_IMG_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE = re.compile(rf"(?P<name>{_IMG_NAME})(?::{_IMG_TAG})?(?:@{_IMG_DIGEST})?")

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
            "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
            "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18)}
# Resources a container may name without a domain (hugepages-<size> too).
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_COMPUTE_RESOURCES = ("cpu", "memory")

_NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# Pod annotations the API server gives a meaning and checks (or that only the kubelet may set).
_RESERVED_POD_ANNOTATIONS = ("kubernetes.io/config.mirror", "scheduler.alpha.kubernetes.io/tolerations")
_RESERVED_POD_ANNOTATION_PREFIXES = ("seccomp.security.alpha.kubernetes.io/",
                                     "container.seccomp.security.alpha.kubernetes.io/",
                                     "container.apparmor.security.beta.kubernetes.io/")
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


# ---- names and label-like strings ------------------------------------------------------------


def _regex_rule(value: str, pattern: re.Pattern[str], limit: int, what: str) -> list[str]:
    out = []
    if len(value) > limit:
        out.append(f"must be no more than {limit} characters")
    if not pattern.fullmatch(value):
        out.append(what)
    return out


def dns1123_label(value: str) -> list[str]:
    """A namespace or Service-like name: lowercase alphanumerics and '-', at most 63."""
    return _regex_rule(value, _DNS1123_LABEL, DNS1123_LABEL_MAX,
                       "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                       "characters or '-', and must start and end with an alphanumeric character")


def dns1123_subdomain(value: str) -> list[str]:
    """An object name: lowercase RFC 1123 labels joined by '.', at most 253 characters."""
    return _regex_rule(value, _DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MAX,
                       "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                       "characters, '-' or '.', and must start and end with an alphanumeric "
                       "character")


def dns1035_label(value: str) -> list[str]:
    """A Service name: a DNS-1123 label that starts with a letter."""
    return _regex_rule(value, _DNS1035_LABEL, DNS1123_LABEL_MAX,
                       "a DNS-1035 label must consist of lower case alphanumeric characters or "
                       "'-', start with an alphabetic character, and end with an alphanumeric "
                       "character")


def qualified_name(value: str) -> list[str]:
    """A label or annotation key: [prefix/]name, prefix a DNS subdomain, name at most 63."""
    parts = value.split("/")
    if len(parts) > 2:
        return ["a qualified name must be [prefix/]name with at most one '/'"]
    name = parts[-1]
    out = []
    if len(parts) == 2:
        if not parts[0]:
            out.append("prefix part must be non-empty")
        else:
            out += [f"prefix part {m}" for m in dns1123_subdomain(parts[0])]
    if not name:
        out.append("name part must be non-empty")
        return out
    out += [f"name part {m}" for m in _regex_rule(
        name, _QUALIFIED_NAME_PART, QUALIFIED_NAME_MAX,
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
        "with an alphanumeric character")]
    return out


def label_value(value: str) -> list[str]:
    """A label value: empty, or at most 63 alphanumerics, '-', '_', '.', alphanumeric at both ends."""
    return _regex_rule(value, _LABEL_VALUE, LABEL_VALUE_MAX,
                       "a valid label value must be an empty string or consist of alphanumeric "
                       "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                       "character")


def env_var_name(value: str) -> list[str]:
    if not value:
        return ["must be non-empty"]
    if not _ENV_VAR_NAME.fullmatch(value):
        return ["a valid environment variable name must consist of alphabetic characters, "
                "digits, '_', '-', or '.', and must not start with a digit"]
    return []


def image_reference(value: str) -> list[str]:
    """A container image the kubelet can pull: [registry[:port]/]path[:tag][@digest]."""
    if value != value.strip():
        return ["must not have leading or trailing whitespace"]
    match = _IMAGE.fullmatch(value)
    if not match:
        return ["is not a valid image reference ([registry[:port]/]name[:tag][@digest], the "
                "name in lower case)"]
    if len(match.group("name")) > IMAGE_NAME_MAX:
        return [f"image name must be no more than {IMAGE_NAME_MAX} characters"]
    return []


# ---- quantities and resources ----------------------------------------------------------------


def parse_quantity(value: str | int) -> Fraction:
    """A Kubernetes quantity ('64Gi', '500m', '1e3', 8) as an exact number; ValueError if it is
    not one or is beyond int64 (in the quantity's base unit)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a quantity such as 64Gi, 500m or 8")
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("is too large: quantities must fit in int64")
    text = str(value)
    if len(text) > QUANTITY_MAX_CHARS:
        raise ValueError(f"must be a quantity of at most {QUANTITY_MAX_CHARS} characters")
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity such as 64Gi, 500m or 8 (within int64)")
    number = Fraction(match.group("number"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        number *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= _DECIMAL[suffix]
    else:
        number *= Fraction(10) ** int(suffix[1:])
    if match.group("sign") == "-":
        number = -number
    if abs(number) > INT64_MAX:
        raise ValueError(f"{text!r} is too large: quantities must fit in int64")
    return number


def _is_native(resource: str) -> bool:
    return "/" not in resource or "kubernetes.io/" in resource


def _is_hugepages(resource: str) -> bool:
    return resource.startswith("hugepages-")


def is_extended_resource(resource: str) -> bool:
    """A domain-prefixed resource outside kubernetes.io (nvidia.com/gpu, rdma/ib): integers,
    never overcommitted."""
    if _is_native(resource) or resource.startswith("requests."):
        return False
    return not qualified_name("requests." + resource)


def resource_name(resource: str) -> list[str]:
    """A container resource name: cpu, memory, ephemeral-storage, hugepages-<size>, or a
    domain-prefixed (extended) resource."""
    problems = qualified_name(resource)
    if problems:
        return problems
    if "/" not in resource:
        if resource in STANDARD_CONTAINER_RESOURCES:
            return []
        if _is_hugepages(resource):
            try:
                size = parse_quantity(resource[len("hugepages-"):])
            except ValueError:
                size = Fraction(0)
            return [] if size > 0 else ["hugepages-<size> needs a page size such as 2Mi"]
        return ["must be a standard resource for containers (cpu, memory, ephemeral-storage, "
                "hugepages-<size>) or a domain-prefixed extended resource"]
    if not _is_native(resource) and not is_extended_resource(resource):
        return ["doesn't follow the extended resource name standard"]
    return []


def _quantities(section: Mapping[str, str | int], path: str,
                out: list[Finding]) -> dict[str, Fraction]:
    values = {}
    for name, raw in section.items():
        where = f"{path}[{name}]"
        problems = resource_name(name)
        if problems:
            out.extend((where, m) for m in problems)
            continue
        try:
            q = parse_quantity(raw)
        except ValueError as exc:
            out.append((where, str(exc)))
            continue
        if q < 0:
            out.append((where, "must be greater than or equal to 0"))
        elif is_extended_resource(name) and q.denominator != 1:
            out.append((where, "must be an integer"))
        elif _is_hugepages(name) and q % parse_quantity(name[len("hugepages-"):]):
            out.append((where, f"must be a multiple of {name[len('hugepages-'):]}"))
        else:
            values[name] = q
    return values


def resource_requirements(requests: Mapping[str, str | int], limits: Mapping[str, str | int],
                          path: str) -> list[Finding]:
    """A container's requests and limits as the API server checks them: names, quantities,
    request <= limit, and extended resources (not overcommitted) with request == limit."""
    out: list[Finding] = []
    lim = _quantities(limits, f"{path}.limits", out)
    req = _quantities(requests, f"{path}.requests", out)
    for name, q in req.items():
        overcommit = _is_native(name) and not _is_hugepages(name)
        if name in lim:
            if not overcommit and q != lim[name]:
                out.append((f"{path}.requests[{name}]", f"must be equal to {name} limit"))
            elif q > lim[name]:
                out.append((f"{path}.requests[{name}]",
                            f"must be less than or equal to {name} limit"))
        elif not overcommit:
            out.append((f"{path}.limits[{name}]",
                        "Limit must be set for non overcommitable resources"))
    names_used = set(requests) | set(limits)
    if any(map(_is_hugepages, names_used)) and not names_used & set(_COMPUTE_RESOURCES):
        out.append((path, "HugePages require cpu or memory"))
    return out


# ---- metadata, labels, annotations -----------------------------------------------------------


def label_map(value: Any, path: str) -> list[Finding]:
    if not isinstance(value, Mapping):
        return [(path, "must be a mapping of label keys to string values")]
    out: list[Finding] = []
    for key, val in value.items():
        if not isinstance(key, str):
            out.append((path, f"key {key!r} must be a string"))
            continue
        out += [(f"{path}[{key}]", f"key {m}") for m in qualified_name(key)]
        if not isinstance(val, str):
            out.append((f"{path}[{key}]", "value must be a string"))
        else:
            out += [(f"{path}[{key}]", m) for m in label_value(val)]
    return out


def annotation_map(value: Any, path: str, limit: int = ANNOTATIONS_TOTAL_MAX_BYTES) -> list[Finding]:
    if not isinstance(value, Mapping):
        return [(path, "must be a mapping of annotation keys to string values")]
    out: list[Finding] = []
    total = 0
    for key, val in value.items():
        if not isinstance(key, str):
            out.append((path, f"key {key!r} must be a string"))
            continue
        out += [(f"{path}[{key}]", f"key {m}") for m in qualified_name(key.lower())]
        if not isinstance(val, str):
            out.append((f"{path}[{key}]", "value must be a string"))
            continue
        total += len(key.encode("utf-8", "surrogatepass")) + len(val.encode("utf-8", "surrogatepass"))
    if total > limit:
        out.append((path, f"annotations total {total} bytes, more than the {limit} allowed"))
    return out


def pod_annotations(value: Mapping[str, str], path: str) -> list[Finding]:
    """Extra annotations on the engine pods: valid keys, room left for the operator's own,
    and none of those the API server interprets on a pod."""
    out = annotation_map(value, path, ANNOTATIONS_TOTAL_MAX_BYTES - OPERATOR_ANNOTATIONS_RESERVE_BYTES)
    for key, val in value.items():
        if key in _RESERVED_POD_ANNOTATIONS or key.startswith(_RESERVED_POD_ANNOTATION_PREFIXES):
            out.append((f"{path}[{key}]", "is interpreted by Kubernetes on pods; use the pod's "
                                          "own fields instead"))
        elif key == POD_DELETION_COST:
            try:
                cost = int(val, 10)
            except ValueError:
                cost = INT32_MAX + 1
            if not -(2**31) <= cost <= INT32_MAX:
                out.append((f"{path}[{key}]", "must be a 32bit integer"))
    return out


def object_metadata(meta: Any) -> list[Finding]:
    """metadata of the PDCluster itself: name (a DNS subdomain, which also yields valid child
    names), namespace (a DNS label), labels and annotations."""
    if meta is None:
        return [("metadata.name", "required")]
    if not isinstance(meta, Mapping):
        return [("metadata", "must be a mapping with at least a name")]
    out: list[Finding] = []
    name = meta.get("name")
    if name is None:
        out.append(("metadata.name", "required"))
    elif not isinstance(name, str):
        out.append(("metadata.name", f"must be a string, got {type(name).__name__}"))
    else:
        out += [("metadata.name", m) for m in dns1123_subdomain(name)]
        if not out:
            out += child_names(name)
    namespace = meta.get("namespace")
    if namespace not in (None, ""):  # empty: unset, as the API server reads it
        out += namespace_name(namespace, "metadata.namespace")
    if meta.get("labels") is not None:
        out += label_map(meta["labels"], "metadata.labels")
    if meta.get("annotations") is not None:
        out += annotation_map(meta["annotations"], "metadata.annotations")
    return out


def namespace_name(value: Any, path: str) -> list[Finding]:
    if not isinstance(value, str):
        return [(path, f"must be a string, got {type(value).__name__}")]
    return [(path, m) for m in dns1123_label(value)]


def child_names(cluster_name: str) -> list[Finding]:
    """The children's names derived from metadata.name must be DNS-1035 labels (Services) that
    leave room for the pod suffix; names.base_name guarantees it, checked here all the same."""
    out: list[Finding] = []
    for role in names.ROLE_SUFFIXES:
        child = names.child_name(cluster_name, role)
        problems = dns1035_label(child)
        if problems or len(child) > names.CHILD_NAME_MAX_CHARS:
            out.append(("metadata.name", f"would name the {role} Service {child!r}, which is not "
                                         f"a DNS-1035 label of at most {names.CHILD_NAME_MAX_CHARS} "
                                         f"characters"))
    return out


# ---- scheduling ------------------------------------------------------------------------------


def tolerations(items: list[Toleration], path: str) -> list[Finding]:
    out: list[Finding] = []
    for i, t in enumerate(items):
        where = f"{path}[{i}]"
        key = t.key or ""
        value = t.value or ""
        if key:
            out += [(f"{where}.key", m) for m in qualified_name(key)]
        elif t.operator.value != "Exists":
            out.append((f"{where}.operator", "operator must be Exists when `key` is empty, "
                                             "which means \"match all values and all keys\""))
        if t.toleration_seconds is not None:
            if t.effect is None or t.effect.value != "NoExecute":
                out.append((f"{where}.effect",
                            "effect must be 'NoExecute' when `tolerationSeconds` is set"))
            if not INT64_MIN <= t.toleration_seconds <= INT64_MAX:
                out.append((f"{where}.tolerationSeconds", "must fit in int64"))
        if t.operator.value == "Exists" and value:
            out.append((f"{where}.value", "value must be empty when `operator` is 'Exists'"))
        elif t.operator.value == "Equal":
            out += [(f"{where}.value", m) for m in label_value(value)]
    return out


def _fields(obj: Any, path: str, allowed: dict[str, str], required: tuple[str, ...] = ()
            ) -> tuple[dict[str, Any], list[Finding]]:
    """Type-check one object of the affinity tree: a mapping whose keys are known (value kind
    per key: 'object', 'list', 'str', 'int', 'strs') and whose required keys are present."""
    if not isinstance(obj, Mapping):
        return {}, [(path, "must be an object")]
    out: list[Finding] = []
    good: dict[str, Any] = {}
    for key, val in obj.items():
        where = f"{path}.{key}"
        kind = allowed.get(key) if isinstance(key, str) else None
        if kind is None:
            out.append((where, "unknown field"))
        elif val is None:  # the API server reads null as unset; the schema refuses it
            out.append((where, "must not be null (omit the field instead)"))
        elif kind == "object" and not isinstance(val, Mapping):
            out.append((where, "must be an object"))
        elif kind == "list" and not isinstance(val, list):
            out.append((where, "must be a list"))
        elif kind == "str" and not isinstance(val, str):
            out.append((where, "must be a string"))
        elif kind == "int" and (isinstance(val, bool) or not isinstance(val, int)):
            out.append((where, "must be an integer"))
        elif kind == "strs" and (not isinstance(val, list)
                                 or not all(isinstance(v, str) for v in val)):
            out.append((where, "must be a list of strings"))
        else:
            good[key] = val
    out += [(f"{path}.{key}", "required") for key in required
            if key not in good and not any(f[0].startswith(f"{path}.{key}") for f in out)]
    return good, out


def _requirement(obj: Any, path: str, operators: tuple[str, ...], *,
                 values_are_labels: bool) -> list[Finding]:
    req, out = _fields(obj, path, {"key": "str", "operator": "str", "values": "strs"},
                       ("key", "operator"))
    if "key" in req:
        out += [(f"{path}.key", m) for m in qualified_name(req["key"])]
    op, values = req.get("operator"), req.get("values") or []
    if op is None:
        return out
    if op not in operators:
        out.append((f"{path}.operator", f"Unsupported value: {op!r}: supported values: "
                                        f"{', '.join(operators)}"))
    elif op in ("In", "NotIn") and not values:
        out.append((f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist") and values:
        out.append((f"{path}.values", "may not be specified when `operator` is 'Exists' or "
                                      "'DoesNotExist'"))
    elif op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"[+-]?[0-9]{1,19}", values[0])
                                 or not INT64_MIN <= int(values[0]) <= INT64_MAX):
        out.append((f"{path}.values", "must be a single int64 when `operator` is 'Lt' or 'Gt'"))
    if values_are_labels:
        for j, v in enumerate(values):
            out += [(f"{path}.values[{j}]", m) for m in label_value(v)]
    return out


def _list_of(obj: Any, path: str, each: Any) -> list[Finding]:
    out: list[Finding] = []
    for i, item in enumerate(obj or []):
        out += each(item, f"{path}[{i}]")
    return out


def _field_requirement(obj: Any, path: str) -> list[Finding]:
    req, out = _fields(obj, path, {"key": "str", "operator": "str", "values": "strs"},
                       ("key", "operator"))
    if "key" in req and req["key"] != "metadata.name":
        out.append((f"{path}.key", "not a valid field selector key (only metadata.name)"))
    op = req.get("operator")
    if op is not None and op not in ("In", "NotIn"):
        out.append((f"{path}.operator", "not a valid selector operator for a node field "
                                        "selector (In or NotIn)"))
    elif op is not None and len(req.get("values") or []) != 1:
        out.append((f"{path}.values", "must be only one value when `operator` is 'In' or "
                                      "'NotIn' for node field selector"))
    for j, v in enumerate(req.get("values") or []):
        out += [(f"{path}.values[{j}]", m) for m in dns1123_subdomain(v)]
    return out


def _node_selector_term(obj: Any, path: str) -> list[Finding]:
    term, out = _fields(obj, path, {"matchExpressions": "list", "matchFields": "list"})
    out += _list_of(term.get("matchExpressions"), f"{path}.matchExpressions",
                    lambda o, p: _requirement(o, p, _NODE_SELECTOR_OPERATORS,
                                              values_are_labels=False))
    out += _list_of(term.get("matchFields"), f"{path}.matchFields", _field_requirement)
    return out


def _weight(term: dict[str, Any], path: str) -> list[Finding]:
    if "weight" in term and not 1 <= term["weight"] <= 100:
        return [(f"{path}.weight", "must be in the range 1-100")]
    return []


def _node_affinity(obj: Any, path: str) -> list[Finding]:
    aff, out = _fields(obj, path, {"requiredDuringSchedulingIgnoredDuringExecution": "object",
                                   "preferredDuringSchedulingIgnoredDuringExecution": "list"})
    req_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    if "requiredDuringSchedulingIgnoredDuringExecution" in aff:
        sel, errs = _fields(aff["requiredDuringSchedulingIgnoredDuringExecution"], req_path,
                            {"nodeSelectorTerms": "list"}, ("nodeSelectorTerms",))
        out += errs
        if "nodeSelectorTerms" in sel and not sel["nodeSelectorTerms"]:
            out.append((f"{req_path}.nodeSelectorTerms",
                        "must have at least one node selector term"))
        out += _list_of(sel.get("nodeSelectorTerms"), f"{req_path}.nodeSelectorTerms",
                        _node_selector_term)

    def preferred(o: Any, p: str) -> list[Finding]:
        term, errs = _fields(o, p, {"weight": "int", "preference": "object"},
                             ("weight", "preference"))
        errs += _weight(term, p)
        if "preference" in term:
            errs += _node_selector_term(term["preference"], f"{p}.preference")
        return errs

    out += _list_of(aff.get("preferredDuringSchedulingIgnoredDuringExecution"),
                    f"{path}.preferredDuringSchedulingIgnoredDuringExecution", preferred)
    return out


def _label_selector(obj: Any, path: str) -> tuple[set[str], list[Finding]]:
    sel, out = _fields(obj, path, {"matchLabels": "object", "matchExpressions": "list"})
    keys: set[str] = set()
    if "matchLabels" in sel:
        out += label_map(sel["matchLabels"], f"{path}.matchLabels")
        keys |= {k for k in sel["matchLabels"] if isinstance(k, str)}
    out += _list_of(sel.get("matchExpressions"), f"{path}.matchExpressions",
                    lambda o, p: _requirement(o, p, _LABEL_SELECTOR_OPERATORS,
                                              values_are_labels=True))
    keys |= {e["key"] for e in sel.get("matchExpressions") or []
             if isinstance(e, Mapping) and isinstance(e.get("key"), str)}
    return keys, out


def _pod_affinity_term(obj: Any, path: str) -> list[Finding]:
    term, out = _fields(obj, path, {"labelSelector": "object", "namespaceSelector": "object",
                                    "namespaces": "strs", "topologyKey": "str",
                                    "matchLabelKeys": "strs", "mismatchLabelKeys": "strs"},
                        ("topologyKey",))
    selector_keys: set[str] = set()
    if "labelSelector" in term:
        selector_keys, errs = _label_selector(term["labelSelector"], f"{path}.labelSelector")
        out += errs
    if "namespaceSelector" in term:
        out += _label_selector(term["namespaceSelector"], f"{path}.namespaceSelector")[1]
    for j, ns in enumerate(term.get("namespaces") or []):
        out += [(f"{path}.namespaces[{j}]", m) for m in dns1123_label(ns)]
    if "topologyKey" in term:
        if not term["topologyKey"]:
            out.append((f"{path}.topologyKey", "can not be empty"))
        else:
            out += [(f"{path}.topologyKey", m) for m in qualified_name(term["topologyKey"])]
    match, mismatch = term.get("matchLabelKeys") or [], term.get("mismatchLabelKeys") or []
    for field_name, keys in (("matchLabelKeys", match), ("mismatchLabelKeys", mismatch)):
        if keys and "labelSelector" not in term:
            out.append((f"{path}.{field_name}", "must not be specified when labelSelector is not set"))
        for j, key in enumerate(keys):
            out += [(f"{path}.{field_name}[{j}]", m) for m in qualified_name(key)]
    for j, key in enumerate(match):
        if key in selector_keys:
            out.append((f"{path}.matchLabelKeys[{j}]", "exists in both matchLabelKeys and labelSelector"))
        if key in mismatch:
            out.append((f"{path}.matchLabelKeys[{j}]", "exists in both matchLabelKeys and mismatchLabelKeys"))
    return out


def _pod_affinity(obj: Any, path: str) -> list[Finding]:
    aff, out = _fields(obj, path, {"requiredDuringSchedulingIgnoredDuringExecution": "list",
                                   "preferredDuringSchedulingIgnoredDuringExecution": "list"})
    out += _list_of(aff.get("requiredDuringSchedulingIgnoredDuringExecution"),
                    f"{path}.requiredDuringSchedulingIgnoredDuringExecution", _pod_affinity_term)

    def preferred(o: Any, p: str) -> list[Finding]:
        term, errs = _fields(o, p, {"weight": "int", "podAffinityTerm": "object"},
                             ("weight", "podAffinityTerm"))
        errs += _weight(term, p)
        if "podAffinityTerm" in term:
            errs += _pod_affinity_term(term["podAffinityTerm"], f"{p}.podAffinityTerm")
        return errs

    out += _list_of(aff.get("preferredDuringSchedulingIgnoredDuringExecution"),
                    f"{path}.preferredDuringSchedulingIgnoredDuringExecution", preferred)
    return out


def affinity(obj: Any, path: str) -> list[Finding]:
    """A core/v1 Affinity, type-checked field by field (unknown fields refused) with the API
    server's rules on selectors, operators, weights and topology keys."""
    aff, out = _fields(obj, path, {"nodeAffinity": "object", "podAffinity": "object",
                                   "podAntiAffinity": "object"})
    if "nodeAffinity" in aff:
        out += _node_affinity(aff["nodeAffinity"], f"{path}.nodeAffinity")
    for name in ("podAffinity", "podAntiAffinity"):
        if name in aff:
            out += _pod_affinity(aff[name], f"{path}.{name}")
    return out


# ---- the spec --------------------------------------------------------------------------------


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every scalar, map keys included (each at the path of its map)."""
    if isinstance(value, Mapping):
        for key, val in value.items():
            yield path, key
            yield from _leaves(val, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, val in enumerate(value):
            yield from _leaves(val, f"{path}[{i}]")
    else:
        yield path, value


def scalars(value: Any, path: str) -> list[Finding]:
    """Every integer within int64 (the API server stores no larger) and no string with a NUL
    (no process can take it as an argument or in its environment)."""
    out: list[Finding] = []
    for where, leaf in _leaves(value, path):
        if isinstance(leaf, int) and not isinstance(leaf, bool) and not INT64_MIN <= leaf <= INT64_MAX:
            out.append((where, "must fit in int64 (at most 9223372036854775807)"))
        elif isinstance(leaf, str) and "\x00" in leaf:
            out.append((where, "must not contain a NUL character"))
    return out


def _env(spec: PDClusterSpec) -> list[Finding]:
    out: list[Finding] = []
    for base, env in (("spec.engine.env", spec.engine.env), ("spec.prefill.env", spec.prefill.env),
                      ("spec.decode.env", spec.decode.env)):
        for i, var in enumerate(env):
            out += [(f"{base}[{i}].name", m) for m in env_var_name(var.name)]
    return out


def _placement(spec: PDClusterSpec) -> list[Finding]:
    p = spec.placement
    base = "spec.placement"
    out = [(f"{base}.gpuProduct", m) for m in label_value(p.gpu_product)]
    out += label_map(p.node_selector, f"{base}.nodeSelector")
    out += tolerations(p.tolerations, f"{base}.tolerations")
    if p.affinity is not None:
        out += affinity(p.affinity, f"{base}.affinity")
    if p.rdma is not None and not is_extended_resource(p.rdma.resource_name):
        out.append((f"{base}.rdma.resourceName",
                    f"{p.rdma.resource_name!r} is not an extended resource name "
                    f"(<domain>/<name> outside kubernetes.io, e.g. rdma/ib)"))
    try:
        if parse_quantity(p.shared_memory_size) < 0:
            out.append((f"{base}.sharedMemorySize", "must be greater than or equal to 0"))
    except ValueError as exc:
        out.append((f"{base}.sharedMemorySize", str(exc)))
    out += pod_annotations(p.pod_annotations, f"{base}.podAnnotations")
    return out


def _volumes(spec: PDClusterSpec) -> list[Finding]:
    weights = spec.model.weights
    if weights is None:
        return []
    base = "spec.model.weights"
    out: list[Finding] = []
    if weights.pvc is not None:
        out += [(f"{base}.pvc.claimName", m) for m in dns1123_subdomain(weights.pvc.claim_name)]
    if weights.host_path is not None and ".." in weights.host_path.path.split("/"):
        out.append((f"{base}.hostPath.path", "must not contain '..'"))
    if ".." in weights.mount_path.split("/"):
        out.append((f"{base}.mountPath", "must not contain '..'"))
    mount = posixpath.normpath(weights.mount_path)
    if mount == SHM_MOUNT_PATH or mount.startswith(SHM_MOUNT_PATH + "/") or mount == "/":
        out.append((f"{base}.mountPath", f"collides with the {SHM_MOUNT_PATH} volume every "
                                         f"engine pod mounts"))
    return out


def _ports(spec: PDClusterSpec) -> list[Finding]:
    out: list[Finding] = []
    if spec.engine.kind is EngineKind.VLLM and spec.engine.port == NIXL_SIDE_CHANNEL_PORT:
        out.append(("spec.engine.port", f"{NIXL_SIDE_CHANNEL_PORT} is NIXL's side channel port "
                                        f"in every vLLM engine pod"))
    r = spec.router
    if (r.kind or RouterKind(spec.engine.kind.value)) is RouterKind.VLLM \
            and r.discovery_port in (r.port, r.metrics_port):
        out.append(("spec.router.discoveryPort", "collides with router.port or router.metricsPort"))
    return out


def check_spec(spec: PDClusterSpec) -> list[Finding]:
    """Every Kubernetes rule the spec's values meet again in the children; [] when they pass."""
    out = scalars(spec.model_dump(mode="python", by_alias=True, exclude_none=True), "spec")
    for where, image in (("spec.engine.image", spec.engine.image),
                         ("spec.router.image", spec.router.image)):
        out += [(where, m) for m in image_reference(image)]
    out += _env(spec)
    for role in ("prefill", "decode"):
        res = getattr(spec, role).resources
        out += resource_requirements(res.requests, res.limits, f"spec.{role}.resources")
    out += _placement(spec)
    out += _volumes(spec)
    out += _ports(spec)
    return out
