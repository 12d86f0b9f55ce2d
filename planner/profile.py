"""Performance profile of one instance per role, loaded from YAML.

A profile is a set of measured numbers a user can replace with their own; the loader's only job
is to turn a file into a validated :class:`Profile` and to say exactly which field is wrong
when it is not."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_PROFILE = "deepseek-fp8-8xh200-sglang"


class ProfileError(ValueError):
    """A profile file is missing, unreadable or has an invalid field (named in the message)."""


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: a misspelt field silently falling back to
    # a default would make every plan wrong without a trace.
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class KvTransferProfile(_Strict):
    bytes_per_token: float = Field(ge=0)
    gigabytes_per_second: float = Field(gt=0)
    setup_seconds: float = Field(default=0.0, ge=0)


class WarmupProfile(_Strict):
    new_node_seconds: float = Field(ge=0)
    role_switch_seconds: float = Field(ge=0)


class Profile(_Strict):
    """Validated performance profile (see ``profiles/*.yaml`` for the meaning of each field)."""

    name: str
    gpus_per_instance: int = Field(gt=0)
    prefill: PrefillProfile
    decode: DecodeProfile
    kv_transfer: KvTransferProfile
    warmup: WarmupProfile


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


def load_profile(path_or_name: str | Path | None = None) -> Profile:
    """Load a profile from a YAML file path, or a shipped profile by name (default if None)."""
    if path_or_name is None:
        path_or_name = DEFAULT_PROFILE
    path = Path(path_or_name)
    if path.suffix not in (".yaml", ".yml") and not path.exists():
        text = (
            resources.files(__package__ or "pdscale.planner")
            .joinpath("profiles", f"{path_or_name}.yaml")
            .read_text()
        )
        source = f"{path_or_name} (shipped)"
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
        source = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"invalid profile {source}: not YAML ({exc})") from None
    return parse_profile(data, source=source)
