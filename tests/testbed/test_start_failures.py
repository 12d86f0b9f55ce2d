"""Start failures give one clear line (what failed, where its log is) and leave no process
behind. The binaries here are small stand-ins that misbehave on purpose; the logic under test
(spawn, wait, report, clean up) is the one that runs the real control plane."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pdscale.testbed.localcluster import ClusterError, LocalCluster


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)


HEALTHY_ETCD = """
import http.server, sys
port = int([a for a in sys.argv if a.startswith('--listen-client-urls=')][0].rsplit(':', 1)[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"health":"true"}')
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()
"""


def fake_bin(tmp_path: Path, etcd: str, apiserver: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "etcd", etcd)
    _script(bin_dir / "kube-apiserver", apiserver)
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        _script(bin_dir / name, "import time; time.sleep(600)")
    return bin_dir


def stage(tmp_path: Path) -> list[Path]:
    f = tmp_path / "stage.yaml"
    f.write_text("{}")
    return [f]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent is not running any more.
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_missing_binary_names_it_and_the_fix(tmp_path):
    cluster = LocalCluster(workdir=tmp_path / "c", bin_dir=tmp_path / "nowhere")
    with pytest.raises(ClusterError, match=r"etcd not found in .*nowhere: run e2e/cluster/build"):
        cluster.start()


def test_process_dying_during_start_is_named_with_its_log(tmp_path):
    bin_dir = fake_bin(tmp_path, "import sys; print('listen tcp 127.0.0.1: bind: address already in use'); sys.exit(3)", "")
    cluster = LocalCluster(workdir=tmp_path / "c", bin_dir=bin_dir, stage_files=stage(tmp_path))
    with pytest.raises(ClusterError) as err:
        cluster.start()
    message = str(err.value)
    assert "etcd exited with code 3 during start" in message
    assert "address already in use" in message
    assert f"log: {tmp_path / 'c' / 'logs' / 'etcd.log'}" in message
    assert "\n" not in message


def test_apiserver_never_ready_stops_everything_started(tmp_path):
    bin_dir = fake_bin(tmp_path, HEALTHY_ETCD, "import time; time.sleep(600)")
    cluster = LocalCluster(workdir=tmp_path / "c", bin_dir=bin_dir, stage_files=stage(tmp_path),
                           start_timeout_seconds=3)
    started = []
    original = cluster._spawn

    def spy(name, args):
        original(name, args)
        started.append(cluster.components[-1].process.pid)

    cluster._spawn = spy  # type: ignore[method-assign]
    with pytest.raises(ClusterError, match=r"kube-apiserver not ready after 3s at https://127\.0\.0\.1:\d+/readyz.*log: .*kube-apiserver\.log"):
        cluster.start()
    assert len(started) == 2  # etcd and the apiserver; nothing after the failure
    assert not any(alive(pid) for pid in started)


def test_a_relative_workdir_becomes_absolute(tmp_path, monkeypatch):
    # `make demo` passes out/demo: the components run with another working directory, so a
    # relative certificate path made kube-apiserver fail with "no such file".
    from pdscale.testbed.localcluster import LocalCluster
    from pdscale.testbed.stack import Stack

    monkeypatch.chdir(tmp_path)
    assert LocalCluster(workdir=Path("out/demo/cluster")).workdir == tmp_path / "out/demo/cluster"
    assert Stack(workdir=Path("out/demo/stack")).workdir == tmp_path / "out/demo/stack"


@pytest.mark.slow  # 20-50 s on two busy cores: out of make test-fast
def test_a_second_run_in_the_same_workdir_starts_clean(tmp_path):
    # `make demo` twice: the second run found the first one's etcd data, and with it the Helm
    # release, and the install refused to reuse the name.
    from pdscale.testbed.stack import Stack

    for _ in range(2):
        with Stack(workdir=tmp_path / "stack", nodes=1, profile="demo-sim", progress=False) as stack:
            assert stack.helm("list", "-n", stack.release_namespace, "-q").split() == [stack.release]
