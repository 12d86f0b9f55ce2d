"""Probes of one engine's own counters over HTTP, for the drains: read from the engine, not
Prometheus, because a drain must not end on a scrape that is a minute old.

Each probe answers None when the engine does not answer, or answers something that is not a
count (not JSON, wrong types, negative or non-finite numbers, a body too big): unknown is not
zero, and a caller never ends a drain on a guess. A probe never raises.

The budget is a deadline over the whole exchange (connect, headers, body), not a per-read
socket timeout: an engine dripping one byte a second would pass every per-read timeout and
hold the tick for as long as it likes. A watchdog cuts the connection at the deadline.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import socket
import threading
import time
from typing import Any, TypeGuard

from .vllm_discovery import RUNNING, WAITING, vllm_totals

log = logging.getLogger(__name__)

#: one probe's budget: the tick probes every draining pod in turn, so a hung engine must cost
#: seconds, not the tick
PROBE_TIMEOUT_SECONDS = 2.0
#: a counters page bigger than this is not an engine's (vLLM's /metrics is tens of KiB)
MAX_BODY_BYTES = 4 * 1024 * 1024


def engine_in_flight(ip: str | None, port: int,
                     timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> int | None:
    """Requests an engine still holds, or None when it does not answer (unknown is not zero).

    SGLang's ``/get_load`` counts, on a prefill instance, the requests whose KV its decode
    peer has not collected yet: a prefill is idle only once its last hand-off is done. vLLM
    has no such endpoint; its running and waiting gauges come from ``/metrics``. Both asks
    share one deadline of ``timeout_seconds``."""
    if not ip:
        return None
    deadline = time.monotonic() + timeout_seconds
    body = http_get(ip, port, "/get_load", deadline)
    if body is not None:
        count = in_flight_from_get_load(body)
        if count is not None:
            return count
    # not SGLang, not answering, or not a count: ask as vLLM
    totals = _vllm_totals_by(ip, port, deadline)
    if totals is None or not {RUNNING, WAITING} & totals.keys():
        return None
    return round(totals.get(RUNNING, 0.0) + totals.get(WAITING, 0.0))


def engine_vllm_totals(ip: str, port: int,
                       timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> dict[str, float] | None:
    """A vLLM engine's ``/metrics``, each metric summed over its labels; None: no answer, or
    a count that is negative or not finite."""
    return _vllm_totals_by(ip, port, time.monotonic() + timeout_seconds)


def _vllm_totals_by(ip: str, port: int, deadline: float) -> dict[str, float] | None:
    body = http_get(ip, port, "/metrics", deadline)
    if body is None:
        return None
    totals = vllm_totals(body.decode(errors="replace"))
    if totals is None or not all(_count(v) for v in totals.values()):
        return None
    return totals


def in_flight_from_get_load(body: bytes) -> int | None:
    """The sum of ``num_reqs`` over an SGLang ``/get_load`` answer (one object, or a list of
    one per data-parallel rank); None unless every entry carries a whole, finite count >= 0
    (pure)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return None
    entries = data if isinstance(data, list) else [data]
    if not entries:
        return None
    total = 0
    for entry in entries:
        value = entry.get("num_reqs") if isinstance(entry, dict) else None
        if not _count(value) or value != int(value):
            return None
        total += int(value)
    return total


def _count(value: object) -> TypeGuard[int | float]:
    """A number a counter could hold: int or float (not bool), finite, not negative."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def http_get(ip: str, port: int, path: str, deadline: float) -> bytes | None:
    """The body of a 200 answer to ``GET path`` received whole by ``deadline`` (monotonic
    seconds); None otherwise. Never raises."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    conn = http.client.HTTPConnection(ip, port, timeout=remaining)
    watchdog = threading.Timer(remaining, _cut, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("GET", path, headers={"Accept": "*/*", "Connection": "close"})
        response = conn.getresponse()
        if response.status != 200:
            return None
        body = response.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES or time.monotonic() >= deadline:
            return None  # too big, or cut by the watchdog (perhaps short)
        return body
    except Exception as exc:  # a probe answers unknown, never raises
        log.debug("probe http://%s:%s%s: %s: %s", ip, port, path, type(exc).__name__, exc)
        return None
    finally:
        watchdog.cancel()
        conn.close()


def _cut(conn: http.client.HTTPConnection) -> None:
    """The deadline passed: end the exchange (a blocked read returns at once)."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
