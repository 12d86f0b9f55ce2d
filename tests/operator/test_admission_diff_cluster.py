"""The chart's admission policy (CEL, on a real API server) and the operator's tenant policy
(Python) agree: bench/admission_diff.py's seeded generator, 600 documents under the default,
a strict and an open policy, created with dryRun. The bench runs 20,000
(`.venv/bin/python bench/admission_diff.py`)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _bench():
    spec = importlib.util.spec_from_file_location("admission_diff", ROOT / "bench" / "admission_diff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("admission_diff", module)
    spec.loader.exec_module(module)
    return module


def test_admission_and_the_operator_refuse_the_same_documents(admin_api):
    result = _bench().run(600, 1, 4, admin_api)
    assert result["server_schema_examples"] == [], result["server_schema_examples"]
    assert result["disagreements"] == 0, result["examples"][:3]
    # the generator reaches both verdicts under every policy, or the comparison says little
    for policy in ("default", "strict", "open"):
        assert result["outcomes"].get(f"{policy}:accepted", 0) > 0
        assert result["outcomes"].get(f"{policy}:refused", 0) > 0
