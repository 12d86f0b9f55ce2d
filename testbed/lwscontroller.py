"""The real LeaderWorkerSet controller (LWS v0.7.0) against the local control plane, for the
tests of multi-node instances; nothing else starts it, so the rest pays nothing.

``e2e/cluster/build`` builds the binary (``lws-controller``, from a committed wrapper module);
everything else is read at run time from LWS's own module in the Go module cache, never
copied into this repository:

- the CRD, ``config/crd/bases``;
- the webhook configurations, ``config/webhook/manifests.yaml`` with its
  ``mutating-patch.yaml`` and ``validating-patch.yaml`` applied (they give the pod webhooks
  the objectSelector ``leaderworkerset.sigs.k8s.io/name Exists``: only an LWS group's pods go
  through the controller, every other pod creation is independent of it). The Service
  reference becomes ``url: https://127.0.0.1:<port><path>``, the caBundle the local CA.

The controller runs as a process with the admin's kubeconfig, leader election off, metrics
off and ``internalCertManagement`` disabled (its ``--config`` file, ``config.lws.x-k8s.io/
v1alpha1``): its webhook serving certificate is signed here by the local cluster's CA
(``pki/ca.key``, openssl), with the SAN 127.0.0.1 the API server dials.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from .localcluster import ClusterError, LocalCluster, _die_with_parent, free_port
from .nodes import api_client

LWS_VERSION = os.environ.get("PDSCALE_LWS_VERSION", "v0.7.0")
MODULE = "sigs.k8s.io/lws"
#: kustomize's namePrefix in LWS's config/default: the names its release manifests use
WEBHOOK_CONFIGURATIONS = {"MutatingWebhookConfiguration": "lws-mutating-webhook-configuration",
                          "ValidatingWebhookConfiguration": "lws-validating-webhook-configuration"}
START_TIMEOUT_SECONDS = 120.0


def module_dir(version: str = LWS_VERSION) -> Path:
    """LWS's module in the Go module cache (the build put it there)."""
    override = os.environ.get("PDSCALE_LWS_MODULE_DIR")
    if override:
        return Path(override)
    go = shutil.which("go")
    if go is None:
        raise ClusterError("go not found on PATH: it locates LWS's module (its CRD and webhooks)")
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()
    path = Path(cache) / f"{MODULE}@{version}"
    if not (path / "config" / "crd" / "bases").is_dir():
        raise ClusterError(f"LWS {version} is not in the Go module cache ({path}): "
                           "run e2e/cluster/build")
    return path


def crds(module: Path) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions LWS ships."""
    out: list[dict[str, Any]] = []
    for path in sorted((module / "config" / "crd" / "bases").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The JSON patches of LWS's config/webhook: ``replace`` of one webhook by index."""
    for op in ops:
        parts = op["path"].strip("/").split("/")
        if op["op"] != "replace" or len(parts) != 2 or parts[0] != "webhooks":
            raise ClusterError(f"unexpected patch in LWS's config/webhook: {op}")
        index = int(parts[1])
        if index >= len(doc["webhooks"]):
            raise ClusterError(f"LWS's webhook patch names webhook {index}: not in manifests.yaml")
        doc["webhooks"][index] = op["value"]


def webhook_configurations(module: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """LWS's webhook configurations (patched as its kustomization does), each webhook called
    at ``https://127.0.0.1:<port><path>`` and trusting ``ca_pem``."""
    folder = module / "config" / "webhook"
    docs = {d["kind"]: d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d}
    patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": "validating-patch.yaml"}
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for kind, name in WEBHOOK_CONFIGURATIONS.items():
        doc = docs[kind]
        _apply_patch(doc, yaml.safe_load((folder / patches[kind]).read_text()))
        doc["metadata"] = {"name": name}
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
        out.append(doc)
    return out


def configuration(webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """The controller's --config file (LWS ``api/config/v1alpha1``)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},  # off: nothing reads them here
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
    }


@dataclass
class LWSController:
    """The LWS controller of one local cluster: ``start`` installs the CRD and webhooks and
    runs it; ``stop`` removes the webhooks (no LWS admission outlives the controller) and
    stops it."""

    cluster: LocalCluster
    workdir: Path
    version: str = LWS_VERSION
    process: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.workdir / "lws-controller.log"

    def start(self) -> None:
        binary = self.cluster.bin_dir / "lws-controller"
        if not binary.is_file():
            raise ClusterError(f"lws-controller not found in {self.cluster.bin_dir}: "
                               "run e2e/cluster/build")
        module = module_dir(self.version)
        self.workdir.mkdir(parents=True, exist_ok=True)
        api = api_client(self.cluster.kubeconfig)
        try:
            self._install_crds(api, module)
            self.ports = {"webhook": free_port(), "probe": free_port()}
            cert_dir = self.workdir / "certs"
            self._sign_serving_cert(cert_dir)
            config = self.workdir / "config.yaml"
            config.write_text(yaml.safe_dump(
                configuration(self.ports["webhook"], self.ports["probe"], cert_dir)))
            with open(self.log, "ab") as out:
                self.process = subprocess.Popen(
                    [str(binary), f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}",
                     "--zap-log-level=info"],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    cwd=self.workdir, start_new_session=True,
                    preexec_fn=_die_with_parent if self.cluster.attached else None,
                    # its namespace (events; leader election and cert Secret, both off here)
                    env={**os.environ, "POD_NAMESPACE": "default"})
            self._wait_ready()
            ca_pem = (self.cluster.workdir / "pki" / "ca.crt").read_bytes()
            admission = client.AdmissionregistrationV1Api(api)
            for doc in webhook_configurations(module, self.ports["webhook"], ca_pem):
                create = (admission.create_mutating_webhook_configuration
                          if doc["kind"] == "MutatingWebhookConfiguration"
                          else admission.create_validating_webhook_configuration)
                create(doc)
        except BaseException:
            self.stop()
            raise

    def _install_crds(self, api: client.ApiClient, module: Path) -> None:
        ext = client.ApiextensionsV1Api(api)
        names = []
        for crd in crds(module):
            names.append(crd["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(crd)
            except client.ApiException as exc:
                if exc.status != 409:  # already there (a second start on this cluster)
                    raise
        deadline = time.monotonic() + 60
        for name in names:
            while True:
                conditions = ext.read_custom_resource_definition(name).status.conditions or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not Established after 60s")
                time.sleep(0.2)

    def _sign_serving_cert(self, cert_dir: Path) -> None:
        """tls.crt and tls.key in ``cert_dir`` (controller-runtime's names), signed by the
        cluster's CA for 127.0.0.1."""
        cert_dir.mkdir(parents=True, exist_ok=True)
        pki = self.cluster.workdir / "pki"
        (cert_dir / "san.cnf").write_text("[v3]\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")

        def openssl(*args: str) -> None:
            result = subprocess.run(["openssl", *args], capture_output=True, cwd=cert_dir)
            if result.returncode != 0:
                raise ClusterError(f"openssl {args[0]} failed: {result.stderr.decode().strip()}")

        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=lws-webhook-service",
                "-keyout", "tls.key", "-out", "tls.csr")
        openssl("x509", "-req", "-in", "tls.csr", "-CA", str(pki / "ca.crt"),
                "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "30",
                "-extfile", "san.cnf", "-extensions", "v3", "-out", "tls.crt")

    def _wait_ready(self) -> None:
        """Ready = its health probe answers and its webhook server completes a TLS handshake
        that verifies against the CA, for 127.0.0.1 (what the API server will check)."""
        assert self.process is not None
        ctx = ssl.create_default_context(cafile=str(self.cluster.workdir / "pki" / "ca.crt"))
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ClusterError(f"lws-controller exited with code {self.process.returncode} "
                                   f"during start (log: {self.log})")
            try:
                url = f"http://127.0.0.1:{self.ports['probe']}/readyz"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
                with socket.create_connection(("127.0.0.1", self.ports["webhook"]), timeout=5) as raw, \
                        ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                    return
            except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.3)
        raise ClusterError(f"lws-controller not ready after {START_TIMEOUT_SECONDS:.0f}s: {last} "
                           f"(log: {self.log})")

    def stop(self) -> None:
        """Remove the webhook configurations, then stop the process. Idempotent."""
        with contextlib.suppress(Exception):  # the cluster may be gone already
            admission = client.AdmissionregistrationV1Api(api_client(self.cluster.kubeconfig))
            for kind, name in WEBHOOK_CONFIGURATIONS.items():
                delete = (admission.delete_mutating_webhook_configuration
                          if kind == "MutatingWebhookConfiguration"
                          else admission.delete_validating_webhook_configuration)
                with contextlib.suppress(client.ApiException):
                    delete(name)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

