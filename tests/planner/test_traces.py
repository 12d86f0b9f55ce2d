from __future__ import annotations

from pathlib import Path

import pytest

from pdscale.planner.replay.traces import (
    Trace,
    TraceError,
    donor_prefix_hits,
    load_trace,
    read_azure,
    read_mooncake,
    read_rate_series,
    scale_trace,
    synthesize_from_rates,
)

SHARED = Path("/work/shared/traces")


def test_mooncake_errors_name_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 5, "input_length": 10, "hash_ids": [1]}\n'
    )
    with pytest.raises(TraceError, match=r"t.jsonl:2: missing field 'output_length'"):
        read_mooncake(f)
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\nnot json\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: not JSON"):
        read_mooncake(f)
    f.write_text('{"timestamp": 0, "input_length": -1, "output_length": 2}\n')
    with pytest.raises(TraceError, match=r":1: field 'input_length'"):
        read_mooncake(f)
    f.write_text('{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": ["a"]}\n')
    with pytest.raises(TraceError, match=r":1: field 'hash_ids'"):
        read_mooncake(f)


def test_azure_seven_digit_timestamps_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "a.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
    )
    t = read_azure(f)
    assert t.arrival_seconds == pytest.approx([0.0, 0.052])
    assert t.input_tokens == [4808, 3180]
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,x,10\n")
    with pytest.raises(TraceError, match=r"a.csv:2: field 'ContextTokens'"):
        read_azure(f)
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,10\n")
    with pytest.raises(TraceError, match=r"a.csv:2: field 'TIMESTAMP'"):
        read_azure(f)
    f.write_text("when,ctx,gen\n")
    with pytest.raises(TraceError, match=r"a.csv:1: header"):
        read_azure(f)


def test_rate_series_errors(tmp_path: Path) -> None:
    f = tmp_path / "r.csv"
    f.write_text("window_start_s,total_rate_rps\n0,1.5\n600,-2\n")
    with pytest.raises(TraceError, match=r"r.csv:3: field 'total_rate_rps'"):
        read_rate_series(f)
    f.write_text("window_start_s,total_rate_rps\n0,abc\n")
    with pytest.raises(TraceError, match=r"r.csv:2:"):
        read_rate_series(f)
    with pytest.raises(TraceError, match="length distribution"):
        f.write_text("window_start_s,total_rate_rps\n0,1\n")
        load_trace(f)


def test_shared_traces_read_as_documented() -> None:
    m = read_mooncake(SHARED / "mooncake/conversation_trace.jsonl")
    assert len(m) == 12031
    assert sum(m.input_tokens) / len(m) == pytest.approx(12035, abs=1)
    a = read_azure(SHARED / "azure2023/AzureLLMInferenceTrace_code.csv")
    assert len(a) == 8819
    assert sum(a.input_tokens) / len(a) == pytest.approx(2048, abs=1)
    assert len(read_rate_series(SHARED / "servegen/m-mid_rate.csv")) == 2016


def test_scaling_factors() -> None:
    m = read_mooncake(SHARED / "mooncake/conversation_trace.jsonl")
    x3 = scale_trace(m, rate_scale=3)
    assert len(x3) == 3 * len(m)
    # each copy is a distinct user: its blocks are its own, three disjoint sets of the same size
    original = {b for h in m.hash_ids for b in h}
    assert len({b for h in x3.hash_ids for b in h}) == 3 * len(original)
    t2 = scale_trace(m, time_scale=2)
    assert t2.duration_seconds == pytest.approx(m.duration_seconds / 2)
    half = scale_trace(m, rate_scale=0.5)
    assert 0.45 * len(m) < len(half) < 0.55 * len(m)


def test_rate_scale_copies_share_no_history() -> None:
    """A conversation copied K times is K users: no copy's prompt hits another's blocks, even
    blocks the original reuses across its own turns (which look shared but are private)."""
    turns = [(1, 2), (1, 2, 3), (1, 2, 3, 4)]  # one conversation: each turn extends the last
    tr = Trace("conv", [0.0, 10.0, 20.0], [2, 3, 4], [1, 1, 1], turns, 1)
    x2 = scale_trace(tr, rate_scale=2, seed=5)
    by_copy: dict[tuple[int, ...], set[int]] = {}
    for h in x2.hash_ids:
        by_copy.setdefault(h[:1], set()).update(h)
    assert len(by_copy) == 2
    a, b = by_copy.values()
    assert not a & b
    # within a copy the conversation still reuses its own earlier turns
    assert all(len(s) == 4 for s in (a, b))


def test_rate_series_synthesis_follows_rates() -> None:
    m = read_mooncake(SHARED / "mooncake/conversation_trace.jsonl")
    t = synthesize_from_rates([(0.0, 2.0), (600.0, 10.0)], m, seed=1)
    first = sum(1 for x in t.arrival_seconds if x < 600)
    assert first == pytest.approx(1200, rel=0.15)
    assert len(t) - first == pytest.approx(6000, rel=0.1)
    assert set(t.input_tokens) <= set(m.input_tokens)


def test_donor_prefix_hits_count_leading_blocks_seen_before() -> None:
    t = Trace("t", [0, 1, 2, 3], [4, 4, 4, 4], [1] * 4,
              [(1, 2), (1, 2, 3), (9, 1, 2), (1, 5, 3)], 512)
    # the third request shares blocks 1 and 2, but not as its prefix: no hit
    assert donor_prefix_hits(t) == [0, 2, 0, 1]


def hit_share(t: Trace) -> float:
    """Share of prefix blocks an unbounded cache would hit."""
    return sum(donor_prefix_hits(t)) / sum(len(h) for h in t.hash_ids)


def test_rate_series_remaps_prefix_blocks_to_the_donors_hit_rate() -> None:
    # A rate series at several times the donor's rate draws every donor request many times:
    # with the donor's ids kept whole, every repeat would be a full hit. Remapped, the share of
    # blocks hit is the donor's (within a few points: a hit length with no recent request that
    # long is served fresh).
    m = read_mooncake(SHARED / "mooncake/conversation_trace.jsonl")
    donor = hit_share(m)
    t = synthesize_from_rates([(0.0, 20.0), (3600.0, 0.0)], m, seed=2)
    assert len(t) > 3 * len(m)
    assert hit_share(t) == pytest.approx(donor, abs=0.05)
    # lengths and blocks stay consistent: a request has as many blocks as its donor request
    lengths_to_blocks = {(i, len(h)) for i, h in zip(m.input_tokens, m.hash_ids, strict=True)}
    assert all((i, len(h)) in lengths_to_blocks for i, h in zip(t.input_tokens[:2000], t.hash_ids[:2000],
                                                                strict=True))


def test_split_at_restarts_the_clock_of_the_rest() -> None:
    from pdscale.planner.replay.traces import split_at

    t = Trace("t", [10.0, 11.0, 20.0, 25.0], [1, 2, 3, 4], [1, 1, 1, 1], [(), (), (), ()], 512)
    head, tail = split_at(t, 10.0)
    assert head.arrival_seconds == [10.0, 11.0] and head.input_tokens == [1, 2]
    assert tail.arrival_seconds == [0.0, 5.0] and tail.input_tokens == [3, 4]
