"""A stand-in for ``aiperf profile`` in the tests of ``pdscale profile run`` that need no
aiperf: it takes the flags profile run passes, and writes the ``profile_export.jsonl`` a
deployment running a known profile would give, as aiperf 0.13 writes it. Run as a script
(``python fake_aiperf.py profile ...``) or called (:func:`simulate`).

Timing: a run at concurrency 1 sends its prompts one after another (each alone in prefill);
a run at concurrency C sends waves of C identical requests that prefill together and decode as
one batch of C, so every reconstructed batch is exactly C. ``FAKE_AIPERF_FAIL_AT_ISL``: a run
of that input length writes to stderr and exits 1, as a failed aiperf does."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import parse_profile

TRUTH_YAML = """\
name: fake-truth
gpus_per_instance: 8
prefill: {tokens_per_second: 4000, attention_doubling_tokens: 3000, overhead_seconds: 0.05,
          prefix_cache_tokens: 1000, block_tokens: 16}
decode: {step_seconds: 0.02, per_sequence_seconds: 0.002, per_context_token_seconds: 0.000002,
         kv_capacity_tokens: 1000000, max_batch: 256}
kv_transfer: {bytes_per_token: 1, gigabytes_per_second: 100, setup_seconds: 0.0}
warmup: {new_node_seconds: 1, role_switch_seconds: 1}
"""
TRUTH = parse_profile(yaml.safe_load(TRUTH_YAML), source="fake_aiperf")


def simulate(isl: int, osl: int, concurrency: int, requests: int, t0: float = 1000.0
             ) -> list[tuple[int, int, float, float, float]]:
    """(input tokens, output tokens, TTFT, latency, start) per request, in seconds."""
    model = PerformanceModel(TRUTH)
    out, t = [], t0
    waves = -(-requests // concurrency)
    for w in range(waves):
        size = min(concurrency, requests - w * concurrency)
        ttft = model.prefill_seconds(isl) * (1 if concurrency == 1 else 2)
        ttft += model.kv_transfer_seconds(isl)
        latency = ttft + (osl - 1) * model.tpot_seconds(size, isl + osl / 2)
        out += [(isl, osl, ttft, latency, t)] * size
        t += latency + 0.001
    return out


def records_jsonl(rows: list[tuple[int, int, float, float, float]]) -> str:
    lines = []
    for i, (isl, osl, ttft, latency, start) in enumerate(rows):
        lines.append(json.dumps({
            "metadata": {"session_num": i, "x_request_id": f"r{i}", "turn_index": 0,
                         "request_start_ns": int(start * 1e9),
                         "benchmark_phase": "profiling", "was_cancelled": False},
            "metrics": {"input_sequence_length": {"value": isl, "unit": "tokens"},
                        "time_to_first_token": {"value": ttft * 1000, "unit": "ms"},
                        "request_latency": {"value": latency * 1000, "unit": "ms"},
                        "output_sequence_length": {"value": osl, "unit": "tokens"}}}))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["profile"])
    for flag in ("--url", "--endpoint-type", "--model", "--tokenizer", "--isl-stddev",
                 "--random-seed", "--extra-inputs", "--ui-type"):
        parser.add_argument(flag)
    parser.add_argument("--streaming", action="store_true")
    for flag in ("--isl", "--osl", "--concurrency", "--request-count"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--artifact-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if os.environ.get("FAKE_AIPERF_FAIL_AT_ISL") == str(args.isl):
        print("aiperf: error: connection refused (http://router)", file=sys.stderr)
        return 1
    args.artifact_dir.mkdir(parents=True, exist_ok=True)
    # as aiperf 0.13 does: its dataset's memory map in the temp dir, left there after the run
    leftover = Path(tempfile.gettempdir()) / f"aiperf_mmap_{os.getpid()}"
    leftover.mkdir()
    (leftover / "dataset.dat").write_bytes(b"")
    (args.artifact_dir / "tmpdir.txt").write_text(tempfile.gettempdir())
    rows = simulate(args.isl, args.osl, args.concurrency, args.request_count)
    (args.artifact_dir / "profile_export.jsonl").write_text(records_jsonl(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
