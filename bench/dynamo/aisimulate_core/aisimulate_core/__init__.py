"""Placeholder for aisimulate_core (NVIDIA AI Configurator), which is not installable here.

Dynamo's planner imports these names at module level; only its AIC-estimator mode calls them.
Every name raises when used so that mode fails loudly instead of planning with nothing.
"""


class AicNotAvailable(RuntimeError):
    pass


def _unavailable(name):
    def raiser(*args, **kwargs):
        raise AicNotAvailable(
            f"aisimulate_core.{name}: the AI Configurator estimator is not installed in this "
            "environment (pdscale placeholder); use Dynamo's profile-interpolation or "
            "forward-pass-regression mode"
        )

    raiser.__name__ = name
    return raiser
