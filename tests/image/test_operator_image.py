"""The operator image runs the operator. image/build makes the OCI archive (nothing to do when
its inputs are unchanged); the test reads the archive's config, unpacks its layer, and starts
the operator from the image's root filesystem the way a kubelet would start the chart's pod:
the image's own python and PATH, the chart's command, args and environment, the pod's user
(65532), a read-only root with /tmp writable, the chart's ServiceAccount with the chart's RBAC
mounted at /var/run/secrets/kubernetes.io/serviceaccount, and KUBERNETES_SERVICE_HOST/PORT
naming the API server. That operator must then reconcile a sample PDCluster.

Needs root: the build (mmdebstrap, chroot) and the run (a private mount namespace and chroot;
no container runtime here). The build installs mmdebstrap and umoci with apt-get if missing."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION
from pdscale.testbed.fixtures import wait_for
from pdscale.testbed.localcluster import DEFAULT_BIN_DIR, K8S_VERSION, free_port
from pdscale.testbed.nodes import ensure_cpu_nodes, ensure_h200_nodes

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdscale"
HELM = DEFAULT_BIN_DIR / "helm"
KUBECTL = DEFAULT_BIN_DIR / "kubectl"
KUBE_VERSION = K8S_VERSION.lstrip("v")  # what the chart is rendered for
PACKAGE_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
ARCHIVE = ROOT / "out" / "image" / f"pdscale-operator-{PACKAGE_VERSION}.oci.tar"
REF = f"ghcr.io/pdscale/pdscale-operator:{PACKAGE_VERSION}"
SERVICE_ACCOUNT_DIR = "var/run/secrets/kubernetes.io/serviceaccount"
POOL = "image"  # the fake nodes this test's PDCluster is pinned to
# Where the kubernetes Service's name leads (port 443): a loopback address of its own, so that
# two runs on one machine do not collide.
SERVICE_ADDRESSES = [f"127.0.96.{i}" for i in range(1, 255)]
VENV_SITE = "opt/pdscale/lib/python3.11/site-packages"

# Inside a private mount namespace (the host sees none of it, and it all goes when the process
# exits): the root read-only, as the chart's readOnlyRootFilesystem; a tmpfs on /tmp (the
# chart's emptyDir); /proc and /dev as a runtime gives them; /etc/hosts as the kubelet
# writes it. Then chroot into the image's root, its working directory, the pod's group and
# user (no supplementary groups), and exec the command, found on the image's PATH.
# util-linux's `unshare --root --wd --setgid --setuid` is `chroot --userspec` plus the working
# directory, which chroot(1) cannot set.
LAUNCH = r"""
set -eu
root=$1 uid=$2 gid=$3 workdir=$4 hosts=$5
shift 5
[ -e "$root/etc/hosts" ] || : > "$root/etc/hosts"
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --bind "$hosts" "$root/etc/hosts"
exec /usr/bin/unshare --root="$root" --wd="$workdir" --setgid="$gid" --setuid="$uid" -- "$@"
"""


class KubernetesService:
    """The `kubernetes` Service as kube-proxy gives it to pods: connections to port 443 of its
    address reach the API server. kopf's in-cluster login ignores KUBERNETES_SERVICE_HOST/PORT
    and always calls https://kubernetes.default.svc, so the pod needs the Service by name
    (cluster DNS; here the pod's /etc/hosts) on port 443. The API server's certificate names
    kubernetes.default.svc, so TLS checks out as in a cluster."""

    def __init__(self, api_server: tuple[str, int]):
        self.api_server = api_server
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        for address in random.sample(SERVICE_ADDRESSES, 20):
            try:
                self.listener = socket.create_server((address, 443))
                self.address = address
                break
            except OSError as exc:
                error = exc
        else:
            pytest.fail(f"cannot stand in for the kubernetes Service on port 443: {error}")
        self.listener.settimeout(0.5)
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, name="kubernetes-service", daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                downstream, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.api_server, timeout=10)
            except OSError:
                downstream.close()
                continue
            downstream.settimeout(None)
            upstream.settimeout(None)
            self.accepted += 1
            self.sockets += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def __enter__(self) -> KubernetesService:
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.listener.close()
        for s in self.sockets:
            s.close()


@dataclass
class Image:
    rootfs: Path
    config: dict[str, Any]  # the OCI image config's "config": Entrypoint, Cmd, User, Env, ...
    layers: int


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.geteuid() != 0:
        pytest.skip("needs root: image/build runs mmdebstrap and chroot, the test chroot")
    build = subprocess.run([str(ROOT / "image" / "build")], capture_output=True, text=True,
                           timeout=1500, stdin=subprocess.DEVNULL)
    print(build.stderr)  # the build's progress lines (pytest shows them on failure or with -s)
    assert build.returncode == 0, f"image/build failed:\n{build.stderr[-6000:]}"
    workdir = tmp_path_factory.mktemp("image")
    rootfs = workdir / "rootfs"
    rootfs.mkdir()
    try:
        with tarfile.open(ARCHIVE) as archive:
            index = json.loads(member_bytes(archive, "index.json"))
            [descriptor] = [m for m in index["manifests"]
                            if m["annotations"]["org.opencontainers.image.ref.name"] == REF]
            assert descriptor["annotations"]["io.containerd.image.name"] == REF
            manifest = json.loads(member_bytes(archive, blob(descriptor["digest"])))
            config = json.loads(member_bytes(archive, blob(manifest["config"]["digest"])))
            # One layer, so no whiteouts to apply: tar extracts it as the runtime would.
            for layer in manifest["layers"]:
                assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
                member = archive.extractfile(blob(layer["digest"]))
                assert member is not None
                untar = subprocess.Popen(["tar", "-xzpf", "-", "--numeric-owner", "-C", str(rootfs)],
                                         stdin=subprocess.PIPE)
                assert untar.stdin is not None
                shutil.copyfileobj(member, untar.stdin, 1 << 20)
                untar.stdin.close()
                assert untar.wait() == 0, "could not unpack the image's layer"
        yield Image(rootfs, config["config"], len(manifest["layers"]))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # some 600 MB


def blob(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/")


def member_bytes(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, f"{name} missing from {ARCHIVE}"
    return member.read()


def helm_template(namespace: str, *sets: str) -> list[dict[str, Any]]:
    if not HELM.is_file():
        pytest.fail(f"helm not found at {HELM}: run e2e/cluster/build")
    args = [str(HELM), "template", "pdscale", str(CHART), "-n", namespace, "--include-crds",
            "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def operator_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "operator"]
    return pod, container


def containerfile_final_stage() -> dict[str, list[str]]:
    """The instructions of image/Containerfile's last stage, continuation lines joined."""
    text = (ROOT / "image" / "Containerfile").read_text().replace("\\\n", " ")
    instructions: dict[str, list[str]] = {}
    for line in text.split("\nFROM ")[-1].splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.setdefault(word, []).append(rest.strip())
    return instructions


def test_image_settings_are_the_containerfiles_and_run_the_charts_command(image):
    cfg = image.config
    stage = containerfile_final_stage()
    assert cfg["Entrypoint"] == json.loads(stage["ENTRYPOINT"][0])
    assert cfg["Cmd"] == json.loads(stage["CMD"][0])
    assert cfg["User"] == stage["USER"][0]
    assert cfg["WorkingDir"] == stage["WORKDIR"][0]
    assert dict(e.split("=", 1) for e in cfg["Env"]) == dict(
        e.split("=", 1) for e in shlex.split(stage["ENV"][0]))
    assert set(cfg["ExposedPorts"]) == set(stage["EXPOSE"][0].split())
    version = stage["ARG"][0].split("=", 1)[1]
    assert cfg["Labels"] == dict(e.replace("$VERSION", version).split("=", 1)
                                 for e in shlex.split(stage["LABEL"][0]))
    # The chart runs this image as the image's default command would: cluster-wide, the
    # image's default; by default the chart names the namespaces it serves in place of
    # --all-namespaces (an image cannot know them), and nothing else differs.
    pod, container = operator_container(helm_template("pdscale-system", "rbac.clusterWide=true"))
    assert container["image"] == REF
    assert container["command"] + container["args"] == cfg["Entrypoint"] + cfg["Cmd"]
    _, namespaced = operator_container(helm_template("pdscale-system"))
    assert namespaced["command"] + namespaced["args"] == [
        "--namespace=pdscale-system" if a == "--all-namespaces" else a
        for a in cfg["Entrypoint"] + cfg["Cmd"]]
    security = pod["securityContext"]
    assert cfg["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"
    assert image.layers == 1


def test_image_holds_the_product_alone_on_its_own_python(image):
    root = image.rootfs
    site = root / VENV_SITE
    assert (site / "pdscale" / "operator" / "handlers.py").is_file()
    assert (site / "pdscale" / "planner").is_dir()
    assert not (site / "pdscale" / "testbed").exists(), "the test bed is in the image"
    for absent in ("pytest", "_pytest", "matplotlib", "pip"):
        assert not (site / absent).exists(), f"{absent} is in the image"
    record = next(site.glob("pdscale-*.dist-info")) / "RECORD"
    assert "pdscale/testbed/" not in record.read_text()
    # the venv's interpreter is the root's Debian python 3.11, not the host's
    pyvenv = (root / "opt/pdscale/pyvenv.cfg").read_text()
    assert re.search(r"^home = /usr/bin$", pyvenv, re.MULTILINE), pyvenv
    assert re.search(r"^version = 3\.11\.", pyvenv, re.MULTILINE), pyvenv
    assert (root / "usr/bin/python3.11").is_file()
    assert (root / "opt/pdscale/bin/kopf").read_text().startswith("#!/opt/pdscale/bin/python")
    # byte-code is compiled in (the root is read-only when it runs)
    assert next((site / "kubernetes" / "__pycache__").glob("__init__.cpython-311.pyc"), None)
    passwd = (root / "etc/passwd").read_text()
    assert "pdscale:x:65532:65532:" in passwd
    assert not any((root / "dev").iterdir()), "device nodes in the image"


def _proc_ids(pid: int) -> dict[str, list[int]]:
    ids = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            ids[key] = [int(v) for v in value.split()]
    return ids


@contextlib.contextmanager
def chart_identity(kubeconfig: Path, api: client.ApiClient, docs: list[dict[str, Any]]
                   ) -> Iterator[None]:
    """The chart's CRD, ServiceAccount and RBAC applied as `helm install` would create them;
    the cluster-scoped RBAC removed afterwards (the rest goes with the namespace)."""
    identity = [d for d in docs if d["kind"] in (
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "Role", "RoleBinding")]
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding"} <= {d["kind"] for d in identity}
    applied = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", "--server-side",
         "--force-conflicts", "--field-manager=tests-image", "-f", "-"],
        input=yaml.safe_dump_all(identity), capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    rbac = client.RbacAuthorizationV1Api(api)
    try:
        ext = client.ApiextensionsV1Api(api)
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
                             .status.conditions or []), what="CRD established")
        yield
    finally:
        for kind, delete in (("ClusterRoleBinding", rbac.delete_cluster_role_binding),
                             ("ClusterRole", rbac.delete_cluster_role)):
            for d in identity:
                if d["kind"] == kind:
                    with contextlib.suppress(ApiException):
                        delete(d["metadata"]["name"])


def mount_service_account(rootfs: Path, api: client.ApiClient, namespace: str,
                          service_account: str) -> None:
    """What the kubelet mounts for the pod's ServiceAccount: a token (TokenRequest), the
    cluster's CA and the namespace. /var/run links to /run inside the root: follow it there,
    not on the host."""
    assert os.readlink(rootfs / "var/run") in ("/run", "../run")
    secrets = rootfs / SERVICE_ACCOUNT_DIR.replace("var/run", "run", 1)
    secrets.mkdir(parents=True, exist_ok=True)
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    (secrets / "token").write_text(token)
    shutil.copyfile(api.configuration.ssl_ca_cert, secrets / "ca.crt")
    (secrets / "namespace").write_text(namespace)
    for f in secrets.iterdir():
        f.chmod(0o644)


@contextlib.contextmanager
def operator_pod(image: Image, pod: dict[str, Any], container: dict[str, Any], workdir: Path,
                 service: KubernetesService) -> Iterator[subprocess.Popen[bytes]]:
    """The chart's operator container started from the image's root (see LAUNCH), with what
    a kubelet gives it: the image's environment, the chart's, then the kubernetes Service's
    (KUBERNETES_SERVICE_HOST/PORT: here the API server itself, whose certificate names
    127.0.0.1) and the pod's hostname; and the pod's /etc/hosts, where the Service's name
    stands in for cluster DNS. Stopped with SIGTERM, as a pod is, whatever happens."""
    hostname = "pdscale-operator-image-test"
    hosts = workdir / "hosts"
    hosts.write_text(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"127.0.0.1\t{hostname}\n"
        f"{service.address}\tkubernetes kubernetes.default kubernetes.default.svc "
        "kubernetes.default.svc.cluster.local\n")
    env = dict(e.split("=", 1) for e in image.config["Env"])
    assert all("value" in e for e in container["env"]), "valueFrom is not simulated here"
    env.update({e["name"]: str(e["value"]) for e in container["env"]})
    host, port = service.api_server
    env.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
                "HOSTNAME": hostname})
    env.setdefault("HOME", "/home/pdscale")
    security = pod["securityContext"]
    cwd = container.get("workingDir") or image.config["WorkingDir"]
    with open(workdir / "operator.log", "wb") as log:
        process = subprocess.Popen(
            ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", LAUNCH,
             "launch", str(image.rootfs), str(security["runAsUser"]), str(security["runAsGroup"]),
             cwd, str(hosts), *container["command"], *container["args"]],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)  # kopf stops gracefully on SIGTERM
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def http_get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read() if response.status == 200 else None
    except OSError:
        return None


def test_operator_from_the_image_reconciles_a_pdcluster(image, cluster, admin_api, namespace,
                                                        tmp_path):
    health, metrics = free_port(), free_port()
    # The chart as released into this test's namespace, with its default values but for the
    # ports (the host's network is shared): it watches all namespaces.
    docs = helm_template(namespace, f"operator.healthPort={health}",
                         f"operator.metricsPort={metrics}", "grafana.dashboard.enabled=false")
    pod, container = operator_container(docs)
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    assert image.config["User"] == f"{uid}:{gid}" and uid != 0 and gid != 0
    server = urllib.parse.urlsplit(admin_api.configuration.host)
    log = tmp_path / "operator.log"
    # fake nodes for the sample (3 GPU nodes, a CPU node for the router); kwok readies them
    # while the operator starts
    nodes = ensure_h200_nodes(cluster.kubeconfig, 3, POOL) + ensure_cpu_nodes(cluster.kubeconfig, 1, POOL)
    try:
        with chart_identity(cluster.kubeconfig, admin_api, docs), \
                KubernetesService((server.hostname, server.port or 443)) as service:
            mount_service_account(image.rootfs, admin_api, namespace, pod["serviceAccountName"])
            with operator_pod(image, pod, container, tmp_path, service) as process:
                try:
                    check_operator_pod(image, process, health, container, uid, gid)
                    check_reconciles_sample(admin_api, namespace)
                    page = wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/metrics"),
                                    what="the operator's metrics (the chart's port)")
                    assert b"pdscale_planner_recommended_replicas" in page
                    assert service.accepted > 0, "the operator never went through the Service"
                except BaseException:
                    print(f"---- the operator's log ----\n{log.read_text(errors='replace')[-8000:]}")
                    raise
    finally:
        # The cluster is the whole session's: a CPU node left behind would take the router pods
        # of later tests, which expect theirs.
        core = client.CoreV1Api(admin_api)
        for node in nodes:
            try:
                core.delete_node(node)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def check_operator_pod(image: Image, process: subprocess.Popen[bytes], health: int,
                       container: dict[str, Any], uid: int, gid: int) -> None:
    """Up (the chart's liveness probe answers), as the pod's non-root user, on the image's
    python, inside the image's root, in its working directory."""
    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the operator exited with {process.returncode}")
        return http_get(f"http://127.0.0.1:{health}/healthz") is not None

    wait_for(healthy, timeout_seconds=90, interval_seconds=0.5,
             what="the operator's liveness endpoint (the chart's probes)")
    proc = Path(f"/proc/{process.pid}")
    ids = _proc_ids(process.pid)
    assert ids["Uid"] == [uid] * 4 and ids["Gid"] == [gid] * 4, ids
    assert ids["Groups"] == [], ids
    assert os.readlink(proc / "root") == str(image.rootfs)
    workdir = container.get("workingDir") or image.config["WorkingDir"]
    assert os.readlink(proc / "cwd") == str(image.rootfs / workdir.lstrip("/"))
    assert os.readlink(proc / "exe") == str(image.rootfs / "usr/bin/python3.11")
    # `kopf` found on the image's PATH, run by the venv's interpreter (its shebang)
    cmdline = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
    assert cmdline == [b"/opt/pdscale/bin/python", b"/opt/pdscale/bin/kopf",
                       *(a.encode() for a in container["args"])], cmdline


def check_reconciles_sample(api: client.ApiClient, namespace: str) -> None:
    """The demo's PDCluster, planner off (no Prometheus here), on this test's fake nodes: its
    prefill and decode Deployments appear, then status conditions, then Ready."""
    doc = yaml.safe_load((ROOT / "examples" / "demo-sim.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"].setdefault("placement", {}).setdefault("nodeSelector", {})[
        "pdscale.io/pool"] = POOL
    doc["spec"]["planner"] = {"mode": "Off"}
    name = doc["metadata"]["name"]
    apps = client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)

    def engine_deployments() -> dict[str, int] | None:
        items = apps.list_namespaced_deployment(
            namespace, label_selector=f"app.kubernetes.io/instance={name}").items
        roles = {d.metadata.labels.get("pdscale.io/role"): d.spec.replicas for d in items}
        return roles if {"prefill", "decode"} <= roles.keys() else None

    roles = wait_for(engine_deployments, timeout_seconds=60,
                     what="the prefill and decode Deployments")
    assert (roles["prefill"], roles["decode"]) == (1, 2)

    def conditions() -> dict[str, str]:
        status = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
        return {c["type"]: c["status"] for c in status.get("conditions") or []}

    wait_for(conditions, timeout_seconds=60, what="status conditions on the PDCluster")
    wait_for(lambda: conditions().get("Ready") == "True", timeout_seconds=180,
             what="the PDCluster Ready (its simulated engines warm up in 20 s)")
