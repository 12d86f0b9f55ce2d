"""The per-request arrays that SGLang's ``bench_serving`` and ``vllm bench serve`` both save:
parallel lists ``input_lens``, ``output_lens``, ``ttfts`` (seconds), ``itls`` (a list of
inter-token gaps per request, seconds) and ``errors`` (empty for a success), one entry per
request of the run; vLLM adds ``latencies`` and ``start_times`` (seconds)."""

from __future__ import annotations

from typing import Any

from .json_input import Locator
from .points import RequestRecord

ARRAYS = ("input_lens", "output_lens", "ttfts", "itls")


def records_from_arrays(run: Any, at: Locator, *, hint: str) -> list[RequestRecord]:
    """The successful requests of one run; ``hint`` says how to make the tool save them."""
    for key in ARRAYS:
        if not isinstance(run, dict) or key not in run:
            raise at.error(key, f"missing: the per-request results are not saved ({hint})")
    n = len(at.sequence(run["ttfts"], "ttfts"))
    arrays = {k: at.sequence(run[k], k, n) for k in ARRAYS}
    errors = at.sequence(run.get("errors", [""] * n), "errors", n)
    latencies = at.sequence(run["latencies"], "latencies", n) if "latencies" in run else None
    starts = at.sequence(run["start_times"], "start_times", n) if "start_times" in run else None
    records = []
    for i in range(n):
        if errors[i]:
            continue
        ttft = at.number(arrays["ttfts"][i], f"ttfts[{i}]")
        gaps = at.sequence(arrays["itls"][i], f"itls[{i}]")
        if latencies is not None:
            latency = at.number(latencies[i], f"latencies[{i}]")
        else:
            latency = ttft + sum(at.number(g, f"itls[{i}][{j}]") for j, g in enumerate(gaps))
        if latency < ttft:
            raise at.error(f"latencies[{i}]", "shorter than the time to first token")
        if ttft == 0:  # no first token was seen (a non-streaming endpoint): no timing to fit
            continue
        records.append(RequestRecord(
            int(at.number(arrays["input_lens"][i], f"input_lens[{i}]")),
            int(at.number(arrays["output_lens"][i], f"output_lens[{i}]")),
            ttft, latency,
            None if starts is None else at.number(starts[i], f"start_times[{i}]")))
    return records


def recorded_fields(run: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The run's own description (date, backend, model, concurrency, ...) for provenance:
    scalars only, as the tool wrote them."""
    return {k: run[k] for k in keys if k in run and isinstance(run[k], str | int | float | bool | None)}
