from __future__ import annotations

import pytest

from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import load_profile


@pytest.fixture(scope="session")
def model() -> PerformanceModel:
    return PerformanceModel(load_profile())


@pytest.fixture(scope="session")
def aiperf_sweep(tmp_path_factory: pytest.TempPathFactory):
    """One ``pdscale profile run`` with the real aiperf through the real router (about 6 minutes
    on two cores), shared by the two closed-loop tests: test_profile_run_closed.py checks the
    sweep, the profile and the ConfigMap it wrote; test_profile_fit_closed.py fits aiperf's own
    files the sweep kept. Each ran its own aiperf runs of the same fleet before (about 12
    minutes for the two)."""
    from closed_loop_aiperf import run_profile_sweep

    return run_profile_sweep(tmp_path_factory.mktemp("aiperf-sweep"))
