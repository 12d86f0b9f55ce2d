"""``pdscale replay-pool``: members on one pool in lockstep, never more nodes than the pool,
every grant explained; the member argument and the PDPool file read as documented."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pdscale.main import main
from pdscale.replay_pool import parse_member

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "bench" / "policy_bench_pdcluster.yaml")
AZURE = "/work/shared/traces/azure2023/AzureLLMInferenceTrace_code.csv"


def _rates(path: Path, rates: list[float]) -> str:
    path.write_text("window_start_s,total_rate_rps\n"
                    + "".join(f"{k * 300},{r}\n" for k, r in enumerate(rates)))
    return str(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("pool")
    # two members whose loads rise and fall in turn, on a pool too small for both peaks
    up = _rates(tmp / "up.csv", [4, 4, 4, 20, 40, 40, 40, 10, 4, 4])
    down = _rates(tmp / "down.csv", [40, 40, 40, 20, 4, 4, 4, 20, 40, 40])
    pool = tmp / "pool.yaml"
    pool.write_text("apiVersion: pdscale.io/v1alpha1\nkind: PDPool\nmetadata: {name: p}\n"
                    "spec:\n  nodes: 10\n  horizonSeconds: 1200\n  surplusPricePercent: 50\n"
                    "  members:\n"
                    "  - {name: up, priority: 10, guaranteedNodes: 3}\n  - {name: down}\n")
    out = tmp / "report.json"
    code = main(["replay-pool", "--pool", str(pool), "--policies", "pooled,split",
                 "--member", f"spec={SPEC},trace={up},lengths={AZURE},name=up,slo-ttft=2",
                 "--member", f"spec={SPEC},trace={down},lengths={AZURE},name=down,slo-ttft=2",
                 "--json", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_the_pool_is_never_exceeded_and_every_grant_is_explained(report: dict) -> None:
    assert report["pool_nodes"] == 10
    pooled = report["reports"]["pooled"]
    assert pooled["peak_provisioned_nodes"] <= 10
    up, down = pooled["members"]
    assert (up["member"], up["priority"], up["guaranteed_nodes"]) == ("up", 10, 3)
    assert (down["member"], down["priority"], down["guaranteed_nodes"]) == ("down", 0, 0)
    for a, b in zip(up["grants"], down["grants"], strict=False):
        assert a["t"] == b["t"]  # lockstep: one grant per tick for both
        assert a["budget"] + b["budget"] <= 10
        assert a["reason"] and b["reason"]
    # the members' loads take turns: each is granted more than an even split at some time
    assert max(g["granted"] for g in up["grants"]) > 5
    assert max(g["granted"] for g in down["grants"]) > 5


def test_the_pools_horizon_and_surplus_price_are_the_ones_it_is_planned_with(report: dict) -> None:
    # as the operator plans it: the PDPool's horizonSeconds and surplusPricePercent / 100
    pooled = report["reports"]["pooled"]
    assert (pooled["horizon_seconds"], pooled["surplus_price"]) == (1200.0, 0.5)


def test_split_keeps_each_member_on_its_share(report: dict) -> None:
    split = report["reports"]["split"]
    assert [m["nodes"] for m in split["members"]] == [5, 5]
    for m in split["members"]:
        assert max(d["provisioned_prefill"] + d["provisioned_decode"] for d in m["decisions"]) <= 5
    rows = {r["member"]: r for r in report["comparison"]}
    assert set(rows) == {"up", "down", "total"}
    assert rows["total"]["split_gpu_hours"] == pytest.approx(
        rows["up"]["split_gpu_hours"] + rows["down"]["split_gpu_hours"], abs=0.01)


@pytest.mark.parametrize("text, message", [
    ("spec=a.yaml", "needs spec=PDCLUSTER.yaml and trace=FILE"),
    ("spec=a.yaml,trace=t.csv,prio=3", "'prio=3' is not key=value"),
    ("spec=a.yaml,trace=t.csv,priority=high", "--member: invalid literal"),
])
def test_member_argument_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_member(text)
