"""The planner core imports no Kubernetes client, no kopf and no HTTP library: checked by
import-linter on the package as installed (cli/ -> pdscale, planner/ -> pdscale.planner),
laid out from pyproject's package-dir so the check sees exactly what users import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def installed_layout(target: Path) -> Path:
    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setuptools_cfg["package-dir"].items():
        dest = target.joinpath(*package.split("."))
        shutil.copytree(ROOT / folder, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return target


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), str(ROOT / ".importlinter"), "--no-cache"],
        capture_output=True, text=True, env=env, cwd=tree,
    )


def test_planner_imports_no_cluster_or_http_library(tmp_path):
    result = lint_imports(installed_layout(tmp_path / "site"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_the_contract_catches_a_forbidden_import(tmp_path):
    tree = installed_layout(tmp_path / "site")
    (tree / "pdscale" / "planner" / "leak.py").write_text("import kubernetes\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "pdscale.planner.leak -> kubernetes" in result.stdout
