"""The product's boundaries are checked facts: `lint-imports` on the source tree keeps every
contract of `.importlinter`, each contract breaks on a violation planted in a copy of the tree,
every module of the runtime planner is classified, and the benchmarks import no private name."""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def contracts() -> dict[str, configparser.SectionProxy]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    prefix = "importlinter:contract:"
    return {name[len(prefix):]: config[name] for name in config.sections() if name.startswith(prefix)}


def lines(value: str) -> set[str]:
    return {line.strip() for line in value.splitlines() if line.strip()}


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)  # ahead of the editable install's finder
    return subprocess.run([LINT_IMPORTS, str(ROOT / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, env=env, cwd=cwd)


def test_the_source_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(contracts())} kept, 0 broken" in result.stdout


# contract -> (file under the package to plant in, the planted import, the line lint-imports
# prints under that contract; callers of the planted module may break theirs too)
PLANTED = {
    "planner-runtime-stands-alone": (
        "planner/forecast.py", "import kopf", "pdscale.planner.forecast -> kopf"),
    "planner-core-is-pure": ("planner/model.py", "import urllib3", "pdscale.planner.model -> urllib3"),
    "replay-builds-on-the-planner": (
        "planner/replay/traces.py", "import pdscale.operator.api.names",
        "pdscale.planner.replay.traces -> pdscale.operator.api.names"),
    "operator-imports-only-the-planner": (
        "operator/api/names.py", "import pdscale.planner.replay.traces",
        "pdscale.operator.api.names -> pdscale.planner.replay.traces"),
    "command-line-never-imports-the-test-bed": (
        "render.py", "import pdscale.testbed.demo", "pdscale.render -> pdscale.testbed.demo"),
    "operator-rooms-are-layered": (
        "operator/reconciler/status.py", "import pdscale.operator.loop.fleet",
        "pdscale.operator.reconciler.status -> pdscale.operator.loop.fleet"),
    "rendering-never-imports-the-loop": (
        "operator/render/router.py", "import pdscale.operator.loop.planning",
        "pdscale.operator.render.router -> pdscale.operator.loop.planning"),
    "the-api-imports-nothing-of-ours": (
        "operator/api/names.py", "import pdscale.planner.observe",
        "pdscale.operator.api.names -> pdscale.planner.observe"),
    "replay-from-prometheus-builds-on-the-planner": (
        "planner/recording/from_prometheus.py", "import pdscale.replay_setup",
        "pdscale.planner.recording.from_prometheus -> pdscale.replay_setup"),
    # solve imports decision: decision importing solve closes a cycle in pdscale.planner
    "no-import-cycles": (
        "planner/decision.py", "import pdscale.planner.solve",
        "No cycles are allowed in pdscale.planner."),
}


def broken_contracts(report: str) -> dict[str, str]:
    """The 'Broken contracts' section of a lint-imports report, by contract id (names are
    folded at 80 columns there, so whitespace is normalised before they are looked for)."""
    section = " ".join(report.partition("Broken contracts")[2].split())
    starts = sorted((section.find(" ".join(c["name"].split())), cid)
                    for cid, c in contracts().items() if " ".join(c["name"].split()) in section)
    ends = [start for start, _ in starts[1:]] + [len(section)]
    return {cid: section[start:end] for (start, cid), end in zip(starts, ends, strict=True)}


def test_every_contract_has_a_planted_violation():
    assert set(PLANTED) == set(contracts())


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as a real tree (links followed), to plant violations in."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(ROOT / "pdscale", site / "pdscale", ignore=shutil.ignore_patterns("__pycache__"))
    return site


@pytest.mark.parametrize("contract", sorted(PLANTED))
def test_a_planted_violation_breaks_its_contract(contract: str, package_copy: Path):
    relative, planted, reported = PLANTED[contract]
    target = package_copy / "pdscale" / relative
    original = target.read_text()
    target.write_text(original + f"\n{planted}  # planted by tests/test_layering.py\n")
    try:
        result = lint_imports(package_copy, pythonpath=package_copy)
    finally:
        target.write_text(original)
    assert result.returncode != 0
    assert reported in broken_contracts(result.stdout)[contract]


def test_every_module_of_the_runtime_planner_is_classified():
    # The runtime's contracts list its modules one by one (the replay subpackage lives inside
    # pdscale.planner): a new module must be placed on purpose, pure or I/O.
    runtime = {f"pdscale.planner.{p.stem}" for p in (ROOT / "planner").glob("*.py")
               if p.stem != "__init__"}
    c = contracts()
    assert lines(c["planner-runtime-stands-alone"]["source_modules"]) == runtime
    io_modules = runtime - lines(c["planner-core-is-pure"]["source_modules"])
    assert io_modules == {"pdscale.planner.prometheus"}


def private_imports(source: str) -> list[str]:
    """Names starting with '_' imported from pdscale (a private name is no interface)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pdscale"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.startswith("pdscale") and any(part.startswith("_") and part != "__main__"
                                                               for part in a.name.split("."))]
    return found


def test_the_benchmarks_import_no_private_name():
    offenders = {p.name: private_imports(p.read_text()) for p in (ROOT / "bench").glob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_private_name_check_catches_one():
    assert private_imports("from pdscale.planner.replay.run import ReplaySetup, _run\n") == [
        "pdscale.planner.replay.run._run"]


def test_every_module_of_the_operator_is_in_a_room():
    # The operator's root holds only the kopf entry point and leader election; every other
    # module lives in a room (a sub-package with a one-line docstring) that the layers list.
    operator = ROOT / "operator"
    assert {p.stem for p in operator.glob("*.py")} == {"__init__", "handlers", "leader"}
    rooms = {p.parent.name for p in operator.glob("*/__init__.py")}
    layers = lines(contracts()["operator-rooms-are-layered"]["layers"])
    assert rooms | {"handlers", "leader"} == layers
    for room in rooms:
        doc = ast.get_docstring(ast.parse((operator / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"operator/{room}/__init__.py: one-line docstring"
