"""Fuzz `pdscale render` with PDCluster documents mutated from examples/*.yaml (opt-in).

A seeded generator mutates the examples (type swaps, huge and negative numbers, deletions,
unicode, long strings, deep nesting, wrong kinds, bad names, label values, env names, images,
quantities, tolerations, affinities, annotation keys, unknown fields) and their bytes (non-UTF-8
bytes, aliases and alias bombs, duplicate keys, truncation, oversize files, several documents),
runs each through the command's render path in process (pdscale.spec_file, then
pdscale.render.render) and sorts the outcome:

* crash: an exception other than a refusal (the command would print a traceback);
* refused: exit 2, every error line naming its field (spec., metadata., kind, apiVersion,
  document); a line that does not is counted as 'unnamed';
* accepted: manifests. Each child is checked against the API server's own rules that a JSON
  schema cannot express (names, labels, annotation keys, quantities, env names, images,
  int32 fields; ``child_rule_violations``) and validated strictly with kubernetes-validate
  against the Kubernetes 1.34 schemas.

    .venv/bin/python bench/render_fuzz.py [--count 20000] [--seed 1] [--out out/render_fuzz.json]

tests/operator/test_render_fuzz.py runs the same generator on 2,000 documents.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import json
import pathlib
import random
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from pdscale.operator.api import k8s_rules
from pdscale.operator.api.pdcluster import Toleration
from pdscale.render import dump, render
from pdscale.spec_file import MAX_BYTES, SpecFileError, load_bytes

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S_VERSION = "1.34"

# An error line: where (the document), then the field it names.
FIELD_NAMED = re.compile(
    r"^(document \d+|pdclusters/[^:]+|--namespace): "
    # an unknown key is named as written, which may hold a colon (":pec")
    r"((document|kind|apiVersion|metadata|spec)\b|.+: unknown field$)"
)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
FILE_ERROR = re.compile(r"^document( \d+)?: ")
#: the kernel's limit on one exec string (32 pages of 4 KiB), its terminating NUL included
MAX_ARG_STRLEN = 131_072


# ---- the generator ---------------------------------------------------------------------------


def examples() -> list[dict[str, Any]]:
    """The shipped examples, each made valid (the demo's planner needs a Prometheus URL)."""
    out = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        planner = doc["spec"].setdefault("planner", {})
        if planner.get("mode", "Off") != "Off":
            planner.setdefault("prometheusURL", "http://prometheus:9090")
        out.append(doc)
    return out


BAD_NAMES: list[Any] = [
    "", "A", "Upper", "under_score", "-lead", "trail-", "a..b", "a.b-", ".a", "1abc", "a" * 63,
    "a" * 64, "b" * 253, "c" * 254, "x." * 120 + "x", "é", "a b", "a/b", "a\nb", 7, 3.5, True,
    None, [], {}, "demo", "glm53.serving.example", "p" * 40, "llama-3-70b-instruct-fp8-decode-x",
]
BAD_LABEL_VALUES: list[Any] = [
    "", "ok", "NVIDIA-H200", "-x", "x-", "a" * 63, "a" * 64, "a b", "a/b", "ünïcode", "a:b",
    "x.y_z", 5, None, True, "\u200b", "a\x00b",
]
BAD_KEYS: list[Any] = [
    "ok", "example.com/ok", "a/b/c", "/x", "x/", "Upper.Case/Key", "-x", "a" * 64,
    "p" * 254 + "/x", "kubernetes.io/x", "k/" + "n" * 63, "with space", "ü", "", 3,
]
ENV_NAMES: list[Any] = ["FOO", "foo.bar", "-x", "1ABC", "A=B", "with space", "", "É", "_ok",
                        "a" * 300, 5, None, "TAB\tX"]
IMAGES: list[Any] = [
    "nginx", "lmsysorg/sglang:v0.5.6-cu129", "registry:5000/a/b:tag", "UPPER/case", "a:b:c",
    "a@sha256:" + "0" * 64, "a@sha256:abc", " lead", "trail ", "a//b", "x" * 300, "[::1]:5000/x",
    "img:" + "t" * 129, "ok.example/x/y@sha256:" + "f" * 64, "", "é", 5,
]
QUANTITIES: list[Any] = ["1", "64Gi", "500m", "1.5", "-1", "1e3", "1e400", "1E", "0.1m", "abc",
                         "1Ki ", "+5", "9" * 30, 2**63, -5, 3, 1.5, True, "", "1e1.5", None,
                         "9223372036854775807", "18446744073709551616"]
RESOURCE_NAMES: list[Any] = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "hugepages-x",
                             "example.com/dev", "kubernetes.io/x", "bogus", "a/b/c",
                             "rdma/ib", "nvidia.com/gpu", "Example.com/x", 5]
HUGE_NUMBERS: list[Any] = [2**31, 2**31 - 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -1,
                           0, -(10**20), 10**39, 1e308, float("inf"), float("nan"), -0.5, 1.5]
UNICODE: list[str] = ["ünïcödé", "日本語", "🚀", "\u202eRTL", "e\u0301", "\ufeffbom", "\x00nul",
                      "\x07bell", "tab\there", "line\nbreak", "\ud800", "\U0001f600" * 10]
TYPE_VALUES: list[Any] = [None, True, False, 0, 1, -1, 1.5, "", "str", [], [1, "a"], {}, {"k": "v"},
                          "2001-02-03", 10**25]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _ensure(doc: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = doc
    for key in dotted.split("."):
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    return node


def _random_path(rng: random.Random, doc: Any) -> tuple[Any, ...]:
    return rng.choice(list(_paths(doc)))


def m_type_swap(rng: random.Random, doc: Any) -> Any:
    return _set(doc, _random_path(rng, doc), copy.deepcopy(rng.choice(TYPE_VALUES)))


def m_number(rng: random.Random, doc: Any) -> Any:
    ints = [p for p in _paths(doc) if p and isinstance(_get(doc, p), int)]
    path = rng.choice(ints) if ints and rng.random() < 0.8 else _random_path(rng, doc)
    return _set(doc, path, rng.choice(HUGE_NUMBERS))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def m_delete(rng: random.Random, doc: Any) -> Any:
    paths = [p for p in _paths(doc) if p and isinstance(_get(doc, p[:-1]), dict)]
    if paths:
        path = rng.choice(paths)
        del _get(doc, path[:-1])[path[-1]]
    return doc


def m_unicode(rng: random.Random, doc: Any) -> Any:
    strings = [p for p in _paths(doc) if p and isinstance(_get(doc, p), str)]
    path = rng.choice(strings) if strings else _random_path(rng, doc)
    text = rng.choice(UNICODE)
    old = _get(doc, path) if path else ""
    return _set(doc, path, (old + text) if isinstance(old, str) and rng.random() < 0.5 else text)


def m_long_string(rng: random.Random, doc: Any) -> Any:
    strings = [p for p in _paths(doc) if p and isinstance(_get(doc, p), str)]
    path = rng.choice(strings) if strings else _random_path(rng, doc)
    return _set(doc, path, rng.choice("abz-.") * rng.choice([62, 63, 64, 253, 254, 300, 70_000,
                                                           300_000]))


def m_deep(rng: random.Random, doc: Any) -> Any:
    depth = rng.choice([5, 20, 40, 63, 70, 200])
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return _set(doc, _random_path(rng, doc), value)


def m_kind(rng: random.Random, doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    key = rng.choice(["kind", "apiVersion"])
    doc[key] = rng.choice(["ConfigMap", "pdcluster", "pdscale.io/v1", "pdscale.io/v1alpha1",
                           "PDCluster", "v1", None, 5, ["PDCluster"], "pdscale.io/v1alpha1/x"])
    return doc


def m_name(rng: random.Random, doc: Any) -> Any:
    if isinstance(doc, dict):
        meta = doc.get("metadata")
        if not isinstance(meta, dict):
            meta = doc["metadata"] = {}
        meta[rng.choice(["name", "name", "namespace"])] = copy.deepcopy(rng.choice(BAD_NAMES))
    return doc


def m_metadata_maps(rng: random.Random, doc: Any) -> Any:
    if isinstance(doc, dict):
        meta = doc.get("metadata")
        if not isinstance(meta, dict):
            meta = doc["metadata"] = {"name": "fuzz"}
        meta[rng.choice(["labels", "annotations"])] = {
            rng.choice(BAD_KEYS): rng.choice(BAD_LABEL_VALUES)}
    return doc


def _spec(doc: Any) -> dict[str, Any] | None:
    spec = doc.get("spec") if isinstance(doc, dict) else None
    return spec if isinstance(spec, dict) else None


def m_placement(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is None:
        return doc
    placement = _ensure(spec, "placement")
    choice = rng.randrange(4)
    if choice == 0:
        placement["gpuProduct"] = rng.choice(BAD_LABEL_VALUES)
    elif choice == 1:
        placement["nodeSelector"] = {rng.choice(BAD_KEYS): rng.choice(BAD_LABEL_VALUES)}
    elif choice == 2:
        placement["podAnnotations"] = {rng.choice([*BAD_KEYS, "controller.kubernetes.io/pod-deletion-cost", "kubernetes.io/config.mirror"]):
            rng.choice(["1", "x", "99999999999", "a" * rng.choice([10, 300_000])])}
    else:
        placement["sharedMemorySize"] = rng.choice(QUANTITIES)
    return doc


def m_tolerations(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is None:
        return doc
    tol: dict[str, Any] = {}
    for key, pool in (("key", [*BAD_KEYS, None, "", "gpu"]),
                      ("operator", ["Exists", "Equal", "Lt", "", None, 5]),
                      ("value", BAD_LABEL_VALUES), ("effect", ["NoSchedule", "NoExecute", "Bad", None]),
                      ("tolerationSeconds", [None, 30, -5, 2**63, 2**64, "30"])):
        if rng.random() < 0.6:
            tol[key] = rng.choice(pool)
    _ensure(spec, "placement")["tolerations"] = [tol]
    return doc


def _requirement(rng: random.Random, operators: list[Any]) -> dict[str, Any]:
    req: dict[str, Any] = {"key": rng.choice(BAD_KEYS), "operator": rng.choice(operators)}
    if rng.random() < 0.8:
        req["values"] = rng.choice([[], ["a"], ["a", "b"], ["5"], ["99999999999999999999"],
                                    ["bad value"], [5], "a", ["node-1"]])
    if rng.random() < 0.1:
        req["extra"] = 1
    return req


def _label_selector(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return rng.choice(TYPE_VALUES)
    sel: dict[str, Any] = {}
    if rng.random() < 0.5:
        sel["matchLabels"] = {rng.choice(BAD_KEYS): rng.choice(BAD_LABEL_VALUES)}
    if rng.random() < 0.6:
        sel["matchExpressions"] = [_requirement(rng, ["In", "NotIn", "Exists", "DoesNotExist", "Gt"])]
    return sel


def _pod_term(rng: random.Random) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if rng.random() < 0.9:
        term["topologyKey"] = rng.choice(["kubernetes.io/hostname", "", "bad key!", 5,
                                          "topology.kubernetes.io/zone"])
    if rng.random() < 0.7:
        term["labelSelector"] = _label_selector(rng)
    if rng.random() < 0.2:
        term["namespaceSelector"] = _label_selector(rng)
    if rng.random() < 0.2:
        term["namespaces"] = rng.choice([["default"], ["Bad_NS"], "default", [5]])
    if rng.random() < 0.2:
        term[rng.choice(["matchLabelKeys", "mismatchLabelKeys"])] = [rng.choice(BAD_KEYS)]
    return term


def random_affinity(rng: random.Random) -> Any:
    """An affinity, right or wrong in the ways the API server checks."""
    if rng.random() < 0.05:
        return rng.choice(TYPE_VALUES)
    aff: dict[str, Any] = {}
    if rng.random() < 0.6:
        term = {"matchExpressions": [_requirement(rng, ["In", "NotIn", "Exists", "DoesNotExist",
                                                        "Gt", "Lt", "Bad"])]}
        if rng.random() < 0.2:
            term["matchFields"] = [{"key": rng.choice(["metadata.name", "spec.x"]),
                                    "operator": rng.choice(["In", "Exists"]),
                                    "values": rng.choice([["node-1"], ["a", "b"], ["Bad_Node"]])}]
        node: dict[str, Any] = {}
        if rng.random() < 0.7:
            node["requiredDuringSchedulingIgnoredDuringExecution"] = rng.choice(
                [{"nodeSelectorTerms": [term]}, {"nodeSelectorTerms": []}, {}, [term]])
        if rng.random() < 0.5:
            node["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": rng.choice([1, 50, 100, 0, 101, "5", 2**40]), "preference": term}]
        aff["nodeAffinity"] = node
    for name in ("podAffinity", "podAntiAffinity"):
        if rng.random() < 0.4:
            pod: dict[str, Any] = {}
            if rng.random() < 0.6:
                pod["requiredDuringSchedulingIgnoredDuringExecution"] = [_pod_term(rng)]
            if rng.random() < 0.5:
                pod["preferredDuringSchedulingIgnoredDuringExecution"] = [
                    {"weight": rng.choice([1, 100, 0, -1]), "podAffinityTerm": _pod_term(rng)}]
            aff[name] = pod
    if rng.random() < 0.05:
        aff["unknownAffinity"] = {}
    return aff


def m_affinity(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is not None:
        # an empty affinity too: it pins nothing, and both enforcers must read it so
        _ensure(spec, "placement")["affinity"] = {} if rng.random() < 0.1 else random_affinity(rng)
    return doc


def m_env(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is not None:
        where = _ensure(spec, rng.choice(["engine", "prefill", "decode"]))
        where["env"] = [{"name": "OK", "value": "1"},
                        {"name": rng.choice(ENV_NAMES), "value": rng.choice(["x", 5, None, "\x00"])}]
    return doc


def m_image(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is not None:
        _ensure(spec, rng.choice(["engine", "router"]))["image"] = rng.choice(IMAGES)
    return doc


def m_resources(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is None:
        return doc
    res = _ensure(spec, f"{rng.choice(['prefill', 'decode'])}.resources")
    for section in rng.sample(["requests", "limits"], rng.randint(1, 2)):
        res[section] = {rng.choice(RESOURCE_NAMES): rng.choice(QUANTITIES)
                        for _ in range(rng.randint(1, 3))}
    if rng.random() < 0.3:
        _ensure(spec, "placement")["rdma"] = {"resourceName": rng.choice(RESOURCE_NAMES),
                                              "count": rng.choice([1, 0, 65, "2"])}
    return doc


def m_volumes(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is None:
        return doc
    weights = _ensure(spec, "model.weights")
    choice = rng.randrange(3)
    if choice == 0:
        weights.pop("hostPath", None)
        weights["pvc"] = {"claimName": rng.choice(BAD_NAMES)}
    elif choice == 1:
        weights.pop("pvc", None)
        weights["hostPath"] = {"path": rng.choice(["/raid/models", "/a/../b", "relative", "/",
                                                   "/x/..", 5, "/raid/models/", "/models//x",
                                                   "/models/./x", "/models/x/", "//models"])}
    else:
        weights["mountPath"] = rng.choice(["/models", "/dev/shm", "/dev/shm/x", "/", "/a/../b"])
    return doc


def m_ports(rng: random.Random, doc: Any) -> Any:
    spec = _spec(doc)
    if spec is not None:
        section, key = rng.choice([("engine", "port"), ("router", "discoveryPort"),
                                   ("router", "metricsPort"), ("kvTransfer", "bootstrapPort")])
        _ensure(spec, section)[key] = rng.choice([5600, 8000, 30000, 29000, 30001, 0, 65536, 1])
    return doc


def m_unknown_field(rng: random.Random, doc: Any) -> Any:
    dicts = [p for p in _paths(doc) if isinstance(_get(doc, p), dict)]
    if dicts:
        _get(doc, rng.choice(dicts))[rng.choice(["extra", "unknownField", 5, None])] = 1
    return doc


def m_shape(rng: random.Random, doc: Any) -> Any:
    """The document, metadata or spec of the wrong type."""
    choice = rng.randrange(3)
    if choice == 0 or not isinstance(doc, dict):
        return rng.choice([[doc], "text", 5, None, [], True])
    doc[rng.choice(["metadata", "spec"])] = copy.deepcopy(rng.choice(TYPE_VALUES))
    return doc


STRUCTURED: list[tuple[str, Callable[[random.Random, Any], Any], int]] = [
    ("type-swap", m_type_swap, 6), ("number", m_number, 5), ("delete", m_delete, 4),
    ("unicode", m_unicode, 3), ("long-string", m_long_string, 2), ("deep", m_deep, 2),
    ("kind", m_kind, 2), ("name", m_name, 4), ("metadata-maps", m_metadata_maps, 2),
    ("placement", m_placement, 4), ("tolerations", m_tolerations, 4), ("affinity", m_affinity, 6),
    ("env", m_env, 3), ("image", m_image, 3), ("resources", m_resources, 4),
    ("volumes", m_volumes, 2), ("ports", m_ports, 2), ("unknown-field", m_unknown_field, 2),
    ("shape", m_shape, 2),
]


def _dump(rng: random.Random, doc: Any) -> bytes:
    allow_unicode = rng.random() < 0.5
    try:
        text = yaml.dump(doc, Dumper=DUMPER, sort_keys=False, allow_unicode=allow_unicode,
                         width=120)
    except UnicodeEncodeError:  # a lone surrogate: PyYAML's emitter writes it as an escape
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=allow_unicode, width=120)
    return text.encode("utf-8", "surrogateescape" if rng.random() < 0.5 else "surrogatepass")


def b_non_utf8(rng: random.Random, raw: bytes) -> bytes:
    choice = rng.randrange(3)
    if choice == 0:
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]) + raw[at:]
    if choice == 1:
        return raw.decode("utf-8", "replace").encode("utf-16")
    return raw.replace(b"name: ", "name: caf\xe9-".encode("latin-1"), 1)


def b_alias(rng: random.Random, raw: bytes) -> bytes:
    choice = rng.randrange(4)
    if choice == 0:  # a legitimate merge key sharing role settings
        text = raw.decode("utf-8", "replace")
        return text.replace("  prefill:", "  prefill: &role", 1).replace(
            "  decode:", "  decode:\n    <<: *role", 1).encode()
    if choice == 1:  # a bomb: levels of aliases, each ten times the last
        levels = rng.choice([3, 6, 9])
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
        return raw + ("\nbomb:\n" + "\n".join("  " + line for line in lines) + "\n").encode()
    if choice == 2:  # recursive
        return b"apiVersion: pdscale.io/v1alpha1\nkind: PDCluster\nmetadata: &m {name: x, self: *m}\n"
    return raw + ("\n" + "\n".join(f"k{i}: &k{i} v" for i in range(200))
                  + "\nrefs: [" + ", ".join(f"*k{i}" for i in range(200)) + "]\n").encode()


def b_duplicate_key(rng: random.Random, raw: bytes) -> bytes:
    return raw + b"\nkind: PDCluster\n"


def b_truncate(rng: random.Random, raw: bytes) -> bytes:
    return raw[: rng.randrange(len(raw) + 1)]


def b_flip(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(len(data))] = rng.choice(b":-[]{}&*!|>'\"%@`#,? \t\n\x00\x7f")
    return bytes(data)


def b_oversize(rng: random.Random, raw: bytes) -> bytes:
    pad = MAX_BYTES + rng.choice([1, 1000])
    return raw + b"\n# " + b"x" * pad + b"\n"


def b_deep_text(rng: random.Random, raw: bytes) -> bytes:
    depth = rng.choice([60, 100, 5000])
    return raw + b"\ndeep: " + b"[" * depth + b"]" * depth + b"\n"


def b_multi(rng: random.Random, raw: bytes) -> bytes:
    return raw + b"\n---\n" + rng.choice([b"", b"~\n", b"[1]\n", b"x\n", raw])


def b_bad_yaml(rng: random.Random, raw: bytes) -> bytes:
    return raw + rng.choice([b"\nx: !!python/object:os.system x\n", b"\nx: !!binary '***'\n",
                             b"\n? [a, b]\n: c\n", b"\nx: 2001-02-30\n", b"\nx: " + b"9" * 5000,
                             b"\nx: \"\\ud800\"\n", b"\nx: !custom 1\n", b"\n<<: 5\n", b"\t\n"])


BYTES: list[tuple[str, Callable[[random.Random, bytes], bytes], int]] = [
    ("non-utf8", b_non_utf8, 3), ("alias", b_alias, 4), ("duplicate-key", b_duplicate_key, 1),
    ("truncate", b_truncate, 2), ("flip", b_flip, 3), ("oversize", b_oversize, 1),
    ("deep-text", b_deep_text, 1), ("multi-document", b_multi, 2), ("bad-yaml", b_bad_yaml, 2),
]


@dataclass(frozen=True)
class Case:
    index: int
    mutations: tuple[str, ...]
    raw: bytes


def generate(count: int, seed: int = 1) -> Iterator[Case]:
    """COUNT documents, the same for the same seed: each an example with one to three
    structured mutations, and a quarter of them a byte mutation on top."""
    rng = random.Random(seed)
    bases = examples()
    s_weights = [w for _, _, w in STRUCTURED]
    b_weights = [w for _, _, w in BYTES]
    for index in range(count):
        doc: Any = copy.deepcopy(rng.choice(bases))
        applied = []
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            name, mutate, _ = rng.choices(STRUCTURED, s_weights)[0]
            doc = mutate(rng, doc)
            applied.append(name)
        raw = _dump(rng, doc)
        if rng.random() < 0.25:
            name, mutate_bytes, _ = rng.choices(BYTES, b_weights)[0]
            raw = mutate_bytes(rng, raw)
            applied.append(name)
        yield Case(index, tuple(applied), raw)


# ---- running and judging ---------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # accepted | refused | crash
    reason: str = ""  # refusal class, or the crash's exception
    errors: list[str] = field(default_factory=list)
    manifests: list[dict[str, Any]] = field(default_factory=list)


def run_case(raw: bytes, namespace: str | None = None) -> Outcome:
    """What `pdscale render -f FILE` does with RAW, in process."""
    try:
        try:
            docs = [d.data for d in load_bytes(raw)]
        except SpecFileError as exc:
            return Outcome("refused", file_reason(str(exc)), [str(exc)])
        manifests, errors = render(docs, namespace)
        # What the command then writes: it must encode.
        dump(manifests).encode("utf-8")
    except Exception as exc:
        return Outcome("crash", f"{type(exc).__name__}: {exc}"[:300],
                       [traceback.format_exc(limit=-3)])
    if errors:
        return Outcome("refused", spec_reason(errors[0]), errors)
    return Outcome("accepted", manifests=manifests)


def file_reason(message: str) -> str:
    for needle, reason in (("larger than", "file: size"), ("UTF-8", "file: not UTF-8"),
                           ("nested deeper", "file: depth"), ("aliases", "file: aliases"),
                           ("alias", "file: aliases"), ("duplicate key", "file: duplicate key"),
                           ("Unicode", "file: unicode"), ("digits", "file: integer"),
                           ("date", "file: date")):
        if needle in message:
            return reason
    return "file: YAML syntax"


def spec_reason(line: str) -> str:
    """The refusal's class: the field named, to two levels (spec.placement, metadata.name)."""
    rest = line.split(": ", 1)[1] if ": " in line else line
    named = rest.split(": ", 1)[0]
    parts = [p for p in re.split(r"[.\[\]]+", named) if p]
    if parts[:1] == ["spec"]:
        return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isidentifier() else "spec"
    if parts[:1] in (["metadata"], ["kind"], ["apiVersion"], ["document"]):
        return parts[0]
    return "unknown top-level field"


def unnamed_errors(outcome: Outcome) -> list[str]:
    """Error lines that name no field."""
    if outcome.status != "refused":
        return []
    if outcome.reason.startswith("file:"):
        return [e for e in outcome.errors if not FILE_ERROR.match(e)]
    return [e for e in outcome.errors if not FIELD_NAMED.match(e)]


def _int_fields(value: Any, path: str = "") -> Iterator[tuple[str, int]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _int_fields(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _int_fields(v, f"{path}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool):
        yield path, value


INT64_FIELDS = ("terminationGracePeriodSeconds", "seconds", "tolerationSeconds")


def child_rule_violations(manifest: dict[str, Any]) -> list[str]:
    """The API server's rules that its JSON schema does not carry, on one rendered child."""
    out: list[str] = []
    meta = manifest["metadata"]
    name_rule = (k8s_rules.dns1035_label if manifest["kind"] == "Service"
                 else k8s_rules.dns1123_subdomain)
    out += [f"metadata.name: {m}" for m in name_rule(meta["name"])]
    out += [f"metadata.namespace: {m}" for m in k8s_rules.dns1123_label(meta["namespace"])]
    out += [f"{f}: {m}" for f, m in k8s_rules.label_map(meta.get("labels", {}), "metadata.labels")]
    out += [f"{f}: {m}" for f, m in k8s_rules.annotation_map(meta.get("annotations", {}),
                                                             "metadata.annotations")]
    for path, value in _int_fields(manifest):
        limit = k8s_rules.INT64_MAX if path.rsplit(".", 1)[-1] in INT64_FIELDS else k8s_rules.INT32_MAX
        if not -limit - 1 <= value <= limit:
            out.append(f"{path}: {value!r} out of range")
    template = manifest.get("spec", {}).get("template")
    if template:
        out += _pod_template_violations(template)
    for template in lws_pod_templates(manifest):  # a LeaderWorkerSet's leader and workers
        out += _pod_template_violations(template["template"])
    return out


def lws_pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's leader and worker pod templates, each as a core/v1 PodTemplate (the
    API server validates them as PodTemplateSpecs; kubernetes-validate has no LWS schema).
    [] for any other kind."""
    if manifest.get("kind") != "LeaderWorkerSet":
        return []
    meta = manifest["metadata"]
    group = manifest["spec"]["leaderWorkerTemplate"]
    return [{"apiVersion": "v1", "kind": "PodTemplate",
             "metadata": {"name": f"{meta['name']}-{key.removesuffix('Template')}",
                          "namespace": meta["namespace"]},
             "template": group[key]}
            for key in ("leaderTemplate", "workerTemplate") if key in group]


def _pod_template_violations(template: dict[str, Any]) -> list[str]:
    out: list[str] = []
    meta, pod = template["metadata"], template["spec"]
    out += [f"{f}: {m}" for f, m in k8s_rules.label_map(meta.get("labels", {}), "template.labels")]
    out += [f"{f}: {m}" for f, m in k8s_rules.annotation_map(meta.get("annotations", {}),
                                                             "template.annotations")]
    out += [f"{f}: {m}" for f, m in k8s_rules.label_map(pod.get("nodeSelector", {}), "nodeSelector")]
    tolerations = [Toleration.model_validate(t) for t in pod.get("tolerations", [])]
    out += [f"{f}: {m}" for f, m in k8s_rules.tolerations(tolerations, "tolerations")]
    if "affinity" in pod:
        out += [f"{f}: {m}" for f, m in k8s_rules.affinity(pod["affinity"], "affinity")]
    for c in pod["containers"]:
        out += [f"image: {m}" for m in k8s_rules.image_reference(c["image"])]
        for env in c.get("env", []):
            out += [f"env {env['name']!r}: {m}" for m in k8s_rules.env_var_name(env["name"])]
            if "\x00" in env.get("value", ""):
                out.append(f"env {env['name']!r}: NUL in value")
        res = c.get("resources", {})
        out += [f"{f}: {m}" for f, m in k8s_rules.resource_requirements(
            res.get("requests", {}), res.get("limits", {}), "resources")]
        out += [f"args: NUL in {a!r}" for a in c.get("args", []) if "\x00" in a]
        # the kernel refuses an exec with one string (an argument, or NAME=value) of
        # MAX_ARG_STRLEN bytes or more, NUL included: such a container can never start
        strings = [*c.get("command", []), *c.get("args", []),
                   *(f"{e['name']}={e.get('value', '')}" for e in c.get("env", []))]
        out += [f"exec string of {n} bytes (kernel limit {MAX_ARG_STRLEN})" for x in strings
                if (n := len(x.encode("utf-8", "surrogatepass")) + 1) > MAX_ARG_STRLEN]
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(set(mounts)) != len(mounts):
            out.append(f"volumeMounts: duplicate mountPath in {mounts}")
    for vol in pod.get("volumes", []):
        if "hostPath" in vol and ".." in vol["hostPath"]["path"].split("/"):
            out.append("volumes: hostPath with '..'")
        if "persistentVolumeClaim" in vol:
            out += [f"claimName: {m}" for m in
                    k8s_rules.dns1123_subdomain(vol["persistentVolumeClaim"]["claimName"])]
    return out


@functools.cache
def _schema_validator() -> Callable[[dict[str, Any]], None]:
    """kubernetes_validate.validate, strict, for Kubernetes 1.34. Its schema files are read
    once per process (it reads them on every call otherwise: 10x slower, same result)."""
    import kubernetes_validate
    from kubernetes_validate import utils

    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)

    def check(manifest: dict[str, Any]) -> None:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)

    return check


def schema_violations(manifest: dict[str, Any]) -> list[str]:
    """kubernetes-validate's strict 1.34 verdict on one child ([] when it passes); of a
    LeaderWorkerSet, on its pod templates (``lws_pod_templates``)."""
    import kubernetes_validate

    out = []
    for checked in lws_pod_templates(manifest) or [manifest]:
        try:
            _schema_validator()(json.loads(json.dumps(checked)))
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            out.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {where}: {exc.message}")
    return out


# ---- the bench -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "out" / "render_fuzz.json"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    by_status: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    mutations: collections.Counter[str] = collections.Counter()
    crashes, unnamed, rule_failures, schema_failures = [], [], [], []
    children = 0
    for case in generate(args.count, args.seed):
        mutations.update(case.mutations)
        outcome = run_case(case.raw)
        by_status[outcome.status] += 1
        if outcome.status == "crash":
            crashes.append({"case": case.index, "mutations": case.mutations,
                            "error": outcome.reason, "traceback": outcome.errors[0]})
        elif outcome.status == "refused":
            reasons[outcome.reason] += 1
            unnamed += [{"case": case.index, "line": e} for e in unnamed_errors(outcome)]
        else:
            for manifest in outcome.manifests:
                children += 1
                rule_failures += [{"case": case.index, "mutations": case.mutations, "problem": p}
                                  for p in child_rule_violations(manifest)]
                schema_failures += [{"case": case.index, "mutations": case.mutations,
                                     "problem": p} for p in schema_violations(manifest)]
    elapsed = time.monotonic() - started
    result = {
        "seed": args.seed, "generated": args.count, "accepted": by_status["accepted"],
        "refused": by_status["refused"], "crashes": len(crashes),
        "refused_by_reason": dict(reasons.most_common()),
        "refusals_naming_no_field": len(unnamed), "children_validated": children,
        "child_rule_failures": len(rule_failures), "schema_failures": len(schema_failures),
        "kubernetes_version": K8S_VERSION, "seconds": round(elapsed, 1),
        "mutations_applied": dict(mutations.most_common()),
        "examples": {"crashes": crashes[:20], "unnamed": unnamed[:20],
                     "child_rule_failures": rule_failures[:20],
                     "schema_failures": schema_failures[:20]},
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"{'generated':<40}{args.count:>8}")
    print(f"{'accepted':<40}{by_status['accepted']:>8}")
    print(f"{'refused':<40}{by_status['refused']:>8}")
    for reason, n in reasons.most_common():
        print(f"{'  ' + reason:<40}{n:>8}")
    print(f"{'refusals naming no field':<40}{len(unnamed):>8}")
    print(f"{'crashes':<40}{len(crashes):>8}")
    print(f"{'children checked':<40}{children:>8}")
    print(f"{'child API-server rule failures':<40}{len(rule_failures):>8}")
    print(f"{'schema failures (kubernetes-validate ' + K8S_VERSION + ')':<40}{len(schema_failures):>8}")
    print(f"{'seconds':<40}{elapsed:>8.1f}")
    print(f"wrote {out}")
    return 1 if crashes or unnamed or rule_failures or schema_failures else 0


if __name__ == "__main__":
    sys.exit(main())
