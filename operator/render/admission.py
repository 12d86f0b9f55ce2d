"""The router's prefill admission: on by default in front of smg, derived from the profile
and the TTFT target (docs/admission.md).

smg 1.13 lets each prefill worker hold at most ``--prefill-max-inflight-requests-per-worker``
requests until its prefill answers; the rest wait at the router, oldest first, and one that
waited ``--prefill-queue-timeout-secs`` (whole seconds) or finds ``--prefill-queue-size``
waiting is refused at once with 429 (``model_gateway/src/worker/prefill_admission.rs`` at
smg 1.13.0). With no ``router.admission`` the operator derives both from what one prefill
pass costs at the profile's speed:

- a full pass carries ``pass_tokens`` prompt tokens (SGLang ``--chunked-prefill-size``, 8,192
  on 141 GB H200s; the prefill's own flag when the spec sets it) and takes
  ``pass_seconds`` = the profile's prefill time for that many tokens;
- the in-flight cap is the full passes that fit in **half** the TTFT target (at least 1):
  the requests a prefill holds are through it in half the target, even if each fills a pass;
- each router pod keeps its own count (smg has no shared admission state), so with several
  router replicas the cap is divided among them (at least 1 each);
- the queue timeout is what the target leaves after the engine's share (the cap's passes, at
  most half the target): in whole seconds rounded down (smg takes whole seconds), at least 1.

So a request admitted after waiting the whole timeout still gets its first token by the
target, and one that could not is refused fast instead of answered late. An explicit value
wins field by field; ``router.admission.enabled: false`` turns admission off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdscale.operator.api.pdcluster import EngineKind, PDClusterSpec
from pdscale.planner.model import PerformanceModel
from pdscale.planner.profile import Profile, ProfileError, shipped_profile

#: SGLang ``server_args.py`` sets ``chunked_prefill_size`` to 8,192 below 160 GB of GPU memory
#: (A100, H100, H20, H200); vLLM ``max_num_batched_tokens`` is 8,192 on such GPUs too. The
#: replay's engines use the same budget (planner/replay/prefill_batches.py ENGINES).
DEFAULT_PASS_TOKENS = 8192
#: the flag that sets a prefill pass's token budget, per engine
PASS_FLAG = {EngineKind.SGLANG: "--chunked-prefill-size", EngineKind.VLLM: "--max-num-batched-tokens"}
#: smg's --prefill-queue-size default when admission is on is 100; ours holds more, since a
#: request waits at most the queue timeout anyway
DEFAULT_QUEUE_SIZE = 256


@dataclass(frozen=True)
class Admission:
    """What the router is rendered with, and why (for render, status and events)."""

    prefill_inflight_per_worker: int
    queue_size: int
    queue_timeout_seconds: int
    #: one line: which values were derived, from what
    reason: str


def pass_tokens(spec: PDClusterSpec) -> int:
    """A prefill pass's token budget: the last ``--chunked-prefill-size`` (SGLang) or
    ``--max-num-batched-tokens`` (vLLM) of the engine's then the prefill's extra args, else the
    engine's default on H100/H200-class GPUs."""
    flag = PASS_FLAG[spec.engine.kind]
    value = DEFAULT_PASS_TOKENS
    args = [*spec.engine.extra_args, *spec.prefill.extra_args]
    for i, arg in enumerate(args):
        text = None
        if arg == flag and i + 1 < len(args):
            text = args[i + 1]
        elif arg.startswith(flag + "="):
            text = arg.split("=", 1)[1]
        if text is not None and text.lstrip("-").isdigit() and int(text) > 0:
            value = int(text)
    return value


def spec_profile(spec: PDClusterSpec) -> tuple[Profile, str]:
    """The profile the derivation reads when the caller has none: the spec's shipped
    ``planner.profile``, else the shipped default (also for a ``profileConfigMap``, which only
    the running operator reads: set ``router.admission`` explicitly there)."""
    name = spec.planner.profile
    try:
        profile = shipped_profile(name)
    except ProfileError:
        profile = shipped_profile(None)
    note = ("the default profile (a profileConfigMap is not read to render the router)"
            if spec.planner.profile_config_map is not None else f"profile {profile.name}")
    return profile, note


def derive(spec: PDClusterSpec, profile: Profile | None = None, *, smg: bool) -> Admission | None:
    """The admission the router is rendered with; None when it admits everything (admission
    switched off, or a router without admission: sglang-router and vllm-router).

    ``profile`` None: :func:`spec_profile`. Explicit fields win; see the module docstring for
    the derivation of the rest."""
    a = spec.router.admission
    if not smg or (a is not None and not a.enabled):
        return None
    if profile is None:
        profile, source = spec_profile(spec)
    else:
        source = f"profile {profile.name}"
    ttft = spec.slo.ttft_seconds
    tokens = pass_tokens(spec)
    pass_seconds = PerformanceModel(profile).prefill_seconds(tokens)
    derived: list[str] = []
    cap = a.prefill_inflight_per_worker if a is not None else None
    if cap is None:
        fleet_cap = max(1, math.floor(ttft / 2 / pass_seconds)) if pass_seconds > 0 else 1
        routers = max(1, spec.router.replicas)
        cap = max(1, fleet_cap // routers)
        derived.append(f"{cap} in flight per prefill (full {tokens}-token passes of "
                       f"{pass_seconds:.3g} s in half the {ttft:g} s TTFT target, {source}"
                       + (f"; {fleet_cap} shared by {routers} router pods" if routers > 1 else "")
                       + ")")
    timeout = a.queue_timeout_seconds if a is not None else None
    if timeout is None:
        engine_share = min(cap * max(1, spec.router.replicas) * pass_seconds, ttft / 2)
        timeout = max(1, math.floor(ttft - engine_share))
        derived.append(f"queue timeout {timeout} s (the {ttft:g} s TTFT target less the "
                       f"engine's {engine_share:.3g} s, whole seconds)")
    size = a.queue_size if a is not None else DEFAULT_QUEUE_SIZE
    reason = ("derived: " + "; ".join(derived)) if derived else "as set in router.admission"
    return Admission(cap, size, timeout, reason)
