"""A real Kubernetes control plane on this machine, without Docker: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake 8xH200 nodes), all on 127.0.0.1.

``pdscale cluster up`` starts it in the background and writes a kubeconfig; ``pdscale cluster
down`` stops it; ``pdscale cluster status`` shows each component with its memory. The same
class backs the pytest fixtures in :mod:`pdscale.testbed.fixtures`.

The binaries come from ``e2e/cluster/build`` (Go modules, cached by version). Nothing binds
outside loopback. A failure during start names the component and its log, and stops every
process started so far.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

HELP = "start, stop or inspect the local control plane"  # the line `pdscale --help` shows

K8S_VERSION = os.environ.get("PDSCALE_K8S_VERSION", "v1.34.4")
CACHE_ROOT = Path(os.environ.get("PDSCALE_CACHE", Path.home() / ".cache" / "pdscale"))
DEFAULT_BIN_DIR = CACHE_ROOT / f"k8s-{K8S_VERSION}" / "bin"
DEFAULT_STATE_DIR = Path(
    os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")
) / "pdscale" / "cluster"
# Our pod-ready stage: like kwok's, minus the random jitter, plus a readiness delay read from
# a pod annotation, so tests can simulate an engine's warm-up.
POD_READY_STAGE = Path(__file__).resolve().parent / "kwok-pod-ready.yaml"
# Our pod-delete stages: a deleted pdscale pod goes when its process has exited (the simulated
# fleet removes it, as a kubelet does) or at its grace period's end, not at a random moment
# within it as kwok's own stage has it.
POD_DELETE_STAGE = Path(__file__).resolve().parent / "kwok-pod-delete.yaml"

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
START_TIMEOUT_SECONDS = 120.0


class ClusterError(RuntimeError):
    """One line: what failed and where its log is."""


#: where :func:`free_port` draws from: below the kernel's ephemeral range (read at each call)
FREE_PORT_LOW = 10000


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now, for a component started later.

    Drawn at random below the kernel's ephemeral range, not from it (``bind(0)`` hands out an
    ephemeral port): the kernel also gives ephemeral ports to the source end of every outgoing
    connection, so one picked there can be taken by any client between now and the moment the
    component binds it. A CI run lost an e2e module so: kwok, started seconds after its port
    was picked, failed with "bind: address already in use". Below the range only another
    listener can take it; each draw is checked by binding it."""
    low, _ = _ephemeral_ports()
    if low - FREE_PORT_LOW >= 1000:
        draw = random.Random()  # not the seeded global generator a test may have fixed
        for _ in range(200):
            port = draw.randrange(FREE_PORT_LOW, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # an unusual range: the kernel's choice, as before
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # When the pytest process (or an attached `cluster up --attach`) dies, even by SIGKILL,
    # its children get SIGTERM: no stray control plane after a crashed test run.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def claim_pod_cidr(lock_dir: Path | None = None) -> tuple[str, TextIO]:
    """A /16 of the loopback range (127.X.0.1/16, X in 2..254) that no other live cluster on
    this machine holds, and the open lock file that holds it (an exclusive ``flock``, released
    when the file is closed or its process dies). Drawn at random, then the next free one: two
    clusters started at once (pytest-xdist workers, two helpers' runs) never share a range,
    where a random draw alone collides once in 253 pairs."""
    lock_dir = lock_dir or Path(tempfile.gettempdir()) / "pdscale-pod-cidrs"
    lock_dir.mkdir(parents=True, exist_ok=True)
    first = random.randint(2, 254)
    for k in range(253):
        octet = 2 + (first - 2 + k) % 253
        handle = open(lock_dir / f"127.{octet}.lock", "w")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return f"127.{octet}.0.1/16", handle
    raise ClusterError(f"every pod range 127.2-254.0.0/16 is held by a live cluster ({lock_dir})")


@dataclass
class Component:
    name: str
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class LocalCluster:
    """A control plane whose files (certs, data, logs, kubeconfig) live under ``workdir``."""

    workdir: Path
    bin_dir: Path = DEFAULT_BIN_DIR
    stage_files: list[Path] = field(default_factory=list)
    attached: bool = True  # children die with this process (tests); False for `cluster up`
    components: list[Component] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    admin_token: str = ""
    start_timeout_seconds: float = START_TIMEOUT_SECONDS
    #: the pods' addresses, a /16 of the loopback range: two clusters on one machine (two
    #: test runs, or the e2e tier's parallel workers) must not give two routers the same
    #: address, so ``start`` claims a free one (see ``claim_pod_cidr``) unless one is given
    pod_cidr: str = ""
    _pod_cidr_claim: TextIO | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Components run with their own working directory: every path handed to them is
        # absolute (`pdscale demo --out out/demo` gives a relative one).
        self.workdir = Path(self.workdir).resolve()

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every request of a ServiceAccount (the operator's
        identity here; the controllers use the admin's) at Metadata level, one JSON event a
        line. tests/operator/test_rbac_cluster.py compares it with the operator's RBAC."""
        return self.logs / "audit.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    # ---------------------------------------------------------------- start
    def start(self, progress: bool = False) -> None:
        say = (lambda m: print(f"[cluster] {m}", file=sys.stderr, flush=True)) if progress else (
            lambda m: None
        )
        self._check_binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            if not self.pod_cidr:
                self.pod_cidr, self._pod_cidr_claim = claim_pod_cidr()
            say("generating certificates and tokens")
            self._make_pki()
            self.ports = {
                name: free_port()
                for name in ("etcd", "etcd_peer", "apiserver", "scheduler", "kwok")
            }
            self._write_kubeconfig()
            say(f"starting etcd on 127.0.0.1:{self.ports['etcd']}")
            self._start_etcd()
            self._wait_http("etcd", f"http://127.0.0.1:{self.ports['etcd']}/health",
                            lambda body: b'"health":"true"' in body)
            say(f"starting kube-apiserver on {self.server}")
            self._start_apiserver()
            self._wait_http("kube-apiserver", f"{self.server}/readyz", lambda body: body == b"ok")
            say("starting kube-controller-manager, kube-scheduler and kwok")
            self._start_controllers()
            self._wait_http("kube-scheduler",
                            f"https://127.0.0.1:{self.ports['scheduler']}/healthz",
                            lambda body: body == b"ok", verify=False)
            self._wait_default_service_account()
            self._write_state()
            say(f"ready: export KUBECONFIG={self.kubeconfig}")
        except BaseException:
            self.stop()
            raise

    def _check_binaries(self) -> None:
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            if not (self.bin_dir / name).is_file():
                raise ClusterError(
                    f"{name} not found in {self.bin_dir}: run e2e/cluster/build first "
                    "(it builds the control plane from Go modules)"
                )
        if not self.stage_files:
            self.stage_files = default_stage_files(self.bin_dir)
        for path in self.stage_files:
            if not path.is_file():
                raise ClusterError(f"kwok stage file {path} is missing: run e2e/cluster/build")

    def _make_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)

        def openssl(*args: str) -> None:
            result = subprocess.run(["openssl", *args], capture_output=True, cwd=pki)
            if result.returncode != 0:
                raise ClusterError(f"openssl {args[0]} failed: {result.stderr.decode().strip()}")

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj",
                "/CN=pdscale-local-ca", "-keyout", "ca.key", "-out", "ca.crt")
        (pki / "san.cnf").write_text(
            "[v3]\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1\n"
        )
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                "-keyout", "apiserver.key", "-out", "apiserver.csr")
        openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "30", "-extfile", "san.cnf", "-extensions", "v3",
                "-out", "apiserver.crt")
        openssl("genrsa", "-out", "sa.key", "2048")
        openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.admin_token = os.urandom(16).hex()
        # The admin is the only static identity; the operator gets a real ServiceAccount token
        # (TokenRequest), exactly as on a user's cluster.
        (pki / "tokens.csv").write_text(f'{self.admin_token},admin,admin,"system:masters"\n')

    def _write_kubeconfig(self) -> None:
        ca = self.workdir / "pki" / "ca.crt"
        self.kubeconfig.write_text(
            kubeconfig_text(self.server, ca, self.admin_token, user="admin", context="pdscale-local")
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.logs / f"{name}.log"
        component = Component(name, args, log)
        with open(log, "ab") as out:
            component.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
                preexec_fn=_die_with_parent if self.attached else None,
            )
        self.components.append(component)

    def _start_etcd(self) -> None:
        p = self.ports
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
            f"--initial-cluster=default=http://127.0.0.1:{p['etcd_peer']}",
            "--unsafe-no-fsync=true", "--log-level=warn", "--quota-backend-bytes=4294967296",
        ])

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true", "--profiling=false", "--v=1",
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=200", "--audit-log-maxbackup=1",
        ])

    def _start_controllers(self) -> None:
        from .nodes import KWOK_NODE_ANNOTATION  # the nodes module owns the annotation

        pki = self.workdir / "pki"
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
            "--leader-elect=false", "--secure-port=0", "--bind-address=127.0.0.1",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
            "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
            "--kube-api-qps=100", "--kube-api-burst=200", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['scheduler']}", "--v=1",
        ])
        stages = [f"--config={path}" for path in self.stage_files]
        # Pod IPs from the loopback range: a simulated engine or router can bind to its pod's
        # IP, and the operator reaches pods by IP exactly as inside a real cluster.
        self._spawn("kwok", [
            str(self.bin_dir / "kwok"), f"--kubeconfig={kc}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            f"--cidr={self.pod_cidr}", "--node-ip=127.0.0.1", "--node-lease-duration-seconds=40",
            *stages,
        ])

    def _check_alive(self) -> None:
        for c in self.components:
            assert c.process is not None
            code = c.process.poll()
            if code is not None:
                tail = _last_line(c.log)
                raise ClusterError(
                    f"{c.name} exited with code {code} during start: {tail} (log: {c.log})"
                )

    def _wait_http(self, name: str, url: str, ok, verify: bool = True) -> None:  # type: ignore[no-untyped-def]
        ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        deadline = time.monotonic() + self.start_timeout_seconds
        last = "no answer"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                    body = resp.read().strip()
                    if ok(body):
                        return
                    last = body[:200].decode(errors="replace")
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.3)
        raise ClusterError(
            f"{name} not ready after {self.start_timeout_seconds:.0f}s at {url}: {last} "
            f"(log: {self.logs / (name + '.log')})"
        )

    def _wait_default_service_account(self) -> None:
        # Proof the controller-manager is working: it creates the `default` ServiceAccount.
        url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        try:
            self._wait_http("kube-controller-manager", url, lambda body: b'"default"' in body)
        except ClusterError as exc:
            raise ClusterError(str(exc).replace("not ready", "did not create the default ServiceAccount")) from None

    # ---------------------------------------------------------------- faults
    def component(self, name: str) -> Component:
        found = next((c for c in self.components if c.name == name), None)
        if found is None or found.process is None:
            raise ClusterError(f"no {name} running in this cluster")
        return found

    def restart_apiserver(self, down_seconds: float = 0.0) -> None:
        """Stop the kube-apiserver (SIGTERM, SIGKILL after 10 s), leave it down for
        ``down_seconds``, start it again on the same port and wait until it is ready: every
        client's connections and watches break, as in a control-plane upgrade."""
        old = self.component("kube-apiserver")
        assert old.process is not None
        old.process.terminate()
        try:
            old.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            old.process.kill()
            old.process.wait()
        self.components.remove(old)
        time.sleep(down_seconds)
        self._spawn(old.name, old.args)
        # the controllers were started after it: keep the stop order (reverse of start)
        self.components.insert(1, self.components.pop())
        self._wait_http("kube-apiserver", f"{self.server}/readyz", lambda body: body == b"ok")

    def pause_apiserver(self) -> None:
        """SIGSTOP the kube-apiserver: its connections stay open and answer nothing (a hung
        server, the case a timeout must catch). ``resume_apiserver`` undoes it."""
        process = self.component("kube-apiserver").process
        assert process is not None
        process.send_signal(signal.SIGSTOP)

    def resume_apiserver(self) -> None:
        process = self.component("kube-apiserver").process
        assert process is not None
        process.send_signal(signal.SIGCONT)

    # ---------------------------------------------------------------- stop
    def stop(self) -> None:
        """Stop in reverse order; SIGTERM, then SIGKILL after a grace period. Idempotent."""
        for c in reversed(self.components):
            if c.process is not None and c.process.poll() is None:
                c.process.send_signal(signal.SIGCONT)  # a paused one would not hear SIGTERM
                c.process.terminate()
        deadline = time.monotonic() + 10
        for c in reversed(self.components):
            if c.process is None:
                continue
            try:
                c.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.process.kill()
                c.process.wait()
        self.components.clear()
        if self._pod_cidr_claim is not None:  # the range is free again once kwok is gone
            self._pod_cidr_claim.close()
            self._pod_cidr_claim = None
            self.pod_cidr = ""
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "state.json").unlink()

    def _write_state(self) -> None:
        state = {
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "bin_dir": str(self.bin_dir),
            "ports": self.ports,
            "pids": {c.name: c.process.pid for c in self.components if c.process},
            "logs": str(self.logs),
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))


#: Metadata (who, what, verb, answer; no bodies) for ServiceAccounts alone, once a request is
#: done: the operator's identity, and little else here, so the log stays small.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def default_stage_files(bin_dir: Path) -> list[Path]:
    """kwok's own node stages (initialize, heartbeat with lease) and pod create/complete, plus
    our pod-ready stage, which honours the readiness-delay annotation, and our pod-delete
    stages, which keep a pod until its process has exited."""
    stage = bin_dir.parent / "kwok-stage"
    return [
        stage / "node" / "fast" / "node-initialize.yaml",
        stage / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        stage / "pod" / "general" / "pod-create.yaml",
        stage / "pod" / "general" / "pod-complete.yaml",
        POD_READY_STAGE,
        POD_DELETE_STAGE,
    ]


def kubeconfig_text(server: str, ca: Path, token: str, *, user: str, context: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": context, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
    }, indent=2)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _pid_alive(pid: int, bin_dir: str) -> bool:
    # A recycled pid must never be killed: check it still runs one of our binaries.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return False
    return cmdline.startswith(bin_dir)


# -------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=["up", "down", "status", "nodes"],
        help="up: start the local control plane with fake nodes; down: stop it; status: "
             "components and memory; nodes: create fake 8xH200 nodes on the cluster that "
             "KUBECONFIG points to (a kind cluster running kwok)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"state folder: certs, etcd data, logs, kubeconfig (default {DEFAULT_STATE_DIR})")
    parser.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR,
                        help="folder with the control-plane binaries from e2e/cluster/build")
    parser.add_argument("--nodes", type=int, default=24,
                        help="fake 8xH200 nodes to create on `up` (default 24)")


def run(args: argparse.Namespace) -> int:
    state_file = args.dir / "state.json"
    if args.action == "nodes":
        from .nodes import ensure_h200_nodes, wait_nodes_ready
        kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        names = ensure_h200_nodes(kubeconfig, args.nodes)
        wait_nodes_ready(kubeconfig, names)
        print(f"{len(names)} fake 8xH200 nodes Ready on {kubeconfig}")
        return 0
    if args.action == "down":
        if not state_file.exists():
            print(f"no cluster running under {args.dir}")
            return 0
        state = json.loads(state_file.read_text())
        stopped = stop_pids(state["pids"], state["bin_dir"])
        state_file.unlink()
        print(f"stopped {', '.join(stopped) or 'nothing (already gone)'}")
        return 0
    if args.action == "status":
        if not state_file.exists():
            print(f"no cluster running under {args.dir}")
            return 1
        state = json.loads(state_file.read_text())
        total = 0.0
        for name, pid in state["pids"].items():
            alive = _pid_alive(pid, state["bin_dir"])
            rss = _rss_mib(pid) if alive else 0.0
            total += rss
            print(f"{name:26s} pid {pid:<8d} {'running' if alive else 'DEAD':8s} {rss:8.1f} MiB")
        print(f"{'total':26s} {'':22s} {total:8.1f} MiB")
        print(f"KUBECONFIG={state['kubeconfig']}")
        return 0
    if state_file.exists():
        state = json.loads(state_file.read_text())
        if all(_pid_alive(pid, state["bin_dir"]) for pid in state["pids"].values()):
            print(f"already running: export KUBECONFIG={state['kubeconfig']}")
            return 0
        stop_pids(state["pids"], state["bin_dir"])
    if args.dir.exists():
        shutil.rmtree(args.dir)
    cluster = LocalCluster(workdir=args.dir, bin_dir=args.bin_dir, attached=False)
    try:
        started = time.monotonic()
        cluster.start(progress=True)
        from .nodes import ensure_cpu_nodes, ensure_h200_nodes, wait_nodes_ready
        names = ensure_h200_nodes(cluster.kubeconfig, args.nodes)
        cpus = ensure_cpu_nodes(cluster.kubeconfig, 2)
        wait_nodes_ready(cluster.kubeconfig, names + cpus)
        print(f"[cluster] {len(names)} fake 8xH200 nodes and {len(cpus)} CPU nodes Ready; up in "
              f"{time.monotonic() - started:.1f}s", file=sys.stderr)
    except ClusterError as exc:
        print(f"pdscale cluster up: {exc}", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def stop_pids(pids: dict[str, int], bin_dir: str) -> list[str]:
    stopped = []
    for name, pid in reversed(list(pids.items())):
        if _pid_alive(pid, bin_dir):
            os.kill(pid, signal.SIGTERM)
            stopped.append(name)
    deadline = time.monotonic() + 10
    for pid in pids.values():
        while _pid_alive(pid, bin_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid, bin_dir):
            os.kill(pid, signal.SIGKILL)
    return stopped
