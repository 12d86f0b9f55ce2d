""".ci/run's flow around the kind tier, with `make` and e2e/kind/build stood in for (pure: no
Docker, no tests run): the builds start in the background at nice 19 beside `make test`,
`make e2e-kind` runs after it, and every outcome ends in one line that says what happened:
a skipped tier says why, a failed one names the step and its log, and CI fails unless both
`make test` and the tier passed (or the tier was skipped)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NICE = os.nice(0)  # this test's own: .ci/run's steps run at it, the kind builds 19 above it

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("setsid", "nice")), reason="needs setsid and nice")

# `make` as .ci/run calls it: records each call (and its nice value) in calls.log; `make test`
# and `make e2e-kind` pass or fail as TEST and RUN say; e2e-kind writes step times as
# e2e/kind/run does.
MAKE = """#!/bin/bash
echo "make $* nice=$(nice)" >> calls.log
case "$*" in
  e2e-kind) mkdir -p out/kind
    printf '[kind-tier %4ss] %-28s %4ss\\n' 1 docker 1 38 "kind create cluster" 37 > out/kind/times.txt
    [ "$RUN" = ok ] ;;
  test) [ -z "$TEST_WAIT" ] || while [ ! -e build.started ]; do sleep 0.1; done; [ "$TEST" = ok ] ;;
esac
"""
# e2e/kind/build: records its nice value, then ends as BUILD says
BUILD = """#!/bin/bash
echo "build nice=$(nice)" >> calls.log; touch build.started
mkdir -p out/kind; echo "node  3s" > out/kind/build-times.txt
case "$BUILD" in
  ok) exit 0;;
  skip) echo "kind tier skipped: dockerd did not come up within 60 s" >&2; exit 3;;
  fail) echo "[kind-build  99s] FAILED: node image (log: /x/out/kind/build-node.log)" >&2; exit 1;;
esac
"""


def run_ci(tmp_path: Path, build: str, test: str = "ok", run: str = "ok") -> tuple[int, str, list[str]]:
    tree = tmp_path / "tree"
    (tree / ".ci").mkdir(parents=True)
    (tree / "e2e" / "kind").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", tree / ".ci" / "run")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for path, text in ((stubs / "make", MAKE), (tree / "e2e" / "kind" / "build", BUILD)):
        path.write_text(text)
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "BUILD": build, "TEST": test,
           "RUN": run, "TEST_WAIT": "1" if build == "ok" else ""}
    done = subprocess.run([str(tree / ".ci" / "run")], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    calls = (tree / "calls.log").read_text().splitlines()
    return done.returncode, done.stdout + done.stderr, calls


def test_the_builds_run_niced_beside_make_test_and_the_tier_after_it(tmp_path: Path) -> None:
    rc, out, calls = run_ci(tmp_path, "ok")
    assert rc == 0, out
    assert calls[0] == f"make -j3 --output-sync=line setup dynamo-venv aiperf-venv nice={NICE}"
    # make test waits until the build has started: they overlap
    assert sorted(calls[1:3]) == [f"build nice={min(NICE + 19, 19)}", f"make test nice={NICE}"]
    assert calls[3:] == [f"make e2e-kind nice={NICE}"]
    assert "log: " + str(tmp_path / "tree" / "out" / "ci" / "kind-build.log") in out
    assert out.rstrip().endswith("make test exit 0, kind tier passed")


def test_no_docker_says_why_and_passes(tmp_path: Path) -> None:
    rc, out, calls = run_ci(tmp_path, "skip")
    assert rc == 0, out
    assert "[ci] kind tier skipped: dockerd did not come up within 60 s\n" in out
    assert not any(c.startswith("make e2e-kind") for c in calls)
    assert out.rstrip().endswith("kind tier skipped")


def test_a_failed_build_names_the_image_and_its_log(tmp_path: Path) -> None:
    rc, out, calls = run_ci(tmp_path, "fail")
    assert rc != 0
    log = tmp_path / "tree" / "out" / "ci" / "kind-build.log"
    assert (f"[ci] kind tier FAILED in its builds: node image (log: /x/out/kind/build-node.log)"
            f" (all of it: {log})") in out
    assert not any(c.startswith("make e2e-kind") for c in calls)


def test_a_failed_run_names_the_step_after_the_last_that_passed(tmp_path: Path) -> None:
    rc, out, _ = run_ci(tmp_path, "ok", run="fail")
    assert rc != 0
    assert "[ci] kind tier FAILED in the step after 'kind create cluster'" in out
    assert str(tmp_path / "tree" / "out" / "ci" / "kind-run.log") in out


def test_a_failed_make_test_fails_ci_and_the_tier_still_runs(tmp_path: Path) -> None:
    rc, out, calls = run_ci(tmp_path, "ok", test="fail")
    assert rc != 0
    assert calls[-1] == f"make e2e-kind nice={NICE}"
    assert out.rstrip().endswith("make test exit 1, kind tier passed")
