"""A fresh reader's path, run as written: every ```bash block of the getting-started pages
(Install with Helm, Your first PDCluster), in page order, in one shell at the repository root,
against a fresh local control plane: each must exit 0 and print what its marker expects. It
ends with the quick-start PDClusters in Recommend mode, validated and with their children
applied by the operator.

The local nodes run no containers (kwok), so the operator's Deployment from the chart never
runs here: once the chart is installed, the test runs the operator process as that pod would
(the chart's ServiceAccount token and RBAC, its leader-election namespace and tenant policy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from docblocks import GETTING_STARTED, blocks

from pdscale.testbed.localcluster import DEFAULT_BIN_DIR, LocalCluster
from pdscale.testbed.nodes import operator_kubeconfig

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def test_every_bash_block_of_the_getting_started_pages_is_marked_to_run():
    for page in GETTING_STARTED:
        found = [b for b in blocks(page) if b.language == "bash"]
        assert found, page
        unmarked = [b.line for b in found if not b.run]
        assert not unmarked, f"{page.name}: ```bash blocks at lines {unmarked} do not run in tests"


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.environ.get("KUBECONFIG"):
        pytest.skip("the reader's path installs the chart into pdscale-system: it needs a fresh "
                    "cluster, not the KUBECONFIG one")
    local = LocalCluster(workdir=tmp_path_factory.mktemp("fresh-cluster"))
    local.start()
    try:
        yield local.kubeconfig
    finally:
        local.stop()


def _start_operator(kubeconfig: Path, workdir: Path) -> subprocess.Popen[bytes]:
    """The operator as the chart's pod runs it: the installed Deployment's command, arguments
    and environment (the served namespaces, the admin's Prometheus and tenant policy), under
    the chart's ServiceAccount token and RBAC; no metrics or health port."""
    token_config = operator_kubeconfig(kubeconfig, workdir / "operator.kubeconfig",
                                       namespace="pdscale-system",
                                       service_account="pdscale-operator", create=False)
    deployment = json.loads(subprocess.run(
        [str(DEFAULT_BIN_DIR / "kubectl"), "--kubeconfig", str(kubeconfig), "--namespace",
         "pdscale-system", "get", "deployment", "pdscale-operator", "-o", "json"],
        capture_output=True, text=True, check=True).stdout)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # no metrics or health server here (their fixed ports may be taken on this machine)
    chart_env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e
                 and e["name"] not in ("PDSCALE_METRICS_PORT", "PDSCALE_HEALTH_PORT")}
    assert chart_env.get("PDSCALE_PROMETHEUS_URL"), "the install page sets operator.prometheusURL"
    args = [a for a in container["args"] if not a.startswith("--liveness")]
    env = {**os.environ, **chart_env, "KUBECONFIG": str(token_config), "PYTHONSAFEPATH": "1",
           "PDSCALE_PLANNER_TICK_SECONDS": "2"}
    log = open(workdir / "operator.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(Path(sys.executable).parent / container["command"][0]), *args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=workdir,
        start_new_session=True)


def test_the_getting_started_commands_run_as_written(fresh_cluster, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(fresh_cluster),
           "PATH": f"{DEFAULT_BIN_DIR}:{os.environ.get('PATH', '')}"}
    operator = None
    ran = []
    try:
        for page in GETTING_STARTED:
            for block in blocks(page):
                if not block.run:
                    continue
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script],
                                        cwd=ROOT, env=env, capture_output=True, text=True,
                                        timeout=300)
                where = f"{block.page}:{block.line}"
                assert result.returncode == 0, (
                    f"{where} exited {result.returncode}:\n{block.script}\n{result.stdout}"
                    f"\n{result.stderr}")
                for text in block.expect:
                    assert text in result.stdout, f"{where}: {text!r} not in:\n{result.stdout}"
                ran.append(where)
                if operator is None and "helm install" in block.script:
                    operator = _start_operator(fresh_cluster, tmp_path)
        assert len(ran) >= 10
        # where the reader's path ends: two PDClusters in Recommend mode, accepted, applied
        kubectl = DEFAULT_BIN_DIR / "kubectl"
        out = subprocess.run([str(kubectl), "--namespace", "llm", "get", "pdc", "-o", "json"],
                             env=env, capture_output=True, text=True, check=True).stdout
        items = {i["metadata"]["name"]: i for i in json.loads(out)["items"]}
        assert set(items) == {"chat", "chat-vllm"}
        for item in items.values():
            assert item["spec"]["planner"]["mode"] == "Recommend"
            conditions = {c["type"]: c for c in item["status"]["conditions"]}
            assert conditions["SpecValid"]["status"] == "True"
            assert conditions["ChildrenApplied"]["status"] == "True"
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
