"""The demo's recording and its replay beside the live run (pure: no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdscale.planner.replay.traces import load_trace, read_mooncake
from pdscale.testbed import demo_replay
from pdscale.testbed.demo import Sample, phase_clock
from pdscale.testbed.demo_replay import (
    IntervalCounts,
    agreement,
    agreement_between_draws,
    best_lag,
    difference_note,
    fidelity,
    interval_attainment_by_phase,
    side_by_side,
    trace_rows,
)
from pdscale.testbed.loadgen import Phase, RequestRecord, plan_requests

BLOCK = 64
PHASES = (Phase("chat", 20.0, 3.0, 200, 10, 0.6), Phase("agents", 20.0, 3.0, 300, 20, 0.8))


def sent_late(specs, lag_seconds: float = 0.013, fail_every: int = 5) -> list[RequestRecord]:  # type: ignore[no-untyped-def]
    """What the client records: each request leaves a little late; some fail."""
    return [RequestRecord(s.index, s.phase, s.at_seconds + lag_seconds, s.input_tokens,
                          s.output_tokens, s.output_tokens, 200, 1.0, 0.03, 2.0,
                          "http 503" if s.index % fail_every == 0 else None)
            for s in specs]


def test_the_recording_reads_back_as_the_load_sent(tmp_path: Path) -> None:
    specs = plan_requests(PHASES, seed=3)
    records = sent_late(specs)
    path = tmp_path / "trace.jsonl"
    demo_replay.write_jsonl(path, trace_rows(specs, reversed(records), block_tokens=BLOCK))
    trace = read_mooncake(path, block_tokens=BLOCK)
    # every request sent, failed ones too, at its send time (ms), with its lengths
    assert len(trace) == len(specs)
    assert trace.arrival_seconds == [round((s.at_seconds + 0.013) * 1000) / 1000 for s in specs]
    assert trace.input_tokens == [s.input_tokens for s in specs]
    assert trace.output_tokens == [s.output_tokens for s in specs]
    # each prompt has a block per started 64 tokens; two prompts share exactly the full
    # blocks their common prefix group's words cover, and nothing across groups
    for i, a in enumerate(specs):
        assert len(trace.hash_ids[i]) == -(-a.input_tokens // BLOCK)
        for j, b in enumerate(specs[:i]):
            common = 0
            for x, y in zip(trace.hash_ids[i], trace.hash_ids[j], strict=False):
                if x != y:
                    break
                common += 1
            expected = (min(a.shared_prefix_tokens, b.shared_prefix_tokens) // BLOCK
                        if a.prefix_group is not None and a.prefix_group == b.prefix_group else 0)
            assert common == expected, (a.index, b.index)
            assert not set(trace.hash_ids[i][expected:]) & set(trace.hash_ids[j])
    shared = sum(1 for i, h in enumerate(trace.hash_ids)
                 if any(h[:1] == g[:1] for g in trace.hash_ids[:i]))
    assert shared > len(specs) // 2  # the agents' long shared prefixes do reach full blocks
    # the command line's reader takes the same file (it assumes 512-token blocks)
    assert load_trace(path).input_tokens == trace.input_tokens


def test_a_prefix_shorter_than_a_block_shares_nothing() -> None:
    specs = plan_requests((Phase("chat", 30.0, 3.0, 60, 4, 0.5),), seed=1)
    rows = trace_rows(specs, sent_late(specs), block_tokens=BLOCK)
    ids = [i for r in rows for i in r["hash_ids"]]
    assert len(ids) == len(set(ids))


def counts(t: float, live: tuple[int, int] | None, replayed: tuple[int, int],
           phase: str = "chat") -> IntervalCounts:
    lp, ld = live if live else (None, None)
    return IntervalCounts(t, phase, lp, ld, 0, 0, *replayed)


def test_agreement_counts_intervals_within_one_for_both_roles() -> None:
    rows = [counts(0, (2, 3), (2, 3)), counts(10, (3, 2), (2, 3)),   # agree, agree (+-1)
            counts(20, (2, 3), (2, 5)),                               # decode off by 2
            counts(30, (5, 3), (2, 3), "docs"),                       # prefill off by 3
            counts(40, None, (9, 9))]                                 # no live decision yet
    assert agreement(rows) == 2 / 4
    assert agreement(rows, tolerance=0) == 1 / 4
    assert agreement(rows, tolerance=3) == 1.0
    note = difference_note(rows, 10.0)
    assert "prefill: live above the replay in 1 (docs 1)" in note
    assert "decode: live below the replay in 1 (chat 1)" in note


def test_a_live_loop_that_follows_the_replay_late_is_called_late() -> None:
    replayed = [(2, 3)] * 4 + [(8, 2)] * 6 + [(3, 6)] * 6
    live = [(2, 3)] * 6 + [(8, 2)] * 6 + [(3, 6)] * 4  # the same steps, two intervals later
    rows = [counts(10.0 * k, lv, rp) for k, (lv, rp) in enumerate(zip(live, replayed, strict=True))]
    assert agreement(rows) == 12 / 16
    assert best_lag(rows) == (2, 1.0)
    assert best_lag(rows, roles=("decode",)) == (2, 1.0)
    note = difference_note(rows, 10.0)
    assert ("prefill: live below the replay in 2 (chat 2) and above the replay in 2 (chat 2), and "
            "agrees best with the replay 2 interval(s) (20 s) earlier (100% of intervals, 75% "
            "unshifted): the live loop decides it late;") in note
    assert note.endswith("decode: live below the replay in 2 (chat 2), and agrees best with the replay 2 "
                         "interval(s) (20 s) earlier (100% of intervals, 88% unshifted): the live "
                         "loop decides it late.")
    # a live loop that is low, not late, is not called late
    low = [counts(10.0 * k, (lp - 3, ld), (lp, ld)) for k, (lp, ld) in enumerate(replayed)]
    assert "late" not in difference_note(low, 10.0)
    steady = [counts(10.0 * k, (2, 3), (2, 3)) for k in range(8)]
    assert difference_note(steady, 10.0) == "prefill: within 1 in every interval; decode: within 1 in every interval."


def sample(t: float, target: tuple[int, int] | None, ready: tuple[int, int] = (1, 1)) -> Sample:
    return Sample(t, "chat", *ready, *(target or (None, None)), "-", "", 2)


def test_each_replayed_tick_meets_the_live_decision_in_force_half_an_interval_later() -> None:
    samples = [sample(0, None), sample(4, (2, 3)), sample(14, (4, 3)), sample(25.5, (6, 1)), sample(27, (1, 1))]
    decisions = [{"t": 0.5, "prefill": 2, "decode": 3}, {"t": 10.5, "prefill": 4, "decode": 3},
                 {"t": 20.5, "prefill": 4, "decode": 2}]
    oracle = [{"t": 0.5, "prefill": 3, "decode": 3}]
    phase = phase_clock([{"name": "chat", "duration_seconds": 20}, {"name": "docs", "duration_seconds": 20}])
    rows = side_by_side(samples, decisions, oracle, interval_seconds=10.0, phase_at=phase)
    assert [(r.live_prefill, r.live_decode) for r in rows] == [(2, 3), (4, 3), (6, 1)]
    assert [r.phase for r in rows] == ["chat", "chat", "docs"]
    assert (rows[0].oracle_prefill, rows[1].oracle_prefill) == (3, None)
    assert agreement(rows) == 2 / 3


def test_replayed_attainment_per_phase_weighs_intervals_by_their_requests() -> None:
    per_interval = [{"t": 0.2, "rate_rps": 1.0, "attainment": 1.0},
                    {"t": 10.2, "rate_rps": 3.0, "attainment": 0.5},
                    {"t": 20.2, "rate_rps": 0.0, "attainment": None},
                    {"t": 30.2, "rate_rps": 2.0, "attainment": 0.25}]
    phase = phase_clock([{"name": "chat", "duration_seconds": 20}, {"name": "docs", "duration_seconds": 20}])
    by_phase = interval_attainment_by_phase(per_interval, 10.0, phase)
    assert by_phase == {"chat": pytest.approx((10 + 15) / 40), "docs": pytest.approx(5 / 20)}


def test_fidelity_reports_the_difference_in_points_and_checks_the_targets() -> None:
    def report(attainment: float) -> dict:  # type: ignore[type-arg]
        return {"slo_attainment": attainment, "gpu_hours": 1.0, "initial_fleet": {},
                "per_interval": [{"t": 0.0, "rate_rps": 1.0, "attainment": attainment}]}

    live = {"slo_attainment": 0.42, "slo_attainment_by_phase": {"chat": 0.42}, "gpu_hours_ready": 1.0}
    phase = phase_clock([{"name": "chat", "duration_seconds": 100}])
    rows = [counts(10.0 * k, (2, 3), (2, 3)) for k in range(9)] + [counts(90, (2, 3), (6, 3))]
    f = fidelity(live, {"pdscale": report(0.45), "oracle": report(0.9)}, rows,
                 interval_seconds=10.0, phase_at=phase)
    assert f["attainment_difference_pp"] == pytest.approx(3.0)
    assert f["attainment_difference_pp_by_phase"] == {"chat": pytest.approx(3.0)}
    assert f["attainment_within_tolerance"] and f["counts_agree_share"] == 0.9
    assert f["counts_agree_within_target"] and f["intervals_compared"] == 10
    f = fidelity(live, {"pdscale": report(0.50)}, rows[1:], interval_seconds=10.0, phase_at=phase)
    assert f["attainment_difference_pp"] == pytest.approx(8.0)
    assert not f["attainment_within_tolerance"] and not f["counts_agree_within_target"]
    text = demo_replay.fidelity_paragraph(f)
    assert "+8.0 pp (NOT within 5 pp), by phase chat +8.0." in text and "88.9% of 9 intervals" in text
    # one disagreeing interval at the end is no sign of lateness (a shift only drops it)
    assert "late" not in text
    f["replayed_by_tick_phase"] = {"0": 0.47, "5": 0.53}
    assert "by phase chat +8.0; with the planner's ticks at other phases of its interval the " \
           "replay meets 47.0%-53.0%. Decided" in demo_replay.fidelity_paragraph(f)
    f = fidelity(live, {"pdscale": report(0.50)}, rows[1:], interval_seconds=10.0, phase_at=phase,
                 router_draws={1: 0.5, 2: 0.45, 3: 0.47})
    assert f["attainment_outside_router_draws_pp"] == pytest.approx(3.0)
    assert "chat +8.0; over 3 draws of the replay's random router (the live router's was one " \
           "more) 45.0%-50.0%, live 3.0 pp outside." in demo_replay.fidelity_paragraph(f)
    f = fidelity(live, {"pdscale": report(0.50)}, rows[1:], interval_seconds=10.0, phase_at=phase,
                 router_draws={1: 0.5, 2: 0.41})
    assert f["attainment_outside_router_draws_pp"] == 0.0
    assert "41.0%-50.0% with live inside." in demo_replay.fidelity_paragraph(f)
    f = fidelity(live, {"pdscale": report(0.50)}, rows[1:], interval_seconds=10.0, phase_at=phase,
                 agreement_between_router_draws=0.72)
    assert f["counts_agree_between_router_draws"] == 0.72
    assert ("88.9% of 9 intervals (target 90%), where the replay's own router draws agree with "
            "each other in 72.0% on average: ") in demo_replay.fidelity_paragraph(f)


def test_draws_of_the_router_are_compared_pair_by_pair_tick_by_tick() -> None:
    def draw(*counts: tuple[int, int]) -> list[dict[str, int]]:
        return [{"t": 10 * k, "prefill": p, "decode": d} for k, (p, d) in enumerate(counts)]

    a = draw((1, 2), (2, 5), (16, 1), (3, 12))
    b = draw((1, 2), (2, 7), (16, 2), (3, 12))    # decode 2 off at the second tick
    c = draw((1, 2), (2, 5), (12, 1))             # a tick short; prefill 4 off at the third
    # a-b 3/4, a-c 2/3, b-c 1/3 (ticks both have)
    assert agreement_between_draws([a, b, c]) == pytest.approx((3 / 4 + 2 / 3 + 1 / 3) / 3)
    assert agreement_between_draws([a, b, c], tolerance=4) == pytest.approx(1.0)
    assert agreement_between_draws([a]) is None


def test_the_live_plan_schedule_is_read_off_the_first_slot_after_the_load_began() -> None:
    def at(t: float, slot: float | None) -> Sample:
        return Sample(t, "chat", 1, 1, 1, 1, "-", "", 2, slot)

    # planned before the load (the PDCluster was applied first), then every 10 s at 7.3
    samples = [at(-3.0, -12.7), at(0.0, -2.7), at(8.0, 7.3), at(10.0, 7.3), at(18.0, 17.3)]
    assert demo_replay.live_tick_phase(samples, 10.0) == pytest.approx(7.3)
    assert demo_replay.live_tick_phase(samples[:2], 10.0) == pytest.approx(7.3)  # from -2.7
    # a recording older than the field: no schedule, the replay ticks from the first arrival
    assert demo_replay.live_tick_phase([sample(0, (1, 1))], 10.0) is None


def _timeline(ready_decode: dict[float, int], targets: dict[float, int], *,
              router_decode: dict[float, int] | None = None, until: float = 40.0) -> list[Sample]:
    """Samples every 2 s: decode's target from each plan slot on, its Ready count (and the
    router's listed count) from each time on."""
    def at(t: float, steps: dict[float, int]) -> int:
        return steps[max(k for k in steps if k <= t)]

    out, t = [], 0.0
    while t <= until:
        slot = max(k for k in targets if k <= t)
        out.append(Sample(t, "chat", 1, at(t, ready_decode), 1, targets[slot], "-", "", 0, slot,
                          1 if router_decode else None,
                          at(t, router_decode) if router_decode else None))
        t += 2.0
    return out


def test_the_join_delay_is_the_wait_to_serve_beyond_the_warm_up() -> None:
    # planned at 5 s: two more decodes; the first serves from 29 s (seen at 30), the second
    # from 31 (seen at 32): 25 s and 27 s after the plan, less a sample's half period (1 s),
    # less the warm-up (20 s)
    samples = _timeline({0: 2, 29: 3, 31: 4}, {-5: 2, 5: 4})
    assert demo_replay.join_delay(samples, 20.0) == pytest.approx((4.0 + 6.0) / 2)
    # the router lists them 2 s after they turn Ready: that is the wait a request sees
    listed = _timeline({0: 2, 29: 3, 31: 4}, {-5: 2, 5: 4}, router_decode={0: 2, 31: 3, 33: 4})
    assert demo_replay.join_delay(listed, 20.0) == pytest.approx((6.0 + 8.0) / 2)
    timing = demo_replay.live_timing(listed, 10.0, 20.0)
    assert timing.tick_phase_seconds == pytest.approx(5.0)
    assert timing.join_delay_seconds == pytest.approx(7.0)


def test_an_order_cancelled_before_it_serves_times_nothing() -> None:
    # two ordered at 5 s, the target back at 2 from 15 s: both pods go, nothing joins
    assert demo_replay.join_delay(_timeline({0: 2}, {0: 2, 5: 4, 15: 2}), 20.0) is None
    # one of the two cancelled (newest first): the other's wait is still timed from 5 s
    samples = _timeline({0: 2, 29: 3}, {0: 2, 5: 4, 15: 3})
    assert demo_replay.join_delay(samples, 20.0) == pytest.approx(4.0)
    # an instance that serves where none was ordered (a role switch, a restart) times nothing,
    # and a count that drops (a drain) orders nothing
    assert demo_replay.join_delay(_timeline({0: 2, 9: 1, 19: 2}, {0: 2}), 20.0) is None
