"""The replay's router admission (planner/replay/router_admission.py): smg's prefill cap per
instance, its queue and its timeout, one rule per test, as observed against the real smg in
tests/loop/test_smg_admission.py."""

from __future__ import annotations

import numpy as np
import pytest

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.replay.router_admission import AdmissionQueue, PrefillAdmission
from pdscale.planner.replay.simulate import SimConfig, SimResult, simulate
from pdscale.planner.replay.traces import Trace

BLOCK = 512


def run(model: PerformanceModel, trace: Trace, admission: PrefillAdmission | None,
        prefill: int = 1, **kw: object) -> SimResult:
    cfg = SimConfig(router="least-queue", initial_prefill=prefill, prefill_only=True,
                    engine="sglang", prefill_chunk_tokens=4096, slo=Slo(ttft_seconds=60.0),
                    prefill_admission=admission, **kw)  # type: ignore[arg-type]
    return simulate(trace, model, cfg)


def burst(n: int, tokens: int = 4000, gap_seconds: float = 0.001) -> Trace:
    # prompts one pass long each, no shared prefix
    return Trace("t", [i * gap_seconds for i in range(n)], [tokens] * n, [1] * n,
                 [(1000 + i,) for i in range(n)], BLOCK)


def test_a_request_over_the_cap_waits_at_the_router_until_a_prefill_answers(model) -> None:
    one_pass = model.prefill_seconds(4000)
    r = run(model, burst(2), PrefillAdmission(1, queue_size=4, queue_timeout_seconds=60))
    # the second is sent only when the first answers: one pass later, not batched beside it
    assert r.ttft_seconds[1] == pytest.approx(2 * one_pass - 0.001, rel=1e-6)
    # without admission the engine queues it itself: the same first-token time here
    free = run(model, burst(2), None)
    assert free.ttft_seconds[1] == pytest.approx(r.ttft_seconds[1], rel=1e-6)


def test_the_queue_full_refuses_at_once_and_the_timeout_refuses_the_late(model) -> None:
    one_pass = model.prefill_seconds(4000)
    # cap 1, two may wait; a timeout shorter than two passes: the second waits one pass (ok),
    # the third would wait two (refused), the fourth finds the queue full (refused)
    adm = PrefillAdmission(1, queue_size=2, queue_timeout_seconds=1.5 * one_pass)
    r = run(model, burst(4), adm)
    assert list(r.rejected) == [False, False, True, True]
    assert np.isnan(r.ttft_seconds[2]) and np.isnan(r.ttft_seconds[3])
    # the engines themselves would have served all four, the last two late
    assert not run(model, burst(4), None).rejected.any()


def test_the_cap_is_per_instance_so_admitted_load_follows_the_prefill_count(model) -> None:
    adm = PrefillAdmission(1, queue_size=0, queue_timeout_seconds=60)
    assert run(model, burst(3), adm, prefill=1).rejected.sum() == 2
    assert run(model, burst(3), adm, prefill=3).rejected.sum() == 0


def test_the_router_chooses_only_among_instances_under_their_cap(model) -> None:
    # cache-aware would send the last request to instance 0, where its prefix is cached; with
    # instance 0 at its cap it goes to the idle instance 1 and computes its whole prompt there
    prefix = tuple(range(1, 9))  # 8 blocks, 4,096 tokens
    tr = Trace("t", [0.0, 10.0, 10.001], [4000, 9000, 4000], [1, 1, 1],
               [prefix, prefix + tuple(range(51, 61)), (*prefix, 70)], BLOCK)

    def ttft_of_last(admission):
        cfg = SimConfig(router="cache-aware", initial_prefill=2, prefill_only=True,
                        engine="sglang", prefill_chunk_tokens=4096, slo=Slo(ttft_seconds=60.0),
                        prefill_admission=admission)
        return simulate(tr, model, cfg).ttft_seconds[2]

    capped = ttft_of_last(PrefillAdmission(1, queue_size=4, queue_timeout_seconds=60))
    assert capped == pytest.approx(model.prefill_seconds(4000), rel=1e-6)
    # uncapped, it waits behind the long request on instance 0 for its cached prefix
    assert ttft_of_last(None) > capped


def test_the_queue_takes_the_oldest_first_and_expires_from_the_front() -> None:
    q = AdmissionQueue(PrefillAdmission(1, queue_size=3, queue_timeout_seconds=2.0))
    assert q.offer(7, 0.0) and q.offer(8, 1.0) and q.offer(9, 1.5)
    assert not q.offer(10, 1.6)
    assert q.expire(2.5) == [7] and [r for r, _ in q.waiting] == [8, 9]
    assert q.open_instances([0, 1, 2], [1, 0, 3]) == [1]


def test_bad_admission_values_are_refused(model) -> None:
    with pytest.raises(ValueError, match="inflight_per_instance"):
        PrefillAdmission(0)
    with pytest.raises(ValueError, match="article"):
        simulate(burst(1), model, SimConfig(engine="article",
                                            prefill_admission=PrefillAdmission(1)))


def test_the_planner_sees_requests_held_at_the_router_in_the_prefill_queue(model) -> None:
    # ten long prompts at once on one instance with cap 1: one computing, nine held at the
    # router, none queued at the engine; the live planner reads the nine from smg's
    # smg_pd_prefill_admission_queued and so must the replayed one
    seen = []

    def controller(obs):
        seen.append(obs.prefill.queue_depth.value)
        return (1, 0)

    cfg = SimConfig(router="least-queue", initial_prefill=1, prefill_only=True, engine="sglang",
                    prefill_chunk_tokens=4096, slo=Slo(ttft_seconds=600.0), interval_seconds=0.01,
                    prefill_admission=PrefillAdmission(1, queue_size=16, queue_timeout_seconds=600))
    tr = Trace("t", [0.0] * 10 + [0.02], [4000] * 11, [1] * 11, [(1000 + i,) for i in range(11)], BLOCK)
    simulate(tr, model, cfg, controller)
    assert seen[1:] == [9.0, 9.0]


def test_a_slot_opens_when_the_prefill_response_ends_after_its_kv_transfer(model) -> None:
    """SGLang's prefill answers a PD request once its KV transfer is done (its inflight queue),
    and smg releases the prefill slot when that response ends: the second request of a cap of
    one is sent a KV transfer after the first prefill, not at its end."""
    tr = Trace("t", [0.0, 0.001], [4000, 4000], [2, 2], [(1,), (2,)], BLOCK)
    cfg = SimConfig(router="least-queue", initial_prefill=1, initial_decode=1, engine="sglang",
                    prefill_chunk_tokens=4096, slo=Slo(ttft_seconds=60.0),
                    prefill_admission=PrefillAdmission(1, queue_size=4, queue_timeout_seconds=60))
    r = simulate(tr, model, cfg)
    one_pass, transfer = model.prefill_seconds(4000), model.kv_transfer_seconds(4000)
    assert r.ttft_seconds[0] == pytest.approx(one_pass + transfer, rel=1e-6)
    assert r.ttft_seconds[1] == pytest.approx(2 * one_pass + 2 * transfer - 0.001, rel=1e-6)


def test_a_request_waiting_exactly_the_timeout_is_refused() -> None:
    # smg's queue refuses at elapsed >= timeout (middleware/concurrency.rs), not only after it
    q = AdmissionQueue(PrefillAdmission(1, queue_size=3, queue_timeout_seconds=2.0))
    assert q.offer(7, 0.0) and q.offer(8, 0.5)
    assert q.expire(2.0) == [7] and [r for r, _ in q.waiting] == [8]
