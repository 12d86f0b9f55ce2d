"""Print the manifests the operator would create for a PDCluster, without a cluster
(like `helm template`). Invalid specs exit with code 2 and the same field-naming messages the
operator reports in its SpecValid condition.

Every malformed input is refused the same way, never with a traceback: a file that is too
large, too deep, an alias bomb or not UTF-8 (pdscale/spec_file.py), a document that is not a
PDCluster mapping, a metadata.name or namespace the API server would refuse, and any spec
field whose value Kubernetes would refuse in a child (operator/api/k8s_rules.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from pdscale.operator.api.tenant_policy import TenantPolicy

EXIT_INVALID = 2
# Top-level fields of a PDCluster document; status is what `kubectl get -o yaml` adds.
DOCUMENT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True,
                        help="PDCluster YAML file (several documents allowed); - reads stdin")
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace for the children when the PDCluster names none "
                             "(default: 'default')")
    parser.add_argument("--include-crd", action="store_true",
                        help="print the PDCluster CRD first")
    parser.add_argument("--tenant-policy", metavar="VALUES.yaml",
                        help="hold the PDClusters to this tenant policy: a Helm values file "
                             "with a tenantPolicy key, or the tenantPolicy mapping itself "
                             "(default: the chart's default policy, as the operator does)")


def _document_problems(doc: dict[Any, Any]) -> list[str]:
    """What makes a mapping not a PDCluster document: kind, apiVersion, unknown fields,
    metadata (the API server's rules on the PDCluster itself), a spec that is not a mapping."""
    from pdscale.operator.api import k8s_rules
    from pdscale.operator.api.pdcluster import GROUP, KIND, VERSION

    out = []
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind != KIND:
        out.append(f"kind: not a {GROUP} {KIND} (kind {kind!r})")
    elif api_version != f"{GROUP}/{VERSION}":
        out.append(f"apiVersion: {api_version!r} is not served; use {GROUP}/{VERSION}")
    if out:
        return out
    out += [f"{key}: unknown field" for key in doc if key not in DOCUMENT_FIELDS]
    out += [f"{field}: {message}" for field, message in k8s_rules.object_metadata(doc.get("metadata"))]
    spec = doc.get("spec")
    if spec is None:
        out.append("spec: required")
    elif not isinstance(spec, dict):
        out.append(f"spec: must be a mapping, got {type(spec).__name__}")
    return out


def _label(number: int, doc: Any) -> str:
    """How an error line names its document: pdclusters/NAME once the name is a good one."""
    from pdscale.operator.api import k8s_rules

    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(name, str) and not k8s_rules.dns1123_subdomain(name):
        return f"pdclusters/{name}"
    return f"document {number}"


def render_one(number: int, doc: Any, namespace: str, policy: TenantPolicy | None = None
               ) -> tuple[list[dict[str, Any]], list[str]]:
    """(manifests, errors) for document NUMBER of the file."""
    from pdscale.operator.api.names import Owner
    from pdscale.operator.render.builders import build_children
    from pdscale.operator.render.checklist import SpecError, validate

    if not isinstance(doc, dict):
        return [], [f"document {number}: document: must be a mapping (a PDCluster), got "
                    f"{type(doc).__name__}"]
    where = _label(number, doc)
    errors = _document_problems(doc)
    if errors and errors[0].startswith(("kind:", "apiVersion:")):
        return [], [f"{where}: {e}" for e in errors]
    if isinstance(doc.get("spec"), dict):
        try:
            spec, derived = validate(doc["spec"], policy or TenantPolicy())
        except SpecError as exc:
            errors += [str(p) for p in exc.problems]
    if errors:
        return [], [f"{where}: {e}" for e in errors]
    meta = doc["metadata"]
    owner = Owner(name=meta["name"], namespace=meta.get("namespace") or namespace)
    return build_children(owner, spec, derived), []


def render(docs: list[Any], namespace: str | None, policy: TenantPolicy | None = None
           ) -> tuple[list[dict[str, Any]], list[str]]:
    """(manifests, errors) for the documents of one file, in order (None: an empty document,
    skipped); anything but a valid PDCluster is an error naming its field."""
    from pdscale.operator.api import k8s_rules

    ns = namespace or "default"
    problems = k8s_rules.namespace_name(ns, "metadata.namespace")
    if problems:
        return [], [f"--namespace: {f}: {m}" for f, m in problems]
    manifests, errors = [], []
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        out, errs = render_one(number, doc, ns, policy)
        manifests += out
        errors += errs
    return manifests, errors


def run(args: argparse.Namespace) -> int:
    from pdscale.spec_file import SpecFileError, read

    try:
        docs = [d.data for d in read(args.filename)]
    except (OSError, SpecFileError) as exc:
        print(f"error: {args.filename}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    policy = None
    if args.tenant_policy:
        try:
            policy = read_tenant_policy(args.tenant_policy)
        except (OSError, SpecFileError, ValueError) as exc:
            print(f"error: --tenant-policy {args.tenant_policy}: {exc}", file=sys.stderr)
            return EXIT_INVALID
    manifests, errors = render(docs, args.namespace, policy)
    if errors:
        for line in errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_INVALID
    if args.include_crd:
        from pdscale.operator.api.crd import build_crd

        manifests.insert(0, build_crd())
    sys.stdout.write("".join(f"# {line}\n" for line in router_notes(docs, policy)))
    sys.stdout.write(dump(manifests))
    return 0


def router_notes(docs: list[Any], policy: TenantPolicy | None = None) -> list[str]:
    """One line per valid PDCluster: which router program was rendered, why, and its prefill
    admission (derived values and what they were derived from), for ``render``'s output as
    YAML comments."""
    from pdscale.operator.render import router
    from pdscale.operator.render.checklist import SpecError, validate

    out = []
    for doc in docs:
        if not (isinstance(doc, dict) and isinstance(doc.get("spec"), dict)):
            continue
        try:
            spec, _ = validate(doc["spec"], policy or TenantPolicy())
        except SpecError:
            continue
        out.append(f"pdclusters/{doc['metadata']['name']}: {router.gateway_note(spec)}")
    return out


def read_tenant_policy(path: str) -> TenantPolicy:
    """A tenant policy from a values file (its ``tenantPolicy``) or the bare mapping."""
    from pdscale.spec_file import read

    docs = [d.data for d in read(path)]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError("must be one YAML mapping")
    data = docs[0].get("tenantPolicy", docs[0])
    return TenantPolicy.from_mapping(data)


def dump(manifests: list[dict[str, Any]]) -> str:
    """The manifests as YAML (libyaml's emitter where present: the same text, 4x faster)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    try:
        return str(yaml.dump_all(manifests, Dumper=dumper, sort_keys=False, width=120))
    except UnicodeEncodeError:  # libyaml takes UTF-8 only; PyYAML's emitter escapes the rest
        return yaml.safe_dump_all(manifests, sort_keys=False, width=120)
