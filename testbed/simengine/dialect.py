"""What differs between the engines the sim imitates: one :class:`Dialect` object per engine.

The engine core (:mod:`.engine`) queues, times and counts the same way for every dialect; a
dialect adds its own endpoints, names its metrics and says how its router hands the KV of a
request from prefill to decode. Every hook is abstract, so each dialect's module states its
whole difference in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .metrics import SGLANG_PROMPT_TOKENS_BUCKETS

if TYPE_CHECKING:
    from aiohttp import web

    from pdscale.planner.observe import Role

    from .config import EngineConfig
    from .metrics import Metrics
    from .room import Room


class EngineCore(Protocol):
    """What a dialect reads of its engine (:class:`~.engine.SimEngine` is the one): the engine
    imports the dialects, so they name it by this interface and not by import."""

    config: EngineConfig
    metrics: Metrics
    role: Role
    engine_id: str
    #: the gauges as last logged
    logged: dict[str, float]

    def inflight(self) -> int: ...
    def kv_held(self) -> int: ...
    def queues(self) -> dict[str, int]: ...
    def used_tokens(self) -> int: ...
    def token_capacity(self) -> int: ...
    def token_usage(self) -> float: ...
    async def handle_generate(self, request: web.Request, api: str) -> web.StreamResponse: ...
    async def handle_health(self, request: web.Request) -> web.Response: ...


class Dialect(ABC):
    """One engine's API on top of a :class:`~.engine.SimEngine` (``self.engine``, an
    :class:`EngineCore`)."""

    #: the ``--dialect`` value
    name: ClassVar[str]
    #: a prefill request waits in a bootstrap queue until its decode asks for its room
    #: (SGLang), or is computed at once because its decode is sent only afterwards (vLLM)
    waits_for_handshake: ClassVar[bool]
    #: a prefill request finishes (answers, is counted) only once its KV reached the decode
    #: (SGLang), or right after it is computed (vLLM, whose KV then stays pinned)
    finishes_after_transfer: ClassVar[bool]
    #: computed KV nobody pulled is freed after ``kv_lease_seconds`` (vLLM's NIXL lease)
    pins_kv: ClassVar[bool]

    def __init__(self, engine: EngineCore) -> None:
        """Raises ValueError for an engine configuration this dialect cannot serve."""
        self.engine = engine

    # -- HTTP -------------------------------------------------------------------------------
    @abstractmethod
    def add_routes(self, router: web.UrlDispatcher) -> None:
        """The dialect's own endpoints, besides the ones every engine has (the OpenAI API,
        ``/health``, ``/v1/models``, ``/metrics`` and the sim's ``/sim/...``)."""

    #: upstream default prompt-length buckets, tokens
    prompt_buckets: ClassVar[tuple[float, ...]] = SGLANG_PROMPT_TOKENS_BUCKETS

    @abstractmethod
    def default_buckets(self) -> tuple[tuple[float, ...], ...]:
        """Upstream default buckets (TTFT, inter-token latency, e2e latency), seconds."""

    @abstractmethod
    def render_metrics(self) -> str:
        """``/metrics``: the engine's counters under this dialect's names and labels."""

    # -- the KV hand-off --------------------------------------------------------------------
    @abstractmethod
    def prefill_room(self, body: dict[str, Any]) -> Any:
        """The room whose KV this prefill request leaves for a decode to collect, or None."""

    @abstractmethod
    def refused_room(self, body: dict[str, Any]) -> Any:
        """The room a refused prefill request must fail at once (its decode half waits on
        it), or None."""

    @abstractmethod
    def kv_source(self, body: dict[str, Any]) -> tuple[Any, Any, Any]:
        """(host, port, room) of the prefill holding a decode request's KV; host or room None
        means the decode prefills the prompt itself."""

    @abstractmethod
    def answer_prefill(self, room: Room, room_id: Any) -> dict[str, Any]:
        """Count a prefill answered for ``room``; extra fields of its answer body."""

    @abstractmethod
    def output_chunk_tokens(self, stream: bool) -> int:
        """Tokens per output chunk the engine delivers (and observes TTFT/ITL on)."""

    # -- what else gets counted -------------------------------------------------------------
    @abstractmethod
    def count_local_prefill(self, input_tokens: int, cached_tokens: int) -> None:
        """A decode instance prefilled a prompt itself."""

    @abstractmethod
    def count_first_token(self, meta: dict[str, Any]) -> None:
        """A decode request produced its first token (``meta``: its prompt and cached tokens)."""

    @abstractmethod
    def count_token(self) -> None:
        """A decode request produced one token."""

    @abstractmethod
    def count_decode_done(self, meta: dict[str, Any], tokens: list[str], n_out: int) -> None:
        """A decode request was answered in full with ``n_out`` tokens."""
