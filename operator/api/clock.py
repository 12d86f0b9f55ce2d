"""The operator's one clock and timestamp vocabulary: Kubernetes writes RFC 3339 (``...Z``), the
planner counts epoch seconds. Pure parsing and formatting, plus the one wall-clock read that
handlers pass down (logic takes time as an argument, never reads it)."""

from __future__ import annotations

from datetime import UTC, datetime


def now_rfc3339() -> str:
    """Now, as Kubernetes writes a timestamp (second precision, UTC, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_seconds(timestamp: str | datetime | None) -> float | None:
    """Epoch seconds of an API timestamp: an RFC 3339 string (API dicts) or a ``datetime``
    (the Kubernetes client's models); ``None`` stays ``None`` (unknown is not zero)."""
    if timestamp is None or timestamp == "":
        return None
    if isinstance(timestamp, datetime):
        return timestamp.timestamp()
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
