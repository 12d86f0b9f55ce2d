"""A fresh machine builds and installs what CI tested (pure: reads files, runs nothing).

- The Go wrapper modules committed under e2e/cluster/ pin the versions e2e/cluster/build
  builds, and the build uses them read-only (checked against their go.sum).
- constraints.txt pins every Python dependency that pyproject.toml names, at a version its
  range allows, and e2e/setup installs with it.
- e2e/kind/create-cluster applies nothing from a URL, and nothing from outside the repository
  that it has not checked against a pinned sha256 first.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "e2e" / "cluster" / "build"
MODULES = ROOT / "e2e" / "cluster"
SETUP = ROOT / "e2e" / "setup"
CONSTRAINTS = ROOT / "constraints.txt"
CREATE_CLUSTER = ROOT / "e2e" / "kind" / "create-cluster"


def pinned_versions(script: str) -> dict[str, str]:
    """{"K8S": "v1.34.4", ...} from lines like K8S_VERSION=${PDSCALE_K8S_VERSION:-v1.34.4}."""
    return dict(re.findall(r"^(\w+)_VERSION=\$\{PDSCALE_\1_VERSION:-(v[0-9][^}]*)\}$", script, re.M))


def requirements(gomod: str) -> dict[str, str]:
    """{module: version} of a go.mod's require lines (single-line and block form)."""
    found = dict(re.findall(r"^require (\S+) (v\S+)", gomod, re.M))
    for block in re.findall(r"^require \($(.*?)^\)", gomod, re.M | re.S):
        found.update(re.findall(r"^\s+(\S+) (v\S+)", block, re.M))
    return found


def replacements(gomod: str) -> dict[str, str]:
    """{module: module@version} of a go.mod's replace lines."""
    return {old: f"{new}@{version}"
            for old, new, version in re.findall(r"^replace (\S+) => (\S+) (v\S+)$", gomod, re.M)}


def test_the_build_script_pins_every_version():
    assert set(pinned_versions(BUILD.read_text())) == {"K8S", "ETCD", "KWOK", "HELM", "LWS"}


def test_the_committed_lws_module_builds_the_pinned_lws_controller():
    version = pinned_versions(BUILD.read_text())["LWS"]
    gomod = (MODULES / "lws" / "go.mod").read_text()
    assert requirements(gomod)["sigs.k8s.io/lws"] == version
    assert f"sigs.k8s.io/lws {version} h1:" in (MODULES / "lws" / "go.sum").read_text()
    # the import that keeps the requirement through go mod tidy, never built itself
    tools = (MODULES / "lws" / "tools.go").read_text()
    assert "//go:build tools" in tools and '_ "sigs.k8s.io/lws/cmd"' in tools


def test_the_committed_etcd_module_builds_the_pinned_etcd():
    etcd = pinned_versions(BUILD.read_text())["ETCD"]
    gomod = (MODULES / "etcd" / "go.mod").read_text()
    gosum = (MODULES / "etcd" / "go.sum").read_text()
    assert requirements(gomod)["go.etcd.io/etcd/server/v3"] == etcd
    # every etcd module of the build at the same release
    etcd_modules = {m: v for m, v in requirements(gomod).items() if m.startswith("go.etcd.io/etcd/")}
    assert set(etcd_modules.values()) == {etcd}, etcd_modules
    assert f"go.etcd.io/etcd/server/v3 {etcd} h1:" in gosum
    assert "etcdmain.Main(os.Args)" in (MODULES / "etcd" / "main.go").read_text()


def test_the_committed_kubernetes_module_builds_the_pinned_kubernetes():
    k8s = pinned_versions(BUILD.read_text())["K8S"]
    staging = "v0." + k8s.removeprefix("v1.")
    gomod = (MODULES / "k8s" / "go.mod").read_text()
    gosum = (MODULES / "k8s" / "go.sum").read_text()
    required = requirements(gomod)
    assert required["k8s.io/kubernetes"] == k8s
    assert f"k8s.io/kubernetes {k8s} h1:" in gosum
    # k8s.io/kubernetes requires its staging modules at v0.0.0: each must be replaced by its
    # published release of the same Kubernetes version, with its checksum in go.sum
    replaced = replacements(gomod)
    assert len(replaced) >= 25, "the staging replaces are missing"
    assert replaced == {m: f"{m}@{staging}" for m in replaced}
    unreplaced = [m for m, v in required.items() if v == "v0.0.0" and m not in replaced]
    assert unreplaced == []
    for module in replaced:
        if module in required:
            assert f"{module} {staging}/go.mod h1:" in gosum, module


def test_the_build_compiles_the_wrapper_modules_read_only():
    script = BUILD.read_text()
    go_builds = [line for line in script.splitlines() if re.search(r"\bgo build\b", line)]
    assert len(go_builds) == 3  # etcd, each Kubernetes binary, the LWS controller
    assert all("-mod=readonly" in line for line in go_builds)
    # the committed module is used when it pins the requested version
    assert 'cp "$here/$1"/go.mod "$here/$1"/go.sum' in script


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[A-Za-z0-9_.-]+", name) and re.fullmatch(r"[^\s;#]+", version), line
        assert canonicalize_name(name) not in pins, f"{name} pinned twice"
        pins[canonicalize_name(name)] = version
    return pins


def named_dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = list(project["project"]["dependencies"])
    names += [r for extra in project["project"]["optional-dependencies"].values() for r in extra]
    names += project["build-system"]["requires"]
    reqs = [Requirement(r) for r in names]
    return [r for r in reqs if canonicalize_name(r.name) != "pdscale"]  # pdscale[testbed]


def test_constraints_pin_every_dependency_pyproject_names():
    pins = constraint_pins()
    missing = sorted({r.name for r in named_dependencies() if canonicalize_name(r.name) not in pins})
    assert missing == [], (
        f"{missing} not in constraints.txt: refresh it as its header says")
    outside = sorted(f"{r} (pinned {pins[canonicalize_name(r.name)]})" for r in named_dependencies()
                     if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True))
    assert outside == []


def test_setup_installs_with_the_constraints_and_reinstalls_when_they_change():
    setup = SETUP.read_text()
    installs = [line for line in setup.splitlines() if re.search(r"pip install", line)]
    assert installs and all("-c constraints.txt" in line for line in installs)
    assert re.search(r"^want=.*constraints\.txt.*sha256sum", setup, re.M)


def applied_paths(script: str) -> list[str]:
    """The -f argument of every kubectl apply/create/replace in a shell script."""
    paths = []
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for command in re.split(r"\$\(|\||;|&&", line):
            kubectl = re.search(r"\bkubectl\b\"?(.*)", command)
            if kubectl is None or not re.search(r"\b(apply|create|replace)\b", kubectl.group(1)):
                continue
            assert not re.search(r"\s-k\b|--kustomize", command), f"unrendered kustomization: {line}"
            match = re.search(r"\s(?:-f|--filename)[= ]+(\S+)", command)
            assert match, f"cannot tell what this applies: {line}"
            paths.append(match.group(1).strip('"'))
    return paths


def test_create_cluster_applies_nothing_without_a_checksum():
    script = CREATE_CLUSTER.read_text()
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"https?://|\bcurl\b|\bwget\b", line)]
    verified = re.findall(r"^verify (\S+)$", script, re.M)
    pins = dict(re.findall(r"^\s+(\S+)\) echo ([0-9a-f]{64}) ;;$", script, re.M))
    assert verified and set(verified) <= set(pins), "a verified manifest without a pinned sha256"
    first_apply = min(i for i, line in enumerate(code) if re.search(r"kubectl apply", line))
    last_verify = max(i for i, line in enumerate(code) if re.match(r"verify \S+$", line))
    assert last_verify < first_apply
    paths = applied_paths(script)
    assert paths
    for path in paths:
        if path.startswith("$work/manifests/"):
            assert path.removeprefix("$work/manifests/") in verified, path
        else:  # a file of this repository, reviewed like any other
            assert path.startswith("$root/") and (ROOT / path.removeprefix("$root/")).is_file(), path
