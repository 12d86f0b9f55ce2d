"""Instances spanning several nodes: `pdscale render` of the multi-node examples gives one
LeaderWorkerSet per role whose pod templates pass the Kubernetes 1.34 schemas, whose engine
arguments are SGLang's / vLLM's multi-node launch, and whose leader alone faces the router; the
checklist refuses layouts that cannot run, naming the field."""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import sys

import pytest
import yaml

from pdscale.operator.api import multinode
from pdscale.operator.api.names import Owner
from pdscale.operator.loop.planning import planner_config
from pdscale.operator.render import builders, lws
from pdscale.operator.render.checklist import SpecError, validate
from pdscale.render import render

ROOT = pathlib.Path(__file__).resolve().parents[2]
SGLANG_EXAMPLE = ROOT / "examples" / "sglang-deepseek-multinode.yaml"
VLLM_EXAMPLE = ROOT / "examples" / "vllm-deepseek-multinode.yaml"


def _fuzz():
    spec = importlib.util.spec_from_file_location("render_fuzz", ROOT / "bench" / "render_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_fuzz", module)
    spec.loader.exec_module(module)
    return module


def _doc(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text())


def _rendered(doc: dict) -> list[dict]:
    manifests, errors = render([doc], None)
    assert errors == []
    return manifests


def _groups(manifests: list[dict]) -> dict[str, dict]:
    return {m["metadata"]["labels"]["pdscale.io/role"]: m for m in manifests
            if m["kind"] == "LeaderWorkerSet"}


def _container(template: dict) -> dict:
    return template["spec"]["containers"][0]


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# -- the LeaderWorkerSets -----------------------------------------------------------------------
@pytest.mark.parametrize("example", [SGLANG_EXAMPLE, VLLM_EXAMPLE], ids=["sglang", "vllm"])
def test_each_role_is_one_leader_worker_set_of_its_nodes(example):
    manifests = _rendered(_doc(example))
    groups = _groups(manifests)
    assert sorted(groups) == ["decode", "prefill"]
    # no engine Deployment beside them: only the router's
    assert [m["metadata"]["labels"]["pdscale.io/role"] for m in manifests
            if m["kind"] == "Deployment"] == ["router"]
    assert groups["prefill"]["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert groups["decode"]["spec"]["leaderWorkerTemplate"]["size"] == 4
    assert (groups["prefill"]["spec"]["replicas"], groups["decode"]["spec"]["replicas"]) == (2, 3)


@pytest.mark.parametrize("example", [SGLANG_EXAMPLE, VLLM_EXAMPLE], ids=["sglang", "vllm"])
def test_the_top_level_fields_are_lws_v0_7_0s(example):
    # as ../shared/docs/multinode-and-pools.md section 1 reads LWS's
    # api/leaderworkerset/v1/leaderworkerset_types.go
    for group in _groups(_rendered(_doc(example))).values():
        assert group["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        spec = group["spec"]
        assert set(spec) <= {"replicas", "leaderWorkerTemplate", "rolloutStrategy",
                             "startupPolicy", "networkConfig"}
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 0
        assert spec["startupPolicy"] in ("LeaderCreated", "LeaderReady")
        assert spec["networkConfig"] == {"subdomainPolicy": "Shared"}
        rollout = spec["rolloutStrategy"]
        assert rollout["type"] == "RollingUpdate"
        assert set(rollout["rollingUpdateConfiguration"]) <= {"partition", "maxUnavailable", "maxSurge"}
        # LWS refuses maxUnavailable 0 with maxSurge 0; no surge: the budget has no spare nodes
        assert rollout["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
        template = spec["leaderWorkerTemplate"]
        assert set(template) <= {"leaderTemplate", "workerTemplate", "size", "restartPolicy",
                                 "subGroupPolicy"}
        assert isinstance(template["size"], int) and template["size"] >= 1
        assert template["restartPolicy"] == "RecreateGroupOnPodRestart"


@pytest.mark.parametrize("example", [SGLANG_EXAMPLE, VLLM_EXAMPLE], ids=["sglang", "vllm"])
def test_the_pod_templates_pass_the_kubernetes_schemas_and_the_api_servers_rules(example):
    pytest.importorskip("kubernetes_validate")
    fuzz = _fuzz()
    for group in _groups(_rendered(_doc(example))).values():
        templates = fuzz.lws_pod_templates(group)
        assert [t["metadata"]["name"].rsplit("-", 1)[1] for t in templates] == ["leader", "worker"]
        assert fuzz.schema_violations(group) == []
        assert fuzz.child_rule_violations(group) == []


def test_a_broken_pod_template_is_caught_by_the_schema_check():
    # the check above is no formality: a wrong type inside the worker template fails it
    pytest.importorskip("kubernetes_validate")
    fuzz = _fuzz()
    group = copy.deepcopy(_groups(_rendered(_doc(SGLANG_EXAMPLE)))["decode"])
    group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["terminationGracePeriodSeconds"] = "long"
    assert len(fuzz.schema_violations(group)) == 1


@pytest.mark.parametrize("example", [SGLANG_EXAMPLE, VLLM_EXAMPLE], ids=["sglang", "vllm"])
def test_every_pod_is_a_whole_pinned_node_as_a_deployment_pod_is(example):
    spec, derived = validate(_doc(example)["spec"])
    owner = Owner(name="x", namespace="default")
    for role, group in _groups(builders.build_children(owner, spec, derived)).items():
        pod = builders.worker_deployment(owner, spec, derived, role)["spec"]["template"]["spec"]
        for key in ("leaderTemplate", "workerTemplate"):
            got = group["spec"]["leaderWorkerTemplate"][key]["spec"]
            for field in ("nodeSelector", "tolerations", "volumes", "terminationGracePeriodSeconds",
                          "automountServiceAccountToken"):
                assert got[field] == pod[field], (role, key, field)
            assert _container(group["spec"]["leaderWorkerTemplate"][key])["resources"] == \
                pod["containers"][0]["resources"]
            assert got["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        # the leader's template is the Deployment's, plus its group role
        leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        assert leader["spec"] == pod
        assert leader["metadata"]["labels"]["pdscale.io/group-role"] == "leader"


def test_the_exclusive_topology_key_becomes_the_lws_annotation():
    groups = _groups(_rendered(_doc(SGLANG_EXAMPLE)))
    annotation = "leaderworkerset.sigs.k8s.io/exclusive-topology"
    assert groups["decode"]["metadata"]["annotations"][annotation] == "example.com/rack"
    assert annotation not in groups["prefill"]["metadata"]["annotations"]


# -- engine arguments ---------------------------------------------------------------------------
def test_sglang_runs_its_multi_node_launch_from_the_lws_environment():
    groups = _groups(_rendered(_doc(SGLANG_EXAMPLE)))
    for role, nodes, tp in (("prefill", 2, 16), ("decode", 4, 32)):
        templates = groups[role]["spec"]["leaderWorkerTemplate"]
        leader, worker = _container(templates["leaderTemplate"]), _container(templates["workerTemplate"])
        # the same command on every node, the rank read from LWS_WORKER_INDEX
        assert leader["command"] == worker["command"] == ["python3", "-m", "sglang.launch_server"]
        assert leader["args"] == worker["args"]
        args = leader["args"]
        assert _after(args, "--nnodes") == str(nodes)
        assert _after(args, "--node-rank") == "$(LWS_WORKER_INDEX)"
        assert _after(args, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20102"
        assert (_after(args, "--tp-size"), _after(args, "--dp-size"), _after(args, "--ep-size")) == \
            (str(tp), str(tp), str(tp))
        assert "--enable-dp-attention" in args
        # rank >= 1 serves /health on --port (a dummy server): probes stay on every node
        assert "readinessProbe" in worker and {p["name"] for p in worker["ports"]} >= {"http"}


def test_only_the_sglang_prefill_leader_runs_the_bootstrap_server():
    prefill = _groups(_rendered(_doc(SGLANG_EXAMPLE)))["prefill"]["spec"]["leaderWorkerTemplate"]
    leader, worker = prefill["leaderTemplate"], prefill["workerTemplate"]
    assert "bootstrap" in [p["name"] for p in _container(leader)["ports"]]
    assert leader["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"
    assert "bootstrap" not in [p["name"] for p in _container(worker)["ports"]]
    assert "sglang.ai/bootstrap-port" not in worker["metadata"]["annotations"]
    assert worker["metadata"]["labels"]["pdscale.io/group-role"] == "worker"


def test_vllm_runs_a_data_parallel_head_and_headless_nodes():
    groups = _groups(_rendered(_doc(VLLM_EXAMPLE)))
    for role, dp in (("prefill", 16), ("decode", 32)):
        templates = groups[role]["spec"]["leaderWorkerTemplate"]
        leader, worker = _container(templates["leaderTemplate"]), _container(templates["workerTemplate"])
        assert leader["command"] == ["vllm", "serve"]
        args = leader["args"]
        assert args[0] == "/models/DeepSeek-V3"
        assert _after(args, "--data-parallel-size") == str(dp)
        assert _after(args, "--data-parallel-size-local") == "8"
        assert _after(args, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
        assert _after(args, "--data-parallel-rpc-port") == "29550"
        assert _after(args, "--tensor-parallel-size") == "1"
        assert "--enable-expert-parallel" in args and "--headless" not in args
        # the other nodes: the same arguments, headless, their first DP rank from the index
        assert worker["args"] == args
        assert worker["command"][:2] == ["/bin/sh", "-c"]
        script = worker["command"][2]
        assert script.startswith('exec vllm serve "$@" --headless ')
        assert '--data-parallel-start-rank "$((LWS_WORKER_INDEX * 8))"' in script
        # no API server there: nothing to probe or call
        assert [p["name"] for p in worker["ports"]] == ["nixl"]
        assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
        assert "readinessProbe" in leader


def test_a_one_node_role_next_to_a_group_stays_a_deployment():
    doc = _doc(SGLANG_EXAMPLE)
    doc["spec"]["prefill"]["nodesPerInstance"] = 1
    doc["spec"]["parallelism"]["prefill"] = {"tensorParallelSize": 8, "dataParallelSize": 8,
                                            "expertParallelSize": 8, "dataParallelAttention": True}
    manifests = _rendered(doc)
    assert sorted(_groups(manifests)) == ["decode"]
    prefill = next(m for m in manifests if m["kind"] == "Deployment"
                   and m["metadata"]["labels"]["pdscale.io/role"] == "prefill")
    args = _container(prefill["spec"]["template"])["args"]
    assert "--nnodes" not in args and "--dist-init-addr" not in args


# -- leaders only ------------------------------------------------------------------------------
def _pod(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def test_only_deployment_pods_and_group_leaders_stand_for_instances():
    pods = [_pod("dep-abc"), _pod("g-0", **{lws.LABEL_WORKER_INDEX: "0"}),
            _pod("g-0-1", **{lws.LABEL_WORKER_INDEX: "1"}), _pod("g-0-3", **{lws.LABEL_WORKER_INDEX: "3"})]
    assert [p["metadata"]["name"] for p in lws.leaders_only(pods)] == ["dep-abc", "g-0"]


def test_the_planner_loop_sees_leaders_only():
    from pdscale.operator.loop.planner_loop import pods_by_key

    base = {"app.kubernetes.io/instance": "c", "pdscale.io/role": "decode"}
    pods = [{"metadata": {"name": n, "namespace": "ns", "labels": {**base, **extra}}}
            for n, extra in (("c-decode-0", {lws.LABEL_WORKER_INDEX: "0"}),
                             ("c-decode-0-1", {lws.LABEL_WORKER_INDEX: "1"}),
                             ("c-decode-1", {lws.LABEL_WORKER_INDEX: "0"}))]
    grouped = pods_by_key(pods)
    assert [p["metadata"]["name"] for p in grouped[("ns", "c", "decode")]] == ["c-decode-0", "c-decode-1"]


def _group_pod(name: str, group: str, index: str, *, ready: bool = True, deleting: bool = False,
               size: str = "4") -> dict:
    meta: dict = {"name": name, "namespace": "ns",
                  "labels": {lws.LABEL_SET_NAME: "c-decode", lws.LABEL_GROUP_INDEX: group,
                             lws.LABEL_WORKER_INDEX: index},
                  "annotations": {lws.ANNOTATION_SIZE: size}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_a_leader_stands_for_a_ready_instance_only_while_its_group_is_whole():
    from pdscale.operator.loop.fleet import pod_view

    def ready_leaders(pods: list[dict]) -> list[str]:
        return [p["metadata"]["name"] for p in lws.instances(pods) if pod_view(p, "decode").ready]

    whole = [_group_pod(f"c-decode-0{'-' + str(i) if i else ''}", "0", str(i)) for i in range(4)]
    assert ready_leaders(whole) == ["c-decode-0"]
    # a worker not Ready yet (LWS starts them after the leader), missing, or being deleted
    # (RecreateGroupOnPodRestart is about to take the group down): the instance is not Ready
    assert ready_leaders([*whole[:3], _group_pod("c-decode-0-3", "0", "3", ready=False)]) == []
    assert ready_leaders(whole[:3]) == []
    assert ready_leaders([*whole[:3], _group_pod("c-decode-0-3", "0", "3", deleting=True)]) == []
    # another group's pods do not count for this one; a Deployment's pod is left as it is
    other = [_group_pod("c-decode-1-3", "1", "3")]
    plain = {"metadata": {"name": "dep-abc", "namespace": "ns", "labels": {}},
             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert ready_leaders([*whole[:3], *other, plain]) == ["dep-abc"]
    assert [p["metadata"]["name"] for p in lws.instances([*whole[:3], plain])] == ["c-decode-0", "dep-abc"]
    assert whole[0]["status"]["conditions"][0]["status"] == "True"  # a copy is marked


def test_ready_groups_come_from_the_lws_status():
    assert lws.ready_groups({"status": {"readyReplicas": 2, "replicas": 3}}) == 2
    assert lws.ready_groups({"status": {}}) == 0
    assert lws.ready_groups(None) == 0


# -- the checklist -----------------------------------------------------------------------------
def _problems(doc_spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        validate(doc_spec)
    return {p.field: p.message for p in err.value.problems}


def _set(spec: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(spec)
    *path, last = dotted.split(".")
    node = out
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return out


SG = _doc(SGLANG_EXAMPLE)["spec"]
VL = _doc(VLLM_EXAMPLE)["spec"]


def test_the_examples_are_valid():
    validate(SG)
    validate(VL)


def test_a_layout_that_does_not_fill_the_groups_nodes_is_refused():
    problems = _problems(_set(SG, "decode.nodesPerInstance", 2))
    assert "decode.nodesPerInstance 2 x placement.gpusPerNode 8 = 16" in \
        problems["spec.parallelism.decode"]


def test_sglang_data_parallelism_across_nodes_needs_dp_attention():
    spec = _set(SG, "parallelism.prefill", {"tensorParallelSize": 8, "dataParallelSize": 2})
    assert "needs dataParallelAttention" in _problems(spec)["spec.parallelism.prefill.dataParallelSize"]


@pytest.mark.parametrize(("layout", "field", "message"), [
    ({"tensorParallelSize": 16, "dataParallelSize": 2, "expertParallelSize": 32},
     "tensorParallelSize", "keeps each TP group inside one node"),
    ({"tensorParallelSize": 1, "dataParallelSize": 16, "expertParallelSize": 16,
      "pipelineParallelSize": 2}, "pipelineParallelSize", "needs Ray"),
])
def test_vllm_layouts_the_head_and_headless_form_cannot_run_are_refused(layout, field, message):
    # each fills the decode group's 4 x 8 GPUs
    problems = _problems(_set(VL, "parallelism.decode", layout))
    assert message in problems[f"spec.parallelism.decode.{field}"]


def test_vllm_data_parallel_ranks_split_over_the_nodes():
    spec = _set(VL, "decode.nodesPerInstance", 3)
    spec = _set(spec, "parallelism.decode", {"tensorParallelSize": 2, "dataParallelSize": 12,
                                              "expertParallelSize": 24})
    decode = _groups(_rendered({**_doc(VLLM_EXAMPLE), "spec": spec}))["decode"]
    worker = _container(decode["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert _after(worker["args"], "--data-parallel-size-local") == "4"
    assert '"$((LWS_WORKER_INDEX * 4))"' in worker["command"][2]


def test_a_topology_key_on_a_one_node_role_is_refused():
    spec = _set(SG, "prefill.nodesPerInstance", 1)
    spec = _set(spec, "parallelism.prefill", {"tensorParallelSize": 8})
    spec = _set(spec, "prefill.exclusiveTopologyKey", "example.com/rack")
    assert "nodesPerInstance > 1" in _problems(spec)["spec.prefill.exclusiveTopologyKey"]


@pytest.mark.parametrize("value", [0, 33, "two"])
def test_nodes_per_instance_is_a_bounded_integer(value):
    assert "spec.decode.nodesPerInstance" in _problems(_set(SG, "decode.nodesPerInstance", value))


def test_the_node_budget_counts_each_instance_s_nodes():
    # 2 prefill x 2 + 3 decode x 4 = 16 nodes now; minima 1 x 2 + 1 x 4 = 6
    validate(_set(SG, "planner.nodeBudget", 16))
    message = _problems(_set(SG, "planner.nodeBudget", 15))["spec.planner.nodeBudget"]
    assert "= 16 (prefill 2, decode 4 nodes per instance)" in message
    message = _problems(_set(SG, "planner.nodeBudget", 5))["spec.planner.nodeBudget"]
    assert "= 6 (prefill 2, decode 4 nodes per instance)" in message


def test_the_planner_is_configured_with_the_groups():
    spec, _ = validate(_set(SG, "planner.nodeBudget", None))
    config = planner_config(spec)
    assert config.nodes_per_instance == (2, 4)
    assert config.nodes == 4 * 2 + 4 * 4  # the maxima's nodes, without a budget
    assert multinode.nodes_per_instance(spec, "decode") == 4


# -- the operator ------------------------------------------------------------------------------
def test_the_operator_applies_the_groups_and_counts_ready_groups_as_instances():
    from test_pdc_reconcile import NOW, FakeKube

    from pdscale.operator.reconciler import conditions as c
    from pdscale.operator.reconciler.reconcile import reconcile

    kube = FakeKube()
    doc = _doc(SGLANG_EXAMPLE)
    name = doc["metadata"]["name"]
    doc["metadata"].update(namespace="serving", uid="uid-1", generation=1, resourceVersion="1")
    kube.objects[("PDCluster", "serving", name)] = doc
    out = reconcile(kube, kube.get("PDCluster", "serving", name), NOW)
    assert not out.refused and not out.conflicts
    sets = {n: o for (kind, _, n), o in kube.objects.items() if kind == "LeaderWorkerSet"}
    assert sorted(sets) == [f"{name}-decode", f"{name}-prefill"]
    assert not any(kind == "Deployment" and n != f"{name}-router" for kind, _, n in kube.objects)
    assert sets[f"{name}-decode"]["spec"]["leaderWorkerTemplate"]["size"] == 4
    status = kube.objects[("PDCluster", "serving", name)]["status"]
    assert c.find(status["conditions"], c.READY)["status"] == "False"
    # instances and the nodes they span (nodesPerInstance from the live LWS's group size)
    assert status["decode"] == {"desiredReplicas": 3, "readyReplicas": 0, "updatedReplicas": 0,
                                "nodesPerInstance": 4, "desiredNodes": 12, "readyNodes": 0}

    # LWS reports whole groups; the router's Deployment is rolled out: every role ready
    for role, groups in (("prefill", 2), ("decode", 3)):
        live = kube.objects[("LeaderWorkerSet", "serving", f"{name}-{role}")]
        live["status"] = {"observedGeneration": 1, "replicas": groups, "updatedReplicas": groups,
                          "readyReplicas": groups}
        live["metadata"]["generation"] = 1
    router = kube.objects[("Deployment", "serving", f"{name}-router")]
    router["status"] = {"observedGeneration": router["metadata"]["generation"], "replicas": 1,
                        "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}
    versions = {k: o["metadata"]["resourceVersion"] for k, o in kube.objects.items()
                if k[0] != "PDCluster"}
    reconcile(kube, kube.get("PDCluster", "serving", name), NOW)
    status = kube.objects[("PDCluster", "serving", name)]["status"]
    assert c.find(status["conditions"], c.READY)["status"] == "True"
    assert {role: status[role]["readyReplicas"] for role in ("prefill", "decode", "router")} == {
        "prefill": 2, "decode": 3, "router": 1}
    assert {role: status[role]["readyNodes"] for role in ("prefill", "decode")} == {
        "prefill": 4, "decode": 12}
    assert "readyNodes" not in status["router"]  # the router is no instance of nodes
    # the applied sets are in sync: nothing applied again
    assert {k: o["metadata"]["resourceVersion"] for k, o in kube.objects.items()
            if k[0] != "PDCluster"} == versions


def test_a_group_set_is_rolled_out_when_its_groups_are_ready():
    from pdscale.operator.reconciler import conditions as c
    from pdscale.operator.reconciler.status import ChildrenView, compute

    def group_set(ready: int) -> dict:
        return {"kind": "LeaderWorkerSet", "metadata": {"generation": 1},
                "spec": {"replicas": 3, "leaderWorkerTemplate": {"size": 2}},
                "status": {"replicas": 3, "updatedReplicas": 3, "readyReplicas": ready}}

    def deployment() -> dict:
        return {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 1},
                "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                           "readyReplicas": 1, "availableReplicas": 1}}

    for ready, expected in ((3, "True"), (2, "False")):
        view = ChildrenView(generation=1, deployments={
            "prefill": group_set(ready), "decode": group_set(3), "router": deployment()})
        status = compute(view, None, "2026-11-30T12:00:00Z")
        assert c.find(status["conditions"], c.READY)["status"] == expected, ready
        assert status["prefill"]["readyReplicas"] == ready  # groups, i.e. instances
        # nodes: the live set's group size per instance
        assert (status["prefill"]["nodesPerInstance"], status["prefill"]["desiredNodes"],
                status["prefill"]["readyNodes"]) == (2, 6, 2 * ready)


def test_the_groups_service_publishes_pods_before_they_are_ready():
    # the group's pods find their leader through the role's headless Service (LWS's subdomain
    # of the same name) before the leader is Ready: it waits for them there
    manifests = _rendered(_doc(SGLANG_EXAMPLE))
    services = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Service"}
    for group in _groups(manifests).values():
        service = services[group["metadata"]["name"]]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        labels = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
    # a one-node role's Service is as before
    assert "publishNotReadyAddresses" not in services["dsv3-wide-ep-router"]["spec"]


def test_status_counts_nodes_from_the_spec_until_the_set_exists():
    from pdscale.operator.reconciler.status import ChildrenView, compute

    view = ChildrenView(generation=1, deployments={"prefill": None, "decode": None, "router": None},
                        nodes_per_instance={"prefill": 2, "decode": 4})
    status = compute(view, None, "2026-11-30T12:00:00Z")
    assert [status[r]["nodesPerInstance"] for r in ("prefill", "decode")] == [2, 4]
    assert [status[r]["readyNodes"] for r in ("prefill", "decode")] == [0, 0]
    # a Deployment's pod is one node, whatever the view says
    deployment = {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 3},
                  "status": {"readyReplicas": 3}}
    view.deployments["prefill"] = deployment
    assert compute(view, None, "2026-11-30T12:00:00Z")["prefill"]["readyNodes"] == 3
