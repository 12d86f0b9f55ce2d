"""Probes of one engine's own counters over HTTP, for the drains: read from the engine, not
Prometheus, because a drain must not end on a scrape that is a minute old.

Each probe answers None when the engine does not answer: unknown is not zero, and a caller
never ends a drain on a guess.
"""

from __future__ import annotations

import json
import urllib.request

from .vllm_discovery import RUNNING, WAITING, vllm_totals

#: one probe's budget: the tick probes every draining pod in turn, so a hung engine must cost
#: seconds, not the tick
PROBE_TIMEOUT_SECONDS = 2.0


def engine_in_flight(ip: str | None, port: int,
                     timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> int | None:
    """Requests an engine still holds, or None when it does not answer (unknown is not zero).

    SGLang's ``/get_load`` counts, on a prefill instance, the requests whose KV its decode
    peer has not collected yet: a prefill is idle only once its last hand-off is done. vLLM
    has no such endpoint; its running and waiting gauges come from ``/metrics``."""
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/get_load", timeout=timeout_seconds) as r:
            data = json.loads(r.read())
        entries = data if isinstance(data, list) else [data]
        return sum(int(e.get("num_reqs", 0)) for e in entries)
    except (OSError, ValueError, AttributeError):
        pass  # not SGLang, or not answering: ask as vLLM
    totals = engine_vllm_totals(ip, port, timeout_seconds)
    if totals is None or not {RUNNING, WAITING} & totals.keys():
        return None
    return round(totals.get(RUNNING, 0.0) + totals.get(WAITING, 0.0))


def engine_vllm_totals(ip: str, port: int,
                       timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> dict[str, float] | None:
    """A vLLM engine's ``/metrics``, each metric summed over its labels; None: no answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout_seconds) as r:
            text: str = r.read().decode(errors="replace")
    except OSError:
        return None
    return vllm_totals(text)
