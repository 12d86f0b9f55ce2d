"""A real Prometheus (Debian package ``prometheus``), run directly with a generated config and a
temporary storage folder, on 127.0.0.1. Scrape targets are file-based service discovery, so
they can be changed while it runs (engines come and go with pods)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .localcluster import ClusterError, _die_with_parent, _last_line, free_port

PROMETHEUS_CANDIDATES = ("prometheus", "/usr/bin/prometheus")


def find_prometheus() -> str:
    for candidate in PROMETHEUS_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    raise ClusterError(
        "prometheus not found: install the Debian package `prometheus` (make setup does)"
    )


#: the local stack's scrape interval: what its planner's readings lag by at most
SCRAPE_INTERVAL_SECONDS = 1.0


@dataclass
class LocalPrometheus:
    workdir: Path
    scrape_interval_seconds: float = SCRAPE_INTERVAL_SECONDS
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    jobs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self, timeout_seconds: float = 60) -> None:
        binary = find_prometheus()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "targets").mkdir(exist_ok=True)
        # A restart keeps its address and its data, as a Prometheus Service would.
        self.port = self.port or free_port()
        interval = f"{int(self.scrape_interval_seconds * 1000)}ms"
        # file_sd is watched with inotify: a rewritten target file takes effect in about a second.
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": "file",
                "file_sd_configs": [{
                    "files": [str(self.workdir / "targets" / "*.json")],
                    "refresh_interval": "1s",
                }],
            }],
        }
        (self.workdir / "prometheus.yml").write_text(json.dumps(config, indent=2))
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1d", "--web.enable-lifecycle"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ClusterError(
                    f"prometheus exited with code {self.process.returncode} during start: "
                    f"{_last_line(self.log)} (log: {self.log})"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise ClusterError(f"prometheus not ready after {timeout_seconds:.0f}s (log: {self.log})")

    def set_targets(self, job: str, targets: list[str], labels: dict[str, str] | None = None) -> None:
        """Scrape ``targets`` (host:port) as ``job``; an empty list removes the job."""
        path = self.workdir / "targets" / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        groups = [{"targets": targets, "labels": {"job": job, **(labels or {})}}] if targets else []
        tmp.write_text(json.dumps(groups))
        tmp.replace(path)  # atomic: Prometheus never reads a half-written file
        self.jobs[job] = targets

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
