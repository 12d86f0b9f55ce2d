"""The operator on the real control plane, under KopfRunner, as its own ServiceAccount."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdc_cluster_helpers import (
    CPU_NODE,
    DECOY_NODE,
    PLURALS,
    expected_children,
    pod_ready,
    sample,
    wait_for,
)

from pdscale.operator.api.pdcluster import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster

NONE = {plural: [] for plural in PLURALS.values()}


class Cluster:
    """Admin-side reads for assertions."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.ns = namespace
        self.co = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.net = client.NetworkingV1Api(api)

    def create(self, doc):
        return self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, doc)

    def get(self, name):
        return self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def patch_spec(self, name, spec_patch):
        return self.co.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name,
                                                      {"spec": spec_patch})

    def delete(self, name):
        self.co.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def condition(self, name, type_):
        status = self.get(name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)

    def ready(self, name):
        cond = self.condition(name, "Ready")
        return cond is not None and cond["status"] == "True" and cond

    def children(self, instance):
        """Names of the objects labelled with this instance, by plural (every kind a
        PDCluster may own)."""
        sel = f"app.kubernetes.io/instance={instance}"
        lists = {
            "deployments": self.apps.list_namespaced_deployment,
            "services": self.core.list_namespaced_service,
            "serviceaccounts": self.core.list_namespaced_service_account,
            "roles": self.rbac.list_namespaced_role,
            "rolebindings": self.rbac.list_namespaced_role_binding,
            "configmaps": self.core.list_namespaced_config_map,
            "networkpolicies": self.net.list_namespaced_network_policy,
        }
        return {plural: sorted(x.metadata.name for x in f(self.ns, label_selector=sel).items)
                for plural, f in lists.items()}

    def versions(self, instance):
        """resourceVersion of the PDCluster and of every child."""
        sel = f"app.kubernetes.io/instance={instance}"
        out = {("PDCluster", instance): self.get(instance)["metadata"]["resourceVersion"]}
        for kind, items in (
            ("Deployment", self.apps.list_namespaced_deployment(self.ns, label_selector=sel).items),
            ("Service", self.core.list_namespaced_service(self.ns, label_selector=sel).items),
            ("ServiceAccount", self.core.list_namespaced_service_account(self.ns, label_selector=sel).items),
            ("Role", self.rbac.list_namespaced_role(self.ns, label_selector=sel).items),
            ("RoleBinding", self.rbac.list_namespaced_role_binding(self.ns, label_selector=sel).items),
            ("ConfigMap", self.core.list_namespaced_config_map(self.ns, label_selector=sel).items),
        ):
            for item in items:
                out[(kind, item.metadata.name)] = item.metadata.resource_version
        return out

    def events(self, name):
        items = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name},involvedObject.kind=PDCluster").items
        return [(e.type, e.reason, e.message) for e in items]

    def pods(self, instance, role):
        """Live pods of one role (Terminating ones excluded: they wait out their drain)."""
        sel = f"app.kubernetes.io/instance={instance},pdscale.io/role={role}"
        return [p for p in self.core.list_namespaced_pod(self.ns, label_selector=sel).items
                if p.metadata.deletion_timestamp is None]


@pytest.fixture
def k(admin_api, namespace):
    return Cluster(admin_api, namespace)


def test_sample_becomes_a_ready_fleet_pinned_to_h200(k, run_operator):
    doc = sample("sglang-glm-4p8d.yaml")
    doc["metadata"]["namespace"] = k.ns
    with run_operator():
        k.create(doc)
        wait_for(lambda: k.children("glm53") == expected_children(doc, k.ns), what="all children")
        ready = wait_for(lambda: k.ready("glm53"), timeout_seconds=120, what="Ready")
        status = k.get("glm53")["status"]
        assert status["prefill"] == {"desiredReplicas": 4, "readyReplicas": 4, "updatedReplicas": 4,
                                     "nodesPerInstance": 1, "desiredNodes": 4, "readyNodes": 4}
        assert status["decode"] == {"desiredReplicas": 8, "readyReplicas": 8, "updatedReplicas": 8,
                                    "nodesPerInstance": 1, "desiredNodes": 8, "readyNodes": 8}
        assert status["observedGeneration"] == k.get("glm53")["metadata"]["generation"]
        assert ready["reason"] == "AllReplicasReady"
        assert status["derived"]["waitingTimeoutSeconds"] == 787
        for role, n in (("prefill", 4), ("decode", 8)):
            pods = k.pods("glm53", role)
            assert len(pods) == n and all(pod_ready(p) for p in pods)
            for pod in pods:
                node = k.core.read_node(pod.spec.node_name)
                assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
                assert pod.spec.node_name != DECOY_NODE
            assert len({p.spec.node_name for p in pods}) == n  # one instance per node
        router_pods = k.pods("glm53", "router")
        assert {p.spec.node_name for p in router_pods} == {CPU_NODE}
        deployment = k.apps.read_namespaced_deployment("glm53-prefill", k.ns)
        ref = deployment.metadata.owner_references[0]
        assert (ref.kind, ref.name, ref.controller) == ("PDCluster", "glm53", True)
        managers = {m.manager for m in deployment.metadata.managed_fields if m.operation == "Apply"}
        assert managers == {"pdscale-operator"}
        reasons = [r for _, r, _ in k.events("glm53")]
        assert reasons.count("Created") == sum(map(len, expected_children(doc, k.ns).values())) \
            and "Ready" in reasons


def test_replica_and_image_changes_roll_the_deployments(k, run_operator):
    doc = sample("vllm-nixl-2p4d.yaml", "roll", **{"prefill.replicas": 1, "decode.replicas": 2,
                                                   "decode.minReplicas": 1})
    doc["spec"]["model"].pop("weights")
    doc["spec"]["model"]["path"] = "meta-llama/Llama-3.3-70B-Instruct"
    with run_operator():
        k.create(doc)
        wait_for(lambda: k.ready("roll"), timeout_seconds=120, what="Ready")
        k.patch_spec("roll", {"decode": {"replicas": 3}})
        wait_for(lambda: k.apps.read_namespaced_deployment("roll-decode", k.ns).spec.replicas == 3,
                 what="decode scaled")
        wait_for(lambda: k.ready("roll") and k.get("roll")["status"]["decode"]["readyReplicas"] == 3,
                 timeout_seconds=120, what="3 decode ready")
        assert ("Normal", "Scaled", "Deployment/roll-decode replicas 2 -> 3") in k.events("roll")

        k.patch_spec("roll", {"engine": {"image": "vllm/vllm-openai:v0.12.0"}})

        def rolled():
            for role, n in (("prefill", 1), ("decode", 3)):
                d = k.apps.read_namespaced_deployment(f"roll-{role}", k.ns)
                if d.spec.template.spec.containers[0].image != "vllm/vllm-openai:v0.12.0":
                    return False
                if (d.status.updated_replicas or 0) != n or (d.status.ready_replicas or 0) != n:
                    return False
            return True
        wait_for(rolled, timeout_seconds=120, what="image rolled out")

        def only_new_pods() -> bool:
            # three live decode pods, all on the new image: a listing taken while the rollout
            # settles may still miss one (CI saw 2 right after the Deployment reported 3
            # updated and ready), and an empty one would make all() pass by itself
            pods = k.pods("roll", "decode")
            return len(pods) >= 3 and all(
                p.spec.containers[0].image == "vllm/vllm-openai:v0.12.0" for p in pods)
        wait_for(only_new_pods, timeout_seconds=120, what="three decode pods, old ones gone")
        rs = k.apps.list_namespaced_replica_set(k.ns, label_selector="pdscale.io/role=prefill").items
        assert len(rs) == 2  # the rollout made a new ReplicaSet
        wait_for(lambda: k.ready("roll"), timeout_seconds=120, what="Ready again")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"decode.minReplicas": 9, "decode.maxReplicas": 4, "decode.replicas": 4},
     '"message":"Invalid value: \\"object\\": minReplicas must not exceed maxReplicas","field":"spec.decode.minReplicas"'),
    ({"parallelism.decode": {"tensorParallelSize": 4, "dataParallelSize": 2}},
     "parallelism.prefill.tensorParallelSize must not exceed parallelism.decode.tensorParallelSize"),
    ({"kvTransfer.backend": "Mooncake"}, "kvTransfer.backend must be NIXL when engine.kind is VLLM"),
    ({"engine.kind": "TensorRT"}, "spec.engine.kind: Unsupported value"),
])
def test_invalid_spec_is_refused_by_the_api_server(k, operator_installed, overrides, message):
    doc = sample("vllm-nixl-2p4d.yaml", "bad", **overrides)
    with pytest.raises(ApiException) as info:
        k.create(doc)
    assert info.value.status == 422
    assert message in info.value.body


def test_invalid_spec_past_cel_is_marked_spec_valid_false(k, run_operator):
    doc = sample("sglang-glm-4p8d.yaml", "short", **{"kvTransfer.waitingTimeoutSeconds": 300})
    with run_operator():
        k.create(doc)
        cond = wait_for(lambda: k.condition("short", "SpecValid"), what="SpecValid")
        assert cond["status"] == "False" and cond["reason"] == "SpecInvalid"
        assert cond["message"] == (
            "spec.kvTransfer.waitingTimeoutSeconds: 300 s is too short: the slowest prefill "
            "(1048576 tokens at 2000 tokens/s plus 50% margin) needs at least 787 s")
        assert k.children("short") == NONE
        wait_for(lambda: ("Warning", "SpecInvalid", cond["message"]) in k.events("short"),
                 what="SpecInvalid event")
        # Fixing the spec brings the fleet up.
        k.patch_spec("short", {"kvTransfer": {"waitingTimeoutSeconds": 900}})
        wait_for(lambda: k.ready("short"), timeout_seconds=120, what="Ready after the fix")


def test_an_object_of_the_same_name_that_is_not_ours_is_left_alone(k, run_operator):
    foreign = k.core.create_namespaced_service(k.ns, {
        "metadata": {"name": "mine-router", "labels": {"owner": "someone-else"}},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "other"}}})
    doc = sample("vllm-nixl-2p4d.yaml", "mine", **{"prefill.replicas": 1, "decode.replicas": 2,
                                                   "decode.minReplicas": 1})
    with run_operator():
        k.create(doc)
        cond = wait_for(lambda: (c := k.condition("mine", "Degraded")) and c["status"] == "True" and c,
                        what="Degraded")
        assert cond["reason"] == "NameConflict"
        assert "Service/mine-router exists and is not controlled by this PDCluster" in cond["message"]
        wait_for(lambda: any(t == "Warning" and r == "NameConflict" for t, r, _ in k.events("mine")),
                 what="NameConflict event")
        wait_for(lambda: k.apps.read_namespaced_deployment("mine-decode", k.ns), what="others made")
        svc = k.core.read_namespaced_service("mine-router", k.ns)
        assert svc.metadata.resource_version == foreign.metadata.resource_version
        assert svc.metadata.owner_references is None
        assert k.condition("mine", "Ready")["reason"] == "NameConflict"


def test_deleting_the_pdcluster_removes_every_child(k, run_operator):
    # The operator's finalizer holds the deletion until the engines are drained (idle, or the
    # drain timeout, 5 x preStopDrainSeconds = 20 s here); these kwok engines serve nothing.
    doc = sample("vllm-nixl-2p4d.yaml", "gone", **{"prefill.replicas": 1, "decode.replicas": 1,
                                                   "decode.minReplicas": 1,
                                                   "prefill.preStopDrainSeconds": 4,
                                                   "decode.preStopDrainSeconds": 4})
    with run_operator():
        k.create(doc)
        wait_for(lambda: k.children("gone") == expected_children(doc, k.ns), what="children")
        wait_for(lambda: k.get("gone")["metadata"].get("finalizers") == ["pdscale.io/drain"],
                 what="the operator's finalizer")
        k.delete("gone")
        wait_for(lambda: k.children("gone") == NONE,
                 timeout_seconds=60, what="garbage collection")
        wait_for(lambda: not k.pods("gone", "prefill") and not k.pods("gone", "decode"),
                 timeout_seconds=90, what="pods gone")


def test_restart_mid_way_converges_and_a_noop_reconcile_writes_nothing(k, run_operator):
    doc = sample("sglang-glm-4p8d.yaml", "resume", **{"prefill.replicas": 2, "decode.replicas": 3,
                                                      "prefill.minReplicas": 1, "decode.minReplicas": 1})
    with run_operator():
        k.create(doc)
        wait_for(lambda: k.children("resume")["deployments"], interval_seconds=0.05,
                 what="first child")
    # Operator down mid-way; change the spec meanwhile.
    k.patch_spec("resume", {"decode": {"replicas": 4}})
    with run_operator():
        wait_for(lambda: k.ready("resume") and k.get("resume")["status"]["decode"]["readyReplicas"] == 4,
                 timeout_seconds=120, what="Ready after restart")
        assert k.children("resume") == expected_children(doc, k.ns)
        assert len(k.pods("resume", "prefill")) == 2 and len(k.pods("resume", "decode")) == 4
        rs = k.apps.list_namespaced_replica_set(k.ns, label_selector="app.kubernetes.io/instance=resume").items
        assert len(rs) == 3  # one per Deployment: no duplicate rollouts
        settled = k.versions("resume")
    # A fresh start re-lists every PDCluster and child and reconciles all of them.
    import datetime
    import time

    from pdscale.operator.handlers import STATS

    # Events carry whole-second creation times: wait out this second, so that every Event
    # from the runs above is older than the restart and every one it posts is not. (Comparing
    # two listings instead once failed in CI on an old Event listed only the second time.)
    time.sleep(1.1)
    restarted = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    before = dict(STATS)
    with run_operator():
        wait_for(lambda: STATS["reconciles"] > before["reconciles"], what="the restart's reconcile")
        time.sleep(3)  # child events of the relist arrive too; none may cause a write
        assert STATS["writes"] == before["writes"]
        assert k.versions("resume") == settled
        items = k.core.list_namespaced_event(
            k.ns, field_selector="involvedObject.name=resume,involvedObject.kind=PDCluster").items
        posted = [(e.reason, e.message) for e in items if e.metadata.creation_timestamp >= restarted]
        assert posted == [], "a no-op restart posted Events"
