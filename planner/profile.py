"""Performance profile of one instance per role, loaded from YAML.

A profile is a set of measured numbers a user can replace with their own; the loader's only job
is to turn a file into a validated :class:`Profile` and to say exactly which field is wrong
when it is not."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_PROFILE = "deepseek-fp8-8xh200-sglang"


class ProfileError(ValueError):
    """A profile file is missing, unreadable or has an invalid field (named in the message)."""


#: every number of a profile is 0 or within these magnitudes: a measured time, rate or size
#: outside them (1e-300 tokens/s, 1e308 bytes) is no measurement, and the planner's divisions
#: by them would overflow
SANE_MIN = 1e-15
SANE_MAX = 1e12


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: a misspelt field silently falling back to
    # a default would make every plan wrong without a trace. No infinity or NaN either.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _sane_numbers(self) -> _Strict:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value != 0 and not SANE_MIN <= abs(value) <= SANE_MAX:
                raise ValueError(f"{name} {value!r} is outside the sane range "
                                 f"[{SANE_MIN:g}, {SANE_MAX:g}] (or 0)")
        return self


class PrefillProfile(_Strict):
    tokens_per_second: float = Field(gt=0, description="uncached prompt tokens/s at short prompts")
    attention_doubling_tokens: float | None = Field(
        default=None, gt=0, description="context length at which per-token cost doubles; None = flat"
    )
    overhead_seconds: float = Field(default=0.0, ge=0)
    prefix_cache_tokens: int = Field(gt=0)
    block_tokens: int = Field(gt=0)


class DecodeProfile(_Strict):
    step_seconds: float = Field(ge=0, description="TPOT at batch 1 and zero context")
    per_sequence_seconds: float = Field(ge=0)
    per_context_token_seconds: float = Field(ge=0)
    kv_capacity_tokens: int = Field(gt=0)
    max_batch: int = Field(gt=0)

    @model_validator(mode="after")
    def _a_step_takes_time(self) -> DecodeProfile:
        # every decode sizing divides by the TPOT these terms give: a decode that costs
        # nothing would serve any load on one instance, and the planner would divide by zero
        if self.step_seconds == self.per_sequence_seconds == self.per_context_token_seconds == 0:
            raise ValueError("step_seconds, per_sequence_seconds and per_context_token_seconds are "
                             "all 0: a decode step must take time (set step_seconds, the TPOT at "
                             "batch 1)")
        return self


class KvTransferProfile(_Strict):
    bytes_per_token: float = Field(ge=0)
    gigabytes_per_second: float = Field(gt=0)
    setup_seconds: float = Field(default=0.0, ge=0)


class WarmupProfile(_Strict):
    new_node_seconds: float = Field(ge=0)
    role_switch_seconds: float = Field(ge=0)


class InstanceShape(_Strict):
    """The whole nodes one instance of each role spans in the deployment a profile describes."""

    prefill: int = Field(ge=1, le=32)
    decode: int = Field(ge=1, le=32)


class Profile(_Strict):
    """Validated performance profile (see ``profiles/*.yaml`` for the meaning of each field)."""

    name: str
    gpus_per_instance: int = Field(gt=0)
    #: the instance shape the capacities are one instance of (nodes per prefill and per decode
    #: instance); the planner refuses a spec of another shape. None: not stated, not checked
    nodes_per_instance: InstanceShape | None = None
    prefill: PrefillProfile
    decode: DecodeProfile
    kv_transfer: KvTransferProfile
    warmup: WarmupProfile
    #: where the numbers came from (``pdscale profile fit`` writes the tool, date, points and
    #: residuals here); for people and status, never read by the planner
    provenance: dict[str, Any] | None = None


def shape_problem(profile: Profile, nodes_per_instance: tuple[int, int]) -> str | None:
    """Why ``profile`` cannot plan instances of ``nodes_per_instance`` (prefill, decode nodes
    each), or None. Its capacities are one instance of the shape it states: read as another
    shape's, a group of 4 nodes would be planned as one node's capacity, or the reverse. A
    profile that states no shape is not checked."""
    shape = profile.nodes_per_instance
    if shape is None or (shape.prefill, shape.decode) == tuple(nodes_per_instance):
        return None
    kp, kd = nodes_per_instance
    return (f"profile {profile.name!r} describes instances of {shape.prefill} prefill / "
            f"{shape.decode} decode nodes (its nodes_per_instance), but "
            f"spec.prefill.nodesPerInstance is {kp} and spec.decode.nodesPerInstance is {kd}: "
            f"give a profile of that shape (spec.planner.profile)")


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        parts.append(f"field '{field}': {err['msg']}")
    return f"invalid profile {source}: " + "; ".join(parts)


def parse_profile(data: Any, *, source: str = "<data>") -> Profile:
    """Validate a mapping (already parsed YAML) into a :class:`Profile`.

    Raises
    ------
    ProfileError
        With every offending field named by its dotted path, e.g. ``prefill.tokens_per_second``.
    """
    if not isinstance(data, dict):
        raise ProfileError(f"invalid profile {source}: top level must be a mapping")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_describe(exc, source)) from None


#: a shipped profile's name: what a PDCluster may name (never a path)
PROFILE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: a profile file is a few KiB; anything far larger is not one (and is not read whole)
MAX_PROFILE_BYTES = 256 * 1024


def shipped_profiles() -> list[str]:
    """The names of the profiles that ship with pdscale."""
    folder = resources.files(__package__ or "pdscale.planner").joinpath("profiles")
    return sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))


def shipped_profile(name: str | None = None) -> Profile:
    """A shipped profile by name (the default if None). This is what the operator loads for a
    PDCluster's ``spec.planner.profile``: a tenant names a profile, it never opens a file."""
    name = DEFAULT_PROFILE if name is None else name
    if not PROFILE_NAME.match(name) or name not in shipped_profiles():
        raise ProfileError(f"no shipped profile named {name!r}; shipped: {shipped_profiles()}")
    text = resources.files(__package__ or "pdscale.planner").joinpath("profiles", f"{name}.yaml").read_text()
    return parse_profile_text(text, source=f"{name} (shipped)")


def load_profile(path_or_name: str | Path | None = None) -> Profile:
    """For the command line: a profile from a YAML file the user names, or a shipped profile
    by name (the default if None)."""
    if path_or_name is None or (isinstance(path_or_name, str) and PROFILE_NAME.match(path_or_name)
                                and not Path(path_or_name).exists()):
        return shipped_profile(None if path_or_name is None else str(path_or_name))
    path = Path(path_or_name)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"profile {path} is over {MAX_PROFILE_BYTES // 1024} KiB: not a profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"profile {path} is not UTF-8 text") from None
    return parse_profile_text(text, source=str(path))


def parse_profile_text(text: str, *, source: str = "<text>") -> Profile:
    """A profile from YAML text, read with bounds (every caller's one reader: the command
    line's file, a tenant's ConfigMap, a shipped profile): at most MAX_PROFILE_BYTES, and
    whatever the YAML parser or its constructors raise (too deep, an integer of 5,000 digits,
    a date that is no date) becomes a ProfileError, never another exception.

    Raises
    ------
    ProfileError
        Naming ``source`` and what is wrong."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(f"invalid profile {source}: {size} bytes, over the "
                           f"{MAX_PROFILE_BYTES // 1024} KiB a profile may have")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"invalid profile {source}: not YAML ({_one_line(exc)})") from None
    except RecursionError:
        raise ProfileError(f"invalid profile {source}: nested too deep") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProfileError(f"invalid profile {source}: a value cannot be read "
                           f"({type(exc).__name__}: {_one_line(exc)})") from None
    try:
        return parse_profile(data, source=source)
    except RecursionError:
        raise ProfileError(f"invalid profile {source}: nested too deep") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]



def scaled_profile(profile: Profile, *, prefill_speed: float = 1.0, decode_speed: float = 1.0) -> Profile:
    """``profile`` for hardware ``prefill_speed``/``decode_speed`` times as fast: every compute
    time divided by the speed (prefill tokens/s times it, its overhead and every decode term
    divided), capacities and warm-ups unchanged. A replay's "fleet 25% slower than its profile"
    is ``prefill_speed=0.8`` (each prefill takes 1.25x as long). Raises ProfileError for a speed
    that is not a positive finite number."""
    for name, speed in (("prefill_speed", prefill_speed), ("decode_speed", decode_speed)):
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.0 < speed < float("inf"):
            raise ProfileError(f"{name} must be a positive finite number, got {speed!r}")
    if prefill_speed == 1.0 and decode_speed == 1.0:
        return profile
    p, d = profile.prefill, profile.decode
    return profile.model_copy(update={
        "name": f"{profile.name}@prefill-x{prefill_speed:g},decode-x{decode_speed:g}",
        "prefill": p.model_copy(update={
            "tokens_per_second": p.tokens_per_second * prefill_speed,
            "overhead_seconds": p.overhead_seconds / prefill_speed,
        }),
        "decode": d.model_copy(update={
            "step_seconds": d.step_seconds / decode_speed,
            "per_sequence_seconds": d.per_sequence_seconds / decode_speed,
            "per_context_token_seconds": d.per_context_token_seconds / decode_speed,
        }),
    })


def capped_profile(profile: Profile, decode_batch_cap: int | None) -> Profile:
    """``profile`` on engines whose decode batch is capped at ``decode_batch_cap`` sequences per
    instance (SGLang's ``--max-running-requests``, vLLM's ``--max-num-seqs``): the deployment's
    cap, not the hardware's, so it lowers ``decode.max_batch`` and never raises it. None: no
    cap, the profile as it is."""
    if decode_batch_cap is None or decode_batch_cap >= profile.decode.max_batch:
        return profile
    if decode_batch_cap < 1:
        raise ProfileError(f"a decode batch cap must be at least 1, got {decode_batch_cap}")
    return profile.model_copy(update={
        "decode": profile.decode.model_copy(update={"max_batch": decode_batch_cap})})


def instance_batch_cap(flag: str, value: int, data_parallel_size: int) -> int:
    """Sequences one instance runs for an engine's batch-cap ``flag`` set to ``value``: SGLang's
    ``--max-running-requests`` is the instance's, split among its DP ranks and rounded down to a
    multiple of them (``Scheduler.__init__``: ``per_dp_max_running_requests``); vLLM's
    ``--max-num-seqs`` is each DP rank's, every rank being its own engine core with its own
    scheduler. The operator (``engines.decode_batch_cap``) and the simulated engines read a
    cap through this one rule."""
    if flag == "--max-num-seqs":
        return value * data_parallel_size
    return value // data_parallel_size * data_parallel_size
