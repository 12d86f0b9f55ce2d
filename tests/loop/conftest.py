"""Fixtures for the loop tests; the process harness is in loop_harness.py."""

from __future__ import annotations

import random

import pytest
from loop_harness import Fleet


@pytest.fixture
def fleet(tmp_path):
    # a private /24 per test, so concurrent runs and leftovers never share an address
    net = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
    f = Fleet(tmp_path, net)
    yield f
    f.close()
    stray = [p.name for p in f.procs if p.popen.poll() is None]
    assert not stray, f"processes left running: {stray}"
