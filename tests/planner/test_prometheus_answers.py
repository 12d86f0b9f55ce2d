"""Prometheus answers are type-checked: only a well-formed vector or scalar answer, a
``[timestamp, "decimal number"]`` sample as the HTTP API documents it, becomes a reading.
Everything else is unknown (None, with a reason), never a number parsed from part of it: a
``value`` of ``"57"`` instead of ``[t, "57"]`` used to be read as 7 (``"57"[1]``)."""

from __future__ import annotations

import math

import pytest

from pdscale.planner.observe import Reading
from pdscale.planner.prometheus import MetricsSnapshot, read_metrics, to_reading

NOW = 1_700_000_000.0


def _vector(value: object) -> list[object]:
    return [{"metric": {}, "value": value}]


#: values that are not a finite decimal number string
BAD_VALUES: list[object] = [
    "", " ", "57 ", " 57", "5 7", "0x1A", "1_000", "1,5", "1.5.2", "--1", "+-1", "1e", "e5",
    "1e+", ".", "-", "+", "NaN", "nan", "+Inf", "-Inf", "inf", "Infinity", "1e999", "-1e999",
    "five", "57abc", "abc57", "٥٧", "５７", "\n57", "57\x00", "true", "null", "[57]",
    57, 57.0, -1, True, None, b"57", ["57"], {"v": "57"}, math.nan, math.inf,
]

#: samples whose timestamp is missing or not a finite number
BAD_SAMPLES: list[object] = [
    ["57"], [NOW], [NOW, "57", "extra"], [], ["1700000000", "57"], [None, "57"], [True, "57"],
    [math.nan, "57"], [math.inf, "57"], [-math.inf, "57"], [{"t": NOW}, "57"], [[NOW], "57"],
    "57", "[1700000000, \"57\"]", 57, None, {"0": NOW, "1": "57"}, {NOW: "57"},
]

#: results whose structure is not a vector of one series or a scalar
BAD_STRUCTURES: list[object] = [
    None, "57", 57, {"value": [NOW, "57"]}, {"result": [{"metric": {}, "value": [NOW, "57"]}]},
    ["57"], [57], [None], [[NOW, "57"]], [{"metric": {}}], [{"metric": "x", "value": [NOW, "57"]}],
    [{"metric": {}, "values": [[NOW, "57"]]}], [{"metric": {}, "histogram": [NOW, {"count": "5"}]}],
    [{"metric": {}, "value": [NOW, "1"]}, {"metric": {}, "value": [NOW, "2"]}],
    [NOW, "57", NOW], [NOW, 57], ["57", NOW],
]

MALFORMED = (
    [_vector([NOW, v]) for v in BAD_VALUES]
    + [[NOW, v] for v in BAD_VALUES if not isinstance(v, str)]  # as a scalar answer
    + [_vector(s) for s in BAD_SAMPLES]
    + BAD_STRUCTURES
)


def test_there_are_at_least_seventy_malformed_answers():
    assert len(MALFORMED) >= 70


@pytest.mark.parametrize("answer", MALFORMED, ids=[f"a{i}" for i in range(len(MALFORMED))])
def test_a_malformed_answer_is_unknown_with_a_reason(answer):
    reading, why = to_reading(answer, NOW, 180.0)
    assert reading is None, f"{answer!r} was read as {reading}"
    assert why


def test_the_57_read_as_7_bug_is_gone():
    # value is a bare string: indexing it took its second character
    reading, why = to_reading(_vector("57"), NOW)
    assert reading is None and why is not None and why.startswith("malformed")


@pytest.mark.parametrize(("text", "value"), [
    ("57", 57.0), ("0", 0.0), ("0.25", 0.25), ("-3", -3.0), ("+2.5", 2.5), ("1e+06", 1e6),
    ("1.5E-3", 1.5e-3), (".5", 0.5), ("5.", 5.0),
])
def test_well_formed_answers_are_read_and_stamped_at_the_sample_time(text, value):
    reading, why = to_reading(_vector([NOW - 15, text]), NOW, 180.0)
    assert why is None and reading == Reading(value, NOW - 15)
    # a scalar answer likewise; an integer timestamp is a number too
    reading, why = to_reading([int(NOW), text], NOW, 180.0)
    assert why is None and reading == Reading(value, NOW)


def test_a_stale_or_future_sample_is_unknown():
    reading, why = to_reading(_vector([NOW - 181, "57"]), NOW, 180.0)
    assert reading is None and why is not None and why.startswith("stale")
    reading, why = to_reading(_vector([NOW + 600, "57"]), NOW, 180.0)
    assert reading is None and why is not None and why.startswith("stale")
    # without an allowed age the reader passes it on dated; the planner's clock judges it
    reading, _ = to_reading(_vector([NOW - 181, "57"]), NOW)
    assert reading is not None and reading.fresh(NOW, 180.0) is None
    assert reading.fresh(NOW - 100, 180.0) == 57.0


class _Answers:
    def __init__(self, answers: dict[str, object]):
        self.answers = answers

    def custom_query(self, query: str) -> object:
        return self.answers[query]


def test_read_metrics_marks_stale_and_malformed_answers_unknown_and_says_why():
    client = _Answers({
        "fresh": _vector([NOW - 5, "57"]),
        "stale": _vector([NOW - 900, "57"]),
        "bare": _vector("57"),
    })
    snap = read_metrics(client, {k: k for k in client.answers}, NOW, max_age_seconds=180.0)
    assert isinstance(snap, MetricsSnapshot)
    assert snap.readings["fresh"] == Reading(57.0, NOW - 5)
    assert snap.readings["stale"] is None and snap.failures["stale"].startswith("stale")
    assert snap.readings["bare"] is None and snap.failures["bare"].startswith("malformed")
