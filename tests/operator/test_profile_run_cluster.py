"""What ``pdscale profile run --render-job`` prints, held to a real API server: the Job is
accepted (server dry run), and its ServiceAccount, through the printed Role alone, writes the
profile's ConfigMap (``--apply-configmap``), updates its own, reads no other ConfigMap and
leaves someone else's of the same name alone; the operator's reader accepts what it wrote."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_profile_source import fitted_yaml

from pdscale.operator.api.pdcluster import ProfileConfigMapRef
from pdscale.operator.loop.profile_source import profile_from_configmap
from pdscale.profile_run import apply_configmap
from pdscale.profile_sweep import JobSettings, pdcluster_target, profile_configmap, sweep_job
from pdscale.testbed.nodes import api_client, operator_kubeconfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PDCLUSTER = {
    "apiVersion": "pdscale.io/v1alpha1", "kind": "PDCluster", "metadata": {"name": "llama"},
    "spec": {"model": {"servedName": "llama-3", "path": "meta-llama/Llama-3.1-8B-Instruct"},
             "engine": {"kind": "SGLang", "image": "img"}, "router": {"image": "router-img"}},
}


def test_the_jobs_identity_writes_its_configmap_and_nothing_else(
        cluster, admin_api, namespace, tmp_path, monkeypatch, capsys):
    target = pdcluster_target(PDCLUSTER, namespace, None)
    account, role, binding, job = sweep_job(
        target, JobSettings(image="registry.example/pdscale-aiperf:1", configmap="llama-profile"),
        ["--url", target.target.url, "--model", target.target.model])
    core, rbac = client.CoreV1Api(admin_api), client.RbacAuthorizationV1Api(admin_api)
    core.create_namespaced_service_account(namespace, account)
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    client.BatchV1Api(admin_api).create_namespaced_job(namespace, job, dry_run="All")

    kubeconfig = operator_kubeconfig(cluster.kubeconfig, tmp_path / "job.kubeconfig",
                                     namespace=namespace,
                                     service_account=account["metadata"]["name"], create=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    text = fitted_yaml()
    assert apply_configmap(profile_configmap("llama-profile", text, namespace=namespace)) == 0
    again = text.replace("name: mine", "name: mine-again", 1)
    assert apply_configmap(profile_configmap("llama-profile", again, namespace=namespace)) == 0
    stored = core.read_namespaced_config_map("llama-profile", namespace)
    assert stored.data == {"profile.yaml": again}
    body = {"metadata": {"name": "llama-profile"}, "data": stored.data}
    assert profile_from_configmap(body, ProfileConfigMapRef(name="llama-profile"),
                                  namespace).name == "mine-again"

    as_job = client.CoreV1Api(api_client(kubeconfig))
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "other"}, "data": {}})
    with pytest.raises(ApiException) as refused:
        as_job.read_namespaced_config_map("other", namespace)
    assert refused.value.status == 403

    # someone else's ConfigMap of that name: left as it is
    core.delete_namespaced_config_map("llama-profile", namespace)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "llama-profile"},
                                                  "data": {"profile.yaml": "theirs"}})
    capsys.readouterr()
    assert apply_configmap(profile_configmap("llama-profile", text, namespace=namespace)) == 2
    assert "is not one profile run wrote" in capsys.readouterr().err
    assert core.read_namespaced_config_map("llama-profile", namespace).data == {
        "profile.yaml": "theirs"}
    assert copy.deepcopy(role)["rules"][1]["resourceNames"] == ["llama-profile"]
