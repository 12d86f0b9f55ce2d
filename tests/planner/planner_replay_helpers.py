"""Replay setups for tests, configured as ``pdscale replay`` configures them, and the
benchmark scripts' modules (bench/ is scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pdscale.planner.replay.run import ReplaySetup
from pdscale.planner.replay.traces import Trace
from pdscale.replay import configure, default_spec


def replay_setup(trace: Trace, *, ttft_seconds: float = 2.0, tpot_seconds: float = 0.05,
                 nodes: int = 64, percentile: int = 99, **fleet: Any) -> ReplaySetup:
    """A replay of ``trace`` whose planner is configured as the operator would configure it
    for a PDCluster of the CRD's defaults with these fields (``pdscale replay`` without
    ``-f``); each role may take the whole budget. ``fleet``: the simulation's own knobs."""
    configured = configure(default_spec(), spec_source="test", overrides={
        "--slo-ttft": ttft_seconds, "--slo-tpot": tpot_seconds, "--nodes": nodes,
        "--percentile": percentile, "--max-prefill": nodes, "--max-decode": nodes,
    })
    return ReplaySetup(trace=trace, planner=configured.config, **fleet)


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as module ``name`` (once)."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
