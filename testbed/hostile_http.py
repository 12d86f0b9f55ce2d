"""HTTP servers on loopback that behave as a hostile tenant's "Prometheus" would: one that
accepts and never answers, one that drips its answer a byte at a time, one whose 200 answer
streams for ever, and one that answers 500 with a body that must not leak. Each runs in a
daemon thread, counts what it sent, and stops by ``close()`` (or ``with``).

Every one is bounded in time by ``give_up_seconds`` (it closes its connections then), so a
client without bounds of its own ends too, late: a test of the old code fails on its
timing instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from types import TracebackType


class HealthyPrometheus(BaseHTTPRequestHandler):
    """The healthy counterpart, for ``ThreadingHTTPServer``: a valid one-sample vector for
    every query, after ``delay_seconds`` (a subclass sets it)."""

    delay_seconds = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_seconds)
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [time.time(), "1"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class HostileServer:
    """A loopback TCP server; ``kind`` is one of ``silent``, ``drip``, ``stream``, ``error``."""

    KINDS = ("silent", "drip", "stream", "error")

    def __init__(self, kind: str, *, give_up_seconds: float = 30.0, drip_every_seconds: float = 0.5,
                 secret: str = "SECRET-internal-page-token-4711", host: str = "127.0.0.1",
                 port: int = 0):
        if kind not in self.KINDS:
            raise ValueError(f"kind: expected one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        self.give_up_seconds = give_up_seconds
        self.drip_every_seconds = drip_every_seconds
        self.secret = secret
        self.connections = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if not host.startswith("127."):
            raise ValueError(f"host: loopback only (127.0.0.0/8), got {host!r}")
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True, name=f"hostile-{kind}")
        self._thread.start()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.bytes_sent += len(data)

    def _serve(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.give_up_seconds
        conn.settimeout(1.0)
        try:
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request (its first segment is enough here)
            if self.kind == "silent":
                while time.monotonic() < end and not self._stop.is_set():
                    time.sleep(0.1)
            elif self.kind == "drip":
                answer = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                          b'Content-Length: 100000\r\n\r\n{"status":"success","data":{"resultType":'
                          b'"vector","result":[' + b" " * 100000)
                for i in range(len(answer)):
                    if time.monotonic() >= end or self._stop.is_set():
                        break
                    self._send(conn, answer[i:i + 1])
                    time.sleep(self.drip_every_seconds)
            elif self.kind == "stream":
                self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
                                 b'{"status":"success","data":{"resultType":"vector","result":[')
                chunk = b'{"metric":{},"value":[0,"1"]},' * 2048
                while time.monotonic() < end and not self._stop.is_set():
                    self._send(conn, chunk)
            else:  # error
                body = f"<html>internal admin console; {self.secret}; do not share</html>".encode()
                self._send(conn, b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\n"
                                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except OSError:
            pass  # the client went away (it gave up): what a bounded client does
        finally:
            with contextlib.suppress(OSError):
                conn.close()
