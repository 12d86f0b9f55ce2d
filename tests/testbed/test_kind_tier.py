"""The kind tier's pure parts (runs no Docker, no cluster).

- e2e/docker/runc-wrapper removes CAP_SYS_RESOURCE, and only it, from a bundle's config.json
  on create/run and from the --process file on exec, then runs the real runc with the same
  arguments (a stand-in runc records them).
- The kind node's Kubernetes wrapper module pins the version the test bed builds, and its
  build uses it read-only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "e2e" / "docker" / "runc-wrapper"
CAPS = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]

pytestmark = pytest.mark.skipif(shutil.which("jq") is None, reason="the wrapper needs jq")


def fake_runc(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "runc-args"
    runc = tmp_path / "runc"
    runc.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n')
    runc.chmod(0o755)
    return runc, log


def run_wrapper(tmp_path: Path, *args: str) -> list[str]:
    runc, log = fake_runc(tmp_path)
    env = {**os.environ, "PDSCALE_REAL_RUNC": str(runc)}
    subprocess.run([str(WRAPPER), *args], check=True, env=env, cwd=tmp_path)
    return log.read_text().splitlines()


def caps(**extra: object) -> dict[str, object]:
    return {k: list(CAPS) for k in ("bounding", "effective", "permitted", "inheritable")} | extra


@pytest.mark.parametrize("command", ["create", "run"])
def test_create_drops_sys_resource_from_the_bundle(tmp_path: Path, command: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "capabilities": caps()}}
    (bundle / "config.json").write_text(json.dumps(config))
    args = ["--root", "/run/x", "--log-format", "json", command, "--bundle", str(bundle), "id1"]
    assert run_wrapper(tmp_path, *args) == args
    got = json.loads((bundle / "config.json").read_text())
    want = [c for c in CAPS if c != "CAP_SYS_RESOURCE"]
    assert got["process"]["capabilities"] == {k: want for k in config["process"]["capabilities"]}  # type: ignore[index]
    assert got["process"]["args"] == ["sh"]


def test_exec_drops_sys_resource_from_the_process_file(tmp_path: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["ls"], "capabilities": caps()}))
    args = ["--root", "/run/x", "exec", "--process", str(process), "--detach", "id1"]
    assert run_wrapper(tmp_path, *args) == args
    assert "CAP_SYS_RESOURCE" not in process.read_text()
    assert json.loads(process.read_text())["capabilities"]["bounding"] == [
        c for c in CAPS if c != "CAP_SYS_RESOURCE"
    ]


def test_other_commands_and_unprivileged_bundles_pass_through(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    plain = {"process": {"args": ["sh"]}}
    (bundle / "config.json").write_text(json.dumps(plain))
    assert run_wrapper(tmp_path, "create", "--bundle", str(bundle), "id2") == [
        "create",
        "--bundle",
        str(bundle),
        "id2",
    ]
    assert json.loads((bundle / "config.json").read_text()) == plain
    assert run_wrapper(tmp_path, "--version") == ["--version"]


def test_node_wrapper_module_pins_the_test_beds_kubernetes() -> None:
    node_mod = (ROOT / "e2e" / "kind" / "node" / "k8s" / "go.mod").read_text()
    bed_mod = (ROOT / "e2e" / "cluster" / "k8s" / "go.mod").read_text()
    build = (ROOT / "e2e" / "kind" / "node" / "build-binaries").read_text()
    bed_build = (ROOT / "e2e" / "cluster" / "build").read_text()

    def pin(text: str) -> str:
        return next(
            line.split()[1]
            for line in text.splitlines()
            if line.strip().startswith("k8s.io/kubernetes v")
        )

    version = "K8S_VERSION=${PDSCALE_K8S_VERSION:-%s}"
    assert pin(node_mod) == pin(bed_mod)
    assert version % pin(node_mod) in build and version % pin(bed_mod) in bed_build
    assert "-mod=readonly" in build


#: the plugins of kubeadm v1.34's CoreDNS Corefile (cmd/kubeadm/app/phases/addons/dns/
#: manifests.go, CoreDNSConfigMap), which kind's clusters run, by package (prometheus is the
#: metrics plugin's directive)
COREFILE_PLUGINS = {"errors": "errors", "health": "health", "ready": "ready",
                    "kubernetes": "kubernetes", "prometheus": "metrics", "forward": "forward",
                    "cache": "cache", "loop": "loop", "reload": "reload",
                    "loadbalance": "loadbalance"}


def test_the_coredns_wrapper_builds_the_corefiles_plugins_and_no_others() -> None:
    wrapper = ROOT / "e2e" / "kind" / "node" / "coredns"
    main = (wrapper / "main.go").read_text()
    plugin = "github.com/coredns/coredns/plugin/"
    imported = {line.split(plugin)[1].strip('"') for line in main.splitlines() if plugin in line}
    assert imported == set(COREFILE_PLUGINS.values())
    assert "coredns/core/plugin" not in main  # CoreDNS's every-plugin import
    build = (ROOT / "e2e" / "kind" / "node" / "build-binaries").read_text()
    version = re.search(r"COREDNS_VERSION=\$\{PDSCALE_COREDNS_VERSION:-(v[\d.]+)\}", build)
    assert version and f"require github.com/coredns/coredns {version[1]}" in (wrapper / "go.mod").read_text()
    assert f"github.com/coredns/coredns {version[1]} h1:" in (wrapper / "go.sum").read_text()

# -- the serving image's engine: the operator's SGLang command read into the simulated engine's


def _demo_spec() -> object:
    from pdscale.operator.api.pdcluster import PDClusterSpec

    manifest = yaml.safe_load((ROOT / "examples" / "demo-sim.yaml").read_text())
    return PDClusterSpec.model_validate(manifest["spec"])


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_pod_entry_reads_the_operators_sglang_command(role: str) -> None:
    from pdscale.operator.render import engines
    from pdscale.operator.render.derived import derive
    from pdscale.testbed.simengine.cli import build_parser, config_from_args
    from pdscale.testbed.simengine.pod import sim_argv

    spec = _demo_spec()
    rendered = engines.render(spec, derive(spec), role)  # type: ignore[arg-type]
    assert rendered.command == ["python3", "-m", "sglang.launch_server"]  # what the image provides
    env = {"PDSCALE_SIM_STARTUP_SECONDS": "7", "PDSCALE_SIM_PROFILE": "demo-sim"}
    args = build_parser().parse_args(sim_argv(rendered.args, env))
    assert (args.role, args.host, args.pod_network, args.port) == (role, "0.0.0.0", True, 8000)
    assert config_from_args(args).pod_network  # a decode fetches KV from the prefill's pod address
    assert (args.model_path, args.model_name) == ("/models/sim-model", "sim-model")
    assert (args.startup_seconds, args.profile, args.time_compression) == (7.0, "demo-sim", 1.0)
    # the SLO buckets the operator rendered reach the sim's histograms
    ttft = rendered.args[rendered.args.index("--bucket-time-to-first-token") + 1]
    assert float(ttft) in args.bucket_time_to_first_token
    if role == "prefill":
        assert args.bootstrap_port == 8998


def test_the_pod_entry_refuses_a_command_that_is_no_pd_instance() -> None:
    from pdscale.testbed.simengine.pod import main, sim_argv

    with pytest.raises(ValueError, match="prefill or decode"):
        sim_argv(["--model-path", "/m", "--port", "8000"], {})
    assert main(["--disaggregation-mode", "null", "--port", "8000"]) == 2


def test_the_sim_binds_a_non_loopback_address_only_in_a_pod() -> None:
    from pdscale.testbed.simengine.cli import main

    assert main(["--role", "decode", "--host", "0.0.0.0", "--port", "1"]) == 2


def test_the_load_generator_names_a_cluster_service_only_from_a_pod() -> None:
    from pdscale.testbed.loadgen import require_loopback

    service = "http://sim-router.kind-e2e.svc:30000/"
    with pytest.raises(ValueError, match="loopback"):
        require_loopback(service)
    assert require_loopback(service, in_cluster=True) == service.rstrip("/")
    assert require_loopback("http://r.ns.svc.cluster.local:80", in_cluster=True)
    for url in ("http://10.96.0.10:80", "http://example.com", "http://svc:80"):
        with pytest.raises(ValueError, match="loopback"):
            require_loopback(url, in_cluster=True)
    assert require_loopback("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
