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
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeGuard

from .vllm_discovery import RUNNING, WAITING, decode_pulls_pending, vllm_totals

log = logging.getLogger(__name__)

#: one probe's budget: the tick probes every draining pod in turn, so a hung engine must cost
#: seconds, not the tick
PROBE_TIMEOUT_SECONDS = 2.0
#: a counters page bigger than this is not an engine's (vLLM's /metrics is tens of KiB)
MAX_BODY_BYTES = 4 * 1024 * 1024


class LoadSource(StrEnum):
    """Which answer an engine's in-flight count came from, and so what it covers."""

    #: SGLang ``GET /v1/loads?include=core,disagg``: running + waiting (with a prefill's
    #: bootstrap queue, a decode's prealloc, transfer and retracted queues) + a prefill's
    #: inflight queue, the requests whose KV is still being sent to a decode
    LOADS = "/v1/loads"
    #: SGLang ``GET /get_load`` (engines without ``/v1/loads``): as above but without the
    #: inflight queue, so a prefill's KV sends are not in it
    GET_LOAD = "/get_load"
    #: vLLM ``/metrics``: running + waiting; a prefill's KV pinned for a decode's pull is not
    #: in it (see vllm_discovery.KVPullWatch)
    VLLM_METRICS = "/metrics"


@dataclass(frozen=True)
class EngineLoad:
    """Requests an engine holds (a whole count >= 0) and the answer it came from."""

    in_flight: int
    source: LoadSource


#: SGLang's load report with the sections the drain needs (core: running and waiting;
#: disagg: the prefill inflight queue)
LOADS_PATH = "/v1/loads?include=core,disagg"


def engine_load(ip: str | None, port: int,
                timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> EngineLoad | None:
    """What an engine holds, or None when that is unknown (no answer, or one that is not a
    count; unknown is not zero).

    SGLang first: ``/v1/loads`` (SGLang PR #16976), whose ``disaggregation`` section counts
    a prefill's requests whose KV is still going out to a decode. Only a 404 there (an older
    engine, or not SGLang) moves on to ``/get_load``, now a deprecated shim that leaves those
    requests out (``LoadSource.GET_LOAD``: the drain then waits longer, see drain.py); only a
    404 there too asks as vLLM (``/metrics``). Any other failure is unknown: a busy engine that
    times out on one path must not be read through another. All asks share one deadline of
    ``timeout_seconds``."""
    if not ip:
        return None
    deadline = time.monotonic() + timeout_seconds
    answer = http_exchange(ip, port, LOADS_PATH, deadline)
    if answer is None:
        return None
    status, body = answer
    if status == 200:
        count = in_flight_from_loads(body)
        return None if count is None else EngineLoad(count, LoadSource.LOADS)
    if status != 404:
        return None
    answer = http_exchange(ip, port, "/get_load", deadline)
    if answer is None:
        return None
    status, body = answer
    if status == 200:
        count = in_flight_from_get_load(body)
        return None if count is None else EngineLoad(count, LoadSource.GET_LOAD)
    if status != 404:
        return None
    totals = _vllm_totals_by(ip, port, deadline)
    if totals is None or not {RUNNING, WAITING} & totals.keys():
        return None
    # waiting: every reason, a decode's requests deferred on their KV pull among them
    waiting = decode_pulls_pending(totals) or 0.0
    return EngineLoad(round(totals.get(RUNNING, 0.0) + waiting), LoadSource.VLLM_METRICS)


def engine_in_flight(ip: str | None, port: int,
                     timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> int | None:
    """``engine_load``'s count alone (None: unknown)."""
    load = engine_load(ip, port, timeout_seconds)
    return None if load is None else load.in_flight


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


def in_flight_from_loads(body: bytes) -> int | None:
    """Requests an SGLang engine holds from its ``/v1/loads?include=core,disagg`` answer
    (pure): over every data-parallel rank in ``loads``, ``num_running_reqs`` +
    ``num_waiting_reqs`` + ``disaggregation.prefill_inflight_queue_reqs``. The shape is
    SGLang's (``entrypoints/v1_loads.py``; the scheduler's ``get_loads`` puts the bootstrap
    queue, or a decode's prealloc, transfer and retracted queues, into ``num_waiting_reqs``,
    and the prefill inflight queue only into the ``disaggregation`` section). None unless
    every rank carries all three as whole, finite counts >= 0: an answer without the
    ``disaggregation`` section we asked for cannot say whether KV is still going out."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    entries = data.get("loads") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    total = 0
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("disaggregation"), dict):
            return None
        counts = (entry.get("num_running_reqs"), entry.get("num_waiting_reqs"),
                  entry["disaggregation"].get("prefill_inflight_queue_reqs"))
        for value in counts:
            if not _whole(value):
                return None
            total += int(value)
    return total


def in_flight_from_get_load(body: bytes) -> int | None:
    """The sum of ``num_reqs`` over an SGLang ``/get_load`` answer (one object, or a list of
    one per data-parallel rank); None unless every entry carries a whole, finite count >= 0
    (pure). It does not count a prefill's KV sends still in flight (see ``LoadSource``)."""
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
        if not _whole(value):
            return None
        total += int(value)
    return total


def _whole(value: object) -> TypeGuard[int | float]:
    """A count of requests: a number a counter could hold, and whole."""
    return _count(value) and value == int(value)


def _count(value: object) -> TypeGuard[int | float]:
    """A number a counter could hold: int or float (not bool), finite, not negative."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def http_get(ip: str, port: int, path: str, deadline: float) -> bytes | None:
    """The body of a 200 answer to ``GET path`` received whole by ``deadline`` (monotonic
    seconds); None otherwise. Never raises."""
    answer = http_exchange(ip, port, path, deadline)
    return answer[1] if answer is not None and answer[0] == 200 else None


def http_exchange(ip: str, port: int, path: str, deadline: float) -> tuple[int, bytes] | None:
    """The status and body of the answer to ``GET path``, received whole by ``deadline``
    (monotonic seconds); None: no answer, or a body too big. Never raises."""
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
        body = response.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES or time.monotonic() >= deadline:
            return None  # too big, or cut by the watchdog (perhaps short)
        return response.status, body
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
