"""The replay's decode instances batch continuously (planner/replay/decode_batches.py): one
rule per test, each checked against a step-by-step count of the same batch."""

from __future__ import annotations

import heapq

import pytest

from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.observe import Role
from pdscale.planner.profile import load_profile
from pdscale.planner.replay.decode_batches import DecodeBatches
from pdscale.planner.replay.fleet import DRAINING, STOPPED, Events, Fleet
from pdscale.planner.replay.prefix_index import PrefixIndex


class Run:
    """One decode instance (or ``n``) driven by hand: requests given as (input, output)."""

    def __init__(self, model: PerformanceModel, requests: list[tuple[int, int]], *, mode: str = "off",
                 slo: Slo | None = None, instances: int = 1, arrivals: list[float] | None = None,
                 router: str = "least-loaded") -> None:
        self.events = Events()
        self.fleet = Fleet(PrefixIndex(1), self.events, switch_seconds=0.0)
        for _ in range(instances):
            self.fleet.add(Role.DECODE, 0.0, 0.0)
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.shed: list[int] = []
        self.decode = DecodeBatches(
            self.fleet, self.events, model, mode, slo or Slo(ttft_seconds=2.0, tpot_seconds=0.05),
            input_tokens=[i for i, _ in requests], output_tokens=[o for _, o in requests],
            arrival_seconds=arrivals or [0.0] * len(requests),
            on_start=lambda r, t: self.started.__setitem__(r, t),
            on_finish=lambda r, start, t: self.finished.__setitem__(r, t),
            on_shed=lambda r, t: self.shed.append(r),
            router=router,
        )

    def until(self, t: float) -> None:
        """Run the events due by ``t``."""
        heap = self.events.heap
        while heap and heap[0][0] <= t:
            at, kind, seq, x = heapq.heappop(heap)
            if kind == Events.DECODE:
                self.decode.finish_due(x, at, seq)
            elif kind == Events.RELEASE:
                self.fleet.release(x, at)


def stepped(model: PerformanceModel, contexts: list[int], steps: int) -> float:
    """Seconds for ``steps`` steps of a batch of sequences at these contexts, step by step (each
    step adds a token to each)."""
    total, ctx = 0.0, list(contexts)
    for _ in range(steps):
        total += model.tpot_seconds(len(ctx), sum(ctx) / len(ctx))
        ctx = [c + 1 for c in ctx]
    return total


@pytest.fixture(scope="module")
def model() -> PerformanceModel:
    return PerformanceModel(load_profile())


def test_a_sequence_alone_takes_the_sum_of_its_steps(model: PerformanceModel) -> None:
    run = Run(model, [(2000, 301)])
    run.decode.place(0, 1.0)
    assert run.started == {0: 1.0}
    run.until(1e9)
    # the first token came from prefill: 300 steps, each at the context then (prompt + tokens)
    assert run.finished[0] == pytest.approx(1.0 + stepped(model, [2001], 300), rel=1e-9)


def test_a_joining_request_slows_every_running_one(model: PerformanceModel) -> None:
    alone = Run(model, [(2000, 301)])
    alone.decode.place(0, 0.0)
    alone.until(1e9)
    joined = Run(model, [(2000, 301), (4000, 1001)])
    joined.decode.place(0, 0.0)
    half = stepped(model, [2001], 150)
    joined.until(half)
    joined.decode.place(1, half)  # joins after 150 of the first one's 300 steps
    joined.until(1e9)
    # the rest of the first one's steps run at a batch of two (their contexts then)
    expected = half + stepped(model, [2151, 4001], 150)
    assert joined.finished[0] == pytest.approx(expected, rel=1e-6)
    assert joined.finished[0] > alone.finished[0]
    # the second runs at two until the first leaves, then alone (speeds up)
    rest = stepped(model, [4151], 850)
    assert joined.finished[1] == pytest.approx(expected + rest, rel=1e-6)


def test_a_full_instance_makes_a_request_wait_for_room(model: PerformanceModel) -> None:
    kv = model.profile.decode.kv_capacity_tokens
    d = model.profile.decode
    tight = PerformanceModel(model.profile.model_copy(update={"decode": d.model_copy(update={"max_batch": 2})}))
    run = Run(tight, [(100, 11), (100, 21), (100, 5)])
    for r in range(3):
        run.decode.place(r, 0.0)
    assert list(run.started) == [0, 1] and list(run.fleet.decode_waiting[0]) == [2]
    run.until(1e9)
    assert run.started[2] == pytest.approx(run.finished[0])  # the first to leave makes room
    # KV capacity: a request whose prompt and output do not fit beside the batch waits too
    run = Run(model, [(kv // 2, 11), (kv // 2 + 10, 11)])
    run.decode.place(0, 0.0)
    run.decode.place(1, 0.0)
    assert list(run.started) == [0]
    run.until(1e9)
    assert run.started[1] == pytest.approx(run.finished[0])


def test_decode_admission_queue_waits_and_shed_drops(model: PerformanceModel) -> None:
    # two of these meet the target at their mean contexts (prompt + half the output), a third not
    slo = Slo(ttft_seconds=0.5, tpot_seconds=model.tpot_seconds(2, 1200) * 1.001)

    def three(mode: str) -> Run:
        run = Run(model, [(1000, 50), (1000, 400), (1000, 20)], mode=mode, slo=slo)
        for r in range(3):
            run.decode.place(r, 0.0)
        return run

    cliff = three("off")  # everyone joins: every sequence runs past the target for a while
    assert len(cliff.started) == 3
    queued = three("queue")  # the third waits for the first to finish
    assert list(queued.started) == [0, 1]
    queued.until(1e9)
    assert queued.started[2] == pytest.approx(queued.finished[0])
    assert queued.finished[0] == pytest.approx(stepped(model, [1001, 1001], 49), rel=1e-6)
    # "shed": the third waited past the TTFT target by the time room opened, and is dropped
    shed = three("shed")
    shed.until(1e9)
    assert queued.finished[0] > slo.ttft_seconds and shed.shed == [2] and 2 not in shed.started
    with pytest.raises(ValueError, match="decode_admission must be one of"):
        three("maybe")


def test_requests_go_to_the_least_loaded_instance_and_a_drain_waits_for_its_batch(
        model: PerformanceModel) -> None:
    run = Run(model, [(1000, 100)] * 3, instances=2)
    for r in range(3):
        run.decode.place(r, 0.0)
    assert [len(b) for b in run.fleet.running] == [2, 1]
    run.fleet.start_drain(0, 0.5, None)
    assert run.fleet.state[0] == DRAINING
    run.until(1e9)
    # released when its last sequence finished, not before
    assert run.fleet.state[0] == STOPPED and run.fleet.since[0] == pytest.approx(max(run.finished[0], run.finished[1]))


def test_the_router_sends_the_decode_half_when_the_request_arrives(model: PerformanceModel) -> None:
    """sgl-router, smg and vllm-router pick a request's decode when it arrives, with its
    prefill: a decode that drains before the KV comes still takes the request (its engine
    waits for what is in flight) and holds its node until it is done, so the two requests
    decode alone, not together on the decode left. The ideal router's least-loaded choice
    waits for the KV and finds one decode."""
    def run(router: str) -> Run:
        r = Run(model, [(1000, 100)] * 2, instances=2, router=router)
        for k in range(2):
            r.decode.bind(k)  # both dispatched while two decodes are ready
        r.fleet.start_drain(1, 0.1, None)
        assert r.fleet.state[1] == DRAINING
        r.until(0.9)
        for k in range(2):
            r.decode.place(k, 1.0)  # their KV arrives
        return r

    dispatched = run("round-robin")
    assert dispatched.decode.load(1) == 1 and [len(b) for b in dispatched.fleet.running] == [1, 1]
    dispatched.until(1e9)
    alone = 1.0 + stepped(model, [1001], 99)
    assert dispatched.finished == pytest.approx({0: alone, 1: alone})
    assert dispatched.fleet.state[1] == STOPPED and dispatched.fleet.since[1] == pytest.approx(alone)
    ideal = run("least-loaded")
    assert [len(b) for b in ideal.fleet.running] == [2, 0]
    ideal.until(1e9)
    assert ideal.finished[0] == pytest.approx(1.0 + stepped(model, [1001, 1001], 99))


def test_a_one_token_output_finishes_at_its_start(model: PerformanceModel) -> None:
    run = Run(model, [(1000, 1)])
    run.decode.place(0, 3.0)
    assert run.finished == {0: 3.0} and not run.fleet.running[0]


def test_the_gaps_streamed_are_counted_in_the_interval_they_stream(model: PerformanceModel) -> None:
    """What an engine's inter-token histogram sums and counts over an interval: each sequence
    of a batch adds each step's time and one gap, when the step runs, not when the request
    finishes. A batch that grows from one sequence to two within the interval shows the
    interval's gaps at the steps' times then (the finished requests' TPOTs would lag it)."""
    run = Run(model, [(2000, 2001), (2000, 2001)])
    run.decode.place(0, 0.0)
    one = stepped(model, [2001], 100)
    run.until(one)
    seconds, count = run.decode.take_gaps(one)
    assert seconds == pytest.approx(one, rel=1e-9) and count == pytest.approx(100, rel=1e-6)
    run.decode.place(1, one)
    two = stepped(model, [2101, 2001], 50)
    run.until(one + two)
    seconds, count = run.decode.take_gaps(one + two)
    # two sequences, 50 steps each, each adding the step's time
    assert seconds == pytest.approx(2 * two, rel=1e-9) and count == pytest.approx(100, rel=1e-6)
    assert seconds / count == pytest.approx(two / 50, rel=1e-9)
    assert run.decode.take_gaps(one + two) == (0.0, 0.0)  # taken: reset


def test_a_draining_decode_whose_last_request_has_one_token_is_released(model: PerformanceModel) -> None:
    # the request was dispatched to decode 1 when it arrived; decode 1 drains before its KV
    # comes; its one-token answer finishes as it joins, with no finish event to release it
    run = Run(model, [(1000, 1)], instances=2, router="round-robin")
    run.decode.bind(0)
    bound = 0 if run.fleet.decode_bound[0] else 1
    run.fleet.start_drain(bound, 0.5, None)
    assert run.fleet.state[bound] == DRAINING
    run.decode.place(0, 1.0)
    run.until(1e9)
    assert run.finished == {0: 1.0}
    assert run.fleet.state[bound] == STOPPED and run.fleet.since[bound] == pytest.approx(1.0)


def test_round_robin_moves_on_while_one_decode_is_ready(model: PerformanceModel) -> None:
    # smg's round robin adds one to its counter on every pick (round_robin.rs: fetch_add then
    # modulo the healthy workers), one worker or several: three picks with one decode ready,
    # then a second one joins, and the fourth pick is counter 3 % 2, the second decode
    run = Run(model, [(1000, 100)] * 4, instances=1, router="round-robin")
    for r in range(3):
        assert run.decode.choose(r) == 0
    run.fleet.add(Role.DECODE, 0.0, 0.0)
    assert run.decode.choose(3) == 1
