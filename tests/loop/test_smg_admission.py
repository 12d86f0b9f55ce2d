"""smg's prefill admission as a PDCluster renders it (``router.admission``): the flags, read
back by smg's own parser; explicit values winning over the derived ones (derivation:
tests/operator/test_admission.py); the switch that turns it off; the spec refused in front of
a router without admission; and the real smg 1.13 in front of simulated engines, shedding what
waits past the timeout and what finds the queue full, with 429s."""

from __future__ import annotations

import concurrent.futures
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
from pdscale.operator.render import builders, router
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.testbed.localcluster import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWNER = Owner(name="glm53", namespace="serving", uid="1234-uid")


def _spec(admission, *, gateway="SMG", ttft_ms=2000, sample="sglang-glm-4p8d.yaml"):
    raw = yaml.safe_load((ROOT / "examples" / sample).read_text())["spec"]
    if gateway is not None:
        raw["router"]["gateway"] = gateway
    raw["router"]["admission"] = admission
    raw.setdefault("slo", {})["ttftMilliseconds"] = ttft_ms
    return validate(raw)


def _router_container(spec, derived) -> dict:
    children = {(c["kind"], c["metadata"]["name"]): c
                for c in builders.build_children(OWNER, spec, derived)}
    return children[("Deployment", "glm53-router")]["spec"]["template"]["spec"]["containers"][0]


def test_smg_reads_the_rendered_admission_flags():
    from smg.launch_router import parse_router_args

    spec, derived = _spec({"prefillInflightPerWorker": 6, "queueSize": 40})
    parsed = parse_router_args(_router_container(spec, derived)["args"])
    assert parsed.prefill_max_inflight_requests_per_worker == 6
    assert parsed.prefill_queue_size == 40
    # derived: the 2 s TTFT target less the engine's share (at most half of it), whole seconds
    assert parsed.prefill_queue_timeout_secs == 1


def test_explicit_values_win_and_the_derived_timeout_is_whole_seconds():
    def timeout(ttft_ms, **extra):
        spec, _ = _spec({"prefillInflightPerWorker": 4, **extra}, ttft_ms=ttft_ms)
        adm = router.admission(spec)
        assert adm is not None and adm.prefill_inflight_per_worker == 4
        return adm.queue_timeout_seconds

    # rounded down: 20 s less the engine's share (4 x 2 pods x 0.394 s = 3.15 s) = 16.85 s
    assert timeout(20_000) == 16
    assert timeout(300) == 1  # smg takes whole seconds; 0 would refuse every wait
    assert timeout(2500, queueTimeoutSeconds=7) == 7


def test_admission_switched_off_renders_no_flag_and_no_derived_value():
    spec, derived = _spec({"enabled": False})
    assert router.admission(spec) is None
    assert not any(a.startswith(("--prefill-queue", "--prefill-max")) for a in _router_container(spec, derived)["args"])
    assert "prefillQueueTimeoutSeconds" not in derived.as_status()


def test_admission_in_front_of_a_router_without_it_is_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"spec\.router\.admission: only smg has prefill admission"):
        _spec({"prefillInflightPerWorker": 4}, gateway="SGLangRouter")
    with pytest.raises(SpecError, match=r"spec\.router\.admission"):
        _spec({"prefillInflightPerWorker": 4}, gateway=None, sample="vllm-nixl-2p4d.yaml")
    with pytest.raises(SpecError, match=r"prefillInflightPerWorker"):
        _spec({"prefillInflightPerWorker": 0})
    # switched off, it is accepted in front of any router
    _spec({"enabled": False}, gateway="SGLangRouter")


def _call(url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")}


def _wait(url: str, ok, what: str, log: pathlib.Path, proc: subprocess.Popen | None = None,
          seconds: float = 180.0) -> None:
    # a wait, not a check (as loop_harness.wait_healthy): on a busy machine a process may take
    # a minute to import and bind (30 s ran out once in a loaded pass); a crash fails at once
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}: {log.read_text(errors='replace')[-800:]}")
        try:
            if ok(_call(url, timeout=2)[0]):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} not up: {log.read_text(errors='replace')[-800:]}")


@pytest.mark.slow
def test_the_real_smg_sheds_what_waits_past_the_ttft_target(tmp_path):
    """One prefill worker that takes 3 s per request, the cap at 1 and a queue of 1, the TTFT
    target 2 s: the first request is served, the second waits at the router and is refused
    after about 2 s (it could not have met the target), the third finds the queue full and is
    refused at once; once the worker is free a new request is served again."""
    spec, derived = _spec({"prefillInflightPerWorker": 1, "queueSize": 1, "queueTimeoutSeconds": 2})
    c = _router_container(spec, derived)
    args = list(c["args"])
    for flag in ("--host", "--prometheus-host"):
        args[args.index(flag) + 1] = "127.0.0.1"
    port = args[args.index("--port") + 1] = str(free_port())
    args[args.index("--prometheus-port") + 1] = str(free_port())
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    engines = {"prefill": free_port(), "decode": free_port()}
    bootstrap = free_port()
    procs: list[subprocess.Popen] = []
    logs = {name: tmp_path / f"{name}.log" for name in ("smg", "prefill", "decode")}

    def start(name: str, command: list[str]) -> None:
        with open(logs[name], "wb") as out:
            procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=tmp_path, env=env))

    engine = [sys.executable, "-m", "pdscale.testbed.simengine", "--host", "127.0.0.1",
              "--prefill-tokens-per-second", "1000"]
    try:
        start("prefill", [*engine, "--role", "prefill", "--port", str(engines["prefill"]),
                          "--bootstrap-port", str(bootstrap)])
        start("decode", [*engine, "--role", "decode", "--port", str(engines["decode"])])
        start("smg", [sys.executable, *c["command"][1:], *args])
        by_name = dict(zip(("prefill", "decode", "smg"), procs, strict=True))
        for name, p in engines.items():
            _wait(f"http://127.0.0.1:{p}/health", lambda s: s == 200, name, logs[name], by_name[name])
        base = f"http://127.0.0.1:{port}"
        _wait(f"{base}/workers", lambda s: s == 200, "smg", logs["smg"], by_name["smg"])
        # what the operator's router sync sends
        assert _call(f"{base}/workers", {"url": f"http://127.0.0.1:{engines['prefill']}",
                                         "worker_type": "prefill", "bootstrap_port": bootstrap})[0] == 202
        assert _call(f"{base}/workers", {"url": f"http://127.0.0.1:{engines['decode']}",
                                         "worker_type": "decode"})[0] == 202
        _wait(f"{base}/readiness", lambda s: s == 200, "smg readiness", logs["smg"], by_name["smg"])

        t0 = time.monotonic()

        def send(i: int) -> tuple[int, str, float]:
            # distinct prompts: no prefix cache shortens a prefill
            body = {"model": "sim-model", "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"{i} " + "word " * 3000}]}
            status, answer = _call(f"{base}/v1/chat/completions", body)
            code = (answer.get("error") or {}).get("code", "") if isinstance(answer, dict) else ""
            return status, code, time.monotonic() - t0

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = []
            for i in range(3):
                futures.append(pool.submit(send, i))
                time.sleep(0.3)  # in this order at the router
            served, waited, full = (f.result() for f in futures)
        assert served[0] == 200 and served[2] >= 2.5, served
        assert waited[:2] == (429, "pd_prefill_queue_timeout"), waited
        assert 1.8 <= waited[2] <= 3.5, waited  # the 2 s target (sent 0.3 s in)
        assert full[:2] == (429, "pd_prefill_queue_full") and full[2] < 1.5, full
        assert send(3)[0] == 200  # the slot is free again
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
