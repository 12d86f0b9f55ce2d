"""Reading the JSON and JSON Lines files of the benchmark clients, with errors that name the
file, the line and the field (the readers of each tool build on this)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .points import BenchmarkError

#: a benchmark output above this is not one we can fit in memory on a laptop (refused, not read)
MAX_INPUT_BYTES = 512 * 1024 * 1024

#: seconds per unit, for the unit strings the tools write next to their values
SECONDS_PER_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
                    "seconds": 1.0}


def _text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise BenchmarkError(str(path), f"over {MAX_INPUT_BYTES >> 20} MiB: not read")
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchmarkError(str(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise BenchmarkError(str(path), f"not UTF-8 text (byte {exc.start})") from None


def read_json(path: Path) -> Any:
    """A whole-document JSON file; a truncated or corrupted one names the line it breaks at."""
    text = _text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchmarkError(str(path), f"not JSON ({exc.msg}, column {exc.colno})",
                             line=exc.lineno) from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-empty line of a JSON Lines file."""
    for number, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(str(path), f"not JSON ({exc.msg}, column {exc.colno})",
                                 line=number) from None


class Locator:
    """Where in a file a value is (file, line), to refuse it by name."""

    def __init__(self, source: str, line: int | None = None):
        self.source, self.line = source, line

    def error(self, field: str, message: str) -> BenchmarkError:
        return BenchmarkError(self.source, message, line=self.line, field=field)

    def get(self, mapping: Any, key: str, field: str) -> Any:
        """``mapping[key]``; ``field`` is the dotted path shown when it is missing."""
        if not isinstance(mapping, Mapping):
            parent = field.rsplit(".", 1)[0] if "." in field else "(top level)"
            raise self.error(parent, f"expected an object, got {type(mapping).__name__}")
        if key not in mapping:
            raise self.error(field, "missing")
        return mapping[key]

    def number(self, value: Any, field: str, *, positive: bool = False) -> float:
        """A finite non-negative number (positive if asked); bools are not numbers here."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.error(field, f"not a number: {value!r}")
        if value < 0 or (positive and value == 0):
            raise self.error(field, f"must be {'positive' if positive else 'non-negative'}: {value!r}")
        return float(value)

    def seconds(self, value: Any, unit: Any, field: str) -> float:
        if unit not in SECONDS_PER_UNIT:
            raise self.error(f"{field}.unit", f"unknown time unit {unit!r}")
        return self.number(value, f"{field}.value") * SECONDS_PER_UNIT[unit]

    def sequence(self, value: Any, field: str, length: int | None = None) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(field, f"expected a list, got {type(value).__name__}")
        if length is not None and len(value) != length:
            raise self.error(field, f"{len(value)} values where the run has {length} requests")
        return value
