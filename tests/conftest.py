# Fixtures for tests that need the real control plane or Prometheus (see pdscale.testbed.fixtures),
# and how `make test` spreads tests/ over two pytest-xdist workers.
from __future__ import annotations

import os
from typing import Any

import pytest

from pdscale.testbed.fixtures import (  # noqa: F401
    admin_api,
    cluster,
    lws_controller,
    namespace,
    prometheus,
)

#: modules that share a session fixture too costly to build twice run on one worker, as one
#: unit: the fixture, then the modules that use it (a module is always one unit)
SHARED_SESSION_FIXTURES = {
    # one `pdscale profile run` with the real aiperf, about 4 minutes (tests/planner/conftest.py)
    "aiperf_sweep": ("tests/planner/test_profile_fit_closed.py",
                     "tests/planner/test_profile_run_closed.py"),
}
UNIT_OF_MODULE = {module: fixture for fixture, modules in SHARED_SESSION_FIXTURES.items()
                  for module in modules}
#: the markers of tests that wait on wall-clock (a control plane, Prometheus, live engines)
WAITING = ("slow", "cluster", "prometheus")


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared fixture its module uses."""
    module = nodeid.split("::", 1)[0]
    return UNIT_OF_MODULE.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the modules of one shared session fixture as one unit.
    (xdist's own ``--dist loadgroup`` reads the ``xdist_group`` mark through a node id that
    pytest 9.2 no longer lets it change, and then groups nothing: pytest-xdist issue 1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return ByUnit(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On an xdist worker (the workers collect, the scheduler hands out units in collection
    order): the units that wait on wall-clock first, the pure, CPU-bound ones last. Two
    waiting units side by side leave each other the CPU they need, and the many short pure
    tests even out the two workers' ends. A module keeps its own order; a run without workers
    keeps the collection as it is. A module that uses a shared fixture outside its unit would
    build it again on the other worker: that is refused here."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    waiting: set[str] = set()
    for item in items:
        for fixture in SHARED_SESSION_FIXTURES:
            if fixture in getattr(item, "fixturenames", ()) and unit(item.nodeid) != fixture:
                raise pytest.UsageError(f"{item.nodeid} uses {fixture}: add its module to "
                                        f"SHARED_SESSION_FIXTURES in tests/conftest.py")
        if any(item.get_closest_marker(m) for m in WAITING):
            waiting.add(unit(item.nodeid))
    items.sort(key=lambda item: unit(item.nodeid) not in waiting)  # stable
