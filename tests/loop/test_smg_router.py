"""The smg gateway as a PDCluster's router: the spec field that chooses it, the command the
operator renders for it (read back by smg's own parser), the real smg starting with that
command and no worker, and which router pods the operator speaks to."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

from pdscale.operator.api.names import Owner
from pdscale.operator.api.pdcluster import SGLangGateway
from pdscale.operator.loop.fleet import PodView
from pdscale.operator.loop.workerlist import router_urls
from pdscale.operator.render import builders, router
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.testbed.localcluster import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWNER = Owner(name="glm53", namespace="serving", uid="1234-uid")


def _spec(gateway: str | None, sample: str = "sglang-glm-4p8d.yaml"):
    raw = yaml.safe_load((ROOT / "examples" / sample).read_text())["spec"]
    if gateway is not None:
        raw["router"]["gateway"] = gateway
    return validate(raw)


def _router_container(gateway: str | None) -> dict:
    spec, derived = _spec(gateway)
    children = {(c["kind"], c["metadata"]["name"]): c
                for c in builders.build_children(OWNER, spec, derived)}
    return children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]


def test_smg_is_the_default_gateway_and_sglang_router_stays_selectable():
    spec, _ = _spec(None)
    assert spec.router.gateway is SGLangGateway.SMG and router.smg(spec)
    assert _router_container(None)["command"] == ["python3", "-m", "smg", "launch"]
    spec, _ = _spec("SGLangRouter")
    assert not router.smg(spec)
    assert _router_container("SGLangRouter")["command"] == ["python3", "-m", "sglang_router.launch_router"]


def test_smg_starts_in_pd_mode_with_no_workers_of_its_own():
    """As for sglang-router: the operator owns the worker list, so smg must neither list
    static workers nor discover pods itself."""
    from smg.launch_router import parse_router_args

    c = _router_container("SMG")
    assert c["command"] == ["python3", "-m", "smg", "launch"]
    parsed = parse_router_args(c["args"])
    assert parsed.pd_disaggregation and not parsed.service_discovery
    assert not parsed.prefill_urls and not parsed.decode_urls and not parsed.worker_urls
    assert parsed.prefill_policy == "cache_aware" and parsed.decode_policy == "round_robin"
    assert (parsed.port, parsed.prometheus_port) == (30000, 29000)
    # the same probes as sglang-router: smg serves both paths
    assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"


def test_a_vllm_spec_stored_with_the_default_gateway_renders_vllm_router():
    """The API server stores the CRD's default (gateway SMG) in every PDCluster, a vLLM one's
    too: the gateway applies to SGLang routers only, so it is ignored there, not refused."""
    spec, derived = _spec("SMG", "vllm-nixl-2p4d.yaml")
    children = {(c["kind"], c["metadata"]["name"]): c
                for c in builders.build_children(OWNER, spec, derived)}
    [deployment] = [c for (kind, name), c in children.items()
                    if kind == "Deployment" and name.endswith("-router")]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == ["vllm-router"]
    assert not router.smg(spec)
    with pytest.raises(SpecError, match=r"spec\.router\.gateway"):
        _spec("Smg")  # enums are CamelCase and exact


def _pod(name: str, ready: bool, deleting: bool = False) -> PodView:
    return PodView(name, "router", f"10.0.0.{len(name)}", ready, 0.0, deleting=deleting)


def test_the_operator_speaks_to_an_smg_that_is_not_ready_yet():
    """smg's /readiness answers 503 until it has a healthy worker, and only the operator gives
    it one: speaking to Ready routers alone would never add the first worker."""
    starting, ready, leaving = _pod("a", False), _pod("bb", True), _pod("ccc", True, deleting=True)
    smg, _ = _spec("SMG")
    old, _ = _spec("SGLangRouter")
    assert router_urls(smg, [starting, ready, leaving]) == ["http://10.0.0.1:30000",
                                                            "http://10.0.0.2:30000"]
    assert router_urls(old, [starting, ready, leaving]) == ["http://10.0.0.2:30000"]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.slow
def test_the_real_smg_starts_with_the_rendered_arguments_and_waits_for_a_worker(tmp_path):
    """The rendered command starts smg 1.13 with no worker: its worker API answers (the
    operator's door), and its readiness says 503 until a worker joins (why the operator does
    not wait for the pod to be Ready)."""
    c = _router_container("SMG")
    args = list(c["args"])
    for flag in ("--host", "--prometheus-host"):
        args[args.index(flag) + 1] = "127.0.0.1"
    port = args[args.index("--port") + 1] = str(free_port())
    args[args.index("--prometheus-port") + 1] = str(free_port())
    log = tmp_path / "smg.log"
    command = [sys.executable, *c["command"][1:]]  # python3 -> this venv's interpreter
    with open(log, "wb") as out:
        smg = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT,
                               cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        deadline = time.monotonic() + 180  # a wait on a busy machine; a crash fails at once
        while True:
            assert smg.poll() is None, f"smg exited: {log.read_text(errors='replace')[-500:]}"
            try:
                status, body = _get(f"http://127.0.0.1:{port}/workers")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text(errors="replace")[-500:]
                time.sleep(0.1)
        workers = json.loads(body)
        assert status == 200 and workers["total"] == 0 and workers["workers"] == []
        assert _get(f"http://127.0.0.1:{port}/readiness")[0] == 503
        assert _get(f"http://127.0.0.1:{port}/liveness")[0] == 200
    finally:
        smg.terminate()
        smg.wait(10)
