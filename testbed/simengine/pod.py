"""The simulated engine as a pod's container runs it (the kind tier's serving image).

There the operator's rendered command runs as it is: ``python3 -m sglang.launch_server
<SGLang's flags>``. The image's ``sglang.launch_server`` calls ``main`` here, which reads the
flags the sim needs from SGLang's (role, port, bootstrap port, model path and name, and the
ones ``engine_flags`` keeps) and runs the sim on the pod's own addresses (``--pod-network``:
inside a pod's network namespace, 0.0.0.0 is the pod's address, not the machine's).

Pod environment the sim reads (set through ``spec.engine.env``): ``PDSCALE_SIM_PROFILE`` (the
planner profile that times it, default ``demo-sim``), ``PDSCALE_SIM_STARTUP_SECONDS`` (its
warm-up, default 0) and ``PDSCALE_SIM_TIME_COMPRESSION`` (default 1).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from .cli import engine_flags
from .cli import main as sim_main

#: SGLang's flag -> the sim's, for flags taking one value that the sim reads as they are
_SAME_VALUE = {
    "--port": "--port",
    "--disaggregation-bootstrap-port": "--bootstrap-port",
    "--model-path": "--model-path",
    "--served-model-name": "--model-name",
}


def _value(argv: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag v`` or ``--flag=v``)."""
    found = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name == flag:
            found = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def sim_argv(engine_argv: list[str], env: Mapping[str, str]) -> list[str]:
    """The sim's command line for SGLang's ``engine_argv`` (what follows ``launch_server``)
    in a pod with environment ``env``. Pure. Refuses (ValueError) a command line that is not a
    prefill or decode instance of a PD deployment."""
    role = _value(engine_argv, "--disaggregation-mode")
    if role not in ("prefill", "decode"):
        raise ValueError(f"--disaggregation-mode must be prefill or decode, got {role!r}")
    out = ["--role", role, "--host", _value(engine_argv, "--host") or "0.0.0.0", "--pod-network"]
    for theirs, ours in _SAME_VALUE.items():
        value = _value(engine_argv, theirs)
        if value is not None and not (ours == "--bootstrap-port" and role == "decode"):
            out += [ours, value]
    if "--port" not in out:
        out += ["--port", "30000"]  # SGLang's default
    out += ["--profile", env.get("PDSCALE_SIM_PROFILE", "demo-sim"),
            "--startup-seconds", env.get("PDSCALE_SIM_STARTUP_SECONDS", "0"),
            "--time-compression", env.get("PDSCALE_SIM_TIME_COMPRESSION", "1"),
            # a pod's grace period ends a drain that runs longer anyway
            "--drain-timeout-seconds", "600"]
    return out + engine_flags(engine_argv)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m sglang.launch_server ...`` in the serving image."""
    try:
        args = sim_argv(sys.argv[1:] if argv is None else argv, os.environ)
    except ValueError as exc:
        print(f"simulated sglang.launch_server: {exc}", file=sys.stderr)
        return 2
    print("simulated sglang.launch_server: python -m pdscale.testbed.simengine " + " ".join(args),
          flush=True)
    return sim_main(args)
