"""The whole product running here, for the demo and the end-to-end tests: a cluster with fake
8xH200 nodes, a real Prometheus, the Helm chart installed, the operator running under the
chart's ServiceAccount, and the simulated fleet following the operator's pods.

The operator runs as local processes rather than in its (fake) pods: kwok pods run nothing.
They use a token of the ServiceAccount the chart created, so they have exactly the chart's
RBAC. Several may run at once, each with its own identity (as the chart's replicas): they elect
a leader through the Lease in the release's namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from .localcluster import DEFAULT_BIN_DIR, ClusterError, LocalCluster, _die_with_parent, free_port
from .localprometheus import LocalPrometheus
from .lwscontroller import LWSController
from .nodes import ensure_cpu_nodes, ensure_h200_nodes, operator_kubeconfig, wait_nodes_ready
from .simfleet import SimFleet

OPERATOR_SERVICE_ACCOUNT = "pdscale-operator"


@dataclass
class Stack:
    workdir: Path
    nodes: int = 24
    #: namespace of the Helm release (and of the operator's ServiceAccount)
    release_namespace: str = "pdscale-system"
    release: str = "pdscale"
    #: seconds between the operator's planner ticks (drains, router sync)
    planner_tick_seconds: float = 2.0
    profile: str | None = None
    progress: bool = True
    kubeconfig: Path | None = None
    #: the Helm chart to install: an explicit path (default: charts/pdscale of the checkout the
    #: command runs in), never a path guessed from where this module is installed
    chart: Path = Path("charts/pdscale")
    local: LocalCluster | None = None
    prometheus: LocalPrometheus | None = None
    fleet: SimFleet | None = None
    #: the operator processes by leader-election identity
    operators: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    operator_metrics_port: int = 0
    #: leader election: Lease duration, renew deadline, retry period (shorter than the
    #: operator's defaults, so that a takeover costs a test seconds)
    lease_seconds: tuple[float, float, float] = (8.0, 6.0, 1.0)
    #: Prometheus servers (tenantPolicy.allowedPrometheusURLs entries) the admin lets a
    #: PDCluster name besides the stack's own, which its PDClusters name
    allowed_prometheus_urls: tuple[str, ...] = ()
    #: run the real LeaderWorkerSet controller (multi-node instances; only the tests of them)
    lws: bool = False
    lws_controller: LWSController | None = None
    _cleanups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()  # children run elsewhere (see LocalCluster)
        self.chart = Path(self.chart).resolve()

    def say(self, message: str) -> None:
        if self.progress:
            print(f"[stack] {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        if not (self.chart / "Chart.yaml").is_file():
            raise ClusterError(f"no Helm chart at {self.chart}: run from a pdscale checkout or "
                               "pass the chart's folder (pdscale demo --chart PATH)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        existing = os.environ.get("KUBECONFIG")
        if existing:
            self.kubeconfig = Path(existing)
            self.say(f"using the cluster of KUBECONFIG={existing}")
        else:
            self.say("starting the local control plane")
            # This cluster belongs to this run: a previous run's etcd data would still hold its
            # Helm release and PDCluster, and the install would refuse to reuse the name.
            shutil.rmtree(self.workdir / "cluster", ignore_errors=True)
            self.local = LocalCluster(workdir=self.workdir / "cluster")
            self.local.start(progress=self.progress)
            self.kubeconfig = self.local.kubeconfig
        if self.lws:
            if self.local is None:
                raise ClusterError("lws=True needs the local control plane (on another cluster, "
                                   "install LWS v0.7.0 there and leave lws off)")
            self.lws_controller = LWSController(self.local, self.workdir / "lws")
            self.lws_controller.start()
            self.say(f"LeaderWorkerSet controller running (log: {self.lws_controller.log})")
        names = ensure_h200_nodes(self.kubeconfig, self.nodes, pool="demo")
        # Routers and the operator need no GPU: two CPU nodes take them.
        cpus = ensure_cpu_nodes(self.kubeconfig, 2, pool="demo")
        wait_nodes_ready(self.kubeconfig, names + cpus)
        self.say(f"{len(names)} fake 8xH200 nodes and {len(cpus)} CPU nodes Ready")

        self.prometheus = LocalPrometheus(workdir=self.workdir / "prometheus")
        self.prometheus.start()
        self.say(f"Prometheus at {self.prometheus.url}")

        self.helm("install", self.release, str(self.chart), "-n", self.release_namespace,
                  "--create-namespace", "--set", "replicaCount=0",
                  # the test bed serves PDClusters in namespaces of its own: said explicitly
                  "--set", "rbac.clusterWide=true", "--wait=false",
                  # the admission policy admits what the operator's policy admits
                  "--set-json", f"tenantPolicy.allowedPrometheusURLs={json.dumps(self.prometheus_allow_list())}")
        self._cleanups.append("helm")
        self.say(f"chart installed: release {self.release} in {self.release_namespace}")

        self.operator_metrics_port = free_port()
        self.start_operator()
        self.prometheus.set_targets("pdscale-operator", [f"127.0.0.1:{self.operator_metrics_port}"])

        self.fleet = SimFleet(kubeconfig=self.kubeconfig, workdir=self.workdir / "fleet",
                              prometheus=self.prometheus, time_compression=1.0,
                              profile=self.profile)
        self.fleet.start()
        self.say("simulated fleet following the operator's pods")

    def tenant_policy_json(self) -> str:
        """The chart's tenantPolicy values (what the installed release carries), as the
        operator's environment variable."""
        values = yaml.safe_load((self.chart / "values.yaml").read_text())
        policy = {k: v for k, v in values["tenantPolicy"].items() if k != "admission"}
        policy["allowedPrometheusURLs"] = self.prometheus_allow_list(values)
        return json.dumps(policy)

    def prometheus_allow_list(self, values: dict[str, Any] | None = None) -> list[str]:
        """The chart's allowedPrometheusURLs and, as the admin of this test bed, its own
        Prometheus (the demo's PDClusters name it) and whatever else a test allows."""
        values = values or yaml.safe_load((self.chart / "values.yaml").read_text())
        own = [self.prometheus.url] if self.prometheus is not None else []
        return [*values["tenantPolicy"].get("allowedPrometheusURLs", []), *own,
                *self.allowed_prometheus_urls]

    def start_operator(self, identity: str = "operator-0") -> None:
        """Run an operator process (again: the failure tests kill it mid-drain and restart
        it; the same identity is the same pod restarting, which renews its own Lease)."""
        assert self.prometheus is not None
        assert identity not in self.operators, f"operator {identity} already runs"
        duration, deadline, retry = self.lease_seconds
        op_kubeconfig = self._operator_kubeconfig()
        env = {**os.environ, "KUBECONFIG": str(op_kubeconfig), "PYTHONSAFEPATH": "1",
               "PDSCALE_PROMETHEUS_URL": self.prometheus.url,
               "PDSCALE_PLANNER_TICK_SECONDS": str(self.planner_tick_seconds),
               "PDSCALE_METRICS_PORT": str(self.operator_metrics_port),
               "PDSCALE_METRICS_HOST": "127.0.0.1",
               "PDSCALE_RESYNC_SECONDS": "30",
               "PDSCALE_LEADER_NAMESPACE": self.release_namespace,
               "PDSCALE_LEADER_IDENTITY": identity,
               "PDSCALE_LEADER_LEASE_DURATION_SECONDS": str(duration),
               "PDSCALE_LEADER_RENEW_DEADLINE_SECONDS": str(deadline),
               "PDSCALE_LEADER_RETRY_PERIOD_SECONDS": str(retry),
               # as the chart's Deployment does: the admin's tenant policy from the values
               "PDSCALE_TENANT_POLICY": self.tenant_policy_json()}
        log = self.workdir / ("operator.log" if identity == "operator-0" else f"operator-{identity}.log")
        kopf = Path(sys.executable).parent / "kopf"
        with open(log, "ab") as out:
            self.operators[identity] = subprocess.Popen(
                [str(kopf), "run", "--all-namespaces", "--standalone",
                 "-m", "pdscale.operator.handlers"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent,
            )
        self.say(f"operator {identity} running as {self.release_namespace}/{OPERATOR_SERVICE_ACCOUNT} "
                 f"(log: {log})")

    def leader(self) -> str | None:
        """The identity holding the operator's leader Lease (None: no one)."""
        from kubernetes import client

        from .nodes import api_client

        assert self.kubeconfig is not None
        try:
            lease = client.CoordinationV1Api(api_client(self.kubeconfig)).read_namespaced_lease(
                "pdscale-operator-leader", self.release_namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        holder: str | None = lease.spec.holder_identity
        return holder
    def remove_pdcluster(self, namespace: str, name: str, timeout_seconds: float = 120) -> None:
        """Delete a PDCluster and wait for its pods to go (garbage collection through the
        owner references): on a shared cluster (KUBECONFIG) the next user starts clean.
        Nothing to do on the stack's own local control plane, which ``stop`` removes whole
        with everything in it: no one uses it next, and waiting there for the pods' drains
        and preStop hooks cost each e2e module's teardown tens of seconds that checked
        nothing."""
        import time

        from kubernetes import client

        from .nodes import api_client

        if self.local is not None:
            return
        assert self.kubeconfig is not None
        api = api_client(self.kubeconfig)
        with contextlib.suppress(client.ApiException):
            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                "pdscale.io", "v1alpha1", namespace, "pdclusters", name)
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline and core.list_namespaced_pod(
                namespace, label_selector=f"app.kubernetes.io/instance={name}").items:
            time.sleep(1)

    def kill_operator(self, identity: str | None = None) -> None:
        """SIGKILL one operator (None: every one): no cleanup handler runs, as when a node
        dies under the operator's pod."""
        for name in [identity] if identity is not None else list(self.operators):
            process = self.operators.pop(name)
            process.kill()
            process.wait()

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None
        for process in self.operators.values():
            process.terminate()
        for process in self.operators.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.operators.clear()
        if "helm" in self._cleanups and self.local is None and self.kubeconfig is not None:
            # On a user's cluster, leave nothing behind; a local cluster is removed whole.
            with contextlib.suppress(ClusterError, subprocess.SubprocessError):
                self.helm("uninstall", self.release, "-n", self.release_namespace)
        self._cleanups.clear()
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None
        if self.lws_controller is not None:
            self.lws_controller.stop()
            self.lws_controller = None
        if self.local is not None:
            self.local.stop()
            self.local = None

    # ------------------------------------------------------------------------------------
    def helm(self, *args: str) -> str:
        helm = DEFAULT_BIN_DIR / "helm"
        if not helm.is_file():
            raise ClusterError(f"helm not found at {helm}: run e2e/cluster/build")
        result = subprocess.run([str(helm), *args, "--kubeconfig", str(self.kubeconfig)],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise ClusterError(f"helm {args[0]} failed: {result.stderr.strip().splitlines()[-1]}")
        return result.stdout

    def _operator_kubeconfig(self) -> Path:
        assert self.kubeconfig is not None
        return operator_kubeconfig(self.kubeconfig, self.workdir / "operator.kubeconfig",
                                   namespace=self.release_namespace,
                                   service_account=OPERATOR_SERVICE_ACCOUNT, create=False)
