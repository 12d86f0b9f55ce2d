"""The docs site builds strictly (a broken link, a missing page or snippet fails), and its built
pages open in a real browser with their title and navigation: a headless Chromium takes a
screenshot of the home page and of one guide, kept under out/docs-test/ as a test artefact."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = ROOT / "out" / "docs-test"
#: the navigation's top sections, as a reader sees them on every page
SECTIONS = ["Getting started", "Concepts", "How-to guides", "Reference", "Benchmarks",
            "Design notes", "Develop"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    assert mkdocs.is_file(), "mkdocs is not installed in the venv: run make setup"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    return out


def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    for page in ["index.html", "getting-started/install/index.html",
                 "getting-started/first-pdcluster/index.html", "how-to/troubleshoot/index.html",
                 "reference/pdcluster-api/index.html", "reference/cli/index.html",
                 "reference/helm-values/index.html", "reference/metrics/index.html",
                 "reference/profile-format/index.html", "benchmarks/index.html",
                 "develop/index.html"]:
        assert (site / page).is_file(), page
    # the snippets of the first-PDCluster page are the example files themselves
    first = (site / "getting-started/first-pdcluster/index.html").read_text()
    assert "quickstart-sglang" in first and "nodeBudget" in first


def test_a_strict_build_fails_on_a_broken_link(tmp_path):
    """The strict build is what catches a broken link: prove it does, on a copy."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "examples", copy / "examples")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "how-to" / "upgrade.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "s")],
                            cwd=copy, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode != 0 and "no-such-page.md" in result.stderr


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.fail("no chromium: make setup installs Debian's (apt-get install chromium)")


def _browse(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--disable-dev-shm-usage", "--window-size=1280,900", "--virtual-time-budget=3000"]
    return subprocess.run([_chromium(), *flags, *args, page.as_uri()], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "HOME": str(ARTEFACTS / "chromium-home")})


@pytest.mark.parametrize(("page", "title", "shot"), [
    ("index.html", "pdscale", "home.png"),
    ("how-to/troubleshoot/index.html", "Troubleshoot - pdscale", "troubleshoot.png"),
])
def test_a_browser_shows_the_page_with_its_title_and_navigation(site, page, title, shot):
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    dom = _browse(site / page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r"<title>(.*?)</title>", dom.stdout, re.S)
    assert found and found.group(1).strip() == title
    nav = dom.stdout[dom.stdout.find('class="md-nav'):]
    for section in SECTIONS:
        assert section in nav, f"{section!r} missing from the navigation of {page}"
    picture = ARTEFACTS / shot
    picture.unlink(missing_ok=True)
    taken = _browse(site / page, f"--screenshot={picture}")
    assert taken.returncode == 0, taken.stderr[-2000:]
    # a PNG of the window's size, not an empty file
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert int.from_bytes(data[16:20], "big") == 1280
