"""The PDPool spec: nodes shared by several PDClusters under one joint plan (docs/pools.md).

A PDPool is the cluster admin's object, not a PDCluster author's: it names its nodes, its
members and each member's priority and guarantee. Membership is decided here (and by who may
write PDPools: RBAC), never by a PDCluster: a PDCluster's ``spec.planner.pool`` only asks
to plan in a pool of its own namespace, and is refused (``pool_refusal``) unless the pool
lists it, so a tenant cannot claim nodes, a priority or a guarantee by writing its own spec.
A member's ``planner.nodeBudget`` stays its own cap within the pool.

The CRD (``crds/pdpools.pdscale.io.yaml``) is generated from these classes by ``crd.py``, as
the PDCluster's is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from .pdcluster import DEFAULT_GPU_PRODUCT, GPU_PRODUCT_LABEL, GROUP, VERSION, PoolRef, _Model

POOL_KIND = "PDPool"
POOL_PLURAL = "pdpools"
POOL_SINGULAR = "pdpool"
POOL_SHORT_NAMES = ["pdp"]
#: the most members one pool plans for (bounds the CEL rules' cost, and the joint solve)
MAX_POOL_MEMBERS = 64
#: the most nodes one pool spans
MAX_POOL_NODES = 100_000

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class PoolMember(_Model):
    """One PDCluster sharing the pool, in the pool's namespace."""

    name: str = Field(
        min_length=1, max_length=63, pattern=_DNS_LABEL,
        description="Name of the PDCluster, in the PDPool's namespace. The pool decides who "
        "is a member: a PDCluster cannot name a pool itself.",
    )
    priority: int = Field(
        default=0, ge=-1_000_000, le=1_000_000,
        description="Higher wins: every node a higher-priority member needs beyond the "
        "guarantees comes before any node of a lower one; the lowest priority gives up "
        "nodes first, through the usual drains. Equal priorities share by value per node.",
    )
    guaranteed_nodes: int = Field(
        default=0, ge=0, le=MAX_POOL_NODES,
        description="Nodes this member gets before any other member's non-guaranteed nodes, "
        "whatever the priorities, as long as it needs them. What it does not need is lent to "
        "the others and taken back (through their drains) when its need returns.",
    )


class PDPoolSpec(_Model):
    """Whole 8xH200 nodes shared by several PDClusters under one joint plan."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.members.all(a, self.members.exists_one(b, b.name == a.name))",
                    "message": "members: each PDCluster may be listed once",
                    "fieldPath": ".members",
                },
                {
                    "rule": "!has(self.nodes) || "
                            "self.members.map(m, m.guaranteedNodes).sum() <= self.nodes",
                    "message": "members' guaranteedNodes must not sum to more than nodes",
                    "fieldPath": ".members",
                },
            ]
        }
    )

    gpu_product: str = Field(
        default=DEFAULT_GPU_PRODUCT, min_length=1,
        description=f"Value of the {GPU_PRODUCT_LABEL} node label of the pool's nodes; the "
        "members' placement.gpuProduct must match it.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pool's nodes carry, within the GPU product: the pool is "
        "the nodes that match both. Members' engine pods are pinned to them.",
    )
    nodes: int | None = Field(
        default=None, ge=1, le=MAX_POOL_NODES,
        description="Nodes the members may hold together (ready, warming and draining). "
        "Unset: the number of nodes matching gpuProduct and nodeSelector, read each interval.",
    )
    members: list[PoolMember] = Field(
        default_factory=list, max_length=MAX_POOL_MEMBERS,
        description="The PDClusters sharing the pool, decided by the pool's author (the "
        "admin), never by the PDClusters' authors.",
    )
    horizon_seconds: int = Field(
        default=1800, ge=60, le=86400,
        description="How long a node moved between members is expected to serve its new "
        "member: its cold start costs warmupSeconds / horizonSeconds of its value, so a node "
        "moves only for a need that outweighs it.",
    )
    surplus_price_percent: int = Field(
        default=0, ge=0, le=100,
        description="Beyond a member's fair share (its even share of the pool), its fluid "
        "demand and its guarantee, a node is granted only while its value per node is at "
        "least this percent (100: a node the member's need rests on, warm; a new node is "
        "discounted by its cold start); the nodes priced out stay idle instead of holding a "
        "member's margin. 0 (the default) grants every node a member needs.",
    )

    @model_validator(mode="after")
    def _members_fit(self) -> PDPoolSpec:
        names = [m.name for m in self.members]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"members: each PDCluster may be listed once ({', '.join(dup)} twice)")
        guaranteed = sum(m.guaranteed_nodes for m in self.members)
        if self.nodes is not None and guaranteed > self.nodes:
            raise ValueError(f"members' guaranteedNodes sum to {guaranteed}, more than nodes "
                             f"{self.nodes}")
        return self


def pool_refusal(namespace: str, name: str, ref: PoolRef | None, gpu_product: str,
                 pool: Mapping[str, Any] | None) -> str | None:
    """Why PDCluster ``namespace/name``, whose ``spec.planner.pool`` is ``ref``, may not plan in
    the PDPool ``pool`` (its body as read, None when missing); None when it is a member (or
    names no pool). The message begins with the field it concerns. Pure: the reconcile
    reports it as a condition, the pool loop leaves the PDCluster out on it.

    A PDCluster only asks; the pool's author decides: a pool of another namespace is refused
    whatever it lists (a tenant cannot claim another tenant's nodes), and so is a pool that
    does not list it."""
    if ref is None:
        return None
    if ref.namespace is not None and ref.namespace != namespace:
        return (f"spec.planner.pool.namespace: {ref.namespace!r} is not this PDCluster's "
                f"namespace {namespace!r}; a PDCluster plans only in a PDPool of its own "
                "namespace")
    if pool is None:
        return f"spec.planner.pool.name: no PDPool {ref.name!r} in namespace {namespace!r}"
    try:
        spec = PDPoolSpec.model_validate(pool.get("spec") or {})
    except ValidationError as exc:
        return (f"spec.planner.pool.name: PDPool {namespace}/{ref.name} is invalid "
                f"({exc.errors()[0].get('msg', 'see its spec')})")
    if name not in {m.name for m in spec.members}:
        return (f"spec.planner.pool.name: PDPool {namespace}/{ref.name} does not list "
                f"PDCluster {name!r} in its members (the pool's author decides who joins)")
    if spec.gpu_product != gpu_product:
        return (f"spec.placement.gpuProduct: {gpu_product!r} is not PDPool "
                f"{namespace}/{ref.name}'s gpuProduct {spec.gpu_product!r}")
    return None


__all__ = ["GROUP", "POOL_KIND", "POOL_PLURAL", "POOL_SHORT_NAMES", "POOL_SINGULAR", "VERSION",
           "PDPoolSpec", "PoolMember", "pool_refusal"]
