"""Trace readers: Mooncake JSONL, Azure CSV and rate series with borrowed lengths.

A :class:`Trace` is plain lists sorted by arrival, cheap for the simulator to walk. Readers do
file I/O (they are loaders, not part of the planning path) and fail with a message naming the
file, the line and the field."""

from __future__ import annotations

import csv
import json
import math
import random
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


class TraceError(ValueError):
    """A trace file is unreadable or malformed; the message names the line and field."""


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival.

    ``hash_ids[i]`` are ids of the request's ``block_tokens``-token prompt prefix blocks (equal
    ids = shared prefix); empty when the source has no cache information."""

    name: str
    arrival_seconds: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    hash_ids: list[tuple[int, ...]]
    block_tokens: int

    def __len__(self) -> int:
        return len(self.arrival_seconds)

    @property
    def duration_seconds(self) -> float:
        return self.arrival_seconds[-1] - self.arrival_seconds[0] if self.arrival_seconds else 0.0


def _int_field(obj: dict[str, object], key: str, where: str) -> int:
    if key not in obj:
        raise TraceError(f"{where}: missing field '{key}'")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or not math.isfinite(v):
        raise TraceError(f"{where}: field '{key}' must be a non-negative number, got {v!r}")
    return int(v)


def read_mooncake(path: str | Path, *, block_tokens: int = 512) -> Trace:
    """Read a Mooncake JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids`` of 512-token blocks)."""
    p = Path(path)
    arrivals: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[tuple[int, ...]] = []
    try:
        fh = p.open()
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: expected a JSON object")
            arrivals.append(_int_field(obj, "timestamp", where) / 1000.0)
            ins.append(_int_field(obj, "input_length", where))
            outs.append(_int_field(obj, "output_length", where))
            h = obj.get("hash_ids", [])
            if not isinstance(h, list) or not all(isinstance(x, int) for x in h):
                raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
            ids.append(tuple(h))
    return _sorted(Trace(p.stem, arrivals, ins, outs, ids, block_tokens))


def read_azure(path: str | Path) -> Trace:
    """Read an Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    The timestamps carry 7 fractional digits, one more than ``strptime``'s ``%f`` accepts:
    the 7th (100 ns) is cut. No prefix information: ``hash_ids`` are empty."""
    p = Path(path)
    arrivals: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header is None or [h.strip() for h in header[:3]] != want:
            raise TraceError(f"{p}:1: header must be {','.join(want)}, got {header}")
        t0: datetime | None = None
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            where = f"{p}:{lineno}"
            if len(row) < 3:
                raise TraceError(f"{where}: expected 3 fields, got {len(row)}")
            stamp = row[0].strip()
            if "." in stamp:
                head, frac = stamp.split(".", 1)
                stamp = f"{head}.{frac[:6]}"
            try:
                ts = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
            except ValueError:
                try:
                    ts = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
                except ValueError:
                    raise TraceError(f"{where}: field 'TIMESTAMP' unparseable: {row[0]!r}") from None
            if t0 is None:
                t0 = ts
            arrivals.append((ts - t0).total_seconds())
            for name, value, dest in (("ContextTokens", row[1], ins), ("GeneratedTokens", row[2], outs)):
                try:
                    n = int(value)
                except ValueError:
                    raise TraceError(f"{where}: field '{name}' is not an integer: {value!r}") from None
                if n < 0:
                    raise TraceError(f"{where}: field '{name}' is negative: {n}")
                dest.append(n)
    return _sorted(Trace(p.stem, arrivals, ins, outs, [()] * len(arrivals), 512))


def read_rate_series(path: str | Path) -> list[tuple[float, float]]:
    """Read a ServeGen rate series ``window_start_s,total_rate_rps`` as (start s, rate rps)."""
    p = Path(path)
    out: list[tuple[float, float]] = []
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read rate series {p}: {exc.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["window_start_s", "total_rate_rps"]:
            raise TraceError(f"{p}:1: header must be window_start_s,total_rate_rps, got {header}")
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            try:
                start, rate = float(row[0]), float(row[1])
            except (ValueError, IndexError):
                raise TraceError(f"{p}:{lineno}: fields 'window_start_s,total_rate_rps' must be numbers: {row}") from None
            if rate < 0 or not math.isfinite(rate):
                raise TraceError(f"{p}:{lineno}: field 'total_rate_rps' must be >= 0, got {rate}")
            out.append((start, rate))
    if not out:
        raise TraceError(f"{p}: no windows")
    return out


def synthesize_from_rates(
    windows: list[tuple[float, float]],
    lengths: Trace,
    *,
    name: str = "rate-series",
    seed: int = 0,
) -> Trace:
    """Poisson arrivals following a piecewise-constant rate, each request's lengths drawn from
    a random request of ``lengths`` (the donor), its prefix blocks remapped.

    The donor's block ids are not borrowed as they are: requests drawn at random from a whole
    trace would share the blocks of donor requests hours apart, and of the same donor request
    drawn twice (a 100% hit on a prompt no user sent twice), inflating cache hits far above the
    donor's (issue 17: 30% on the day series). Instead the new request keeps the donor
    request's *hit length*: as many leading blocks as the donor request found already seen in
    the donor (``donor_prefix_hits``), taken from the most recent earlier new request that has
    that many (as a conversation's next turn extends its previous one), and fresh ids for the
    rest. Prefix reuse then matches the donor's hit rate per request, not its identity."""
    rng = random.Random(seed)
    hits = donor_prefix_hits(lengths)
    recent: deque[tuple[int, ...]] = deque(maxlen=_RECENT_PREFIXES)
    next_id = 0
    arrivals: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[tuple[int, ...]] = []
    n_donor = len(lengths)
    if n_donor == 0:
        raise TraceError("length donor trace is empty")
    for k, (start, rate) in enumerate(windows):
        end = windows[k + 1][0] if k + 1 < len(windows) else start + (
            windows[1][0] - windows[0][0] if len(windows) > 1 else 600.0
        )
        if rate <= 0:
            continue
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            j = rng.randrange(n_donor)
            arrivals.append(t)
            ins.append(lengths.input_tokens[j])
            outs.append(lengths.output_tokens[j])
            n_blocks, k = len(lengths.hash_ids[j]), hits[j]
            shared = next((h[:k] for h in reversed(recent) if len(h) >= k), ()) if k else ()
            fresh = tuple(range(next_id, next_id + n_blocks - len(shared)))
            next_id += len(fresh)
            h = shared + fresh
            recent.append(h)
            ids.append(h)
    return Trace(name, arrivals, ins, outs, ids, lengths.block_tokens)


#: how many recent new requests a remapped prefix may come from (a conversation's earlier
#: turn is recent; a longer search would only cost time)
_RECENT_PREFIXES = 256


def donor_prefix_hits(trace: Trace) -> list[int]:
    """Per request, how many of its leading prefix blocks an earlier request of ``trace`` had
    (the hits of an unbounded prefix cache that has seen the whole trace so far)."""
    seen: set[int] = set()
    out: list[int] = []
    for h in trace.hash_ids:
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        out.append(k)
        seen.update(h)
    return out


def scale_trace(trace: Trace, *, rate_scale: float = 1.0, time_scale: float = 1.0, seed: int = 0) -> Trace:
    """Scale load: ``time_scale`` K compresses time by K (arrivals at t/K); ``rate_scale`` K
    replicates arrivals K times (fractional K replicates a random share once more).

    Every replica is a distinct user: all its prefix-block ids are fresh (``b + c * max_id``
    for copy ``c``), so a copy hits only its own earlier turns, never the original's or
    another copy's. A block seen in more than one request is not evidence of a shared system
    prompt (a conversation's own earlier turns are such blocks too), and the supported traces
    mark no block as shared, so none is kept shared. Replica times are jittered uniformly
    within +-0.5 s so that copies do not arrive in lockstep."""
    if rate_scale <= 0 or time_scale <= 0:
        raise ValueError("rate_scale and time_scale must be > 0")
    rng = random.Random(seed)
    max_id = max((b for h in trace.hash_ids for b in h), default=-1) + 1
    whole = int(rate_scale)
    frac = rate_scale - whole
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    for i, t in enumerate(trace.arrival_seconds):
        copies = whole + (1 if rng.random() < frac else 0)
        for c in range(copies):
            h = trace.hash_ids[i]
            if c == 0:
                tt = t
            else:
                tt = max(0.0, t + rng.uniform(-0.5, 0.5))
                h = tuple(b + c * max_id for b in h)
            rows.append((tt / time_scale, trace.input_tokens[i], trace.output_tokens[i], h))
    rows.sort(key=lambda r: r[0])
    name = trace.name
    if rate_scale != 1.0:
        name += f"@x{rate_scale:g}"
    if time_scale != 1.0:
        name += f"/t{time_scale:g}"
    return Trace(
        name,
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        trace.block_tokens,
    )


def split_at(trace: Trace, seconds: float) -> tuple[Trace, Trace]:
    """(the requests of the first ``seconds``, the rest), the rest's clock restarted at the
    split (its arrivals minus first arrival + ``seconds``): a history before a scored window,
    and the scored window as a trace of its own."""
    t_split = (trace.arrival_seconds[0] if len(trace) else 0.0) + seconds
    k = next((i for i, a in enumerate(trace.arrival_seconds) if a >= t_split), len(trace))

    def part(lo: int, hi: int, shift: float, name: str) -> Trace:
        return Trace(name, [a - shift for a in trace.arrival_seconds[lo:hi]],
                     trace.input_tokens[lo:hi], trace.output_tokens[lo:hi],
                     trace.hash_ids[lo:hi], trace.block_tokens)

    return (part(0, k, 0.0, f"{trace.name}[:{seconds:g}s]"),
            part(k, len(trace), t_split, f"{trace.name}[{seconds:g}s:]"))


def _sorted(trace: Trace) -> Trace:
    a = trace.arrival_seconds
    if all(a[i] <= a[i + 1] for i in range(len(a) - 1)):
        return trace
    order = sorted(range(len(a)), key=a.__getitem__)
    return Trace(
        trace.name,
        [a[i] for i in order],
        [trace.input_tokens[i] for i in order],
        [trace.output_tokens[i] for i in order],
        [trace.hash_ids[i] for i in order],
        trace.block_tokens,
    )


def load_trace(
    path: str | Path,
    *,
    rate_scale: float = 1.0,
    time_scale: float = 1.0,
    lengths_from: str | Path | None = None,
    seed: int = 0,
) -> Trace:
    """Read any supported trace by its content and apply the scale factors.

    ``.jsonl`` is Mooncake; a CSV starting ``TIMESTAMP`` is Azure; a CSV starting
    ``window_start_s`` is a rate series, whose lengths (and prefix blocks) are drawn from the
    trace at ``lengths_from``. For a rate series, ``time_scale`` K compresses the windows K
    times and, like for request traces, multiplies the rate by K; ``rate_scale`` multiplies it.
    """
    p = Path(path)
    if p.suffix == ".jsonl":
        return scale_trace(read_mooncake(p), rate_scale=rate_scale, time_scale=time_scale, seed=seed)
    try:
        with p.open() as fh:
            head = fh.readline()
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror}") from None
    if head.startswith("TIMESTAMP"):
        return scale_trace(read_azure(p), rate_scale=rate_scale, time_scale=time_scale, seed=seed)
    if head.startswith("window_start_s"):
        if lengths_from is None:
            raise TraceError(f"{p}: a rate series needs a length distribution (lengths_from)")
        donor = load_trace(lengths_from)
        windows = [(s / time_scale, r * time_scale * rate_scale) for s, r in read_rate_series(p)]
        name = f"{p.stem}+{donor.name}-lengths"
        if rate_scale != 1.0 or time_scale != 1.0:
            name += f"@x{rate_scale:g}/t{time_scale:g}"
        return synthesize_from_rates(windows, donor, name=name, seed=seed)
    raise TraceError(f"{p}:1: unknown trace format (expected Mooncake .jsonl, Azure or rate CSV)")
