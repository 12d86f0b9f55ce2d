"""The routers' worker list, whatever the router: one interface, chosen once per PDCluster
from its router kind, so the loop and the drains never ask which router they talk to.

Two implementations: ``routersync.SGLangWorkerList`` over the ``/workers`` API of
sglang-router or smg, and ``vllm_discovery.DiscoveryWorkerList`` over vllm-router's ZMQ
discovery (it has no worker API; the operator announces the pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from pdscale.operator.api.pdcluster import PDClusterSpec, RouterKind
from pdscale.operator.clients.routersync import SGLangWorkerList, WorkerSpec
from pdscale.operator.clients.vllm_discovery import Announcer, DiscoveryWorkerList
from pdscale.operator.render import router
from pdscale.planner.observe import Role

from .fleet import PodView, router_workers


class WorkerList(Protocol):
    """What the loop needs of a PDCluster's routers."""

    @property
    def addresses(self) -> tuple[str, ...]:
        """The routers spoken to (their API or discovery addresses)."""
        ...

    @property
    def decode_picked_before_prefill(self) -> bool:
        """The router picks a request's decode on arrival and calls it after the prefill
        answered: a decode that left it waits out the requests held at the prefills."""
        ...

    def listed(self) -> set[str] | None:
        """Normalized worker URLs some router may still send new requests to; None when that
        is unknown (then every pod counts as listed)."""
        ...

    def make_equal(self, desired: frozenset[WorkerSpec]) -> None:
        """Make every router list exactly ``desired`` (best effort: failures wait for the
        next tick)."""
        ...


def desired_workers(spec: PDClusterSpec, pods: Mapping[Role, Sequence[PodView]],
                    leaving: frozenset[str] = frozenset()) -> frozenset[WorkerSpec]:
    """What the routers list: exactly the Ready, non-draining pods, minus those about to
    drain (a pod leaves the router before it is marked, so no one ever sees a draining pod
    listed)."""
    return router_workers([p for role in Role for p in pods[role] if p.name not in leaving],
                          port=spec.engine.port, bootstrap_port=spec.kv_transfer.bootstrap_port)


def router_urls(spec: PDClusterSpec, routers: Sequence[PodView]) -> list[str]:
    """SGLang router API base URLs: not deleting, with an IP, and Ready for sglang-router.
    Not only Ready routers for smg: its /readiness answers 503 until it has a healthy worker,
    and only the operator gives it one (a starting smg that cannot answer yet makes the
    listing unknown, never empty)."""
    return [f"http://{p.ip}:{spec.router.port}" for p in routers
            if p.ip and (p.ready or router.smg(spec)) and not p.deleting]


def discovery_addresses(spec: PDClusterSpec, routers: Sequence[PodView]) -> list[str]:
    """vllm-router discovery sockets. Not only Ready routers: vllm-router is not Ready until
    it has workers."""
    return [f"{p.ip}:{spec.router.discovery_port}" for p in routers if p.ip and not p.deleting]


class WorkerLists:
    """The factory, one per operator: it keeps what outlives a tick (the vLLM announcer)."""

    def __init__(self, announcer: Announcer):
        self.announcer = announcer

    def of(self, spec: PDClusterSpec, routers: Sequence[PodView]) -> WorkerList:
        """The worker list of one PDCluster's ``routers`` (its router pods, as seen now)."""
        if router.kind(spec) is RouterKind.VLLM:
            return DiscoveryWorkerList(self.announcer, tuple(discovery_addresses(spec, routers)))
        return SGLangWorkerList(router_urls(spec, routers))

    def keep_only(self, addresses: Iterable[str]) -> None:
        """Let go of every router not in ``addresses`` (gone since the last tick)."""
        self.announcer.forget(addresses)
