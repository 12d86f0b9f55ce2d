"""Two SGLang-named engines' ``/metrics`` for a load that changes shape once, for tests of the
metrics path (Prometheus -> planner) that need known counters and no simulated serving:
0.4 req/s of 600 prompt tokens, then (after ``switch_seconds``) 0.25 req/s of 1,000; 30% of
prompt tokens cached, 300 output tokens; nothing queued, 2 sequences running on decode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLES = ("prefill", "decode")


def _metrics(role: str, seconds: float, switch_seconds: float) -> str:
    first, second = min(seconds, switch_seconds), max(0.0, seconds - switch_seconds)
    requests = 0.4 * first + 0.25 * second
    prompt = 0.4 * 600 * first + 0.25 * 1000 * second
    if role == "prefill":
        lines = [f"sglang:num_requests_total {requests:.4f}",
                 f"sglang:prompt_tokens_total {prompt:.4f}",
                 f"sglang:cached_tokens_total {0.3 * prompt:.4f}",
                 "sglang:num_queue_reqs 0", "sglang:num_running_reqs 0"]
    else:
        lines = [f"sglang:num_requests_total {requests:.4f}",
                 f"sglang:generation_tokens_total {300 * requests:.4f}",
                 "sglang:num_queue_reqs 0", "sglang:num_running_reqs 2"]
    return "\n".join(lines) + "\n"


def start_engines(switch_seconds: float) -> dict[str, ThreadingHTTPServer]:
    """One server per role on a free loopback port, their clock started now (``shutdown()``
    each when done)."""
    started = time.monotonic()
    return {role: serve_metrics(lambda role=role: _metrics(role, time.monotonic() - started,
                                                           switch_seconds))
            for role in ROLES}


def serve_metrics(body: Callable[[], str]) -> ThreadingHTTPServer:
    """A ``/metrics`` page on a free loopback port whose text ``body()`` gives at each scrape
    (``shutdown()`` it when done)."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = body().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
