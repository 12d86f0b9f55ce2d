"""The reference pages are generated from the code (tools/docsgen.py, `make docs-ref`) and
fail here when the code changes and the page does not. Beyond equality, each page is checked
against its source directly: every field of the CRD, every command and flag of the parser."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def _docsgen():
    spec = importlib.util.spec_from_file_location("docsgen", ROOT / "tools" / "docsgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return _docsgen().generate()


def test_every_reference_page_is_what_the_code_generates(generated):
    stale = [name for name, text in generated.items()
             if not (REFERENCE / name).is_file() or (REFERENCE / name).read_text() != text]
    assert not stale, f"docs/reference drifted from the code: {stale}; run make docs-ref"


def test_the_pages_do_not_depend_on_where_the_caches_are(tmp_path):
    """A run with its caches moved (PDSCALE_CACHE, XDG_STATE_HOME: CI on a fresh machine, a
    user's own layout) generates the committed pages: the defaults the code reads at import
    are shown as their defaults, not as this run's folders."""
    env = {**os.environ, "PDSCALE_CACHE": str(tmp_path / "cache"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONSAFEPATH": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "docsgen.py"), "--check"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_check_command_fails_on_a_drifted_page(tmp_path, monkeypatch):
    docsgen = _docsgen()
    monkeypatch.setattr(docsgen, "OUT", tmp_path)
    assert docsgen.main([]) == 0 and docsgen.main(["--check"]) == 0
    page = tmp_path / "pdcluster-api.md"
    page.write_text(page.read_text().replace("`spec.slo.percentile`", "`spec.slo.pct`"))
    assert docsgen.main(["--check"]) == 1


def _crd_paths(schema: dict, path: str) -> list[str]:
    out = []
    for name, child in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        out.append(here)
        out += _crd_paths(child, here)
        if (child.get("items") or {}).get("properties"):
            out += _crd_paths(child["items"], here + "[]")
    return out


def test_the_api_page_lists_every_field_of_the_crd_with_its_default(generated):
    crd = yaml.safe_load((ROOT / "crds" / "pdclusters.pdscale.io.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    page = generated["pdcluster-api.md"]
    fields = _crd_paths(root["properties"]["spec"], "spec") + _crd_paths(
        root["properties"]["status"], "status")
    assert len(fields) > 100
    missing = [f for f in fields if f"| `{f}` |" not in page]
    assert not missing, missing
    # a default and a validation as the CRD states them
    row = next(line for line in page.splitlines() if line.startswith("| `spec.slo.percentile` |"))
    assert "`90`" in row and "minimum `50`" in row and "maximum `99`" in row


def test_the_cli_page_lists_every_command_and_flag(generated):
    """Built here from each subcommand's own add_arguments, not through the generator."""
    import argparse
    import importlib

    from pdscale.main import subcommands

    page = generated["cli.md"]

    def walk(name: str, parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    found.append((f"{name} {sub_name}", ""))
                    found += walk(f"{name} {sub_name}", sub)
            elif not isinstance(action, argparse._HelpAction):  # -h is every command's
                found += [(name, option) for option in action.option_strings]
        return found

    expected = []
    for command, (module_name, _) in subcommands().items():
        parser = argparse.ArgumentParser(prog=f"pdscale {command}")
        importlib.import_module(module_name).add_arguments(parser)
        expected += [(f"pdscale {command}", ""), *walk(f"pdscale {command}", parser)]
    assert len(expected) > 100
    sections = {}
    for chunk in page.split("\n#")[1:]:
        title = chunk.split("\n", 1)[0].strip("# `")
        sections[title] = chunk
    missing = [(c, o) for c, o in expected
               if c not in sections or (o and f"`{o}`" not in sections[c])]
    assert not missing, missing


def test_the_values_page_lists_every_value_of_the_schema(generated):
    import json

    schema = json.loads((ROOT / "charts" / "pdscale" / "values.schema.json").read_text())

    def paths(node: dict, prefix: str) -> list[str]:
        out = []
        for name, child in (node.get("properties") or {}).items():
            here = f"{prefix}.{name}" if prefix else name
            out += [here, *paths(child, here)]
        return out

    page = generated["helm-values.md"]
    missing = [p for p in paths(schema, "") if f"| `{p}` |" not in page]
    assert not missing, missing


def test_the_metrics_page_lists_the_operators_metrics_and_every_query(generated):
    from pdscale.planner.prometheus import ENGINE_QUERIES

    page = generated["metrics.md"]
    for name in ("pdscale_planner_recommended_replicas", "pdscale_ready_replicas",
                 "pdscale_planner_decisions_total", "pdscale_loop_errors_total",
                 "pdscale_planner_last_plan_timestamp_seconds"):
        assert f"`{name}`" in page
    for queries in ENGINE_QUERIES.values():
        for reading in queries:
            assert f"| `{reading}` |" in page
