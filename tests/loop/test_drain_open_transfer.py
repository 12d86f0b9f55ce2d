"""A prefill drained while the KV of its last request is still on its way to the decode:
simulated engines (SGLang behind the real sglang-router 0.3.2, vLLM NIXL behind the real
vllm-router), the operator's drain decision made every tick from the engines' own answers
(``engine_probe``, ``Drains._await_handoffs``, ``fleet.plan_role_actions``, as
``Drains.move`` makes it), and the pod's removal played by killing the engine.

With today's rule the prefill is removed only once the transfer is over, and the request
succeeds. The same scenario under the old rule (``/get_load``, or running + waiting, reads 0:
remove) kills the prefill mid-transfer and the request fails: that parameter is a strict
xfail, so it fails the suite the day the old rule passes again.

The drain starts with the prefill already out of the router (``listed`` empty): the router's
letting go is tested in test_vllm_router.py and the SGLang router tests; here no other request
is sent."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import aiohttp
import pytest

from pdscale.operator.api.pdcluster import EngineKind, PDClusterSpec
from pdscale.operator.clients.engine_probe import (
    EngineLoad,
    LoadSource,
    engine_load,
    engine_vllm_totals,
    http_get,
    in_flight_from_get_load,
)
from pdscale.operator.clients.vllm_discovery import (
    HANDOFF_GRACE_SECONDS,
    RUNNING,
    WAITING,
    Announcer,
    decode_pulls_pending,
)
from pdscale.operator.loop.drain import Drains, as_engine_load, with_engine_state
from pdscale.operator.loop.fleet import PodView, plan_role_actions
from pdscale.testbed.loadgen import RequestSpec, send_one

pytestmark = pytest.mark.slow

#: how long the prefill holds the KV transfer open (its --kv-setup-seconds): longer than the
#: hand-off grace, so the vLLM rule must see the decode's deferred request, not just wait
TRANSFER_SECONDS = HANDOFF_GRACE_SECONDS + 3.0
TICK_SECONDS = 0.2
DRAIN_TIMEOUT_SECONDS = 120.0

RULES = ["now", pytest.param("old", marks=pytest.mark.xfail(
    strict=True, reason="the old rule removes a prefill while its KV is still on its way"))]


def old_probe(ip: str | None, port: int) -> EngineLoad | None:
    """The drain's probe before /v1/loads: SGLang's /get_load (no inflight queue), else vLLM's
    running + waiting."""
    if not ip:
        return None
    body = http_get(ip, port, "/get_load", time.monotonic() + 2.0)
    if body is not None:
        count = in_flight_from_get_load(body)
        return None if count is None else EngineLoad(count, LoadSource.LOADS)
    totals = engine_vllm_totals(ip, port)
    if totals is None or RUNNING not in totals:
        return None
    return EngineLoad(round(totals[RUNNING] + totals.get(WAITING, 0.0)), LoadSource.LOADS)


def removable(rule: str, drains: Drains, spec: PDClusterSpec, prefill: PodView,
              decode: list[PodView], port: int, now: float) -> tuple[bool, tuple[str, ...]]:
    """One tick of the drain for one draining prefill, as Drains.move makes it: (whether the
    pod is removed now, why it waits)."""
    loads: dict[str | None, EngineLoad | None] = {}

    def probe(ip: str | None, p: int) -> EngineLoad | None:
        loads[ip] = as_engine_load(engine_load(ip, p) if rule == "now" else old_probe(ip, p))
        return loads[ip]

    views = with_engine_state([prefill], port, set(), probe)
    if rule == "now":
        views = drains._await_handoffs("loop", spec, views, loads, decode, now)
    actions = plan_role_actions("prefill", 0, views, 1, now_seconds=now,
                                drain_timeout_seconds=DRAIN_TIMEOUT_SECONDS)
    return actions.finish_drain == (prefill.name,), actions.waiting


def one_request(url: str, out: list, tag: str) -> threading.Thread:
    spec = RequestSpec(0, tag, 0.0, 8, 4, f"{tag} a b c d e f g")

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            out.append(await send_one(session, url, "chat", spec, "sim-model", 0.0, 60.0))

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    return thread


def drain_until_removed(rule, drains, spec, prefill_engine, prefill_view, decode_views,
                        transfer_open) -> tuple[float, list[float], tuple[str, ...]]:
    """Ticks the drain until it removes the prefill (kills it): (removed at, the times its
    transfer was seen open, the last reasons it waited)."""
    open_at: list[float] = []
    why: tuple[str, ...] = ()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = time.monotonic()
        if transfer_open():
            open_at.append(now)
        done, waiting = removable(rule, drains, spec, prefill_view, decode_views,
                                  prefill_engine.port, now)
        why = waiting or why
        if done:
            prefill_engine.stop(signal.SIGKILL)  # the pod is gone, its KV with it
            return time.monotonic(), open_at, why
        time.sleep(TICK_SECONDS)
    pytest.fail(f"the drain never removed the prefill; waiting: {why}")


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def spec_of(kind: EngineKind) -> PDClusterSpec:
    import pathlib

    import yaml

    sample = "sglang-glm-4p8d.yaml" if kind is EngineKind.SGLANG else "vllm-nixl-2p4d.yaml"
    root = pathlib.Path(__file__).resolve().parents[2]
    return PDClusterSpec.model_validate(yaml.safe_load((root / "examples" / sample).read_text())["spec"])


@pytest.mark.parametrize("rule", RULES)
def test_an_sglang_prefill_with_a_transfer_open_is_removed_only_after_it(fleet, rule):
    prefill = fleet.start_engine("prefill", "--kv-setup-seconds", str(TRANSFER_SECONDS))
    decode = fleet.start_engine("decode")
    router_url = fleet.start_router([prefill], [decode])
    records: list = []
    sender = one_request(router_url, records, "drain")

    def transfer_open() -> bool:
        load = engine_load(prefill.host, prefill.port)
        return load is not None and load.in_flight > 0 and queued_at(prefill) == 0

    # The drain starts once the prefill has computed the request and only its KV transfer is
    # left: /get_load already reads 0 there.
    wait_for(transfer_open, "the prefill never held a transfer open")
    get_load = in_flight_from_get_load(http_get(prefill.host, prefill.port, "/get_load",
                                                time.monotonic() + 2) or b"")
    assert get_load == 0, "the shim counts the inflight queue: the scenario tests nothing"
    started = time.monotonic()
    view = PodView("p", "prefill", prefill.host, True, 0.0, draining_since_seconds=time.monotonic())
    decode_view = PodView("d", "decode", decode.host, True, 0.0)
    removed, open_at, why = drain_until_removed(
        rule, Drains(None, None), spec_of(EngineKind.SGLANG), prefill, view, [decode_view],  # type: ignore[arg-type]
        transfer_open)
    sender.join(60)
    print(f"\n{rule} rule: removed {removed - started:.2f} s after the drain started; transfer "
          f"seen open until {max(open_at) - started:.2f} s; last wait: {why}")
    assert len(records) == 1 and records[0].ok, f"{records[0].error if records else 'no answer'}; {fleet.describe()}"
    assert removed > max(open_at)


def queued_at(engine) -> int:
    """Running + waiting (with the bootstrap queue) of an SGLang engine, from /v1/loads."""
    import json

    body = http_get(engine.host, engine.port, "/v1/loads?include=core", time.monotonic() + 2)
    if body is None:
        return -1
    entries = json.loads(body)["loads"]
    return sum(e["num_running_reqs"] + e["num_waiting_reqs"] for e in entries)


@pytest.mark.parametrize("rule", RULES)
def test_a_vllm_prefill_whose_kv_a_decode_still_pulls_is_removed_only_after_the_pull(fleet, rule):
    prefill = fleet.start_engine("prefill", "--dialect", "vllm",
                                 "--kv-setup-seconds", str(TRANSFER_SECONDS))
    decode = fleet.start_engine("decode", "--dialect", "vllm")
    router_url, address = fleet.start_vllm_router()
    announcer, stop = Announcer(side_channel_port=5600), threading.Event()
    thread = threading.Thread(target=announcer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        announcer.set_workers(address, [prefill.spec, decode.spec])
        time.sleep(2 * 1.0 + 0.5)  # two announcements: the router has both

        def pulls() -> float | None:
            totals = engine_vllm_totals(decode.host, decode.port)
            return None if totals is None else decode_pulls_pending(totals)

        def prefill_idle() -> bool:
            totals = engine_vllm_totals(prefill.host, prefill.port)
            return totals is not None and totals.get(RUNNING, 1) + totals.get(WAITING, 1) == 0

        records: list = []
        sender = one_request(router_url, records, "pull")
        # The prefill has answered (running + waiting = 0) and the decode is pulling its KV.
        wait_for(lambda: prefill_idle() and (pulls() or 0) > 0, "no pull was ever open")
        started = time.monotonic()
        # the drain starts: the prefill leaves the router
        announcer.set_workers(address, [decode.spec])
        view = PodView("p", "prefill", prefill.host, True, 0.0, draining_since_seconds=time.monotonic())
        decode_view = PodView("d", "decode", decode.host, True, 0.0)
        spec = spec_of(EngineKind.VLLM)
        # no kube: the decision only; the engines here each have their own port, not the spec's
        drains = Drains(None, None,  # type: ignore[arg-type]
                        vllm_totals=lambda ip, _port: engine_vllm_totals(ip, decode.port))
        drains.begin_tick()
        removed, open_at, why = drain_until_removed(
            rule, drains, spec, prefill, view, [decode_view], lambda: (pulls() or 0) > 0)
        sender.join(60)
        print(f"\n{rule} rule: removed {removed - started:.2f} s after the drain started; pull "
              f"seen open until {max(open_at or [started]) - started:.2f} s; last wait: {why}")
        assert len(records) == 1 and records[0].ok, (
            f"{records[0].error if records else 'no answer'}; {fleet.describe()}")
        assert open_at and removed > max(open_at)
    finally:
        stop.set()
        thread.join(timeout=5)
