"""A prefill's drain waits until the KV it computed has left for its decodes (pure rules, no
cluster): SGLang's inflight queue read from ``/v1/loads``, the ``/get_load`` fallback and its
wait, vLLM NIXL's pulls still owed to decodes and the lease; each rule next to what the old
rule (running + waiting == 0) would have decided, to show the hole it closes."""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from pdscale.operator.api.pdcluster import EngineKind, PDClusterSpec
from pdscale.operator.clients.engine_probe import (
    LOADS_PATH,
    EngineLoad,
    LoadSource,
    engine_in_flight,
    engine_load,
    in_flight_from_get_load,
    in_flight_from_loads,
)
from pdscale.operator.clients.vllm_discovery import (
    HANDOFF_GRACE_SECONDS,
    NIXL_KV_LEASE_SECONDS,
    WAITING,
    WAITING_BY_REASON,
    KVPullWatch,
    decode_pulls_pending,
    vllm_totals,
)
from pdscale.operator.loop.drain import Drains, HandoffWaits, get_load_wait_seconds
from pdscale.operator.loop.fleet import PodView, plan_role_actions

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
NS = "serving"
LEASE = NIXL_KV_LEASE_SECONDS
GRACE = HANDOFF_GRACE_SECONDS


def loads_body(*ranks: tuple[int, int, int]) -> bytes:
    """An SGLang ``/v1/loads?include=core,disagg`` answer (the shape of SGLang's
    ``entrypoints/v1_loads.py``): one entry per DP rank of (running, waiting, inflight)."""
    return json.dumps({
        "timestamp": "2026-12-02T00:00:00+00:00", "version": "0.5.x", "dp_rank_count": len(ranks),
        "loads": [{"dp_rank": i, "num_running_reqs": r, "num_waiting_reqs": w, "num_total_reqs": r + w,
                   "num_used_tokens": 0, "token_usage": 0.0,
                   "disaggregation": {"mode": "prefill", "prefill_bootstrap_queue_reqs": 0,
                                      "prefill_inflight_queue_reqs": f,
                                      "decode_prealloc_queue_reqs": 0,
                                      "decode_transfer_queue_reqs": 0,
                                      "decode_retracted_queue_reqs": 0,
                                      "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}}
                  for i, (r, w, f) in enumerate(ranks)],
        "aggregate": {"total_running_reqs": sum(r for r, _, _ in ranks)},
    }).encode()


# -- SGLang: the inflight queue --------------------------------------------------------------
def test_v1_loads_counts_the_kv_still_being_sent_that_get_load_leaves_out():
    # One prefill, nothing running or waiting, one request whose KV is still on its way.
    transfer_open = loads_body((0, 0, 1))
    shim = b'[{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}]'  # /get_load of the same engine
    assert in_flight_from_loads(transfer_open) == 1
    assert in_flight_from_get_load(shim) == 0  # the old rule: idle, remove it mid-transfer
    assert in_flight_from_loads(loads_body((2, 3, 1), (0, 1, 4))) == 11
    assert in_flight_from_loads(loads_body((0, 0, 0))) == 0


@pytest.mark.parametrize("body", [
    b"", b"[]", b"{}", b'{"loads": []}', b'{"loads": {}}', b'{"loads": [null]}',
    b'{"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]}',  # no disaggregation section
    b'{"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0, "disaggregation": null}]}',
    b'{"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0, "disaggregation": {}}]}',
    b'[{"num_reqs": 0}]',  # /get_load's shape is not /v1/loads'
    loads_body((0, 0, 0)).replace(b'"prefill_inflight_queue_reqs": 0', b'"prefill_inflight_queue_reqs": -1'),
    loads_body((0, 0, 0)).replace(b'"prefill_inflight_queue_reqs": 0', b'"prefill_inflight_queue_reqs": 0.5'),
    loads_body((0, 0, 0)).replace(b'"prefill_inflight_queue_reqs": 0', b'"prefill_inflight_queue_reqs": NaN'),
    loads_body((0, 0, 0)).replace(b'"prefill_inflight_queue_reqs": 0', b'"prefill_inflight_queue_reqs": true'),
    loads_body((0, 0, 0)).replace(b'"num_running_reqs": 0', b'"num_running_reqs": "0"'),
    loads_body((0, 0, 0)).replace(b'"num_waiting_reqs": 0', b'"num_waiting_reqs": Infinity'),
    loads_body((0, 0, 0))[:-5], b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
])
def test_a_v1_loads_answer_that_is_not_a_count_is_unknown(body):
    assert in_flight_from_loads(body) is None


class _Engine:
    """A fake engine: path -> (status, body); every other path answers 404."""

    def __init__(self) -> None:
        self.paths: dict[str, tuple[int, bytes]] = {}
        self.asked: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                engine.asked.append(self.path)
                status, body = engine.paths.get(self.path, (404, b'{"detail": "Not Found"}'))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake_engine() -> Iterator[_Engine]:
    engine = _Engine()
    yield engine
    engine.server.shutdown()
    engine.server.server_close()


def test_the_probe_asks_v1_loads_first_and_falls_back_only_on_404(fake_engine):
    e = fake_engine
    e.paths = {LOADS_PATH: (200, loads_body((0, 0, 2))), "/get_load": (200, b'[{"num_reqs": 0}]')}
    assert engine_load("127.0.0.1", e.port, 1.0) == EngineLoad(2, LoadSource.LOADS)
    assert engine_in_flight("127.0.0.1", e.port, 1.0) == 2
    # an older SGLang: no /v1/loads
    e.paths = {"/get_load": (200, b'[{"num_reqs": 3}]')}
    assert engine_load("127.0.0.1", e.port, 1.0) == EngineLoad(3, LoadSource.GET_LOAD)
    # vLLM: neither
    e.paths = {"/metrics": (200, b'vllm:num_requests_running{engine="0"} 1\n'
                                  b'vllm:num_requests_waiting{engine="0"} 1\n')}
    assert engine_load("127.0.0.1", e.port, 1.0) == EngineLoad(2, LoadSource.VLLM_METRICS)
    # a vLLM whose waiting gauge leaves out the requests deferred on their KV pull
    e.paths = {"/metrics": (200, b'vllm:num_requests_running{engine="0"} 0\n'
                                  b'vllm:num_requests_waiting{engine="0"} 0\n'
                                  b'vllm:num_requests_waiting_by_reason{engine="0",reason="deferred"} 2\n')}
    assert engine_load("127.0.0.1", e.port, 1.0) == EngineLoad(2, LoadSource.VLLM_METRICS)
    # /v1/loads there but failing, or garbage: unknown, never read through /get_load
    for status, body in ((500, b"boom"), (503, b""), (200, b'{"loads": []}'), (200, b"<html>")):
        e.paths = {LOADS_PATH: (status, body), "/get_load": (200, b'[{"num_reqs": 0}]'),
                   "/metrics": (200, b"vllm:num_requests_running 0\n")}
        assert engine_load("127.0.0.1", e.port, 1.0) is None, (status, body)
    # /get_load failing after a 404 on /v1/loads: unknown too
    e.paths = {"/get_load": (500, b""), "/metrics": (200, b"vllm:num_requests_running 0\n")}
    assert engine_load("127.0.0.1", e.port, 1.0) is None


# -- vLLM: the pulls a decode still owes -----------------------------------------------------
def test_a_decode_owes_pulls_for_every_waiting_request_deferred_or_not():
    page = ('vllm:num_requests_running{engine="0"} 4\n'
            'vllm:num_requests_waiting{engine="0"} 3\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 1\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="deferred"} 2\n')
    totals = vllm_totals(page)
    assert totals is not None and decode_pulls_pending(totals) == 3
    # a version whose waiting gauge leaves the deferred ones out: the sum over reasons
    assert decode_pulls_pending({WAITING: 1.0, WAITING_BY_REASON: 3.0}) == 3
    # an older vLLM without the by-reason gauge: waiting alone
    assert decode_pulls_pending({WAITING: 2.0}) == 2
    assert decode_pulls_pending({WAITING: 0.0, WAITING_BY_REASON: 0.0}) == 0
    assert decode_pulls_pending({"vllm:num_requests_running": 5.0}) is None


def test_a_kv_pull_watch_clears_only_after_the_hand_off_grace_with_every_decode_at_zero():
    watch = KVPullWatch(idle_since=NOW)
    # too soon: the prefill's last answer may not have reached its decode yet
    assert watch.follow({"d0": 0, "d1": 0}, NOW + HANDOFF_GRACE_SECONDS / 2).cleared_at is None
    # one decode still waiting (another prefill's request, maybe: decodes do not say whose)
    assert watch.follow({"d0": 0, "d1": 1}, NOW + GRACE).cleared_at is None
    # one decode not answering: unknown, not clear
    assert watch.follow({"d0": 0, "d1": None}, NOW + GRACE).cleared_at is None
    cleared = watch.follow({"d0": 0, "d1": 0}, NOW + GRACE)
    assert cleared.cleared_at == NOW + GRACE and not cleared.pending(NOW + GRACE, LEASE)
    # once clear it stays clear (the prefill was idle and out of the router all along)
    assert cleared.follow({"d0": 7}, NOW + GRACE + 1) == cleared
    # no decode at all: nobody can pull
    assert watch.follow({}, NOW + GRACE).cleared_at is not None


def test_without_a_clear_reading_a_kv_pull_watch_holds_for_one_lease():
    watch = KVPullWatch(idle_since=NOW)
    for t in (NOW, NOW + 1, NOW + LEASE - 0.1):
        assert watch.follow({"d0": 2}, t).pending(t, LEASE)
    assert not watch.pending(NOW + LEASE, LEASE)
    assert watch.pending(NOW + 45, 60.0)  # a longer lease configured on the engines


# -- the waits, tick by tick -----------------------------------------------------------------
def _reason(waits: HandoffWaits, source: LoadSource, engine: EngineKind, pulls: dict, now: float,
            asked: list | None = None, wait: float = 90.0) -> str | None:
    def pulls_pending():
        if asked is not None:
            asked.append(now)
        return pulls

    waits.begin_tick()
    why = waits.reason(NS, "p0", source, engine, pulls_pending, now, lease_seconds=LEASE,
                       get_load_wait_seconds=wait)
    waits.end_tick()
    return why


def test_an_sglang_prefill_counted_by_v1_loads_waits_for_nothing_more():
    assert _reason(HandoffWaits(), LoadSource.LOADS, EngineKind.SGLANG, {}, NOW) is None


def test_an_sglang_prefill_counted_by_get_load_waits_and_says_why():
    waits = HandoffWaits()
    why = _reason(waits, LoadSource.GET_LOAD, EngineKind.SGLANG, {}, NOW)
    assert why is not None and "no /v1/loads" in why and "90 s" in why
    assert _reason(waits, LoadSource.GET_LOAD, EngineKind.SGLANG, {}, NOW + 89) is not None
    assert _reason(waits, LoadSource.GET_LOAD, EngineKind.SGLANG, {}, NOW + 90) is None


def test_the_get_load_wait_is_the_slowest_prefill_with_its_margin():
    doc = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    spec = PDClusterSpec.model_validate(doc["spec"])
    slowest = spec.model.max_context_length_tokens / spec.kv_transfer.conservative_prefill_tokens_per_second
    assert slowest < get_load_wait_seconds(spec) <= 1.5 * slowest + 1


def test_a_vllm_prefill_waits_for_the_decodes_and_reads_them_only_when_it_must():
    waits, asked = HandoffWaits(), []
    # just idle: within the grace the decodes are not even read
    why = _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 1}, NOW, asked)
    assert why is not None and "decodes not read yet" in why and asked == []
    why = _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 1, "d1": None}, NOW + GRACE,
                  asked)
    assert why is not None and "1 requests waiting at decodes" in why and "1 decodes not answering" in why
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 0, "d1": 0}, NOW + GRACE + 5,
                   asked) is None
    # cleared: later ticks read no decode
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 9}, NOW + GRACE + 10, asked) is None
    assert asked == [NOW + GRACE, NOW + GRACE + 5]


def test_a_vllm_prefill_whose_decodes_stay_busy_leaves_after_one_lease():
    waits = HandoffWaits()
    for t in (NOW, NOW + GRACE, NOW + 20, NOW + LEASE - 1):
        assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 3}, t) is not None
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 3}, NOW + LEASE) is None


def test_a_prefill_busy_again_is_forgotten_and_its_wait_starts_over():
    waits = HandoffWaits()
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 3}, NOW) is not None
    waits.begin_tick()  # a tick where it held a request: nobody asks about it
    waits.end_tick()
    assert waits.watches == {}
    # idle again at NOW + 40: a lease from then, not from NOW
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 3}, NOW + 40) is not None
    assert _reason(waits, LoadSource.VLLM_METRICS, EngineKind.VLLM, {"d0": 3}, NOW + 40 + LEASE - 1) is not None


# -- the fleet's step: a hand-off wait holds the removal --------------------------------------
def _prefill(handoff_wait: str | None, draining_since: float = NOW - 10) -> list[PodView]:
    return [PodView("p-stay", "prefill", "10.0.0.1", True, 0.0),
            PodView("p-leave", "prefill", "10.0.0.2", True, 0.0, draining_since_seconds=draining_since,
                    in_flight=0, in_router=False, handoff_wait=handoff_wait)]


@pytest.mark.parametrize("rule", ["now", "old"])
def test_an_idle_prefill_with_kv_on_its_way_is_not_removed(rule):
    # the old rule had no hand-off wait: an idle prefill out of the router was removed
    wait = "a decode may still pull its KV" if rule == "now" else None
    actions = plan_role_actions("prefill", 1, _prefill(wait), 2, now_seconds=NOW,
                                drain_timeout_seconds=300.0)
    if rule == "old":
        assert actions.finish_drain == ("p-leave",)  # the hole: removed mid-pull
        return
    assert actions.finish_drain == () and actions.replicas is None
    assert actions.waiting == ("p-leave drains; a decode may still pull its KV",)


def test_the_drain_timeout_passes_a_hand_off_wait():
    actions = plan_role_actions("prefill", 1, _prefill("waits", draining_since=NOW - 301), 2,
                                now_seconds=NOW, drain_timeout_seconds=300.0)
    assert actions.finish_drain == ("p-leave",) and actions.replicas == 1


# -- the drains' glue: which prefills get a wait, which decodes are read -----------------------
def test_drains_give_the_wait_only_to_idle_prefills_out_of_the_router():
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl-2p4d.yaml").read_text())
    spec = PDClusterSpec.model_validate(doc["spec"])
    read: list[str] = []

    def totals(ip: str, port: int) -> dict[str, float] | None:
        read.append(ip)
        return {WAITING: 1.0} if ip == "10.0.1.1" else None

    drains = Drains(None, None, vllm_totals=totals)  # type: ignore[arg-type]  # no kube needed
    prefill = [PodView("busy", "prefill", "10.0.0.1", True, 0.0, draining_since_seconds=NOW - 9,
                       in_flight=2, in_router=False),
               PodView("listed", "prefill", "10.0.0.2", True, 0.0, draining_since_seconds=NOW - 9,
                       in_flight=0, in_router=True),
               PodView("idle", "prefill", "10.0.0.3", True, 0.0, draining_since_seconds=NOW - 9,
                       in_flight=0, in_router=False),
               PodView("serving", "prefill", "10.0.0.4", True, 0.0)]
    decode = [PodView("d-serving", "decode", "10.0.1.1", True, 0.0),
              PodView("d-leaving", "decode", "10.0.1.2", True, 0.0, deleting=True),
              PodView("d-no-ip", "decode", None, False, 0.0)]
    loads = {p.ip: EngineLoad(p.in_flight or 0, LoadSource.VLLM_METRICS) for p in prefill}
    drains.begin_tick()
    first = drains._await_handoffs(NS, spec, prefill, loads, decode, NOW)
    assert [p.handoff_wait is not None for p in first] == [False, False, True, False]
    assert read == []  # within the grace
    drains.end_tick()
    drains.begin_tick()
    later = drains._await_handoffs(NS, spec, prefill, loads, decode, NOW + GRACE)
    why = later[2].handoff_wait
    assert why is not None and "1 requests waiting" in why and "1 decodes not answering" in why
    assert read == ["10.0.1.1", "10.0.1.2"]  # a decode being deleted may still pull; one without an IP cannot
