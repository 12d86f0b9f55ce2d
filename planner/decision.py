"""What the planner commands for the next interval, and why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Decision:
    """Target counts per role and the reasoning behind them.

    ``prefill``/``decode`` are the replica counts to command (ready + warming after this
    decision; draining instances are not counted). ``switch_to_prefill``/``switch_to_decode``
    say how many of the changes are role switches of existing nodes rather than new nodes or
    removals. Predicted latencies are at the SLO percentile for the first interval; ``inf``
    means the role is overloaded. ``cost_gpu_hours`` is the planned cost over the horizon.
    """

    at_seconds: float
    prefill: int
    decode: int
    predicted_ttft_seconds: float
    predicted_tpot_seconds: float
    cost_gpu_hours: float
    explanation: str
    switch_to_prefill: int = 0
    switch_to_decode: int = 0
    #: True when the budget could not meet the SLO over the horizon
    shortfall: bool = False
    #: True when the inputs were unknown and the previous decision was held
    held: bool = False
    #: per-interval plan over the horizon: (prefill, decode) serving counts
    plan: tuple[tuple[int, int], ...] = field(default=())
    #: the need of the first interval after the budget split (kept for the down-window)
    desired: tuple[int, int] = (0, 0)
    #: the most each role was forecast to need within one warm-up (kept for the down-window:
    #: what the planner itself expected to need again before a new node could be ready)
    lead_need: tuple[int, int] = (0, 0)
    #: how the programme was solved: "lp" (relaxation was integral), "milp", "lp-rounded"
    solver: str = ""
