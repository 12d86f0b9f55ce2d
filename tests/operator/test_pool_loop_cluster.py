"""The pool loop in the running operator (its own identity, real API server): two members of
one PDPool too small for both are planned together (the high priority keeps its fleet, the
low one is trimmed to what is left), the pool's status and Events say so, and PDClusters the
pool does not admit are refused with a condition naming the field.

The members' Prometheus is unreachable, so each planner holds its fleet (1P2D, 3 nodes): the
need the pool divides is that hold, which is enough to make the pool (5 nodes) short."""

from __future__ import annotations

import pytest
from kubernetes import client
from pdc_cluster_helpers import sample, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

GROUP, VERSION = "pdscale.io", "v1alpha1"


def _member(name: str, pool: dict) -> dict:
    return sample("demo-sim.yaml", name, **{"planner.prometheusURL": "http://127.0.0.1:9",
                                            "planner.pool": pool})


def _condition(custom, ns: str, name: str, type_: str) -> dict | None:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "pdclusters", name)
    return next((c for c in (body.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


def test_a_pool_plans_its_members_together_and_refuses_the_others(
        cluster, admin_api, namespace, run_operator):
    custom = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    other = f"{namespace}-b"
    core.create_namespace({"metadata": {"name": other}})
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PDPool", "metadata": {"name": "shared"},
            "spec": {"nodes": 5, "members": [{"name": "high", "priority": 100},
                                             {"name": "low", "priority": 1},
                                             {"name": "thief"}]}})
        with run_operator():
            for name in ("high", "low", "intruder"):
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "pdclusters",
                                                       _member(name, {"name": "shared"}))
            # the pool lists "thief", but of its own namespace: another namespace's is refused
            custom.create_namespaced_custom_object(
                GROUP, VERSION, other, "pdclusters",
                _member("thief", {"name": "shared", "namespace": namespace}))

            def pool_status():
                body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools",
                                                           "shared")
                status = body.get("status") or {}
                members = {m["name"]: m for m in status.get("members") or []}
                # settled: low's planner has seen its hold of 3 (its first plan waits for the
                # Deployments its reconcile creates and counts their replicas not made yet:
                # read before, on a busy host, it held 1P0D or 1P1D and kept that)
                low = members.get("low") or {}
                return status if "gives up" in (low.get("reason") or "") else None

            status = wait_for(pool_status, timeout_seconds=120, what="the pool's split in status")
            granted = {m["name"]: m for m in status["members"]}
            assert set(granted) == {"high", "low"}
            assert status["nodes"] == 5 and status["grantedNodes"] <= 5
            assert granted["high"]["grantedNodes"] == 3  # its whole hold
            assert granted["low"]["grantedNodes"] == 2  # its minReplicas, 1P1D
            assert "gives up 1 of the 3" in granted["low"]["reason"]
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "True" and ready["observedGeneration"] >= 1
            degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
            assert degraded["status"] == "True" and "thief" in degraded["message"]

            # the low member's planner commands what the pool granted, and says why
            def low_planner():
                body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                           "pdclusters", "low")
                planner = (body.get("status") or {}).get("planner") or {}
                return planner if planner.get("recommended") == {"prefill": 1, "decode": 1} else None

            planner = wait_for(low_planner, timeout_seconds=60, what="low trimmed to 1P1D")
            assert "pool: " in planner["explanation"]
            events = wait_for(lambda: [e for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=shared").items
                if e.reason == "PoolTrim"], what="a PoolTrim Event on the PDPool")
            assert events[0].involved_object.kind == "PDPool"
            assert events[0].message.startswith("low: ")

            # asking is not joining: refused, the condition naming the field
            cond = wait_for(lambda: _condition(custom, namespace, "intruder", "PoolMember"),
                            what="intruder's PoolMember condition")
            assert cond["status"] == "False" and cond["reason"] == "PoolRefused"
            assert cond["message"].startswith("spec.planner.pool.name: ")
            cond = wait_for(lambda: _condition(custom, other, "thief", "PoolMember"),
                            what="thief's PoolMember condition")
            assert cond["status"] == "False"
            assert cond["message"].startswith("spec.planner.pool.namespace: ")
            joined = _condition(custom, namespace, "high", "PoolMember")
            assert joined is not None and joined["status"] == "True"
            # the refused ones plan nothing: no decision in their status
            intruder = custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                           "pdclusters", "intruder")
            assert "lastDecision" not in ((intruder.get("status") or {}).get("planner") or {})

            # the admin lists it: it joins at once (the PDPool's change reconciles the
            # PDClusters naming it; the resync is minutes away), and the three members'
            # minReplicas (6 nodes) no longer fit in 5: the pool says so and plans nothing
            custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools", "shared", {
                "spec": {"members": [{"name": "high", "priority": 100},
                                     {"name": "low", "priority": 1}, {"name": "intruder"}]}})
            wait_for(lambda: (c := _condition(custom, namespace, "intruder", "PoolMember"))
                     and c["status"] == "True", timeout_seconds=30, what="intruder joined")

            def not_planned():
                body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "pdpools",
                                                           "shared")
                ready = next((c for c in (body.get("status") or {}).get("conditions") or []
                              if c["type"] == "Ready"), None)
                return ready if ready and ready["status"] == "False" else None

            ready = wait_for(not_planned, timeout_seconds=60, what="the pool says it cannot plan")
            assert "do not fit" in ready["message"] and ready["observedGeneration"] == 2
    finally:
        core.delete_namespace(other)
