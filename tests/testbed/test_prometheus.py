"""A real Prometheus scrapes a target on 127.0.0.1 and answers PromQL."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_api_client import PrometheusConnect

pytestmark = pytest.mark.prometheus


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


def test_prometheus_scrapes_a_target_and_answers_promql(prometheus):
    handler = type("H", (_Metrics,), {"body": b'sglang:num_queue_reqs{engine_type="prefill"} 7\n'})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prometheus.set_targets("engine", [f"127.0.0.1:{server.server_address[1]}"], {"role": "prefill"})
        prom = PrometheusConnect(url=prometheus.url)
        deadline = time.monotonic() + 30
        result = []
        while time.monotonic() < deadline and not result:
            result = prom.custom_query('sum by (role) (sglang:num_queue_reqs{job="engine"})')
            time.sleep(0.5)
        assert result, "no sample scraped within 30 s"
        assert result[0]["metric"] == {"role": "prefill"}
        assert float(result[0]["value"][1]) == 7.0
    finally:
        server.shutdown()
        prometheus.set_targets("engine", [])
