"""Replay setups for tests, configured as ``pdscale replay`` configures them."""

from __future__ import annotations

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
