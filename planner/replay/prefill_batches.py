"""Prefill instances that batch as SGLang and vLLM do: passes up to a chunk of tokens.

The engines' schedulers (SGLang ``scheduler.py`` with ``schedule_batch.py``'s
``PrefillAdder``; vLLM v1 ``core/sched/scheduler.py``) run one forward pass at a time. A pass
takes waiting requests first come first served until the pass's token budget is spent (SGLang
``--chunked-prefill-size``, vLLM ``--max-num-batched-tokens``); the request that does not fit
whole is chunked: it takes what is left of the budget and goes on in the next pass. Every
request of a pass gets its first token when the pass ends, and a chunked one when its last
chunk's pass ends.

The prefix cache follows the engines too: a request's cached prefix is matched when a pass
takes it (SGLang ``match_prefix`` in ``schedule_policy``; vLLM ``get_computed_blocks``), and
its blocks enter the cache once computed (SGLang ``cache_unfinished_req`` /
``cache_finished_req`` after the forward; vLLM caches full blocks after the step). Two
requests of one pass never share: the second is scheduled before the first is computed.

Default budgets, read from the engines' sources: SGLang ``server_args.py`` sets
``chunked_prefill_size`` by GPU memory, 8,192 below 160 GB (A100, H100, H20, H200) and 16,384
above (B200, MI300); vLLM ``arg_utils.py`` sets ``max_num_batched_tokens`` to 8,192 for the
API server on GPUs of 70 GB or more (other than A100), 2,048 below.

A pass costs the profile's pass overhead once
(:meth:`~..model.PerformanceModel.prefill_pass_overhead_seconds`) plus the compute of each of
its parts (:meth:`~..model.PerformanceModel.prefill_compute_seconds` of each chunk, with what
was computed before it as its cached part, so that a long prompt's attention cost is charged
once). SGLang runs one forward per batch (``event_loop_normal_disagg_prefill``:
``get_new_batch_prefill`` builds the batch, the chunked request first, and one ``run_batch``
computes it), so the fixed cost of a forward is paid per pass, not per prompt: a pass of k
prompts pays it once, and a chunked prompt once in each pass it is part of, shared there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from ..model import PerformanceModel
from .fleet import Events, Fleet
from .prefix_index import PrefixIndex

#: engine -> default prefill pass budget in tokens on H100/H200-class GPUs (module docstring);
#: "article" is the global-scheduling article's model: one request at a time, no batching
ENGINES: dict[str, int | None] = {"sglang": 8192, "vllm": 8192, "article": None}


class PrefillBatches:
    """Per prefill instance: a FIFO of waiting requests, the pass running, a chunked request.

    ``on_done(r, t, hit_tokens, forward_seconds)`` is called when request ``r``'s prefill
    completes at ``t`` with ``hit_tokens`` of its prompt found in the cache when it was
    scheduled, ``forward_seconds`` after the pass that first took it started (what the engines'
    prefill forward latency records)."""

    def __init__(
        self,
        fleet: Fleet,
        prefix: PrefixIndex,
        events: Events,
        model: PerformanceModel,
        *,
        chunk_tokens: int,
        input_tokens: Sequence[int],
        blocks: Sequence[tuple[int, ...]],
        block_tokens: int,
        on_done: Callable[[int, float, int, float], None],
    ) -> None:
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
        self.fleet, self.prefix, self.events, self.model = fleet, prefix, events, model
        self.chunk_tokens = chunk_tokens
        self.input_tokens, self.blocks, self.block_tokens = input_tokens, blocks, block_tokens
        self.on_done = on_done
        #: instance -> requests waiting for a pass, first come first
        self.waiting: dict[int, deque[int]] = {}
        #: instance -> the requests of the pass running: (request, tokens computed after it);
        #: absent when the instance is idle
        self.running: dict[int, list[tuple[int, int]]] = {}
        #: request -> (tokens computed so far, hit tokens at scheduling, when the pass that
        #: first took it started), while it is scheduled
        self.progress: dict[int, tuple[int, int, float]] = {}
        #: instance -> the request chunked by the last pass, continued first by the next
        self.chunked: dict[int, int] = {}
        #: instance -> the seconds of the pass running
        self.pass_seconds: dict[int, float] = {}
        #: instance -> (requests, tokens computed, tokens read from cache or earlier chunks)
        #: of its latest pass, the shape an engine's per-pass metrics report
        self.pass_shape: dict[int, tuple[int, int, int]] = {}

    def queued(self, i: int) -> int:
        """Requests waiting on instance ``i`` for their first pass (SGLang's num_queue_reqs)."""
        q = self.waiting.get(i)
        return len(q) if q else 0

    def queued_tokens(self, i: int) -> int:
        """Prompt tokens of the requests waiting on instance ``i`` (raw, before any cache hit)."""
        q = self.waiting.get(i)
        return sum(self.input_tokens[r] for r in q) if q else 0

    def submit(self, i: int, r: int, now: float) -> None:
        """Request ``r`` is routed to instance ``i`` at ``now``."""
        self.waiting.setdefault(i, deque()).append(r)
        if i not in self.running:
            self._start_pass(i, now)

    def pass_done(self, i: int, now: float) -> float:
        """Instance ``i``'s pass ended at ``now``: its finished requests get their first token
        and enter the cache; the next pass starts if anything waits. Returns the pass's
        seconds (the GPU busy time SGLang adds up per pass)."""
        seconds = self.pass_seconds.pop(i)
        for r, computed in self.running.pop(i):
            n = self.input_tokens[r]
            if computed < n:
                continue  # chunked: goes on in the next pass
            _, hit, started = self.progress.pop(r)
            self.prefix.insert(i, self.blocks[r])
            self.on_done(r, now, hit, now - started)
        if self.waiting.get(i) or i in self.chunked:
            self._start_pass(i, now)
        return seconds

    def _start_pass(self, i: int, now: float) -> None:
        budget = self.chunk_tokens
        members: list[tuple[int, int]] = []
        kv_read = 0
        seconds = self.model.prefill_pass_overhead_seconds()
        price = self.model.prefill_compute_seconds
        r = self.chunked.pop(i, None)
        queue = self.waiting.get(i)
        while budget > 0:
            if r is None:
                if not queue:
                    break
                r = queue.popleft()
                n = self.input_tokens[r]
                # matched when scheduled: what this instance has computed and cached by now
                hits = self.prefix.hits(self.blocks[r], 1 << i).get(i, 0)
                # the engines always compute at least the last token (its logits)
                hit = min(hits * self.block_tokens, n - 1) if n > 0 else 0
                self.progress[r] = (hit, hit, now)
            done, hit, started = self.progress[r]
            n = self.input_tokens[r]
            take = min(n - done, budget)
            kv_read += done
            seconds += price(done + take, done)
            self.progress[r] = (done + take, hit, started)
            members.append((r, done + take))
            budget -= take
            if done + take < n:
                self.chunked[i] = r
                break
            r = None
        if not members:
            return
        end = now + seconds
        self.running[i] = members
        self.pass_seconds[i] = seconds
        self.pass_shape[i] = (len(members), self.chunk_tokens - budget, kv_read)
        # the routers read busy as when the instance runs empty: never before this pass ends
        self.fleet.busy[i] = max(self.fleet.busy[i], end)
        self.events.push(end, Events.PASS, i)
