"""The load generator's pure parts: request plans, stream parsing, summaries, loopback."""

from __future__ import annotations

import pytest

from pdscale.testbed.loadgen import (
    SEED_PHASES,
    Phase,
    RequestRecord,
    plan_requests,
    require_loopback,
    scale_phases,
    summarize,
    tokens_in_chunk,
)


def test_plan_is_deterministic_and_follows_rate_and_phases():
    phases = (Phase("a", 10.0, 20.0, 100, 10, 0.5), Phase("b", 10.0, 5.0, 400, 40, 0.0))
    plan = plan_requests(phases, seed=3)
    assert plan == plan_requests(phases, seed=3)
    a = [s for s in plan if s.phase == "a"]
    b = [s for s in plan if s.phase == "b"]
    assert 150 < len(a) < 250 and 25 < len(b) < 80  # Poisson around 200 and 50
    assert all(0 <= s.at_seconds < 10 for s in a) and all(10 <= s.at_seconds < 20 for s in b)
    assert all(len(s.prompt.split()) == s.input_tokens for s in plan)


def test_prompts_share_the_requested_prefix_share():
    plan = plan_requests((Phase("chat", 30.0, 10.0, 200, 10, 0.6),), seed=1)
    shared = [sum(w.startswith("c") for w in s.prompt.split()) / s.input_tokens for s in plan]
    assert all(abs(x - 0.6) < 0.01 for x in shared)


def test_plan_is_bounded():
    assert len(plan_requests((Phase("a", 100.0, 100.0, 10, 10),), max_requests=50)) == 50


def test_seed_phases_scale_down():
    chat, docs, agents = scale_phases(SEED_PHASES, token_scale=0.01, rate_scale=0.1,
                                      duration_seconds=5)  # fmt: skip
    assert (chat.mean_input_tokens, chat.mean_output_tokens, chat.rate_rps) == (20, 5, 10.0)
    assert docs.mean_input_tokens == 160 and agents.prefix_share == 0.8


def test_tokens_in_chunks():
    assert tokens_in_chunk("chat", {"choices": [{"delta": {"content": "t3 "}}]}, 3) == 1
    assert tokens_in_chunk("chat", {"choices": [{"delta": {"role": "assistant"}}]}, 0) == 0
    assert tokens_in_chunk("chat", {"choices": [], "usage": {}}, 5) == 0
    assert tokens_in_chunk("completions", {"choices": [{"text": "t0 "}]}, 0) == 1
    assert tokens_in_chunk("generate", {"text": "t0 t1 ", "meta_info": {"completion_tokens": 2}}, 1) == 1


def record(i, *, error=None, ttft=0.1, tpot=0.01):
    return RequestRecord(i, "p", 0.0, 10, 5, 5 if error is None else 2, 200, ttft, tpot, 1.0, error)


def test_summary_counts_failures_by_kind():
    records = [record(i, ttft=0.1 * (i + 1)) for i in range(10)]
    records += [record(10, error="stream ended without [DONE]"), record(11, error="http 503: x")]
    s = summarize(records)
    assert s["requests"] == 12 and s["failed"] == 2
    assert s["errors"] == {"stream ended without [DONE]": 1, "http 503": 1}
    assert s["ttft_p50_seconds"] == pytest.approx(0.5) and s["ttft_p90_seconds"] == pytest.approx(0.9)


def test_only_loopback_targets():
    assert require_loopback("http://127.9.8.7:30000/") == "http://127.9.8.7:30000"
    with pytest.raises(ValueError, match="loopback"):
        require_loopback("http://10.0.0.1:30000")


def test_cli_refuses_a_non_loopback_target_before_sending(capsys):
    from pdscale.testbed.loadgen import main

    assert main(["--url", "http://10.1.2.3:30000", "--phase-seconds", "1"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_a_stopped_load_sends_nothing_more_and_returns_without_waiting_for_its_plan():
    import asyncio
    import threading
    import time

    from pdscale.testbed.loadgen import RequestSpec, run_load

    # a plan reaching 100 s ahead, to a loopback port nobody listens on: a request sent would
    # come back as a failed record, so an empty result means none was sent
    specs = [RequestSpec(index=i, phase="p", at_seconds=100.0 + i, prompt="a b", input_tokens=2,
                         output_tokens=2, prefix_group=None) for i in range(3)]
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    records = asyncio.run(run_load("http://127.0.0.1:9", specs, stop=stop))
    assert records == []
    assert time.monotonic() - started < 50  # not the plan's 100 s


def test_a_cohort_travels_in_the_metadata_map_and_nothing_is_sent_without_one():
    from dataclasses import replace

    from pdscale.testbed.loadgen import RequestSpec, request_body

    spec = RequestSpec(0, "p", 0.0, 2, 3, "a b")
    for api in ("chat", "completions"):
        assert "metadata" not in request_body(api, spec, "m")[1]
        assert request_body(api, replace(spec, cohort="all-rise"), "m")[1]["metadata"] == {"cohort": "all-rise"}
