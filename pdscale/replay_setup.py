"""What a replay of a PDCluster runs: the planner's configuration read from its spec
(:class:`Configured`, made by :func:`pdscale.replay.configure`) and the simulated fleet, routed
and admitted as the spec's router is rendered (:func:`fleet_setup`). ``pdscale replay`` and its
Prometheus re-plan and simulation (``prometheus_replay``, ``prometheus_simulate``) share them;
the command line's flags stay in :mod:`pdscale.replay`."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdscale.operator.api.pdcluster import PDClusterSpec
    from pdscale.planner.config import PlannerConfig
    from pdscale.planner.replay.router_admission import PrefillAdmission


@dataclass(frozen=True)
class Configured:
    """The planner's configuration for a replay, and where each spec field it reads came
    from: rows of (field as in the PDCluster, value, source)."""

    spec: PDClusterSpec
    config: PlannerConfig
    sources: tuple[tuple[str, str, str], ...]

    def as_json(self) -> dict[str, dict[str, Any]]:
        return {name: {"value": value, "from": source} for name, value, source in self.sources}


#: a PDCluster's routing policy -> the replay's router of that name (planner/replay/routers.py
#: for prefill, decode_batches.py for decode)
_ROUTING = {"CacheAware": "cache-aware", "RoundRobin": "round-robin",
            "PowerOfTwo": "power-of-two", "Random": "random"}


def routing(spec: PDClusterSpec) -> dict[str, str]:
    """The replay's ``router`` and ``decode_router`` for the policies the spec's router is
    rendered with (``router.prefillPolicy``, ``router.decodePolicy``) as that router applies
    them; the deployed stack's defaults for a spec of defaults.

    sglang-router 0.3.2 (router.gateway SGLangRouter) routes PD prefills at random under CacheAware:
    its PD prefill policy never gets a prefix tree (tests/loop/test_router_prefill_tree.py);
    smg 1.13 (the default gateway) keeps prefixes on a prefill by its own rule (``smg-cache-aware``: its tree takes
    the prefix at routing, a per-request load gate, least loaded otherwise; docs/routers.md).
    vllm-router is a fork of sgl-router whose PD tree we have not observed: it is replayed by
    its policy's rule."""
    from pdscale.operator.api.pdcluster import RoutingPolicy
    from pdscale.operator.render import router
    from pdscale.planner.replay.run import STACKS

    if getattr(spec, "router", None) is None:
        return {k: STACKS["deployed"][k] for k in ("router", "decode_router")}
    prefill = router.prefill_choice(spec)
    name = ("smg-cache-aware" if prefill is RoutingPolicy.CACHE_AWARE and router.smg(spec)
            else _ROUTING[prefill.value])
    return {"router": name, "decode_router": _ROUTING[spec.router.decode_policy.value]}


def router_admission(spec: PDClusterSpec) -> PrefillAdmission | None:
    """The prefill admission the spec's router applies, exactly as the operator renders it
    (smg's, on by default and derived where ``router.admission`` leaves a value unset, from
    the spec's shipped profile: operator/render/admission.py), whatever ``--profile`` the replay
    plans with; None when the router admits everything. A spec of defaults (no ``-f``) has
    the default router: smg with derived admission."""
    from pdscale.operator.api.pdcluster import EngineKind, EngineSpec, RouterSpec
    from pdscale.operator.render import router
    from pdscale.planner.replay.router_admission import PrefillAdmission

    if getattr(spec, "router", None) is None:  # a spec of defaults (no -f) has no router
        spec = spec.model_copy(update={
            "router": RouterSpec.model_construct(),
            "engine": EngineSpec.model_construct(kind=EngineKind.SGLANG, extra_args=[])})
    adm = router.admission(spec)
    if adm is None:
        return None
    return PrefillAdmission(adm.prefill_inflight_per_worker, adm.queue_size,
                            float(adm.queue_timeout_seconds))


def spec_replicas(spec: PDClusterSpec) -> tuple[int, int]:
    """(prefill, decode) replicas the spec asks for: where the operator starts the fleet."""
    return spec.prefill.replicas, spec.decode.replicas


def fleet_setup(args: argparse.Namespace, trace: Any, configured: Configured, truth: Any) -> Any:
    """The replay's fleet: the stack named, routed and admitted as the spec's router is
    rendered on the deployed stack (the what-if stacks keep their own), flags overriding."""
    from pdscale.planner.replay.run import STACKS, ReplaySetup

    stack = STACKS[args.stack]
    deployed = args.stack == "deployed"
    routes = routing(configured.spec) if deployed else stack
    # a what-if stack's router sends each prefill where it is served soonest: one pool
    config = configured.config if deployed else dataclasses.replace(configured.config,
                                                                     prefill_queue="pooled")
    return ReplaySetup(
        trace=trace, planner=config, engine=stack["engine"],
        router=args.router or routes["router"],
        decode_router=args.decode_router or routes["decode_router"],
        early_rejection=stack["early_rejection"] if args.early_rejection is None else True,
        decode_admission=args.decode_admission, fleet_model=truth,
        prefill_admission=router_admission(configured.spec) if deployed else None,
        tick_phase_seconds=args.tick_phase_seconds, join_delay_seconds=args.join_delay_seconds,
        scrape_seconds=args.scrape_seconds, scrape_lag_seconds=args.scrape_lag_seconds,
    )
