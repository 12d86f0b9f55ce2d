"""pdscale: operator and autoscaling planner for prefill/decode disaggregated LLM serving.

The command line lives here; the operator and the planner are the subpackages
``pdscale.operator`` and ``pdscale.planner`` (folders ``operator/`` and ``planner/``).
"""

from .main import main

__all__ = ["main"]
