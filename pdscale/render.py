"""Print the manifests the operator would create for a PDCluster, without a cluster
(like `helm template`). Invalid specs exit with code 2 and the same field-naming messages the
operator reports in its SpecValid condition."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import yaml

EXIT_INVALID = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True,
                        help="PDCluster YAML file (several documents allowed); - reads stdin")
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace for the children when the PDCluster names none "
                             "(default: 'default')")
    parser.add_argument("--include-crd", action="store_true",
                        help="print the PDCluster CRD first")


def _load(filename: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if filename == "-" else pathlib.Path(filename).read_text("utf-8")
    return [d for d in yaml.safe_load_all(text) if d]


def render(docs: list[dict[str, Any]], namespace: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """(manifests, errors) for the PDCluster documents; other kinds are an error."""
    from pdscale.operator.builders import build_children
    from pdscale.operator.checklist import SpecError, validate
    from pdscale.operator.names import Owner
    from pdscale.operator.pdcluster import GROUP, KIND

    manifests, errors = [], []
    for i, doc in enumerate(docs):
        meta = doc.get("metadata") or {}
        name = meta.get("name")
        where = f"{KIND.lower()}s/{name}" if name else f"document {i + 1}"
        if doc.get("kind") != KIND or not str(doc.get("apiVersion", "")).startswith(f"{GROUP}/"):
            errors.append(f"{where}: not a {GROUP} {KIND} (kind {doc.get('kind')!r})")
            continue
        if not name:
            errors.append(f"{where}: metadata.name: required")
            continue
        try:
            spec, derived = validate(doc.get("spec"))
        except SpecError as exc:
            errors.extend(f"{where}: {p}" for p in exc.problems)
            continue
        owner = Owner(name=name, namespace=meta.get("namespace") or namespace or "default")
        manifests.extend(build_children(owner, spec, derived))
    return manifests, errors


def run(args: argparse.Namespace) -> int:
    try:
        docs = _load(args.filename)
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: {args.filename}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    manifests, errors = render(docs, args.namespace)
    if errors:
        for line in errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_INVALID
    if args.include_crd:
        from pdscale.operator.crd import build_crd

        manifests.insert(0, build_crd())
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False, width=120))
    return 0
