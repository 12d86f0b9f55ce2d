from __future__ import annotations

import pytest

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile


@pytest.fixture(scope="session")
def model() -> PerformanceModel:
    return PerformanceModel(load_profile())
