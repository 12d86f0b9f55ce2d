"""The simulated fleet: what a GPU node would run for each pod the operator creates.

It follows the pods of PDClusters on the cluster (kwok makes them Running and Ready on fake
8xH200 nodes, with loopback pod IPs) and, for each one, runs the program the pod stands for,
bound to the pod's IP:

- prefill and decode pods: a simulated SGLang engine (for an instance of several nodes, an
  LWS group, its leader's pod alone: the other nodes run nothing here) (``pdscale.testbed.simengine``), timed by the
  planner's performance model and time-compressed, with its warm-up;
- router pods: the real router (``sglang-router`` or ``smg``, or ``vllm-router`` for vLLM), started with
  the arguments the operator rendered into the pod.

A pod that is deleted first runs its preStop sleep, still serving at its address, then gets
SIGTERM, and its engine drains before it exits, as a real pod's would (``sigterm_at``); once the
process has exited, the fleet removes the pod, as a kubelet does once its
containers have stopped (kwok-pod-delete.yaml keeps a pod the fleet runs a process for,
``PROCESS_ANNOTATION``, until then or its grace period's end, and removes any other at once).
Prometheus (when given) scrapes every engine, labelled with namespace, pdcluster and role, as a
PodMonitor would.

Processes, not threads: each engine is its own process so that two cores share the load and
a pod's death is a process's death.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from .localcluster import _die_with_parent
from .localprometheus import LocalPrometheus
from .nodes import api_client
from .simengine import engine_flags

MANAGED_BY = "app.kubernetes.io/managed-by=pdscale-operator"
LABEL_ROLE = "pdscale.io/role"
LABEL_INSTANCE = "app.kubernetes.io/instance"
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
READY_DELAY_ANNOTATION = "pdscale.io/simulated-ready-delay-seconds"
#: set on a pod once a process runs for it: kwok then keeps the deleted pod until the fleet
#: removes it (its process has exited) or its grace period ends (kwok-pod-delete.yaml)
PROCESS_ANNOTATION = "pdscale.io/simulated-process"
#: set by LWS's pod webhook on every pod of a group, "0" on the leader: an instance of several
#: nodes is served by its leader alone (rank 0 runs the HTTP API; vLLM's others are headless)
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def engine_in_flight(r: Running) -> int | None:
    """Requests the engine ``r`` holds (None: a router, or no answer)."""
    return None if r.role == "router" or not r.port else in_flight_at(f"http://{r.ip}:{r.port}")


def in_flight_at(url: str) -> int | None:
    """Requests an SGLang engine at ``url`` holds, from its ``/get_load`` (None: no answer,
    or not one)."""
    try:
        with urllib.request.urlopen(f"{url}/get_load", timeout=2) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return sum(int(e.get("num_reqs", 0)) for e in (data if isinstance(data, list) else [data]))


def sigterm_at(pod: client.V1Pod) -> float:
    """The Unix time a kubelet signals the engine of a deleted ``pod``: after the container's
    preStop sleep, counted from the deletion, and no later than the end of its grace period.

    The pod keeps its IP and serves meanwhile. That window is what lets the operator drop a
    pod the Deployment controller deletes (a rollout) from the router before the address can be
    given to another pod; terminating at once made the address free within a second."""
    deadline = pod.metadata.deletion_timestamp.timestamp()
    grace = pod.metadata.deletion_grace_period_seconds or 0
    lifecycle = pod.spec.containers[0].lifecycle if pod.spec and pod.spec.containers else None
    sleep = lifecycle.pre_stop.sleep if lifecycle and lifecycle.pre_stop else None
    return min(deadline - grace + (sleep.seconds if sleep else 0), deadline)


def engine_ready_at(pod: client.V1Pod, now: float | None = None) -> float:
    """The Unix time kwok turns ``pod`` Ready: its delay annotation after the pod's
    Initialized transition (kwok-pod-ready.yaml), or after ``now`` if that is unknown.
    Timestamps carry whole seconds, so this is up to a second early: an engine ready a moment
    before its pod is harmless, after it is a 503 to whoever the router sends."""
    delay = float((pod.metadata.annotations or {}).get(READY_DELAY_ANNOTATION, "0"))
    initialized = next((c.last_transition_time for c in (pod.status.conditions or [])
                        if c.type == "Initialized" and c.status == "True"
                        and c.last_transition_time is not None), None)
    start = initialized.timestamp() if initialized is not None else (
        time.time() if now is None else now)
    return start + delay


@dataclass
class Running:
    pod: str
    role: str
    ip: str
    process: subprocess.Popen[bytes]
    log: Path
    instance: str = ""
    port: int = 0
    stopping: bool = False


@dataclass
class SimFleet:
    kubeconfig: Path
    workdir: Path
    namespaces: list[str] | None = None  # None = every namespace
    prometheus: LocalPrometheus | None = None
    time_compression: float = 10.0
    profile: str | None = None
    poll_seconds: float = 0.5
    running: dict[str, Running] = field(default_factory=dict)
    #: "namespace/pod" -> requests its engine held when the fleet first saw the pod deleted
    #: (None: the engine did not say), what a test asks of a drain now that SIGTERM waits out
    #: the preStop sleep
    in_flight_at_deletion: dict[str, int | None] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.core = client.CoreV1Api(api_client(self.kubeconfig))
        self._thread = threading.Thread(target=self._loop, name="simfleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for r in list(self.running.values()):
            self._terminate(r)
        deadline = time.monotonic() + 15
        for r in list(self.running.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            if r.process.poll() is None:
                r.process.kill()
                r.process.wait()
        self.running.clear()

    # ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the API server restarting must not end the fleet
                print(f"[simfleet] sync failed: {exc}", file=sys.stderr)
            self._stop.wait(self.poll_seconds)

    def _pods(self) -> list[client.V1Pod]:
        if self.namespaces is None:
            return list(self.core.list_pod_for_all_namespaces(label_selector=MANAGED_BY).items)
        pods: list[client.V1Pod] = []
        for ns in self.namespaces:
            pods += self.core.list_namespaced_pod(ns, label_selector=MANAGED_BY).items
        return pods

    def sync(self) -> None:
        seen = set()
        for pod in self._pods():
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            role = (pod.metadata.labels or {}).get(LABEL_ROLE)
            if role not in ("prefill", "decode", "router"):
                continue
            if (pod.metadata.labels or {}).get(LWS_WORKER_INDEX, "0") != "0":
                # an LWS group's other nodes hold no router-facing port: no process, so kwok
                # keeps them Ready by itself and removes them at once when deleted
                continue
            current = self.running.get(key)
            if pod.metadata.deletion_timestamp is not None:
                if current is not None and key not in self.in_flight_at_deletion:
                    self.in_flight_at_deletion[key] = engine_in_flight(current)
                if current is not None and time.time() < sigterm_at(pod):
                    seen.add(key)  # the preStop sleep: still serving at its address
                    continue
                if current is not None:
                    self._terminate(current)
                if current is None or current.process.poll() is not None:
                    self._remove(pod)  # nothing runs for it any more: the kubelet's part
                else:
                    seen.add(key)
                continue
            if not pod.status.pod_ip:
                continue
            seen.add(key)
            if current is None or (current.process.poll() is not None and not current.stopping):
                self.running[key] = self._launch(pod, role)
                if PROCESS_ANNOTATION not in (pod.metadata.annotations or {}):
                    self._mark(pod)
        for key, r in list(self.running.items()):
            if key not in seen:
                self._terminate(r)
            if r.process.poll() is not None and (r.stopping or key not in seen):
                del self.running[key]
        self._publish_targets()

    def _launch(self, pod: client.V1Pod, role: str) -> Running:
        ip = pod.status.pod_ip
        container = pod.spec.containers[0]
        ports = {p.name: p.container_port for p in (container.ports or [])}
        log = self.workdir / f"{pod.metadata.namespace}.{pod.metadata.name}.log"
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        vllm = (container.command or [""])[0].startswith("vllm")
        if role == "router":
            args = list(container.args or [])
            for flag in ("--host", "--prometheus-host"):
                if flag in args:
                    args[args.index(flag) + 1] = ip
            if "--vllm-discovery-address" in args:  # its ZMQ discovery, on the pod's address
                i = args.index("--vllm-discovery-address") + 1
                args[i] = f"{ip}:{args[i].rsplit(':', 1)[1]}"
            # the pod's own program: sglang-router, smg (``python3 -m smg launch``) or vllm-router
            smg = (container.command or [])[2:3] == ["smg"]
            cmd = ([str(Path(sys.executable).parent / "vllm-router"), *args] if vllm
                   else [sys.executable, "-m", "smg", "launch", *args] if smg
                   else [sys.executable, "-m", "sglang_router.launch_router", *args])
            # Second guard after the engines' local model path: the router's hub client
            # honours HF_ENDPOINT, here a closed loopback port.
            env["HF_ENDPOINT"] = "http://127.0.0.1:9"
        else:
            annotations = pod.metadata.annotations or {}
            port = ports.get("http") or next(iter(ports.values()), 8000)
            cmd = [sys.executable, "-m", "pdscale.testbed.simengine", "--role", role, "--host", ip,
                   "--port", str(port), "--time-compression", str(self.time_compression),
                   # kwok turns the pod Ready this long after it was Initialized; the engine
                   # serves from that moment, not that long after this process noticed the
                   # pod (seconds later under load: the router, told the pod was Ready, got
                   # 503 "warming up" in between)
                   "--ready-at", str(engine_ready_at(pod)),
                   "--drain-timeout-seconds", "600",
                   # A local model folder with a tokenizer.json: the router loads the
                   # tokenizer from it instead of asking the Hugging Face hub.
                   "--model-path", str(self.workdir / "model")]
            if vllm:
                cmd += ["--dialect", "vllm"]  # vLLM's API and metric names, no /get_load
            if role == "prefill":  # (a vLLM-dialect prefill hands its KV over on this port too)
                cmd += ["--bootstrap-port", annotations.get(BOOTSTRAP_ANNOTATION, "8998")]
            if self.profile:
                cmd += ["--profile", self.profile]
            # the engine flags that change what it reports (buckets, log interval, caps)
            cmd += engine_flags(list(container.command or []) + list(container.args or []))
        with open(log, "ab") as out:
            process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, cwd=self.workdir,
                                       start_new_session=True, preexec_fn=_die_with_parent)
        instance = (pod.metadata.labels or {}).get(LABEL_INSTANCE, "")
        # Prometheus scrapes an engine on its HTTP port and a router on its metrics port.
        port = ports.get("metrics", 0) if role == "router" else int(cmd[cmd.index("--port") + 1])
        return Running(pod.metadata.name, role, ip, process, log, instance, port)

    def _mark(self, pod: client.V1Pod) -> None:
        """Annotate ``pod``: a process runs for it, so a deletion waits for that process."""
        with contextlib.suppress(client.ApiException):
            self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                           {"metadata": {"annotations": {PROCESS_ANNOTATION: "true"}}})

    def _remove(self, pod: client.V1Pod) -> None:
        """Delete ``pod`` now (grace 0, this very pod by its uid), as a kubelet does once the
        pod's containers have stopped. Gone already, or replaced: nothing to do."""
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(
                    uid=pod.metadata.uid)))

    def _terminate(self, r: Running) -> None:
        if not r.stopping and r.process.poll() is None:
            r.process.send_signal(signal.SIGTERM)  # an engine drains, then exits
        r.stopping = True

    def _publish_targets(self) -> None:
        if self.prometheus is None:
            return
        by_job: dict[tuple[str, str, str], list[str]] = {}
        for key, r in self.running.items():
            if r.stopping or not r.port:
                continue
            ns = key.split("/", 1)[0]
            by_job.setdefault((ns, r.instance, r.role), []).append(f"{r.ip}:{r.port}")
        for (ns, instance, role), targets in by_job.items():
            job = f"fleet.{ns}.{instance}.{role}"
            if self.prometheus.jobs.get(job) != sorted(targets):
                self.prometheus.set_targets(job, sorted(targets),
                                            {"namespace": ns, "pdcluster": instance, "role": role})
        for job in list(self.prometheus.jobs):
            if not job.startswith("fleet."):
                continue  # not ours (the operator's own metrics, say)
            _, ns, instance, role = job.split(".", 3)
            if (ns, instance, role) not in by_job and self.prometheus.jobs[job]:
                self.prometheus.set_targets(job, [])
