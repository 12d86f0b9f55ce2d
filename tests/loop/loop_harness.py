"""Processes for the loop tests (imported as `loop_harness`: tests/loop is not a package): simulated SGLang engines and the real SGLang routers (sglang-router 0.3.2, or the smg 1.13 gateway), or vllm-router.

Every process binds to its own 127.x.y.z address (Linux routes all of 127.0.0.0/8 to
loopback) with a free port, logs to a file under the test's tmp dir, and is stopped by the
fixture's finalizer: SIGTERM, then SIGKILL if it lingers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdscale.operator.clients.routersync import WorkerSpec
from pdscale.testbed.localcluster import free_port

# Timing every loop test uses (model seconds; no compression): quick, and far enough above
# scheduling noise that TTFT and TPOT are measurable on a 2-core machine.
TIMING = {
    "prefill-tokens-per-second": 20_000,
    "prefill-overhead-seconds": 0.01,
    "decode-step-seconds": 0.01,
    "decode-per-sequence-seconds": 0.0001,
    "kv-setup-seconds": 0.005,
    "kv-tokens-per-second": 1_000_000,
}
BLOCK_TOKENS = 16

#: the SGLang routers the loop tests run, by their PyPI names: the same command line and
#: worker API, different programs (docs/routers.md)
SGLANG_ROUTER, SMG = "sglang-router", "smg"
GATEWAY_COMMAND = {
    SGLANG_ROUTER: [sys.executable, "-m", "sglang_router.launch_router"],
    SMG: [sys.executable, "-m", "smg", "launch"],
}


def http_json(url: str, *, method: str = "GET", body: dict | None = None, timeout: float = 5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def child_env() -> dict[str, str]:
    # PYTHONSAFEPATH: the repo's operator/ folder must never shadow the stdlib module.
    # HF_ENDPOINT: the engines report a local --model-path with a tokenizer, so the router has
    # no reason to ask the hub; should that ever change, the ask goes to a closed local port.
    return {**os.environ, "PYTHONSAFEPATH": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_HUB_OFFLINE": "1"}  # fmt: skip


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(text)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode


@dataclass
class Engine(Proc):
    role: str = "decode"
    host: str = ""
    port: int = 0
    bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def spec(self) -> WorkerSpec:
        return WorkerSpec(self.url, self.role, self.bootstrap_port)

    def state(self) -> dict:
        return http_json(self.url + "/sim/state")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


@dataclass
class Fleet:
    """Engines and one router on a private 127.x.y.0/24, torn down by :meth:`close`."""

    tmp: Path
    net: str
    procs: list[Proc] = field(default_factory=list)
    router_url: str = ""
    #: the router's Prometheus endpoint (its ``/metrics``)
    router_metrics_url: str = ""
    router: Proc | None = None
    _next_host: int = 10

    def host(self) -> str:
        self._next_host += 1
        return f"{self.net}.{self._next_host}"

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        log = self.tmp / f"{name}.log"
        popen = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=self.tmp, env=child_env())  # fmt: skip
        return Proc(name, popen, log)

    def start_engine(self, role: str, *extra: str, wait: bool = True) -> Engine:
        host = self.host()
        port = free_port(host)
        bootstrap = free_port(host) if role == "prefill" else None
        argv = [sys.executable, "-m", "pdscale.testbed.simengine", "--role", role, "--host", host,
                "--port", str(port), "--block-tokens", str(BLOCK_TOKENS),
                "--model-path", str(self.tmp / "sim-model")]  # fmt: skip
        if bootstrap:
            argv += ["--bootstrap-port", str(bootstrap)]
        for key, value in TIMING.items():
            argv += [f"--{key}", str(value)]
        argv += list(extra)
        p = self._spawn(f"{role}-{host}", argv)
        engine = Engine(p.name, p.popen, p.log, role, host, port, bootstrap)
        self.procs.append(engine)
        if wait:
            self.wait_healthy(engine)
        return engine

    # Waits, not checks: a process started on a busy machine (issue 47: 15 s ran out with ten
    # runnable processes on two cores) may take long to import and bind; what is checked is
    # that it comes up, and a crash still fails at once.
    # 180 s: an engine process imports its stack in ~2 s on an idle machine and took over 60 s
    # once at load average 25 on 2 cores (issue 47); a healthy one returns at once
    def wait_healthy(self, engine: Engine, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if engine.popen.poll() is not None:
                pytest.fail(f"{engine.name} exited {engine.popen.returncode}; log {engine.log}:\n"
                            f"{engine.tail()}")  # fmt: skip
            try:
                with urllib.request.urlopen(engine.url + "/health", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        pytest.fail(f"{engine.name} not healthy in {timeout}s; log {engine.log}")

    def start_router(self, prefill: list[Engine], decode: list[Engine], *extra: str,
                     gateway: str = SGLANG_ROUTER) -> str:
        """``gateway``: which SGLang router program, :data:`SGLANG_ROUTER` or :data:`SMG`."""
        host = f"{self.net}.10"
        port, metrics_port = free_port(host), free_port(host)
        argv = [*GATEWAY_COMMAND[gateway], "--host", host,
                "--port", str(port), "--prometheus-host", host,
                "--prometheus-port", str(metrics_port), "--pd-disaggregation",
                "--policy", "round_robin", "--worker-startup-check-interval", "1"]  # fmt: skip
        for e in prefill:
            argv += ["--prefill", e.url, str(e.bootstrap_port)]
        for e in decode:
            argv += ["--decode", e.url]
        self.router = self._spawn(gateway, argv + list(extra))
        self.procs.append(self.router)
        self.router_url = f"http://{host}:{port}"
        self.router_metrics_url = f"http://{host}:{metrics_port}/metrics"
        self.wait_router_workers(len(prefill) + len(decode))
        return self.router_url

    def start_vllm_router(self, *extra: str) -> tuple[str, str]:
        """The real vllm-router in PD mode with its ZMQ discovery and no worker (they are
        announced, see operator/clients/vllm_discovery.py). Returns (router URL, discovery address)."""
        host = f"{self.net}.10"
        port, discovery = free_port(host), free_port(host)
        argv = [str(Path(sys.executable).parent / "vllm-router"), "--vllm-pd-disaggregation",
                "--vllm-discovery-address", f"{host}:{discovery}", "--kv-connector", "nixl",
                "--host", host, "--port", str(port), "--prometheus-host", host,
                "--prometheus-port", str(free_port(host)), *extra]  # fmt: skip
        self.router = self._spawn("vllm-router", argv)
        self.procs.append(self.router)
        self.router_url = f"http://{host}:{port}"
        deadline = time.monotonic() + 180  # as wait_healthy: a wait; a crash fails at once
        while True:
            assert self.router.popen.poll() is None, self.router.tail()
            try:
                http_json(self.router_url + "/workers")
                return self.router_url, f"{host}:{discovery}"
            except OSError:
                assert time.monotonic() < deadline, self.router.tail()
                time.sleep(0.1)

    def router_metric(self, prefix: str) -> float:
        """The sum of the router's samples whose line starts with ``prefix`` (a name, or a name
        and its labels); 0 when there is none, as a router creates a series at its first event."""
        with urllib.request.urlopen(self.router_metrics_url, timeout=5) as resp:
            return sum(float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                       if line.startswith(prefix))  # fmt: skip

    def router_workers(self) -> list[dict]:
        return http_json(self.router_url + "/workers")["workers"]

    def wait_router_workers(self, count: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            assert self.router is not None
            if self.router.popen.poll() is not None:
                pytest.fail(f"router exited {self.router.popen.returncode}; "
                            f"log {self.router.log}:\n{self.router.tail()}")  # fmt: skip
            try:
                last = self.router_workers()
                if len(last) == count and all(w["is_healthy"] for w in last):
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        pytest.fail(f"router lists {last}, wanted {count} healthy workers; log {self.router.log}")

    def describe(self) -> str:
        """Log paths for failure messages."""
        return "logs: " + ", ".join(str(p.log) for p in self.procs)

    def close(self) -> None:
        # short: after a kill, survivors may hold KV nobody will collect (as SGLang would,
        # until its bootstrap timeout); their drain would wait for it
        for p in reversed(self.procs):
            p.stop(signal.SIGTERM, timeout=2)
