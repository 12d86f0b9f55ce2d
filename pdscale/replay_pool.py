"""Replay several PDClusters, one trace each, on one pool of nodes (docs/pools.md).

Each ``--member`` names a PDCluster file and a trace; ``--pool`` optionally reads a PDPool
(its ``nodes``, ``horizonSeconds`` and ``surplusPricePercent``, each member's ``priority`` and
``guaranteedNodes``, by the PDCluster's ``metadata.name``). The report compares, per member and in total: ``pooled`` (the joint grant
each interval, every member's own planner within its grant), ``split`` (each member planning
alone on an even static split of the pool) and ``oracle`` (the joint grant over planners
that know their future load)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELP = "replay several PDClusters, one trace each, on one shared pool of nodes"

#: the member keys ``--member`` takes (key=value, comma-separated)
MEMBER_KEYS = ("spec", "trace", "name", "rate-scale", "time-scale", "lengths", "slo-ttft",
               "priority", "guaranteed")


@dataclass(frozen=True)
class MemberArg:
    spec: str
    trace: str
    name: str | None = None
    rate_scale: float = 1.0
    time_scale: float = 1.0
    lengths: str | None = None
    slo_ttft: float | None = None
    priority: int | None = None
    guaranteed: int | None = None


def parse_member(text: str) -> MemberArg:
    """``spec=FILE,trace=FILE[,name=N][,rate-scale=K][,time-scale=K][,lengths=FILE]
    [,slo-ttft=S][,priority=P][,guaranteed=G]``."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in MEMBER_KEYS:
            raise argparse.ArgumentTypeError(
                f"--member: {part!r} is not key=value with key in {', '.join(MEMBER_KEYS)}")
        fields[key] = value
    if "spec" not in fields or "trace" not in fields:
        raise argparse.ArgumentTypeError("--member needs spec=PDCLUSTER.yaml and trace=FILE")
    try:
        return MemberArg(
            spec=fields["spec"], trace=fields["trace"], name=fields.get("name"),
            rate_scale=float(fields.get("rate-scale", 1.0)),
            time_scale=float(fields.get("time-scale", 1.0)), lengths=fields.get("lengths"),
            slo_ttft=float(fields["slo-ttft"]) if "slo-ttft" in fields else None,
            priority=int(fields["priority"]) if "priority" in fields else None,
            guaranteed=int(fields["guaranteed"]) if "guaranteed" in fields else None,
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--member: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--member", action="append", type=parse_member, required=True,
                        metavar="spec=FILE,trace=FILE[,...]",
                        help="a member: " + ", ".join(MEMBER_KEYS) + " (repeat per member)")
    parser.add_argument("--pool", metavar="PDPOOL.yaml",
                        help="a PDPool: nodes, horizonSeconds, surplusPricePercent, and priority and "
                             "guaranteedNodes per member name")
    parser.add_argument("--pool-nodes", type=int, help="the pool's nodes (overrides --pool)")
    parser.add_argument("--surplus-price-percent", type=int, metavar="0-100",
                        help="the pool's surplusPricePercent (overrides --pool; default 0: off)")
    parser.add_argument("--policies", default="pooled,split,oracle",
                        help="comma-separated, of pooled, split, oracle")
    parser.add_argument("--start-from", choices=["history", "hindsight"], default="history",
                        help="as pdscale replay: the first warm-up is history (default)")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def _read_pool(path: str) -> Any:
    from pdscale.operator.api.pdcluster import GROUP
    from pdscale.operator.api.pdpool import POOL_KIND, PDPoolSpec
    from pdscale.replay import ConfigurationError
    from pdscale.spec_file import read

    docs = [d.data for d in read(path) if isinstance(d.data, dict) and d.data.get("kind") == POOL_KIND
            and str(d.data.get("apiVersion", "")).startswith(f"{GROUP}/")]
    if len(docs) != 1:
        raise ConfigurationError(f"{path}: expected one {POOL_KIND} document, found {len(docs)}")
    return PDPoolSpec.model_validate(docs[0].get("spec") or {})


def member_setups(members: list[MemberArg], *, pool: Any = None, start: str = "history") -> list[Any]:
    """Each member's replay, configured from its PDCluster as ``pdscale replay -f`` does."""
    from pdscale.planner.replay.pool import PoolMemberSetup
    from pdscale.planner.replay.run import STACKS, ReplaySetup, start_from
    from pdscale.planner.replay.traces import load_trace
    from pdscale.replay import configure, read_spec
    from pdscale.replay_setup import router_admission, routing
    from pdscale.spec_file import read

    by_name = {m.name: m for m in (pool.members if pool is not None else [])}
    out = []
    for k, m in enumerate(members):
        spec = read_spec(m.spec)
        name = m.name or next((str(d.data.get("metadata", {}).get("name")) for d in read(m.spec)
                               if isinstance(d.data, dict) and d.data.get("kind") == "PDCluster"),
                              f"member{k}")
        configured = configure(spec, spec_source=f"file {m.spec}",
                               overrides={"--slo-ttft": m.slo_ttft})
        trace = load_trace(m.trace, rate_scale=m.rate_scale, time_scale=m.time_scale,
                           lengths_from=m.lengths)
        setup = ReplaySetup(trace=trace, planner=configured.config, **{
            **STACKS["deployed"], **routing(configured.spec)},
            prefill_admission=router_admission(configured.spec))
        setup, history = start_from(setup, start)
        listed = by_name.get(name)
        priority = m.priority if m.priority is not None else (listed.priority if listed else 0)
        guaranteed = m.guaranteed if m.guaranteed is not None else (
            listed.guaranteed_nodes if listed else 0)
        out.append(PoolMemberSetup(name=name, setup=setup, priority=priority,
                                   guaranteed_nodes=guaranteed, history=history))
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pdscale.planner.replay.pool import POOL_POLICIES, compare, run_pool
    from pdscale.planner.replay.traces import TraceError
    from pdscale.replay import ConfigurationError

    console = Console(stderr=True)
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in POOL_POLICIES]
    if bad or not policies:
        console.print(f"[red]error:[/red] --policies: each of {', '.join(POOL_POLICIES)}")
        return 2
    try:
        pool = _read_pool(args.pool) if args.pool else None
        members = member_setups(args.member, pool=pool, start=args.start_from)
    except (ConfigurationError, TraceError, OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    nodes = args.pool_nodes or (pool.nodes if pool is not None else None)
    if not nodes:
        console.print("[red]error:[/red] the pool's size: --pool-nodes, or nodes in --pool")
        return 2
    price = args.surplus_price_percent if args.surplus_price_percent is not None else (
        pool.surplus_price_percent if pool is not None else 0)
    if not 0 <= price <= 100:
        console.print("[red]error:[/red] --surplus-price-percent: within 0-100")
        return 2
    # the pool's own horizon, as the operator plans it
    horizon = float(pool.horizon_seconds) if pool is not None else 1800.0
    reports = {}
    for policy in policies:
        console.print(f"replay {policy} on {nodes} nodes: {len(members)} members"
                      + (f", surplus price {price}%" if price else ""))
        try:
            reports[policy] = run_pool(members, pool_nodes=nodes, policy=policy,
                                       horizon_seconds=horizon, surplus_price=price / 100.0)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
    table = Table(title=f"pool of {nodes} nodes")
    rows = compare(reports)
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*[f"{v:.4f}" if isinstance(v, float) and "attainment" in k else
                        f"{v:.1f}" if isinstance(v, float) else str(v) for k, v in row.items()])
    Console().print(table)
    for policy, rep in reports.items():
        console.print(f"{policy}: peak {rep['peak_provisioned_nodes']} nodes provisioned at once "
                      f"(pool {nodes}), {rep['wall_seconds']:g} s")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"pool_nodes": nodes, "comparison": rows,
                                                   "reports": reports}, indent=1))
        console.print(f"wrote {args.json_out}")
    return 0
