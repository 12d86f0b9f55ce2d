"""The Helm chart: lints, validates its values against the schema with field-naming errors,
renders a restricted-security operator, carries the CRD and RBAC of their single sources, and
installs for real on the cluster with an identity that can do its job and no more."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from pdscale.operator.render import rbac
from pdscale.testbed.localcluster import DEFAULT_BIN_DIR

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdscale"
HELM = DEFAULT_BIN_DIR / "helm"
KUBE_VERSION = "1.34.4"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.is_file():
        pytest.fail(f"helm not found at {HELM}: run e2e/cluster/build")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(*sets: str) -> list[dict]:
    args = ["template", "t", str(CHART), "-n", "pdscale-system", "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_plain_helm_template_renders_without_a_kube_version():
    """What a reader types first. The chart asks for Kubernetes >= 1.29; a helm built without
    its release ldflags assumed v1.20.0 and refused every render without --kube-version
    (e2e/cluster/build now sets them as helm's own Makefile does)."""
    result = helm("template", "t", str(CHART), check=False)
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert {"Deployment", "ClusterRole", "ServiceAccount"} <= kinds
    # and the constraint still refuses a cluster older than the chart supports
    old = helm("template", "t", str(CHART), "--kube-version", "1.28.0", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr


@pytest.mark.parametrize("name", ["pdclusters.pdscale.io.yaml", "pdpools.pdscale.io.yaml"])
def test_chart_crd_is_the_crd_in_crds_folder(name):
    assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text(), (
        f"make chart-sync: copy crds/{name} to charts/pdscale/crds/")


def test_chart_rbac_rules_are_the_operators_rules():
    rendered = by_kind(render("rbac.clusterWide=true"), "ClusterRole")[0]["rules"]
    assert rendered == json.loads(json.dumps(rbac.rules())), (
        "make chart-sync: regenerate charts/pdscale/rbac-*-rules.yaml from pdscale.operator.render.rbac"
    )


def test_the_default_rbac_is_namespaced_to_the_release_namespace():
    docs = render()
    cluster_role = by_kind(docs, "ClusterRole")[0]
    # cluster-wide: only following the CRD and namespaces, nothing that writes
    assert cluster_role["rules"] == json.loads(json.dumps(rbac.watching_rules() + rbac.cluster_rules()))
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in cluster_role["rules"])
    roles = {r["metadata"]["namespace"]: r["rules"] for r in by_kind(docs, "Role")
             if r["metadata"]["name"] == cluster_role["metadata"]["name"]}
    assert roles == {"pdscale-system": json.loads(json.dumps(rbac.namespaced_rules()))}
    container = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--all-namespaces" not in container["args"]
    assert "--namespace=pdscale-system" in container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PDSCALE_WATCH_NAMESPACES"] == "pdscale-system"


def test_cluster_wide_rbac_only_when_asked_and_never_with_a_namespace_list():
    docs = render("rbac.clusterWide=true")
    container = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--all-namespaces" in container["args"]
    assert {e["name"]: e.get("value") for e in container["env"]}["PDSCALE_WATCH_NAMESPACES"] == ""
    cluster_role = by_kind(docs, "ClusterRole")[0]
    assert not [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == cluster_role["metadata"]["name"]]
    result = helm("template", "t", str(CHART), "--kube-version", KUBE_VERSION,
                  "--set", "rbac.clusterWide=true", "--set", "operator.watchNamespaces={a}", check=False)
    assert result.returncode != 0 and "rbac.clusterWide" in result.stderr


def test_helm_lint_strict_passes():
    helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)


@pytest.mark.parametrize(("value", "field", "reason"), [
    ("replicaCount=two", "/replicaCount", "want integer"),
    ("replicaCount=6", "/replicaCount", "maximum"),
    ("operator.logLevel=verbose", "/operator/logLevel", "must be one of"),
    ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval", "pattern"),
    ("operatr.workers=3", "", "additional properties 'operatr' not allowed"),
])
def test_bad_values_are_refused_naming_the_field(value, field, reason):
    result = helm("template", "t", str(CHART), "--kube-version", KUBE_VERSION, "--set", value,
                  check=False)
    assert result.returncode != 0
    assert f"at '{field}'" in result.stderr
    assert reason in result.stderr


def test_operator_pod_meets_the_restricted_pod_security_standard():
    deployment = by_kind(render(), "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--all-namespaces" not in container["args"]  # namespaced by default
    assert container["resources"]["limits"]["memory"] == "1Gi"


def test_watch_namespaces_grant_roles_there_and_only_the_crd_cluster_wide():
    docs = render("operator.watchNamespaces={team-a,team-b}")
    cluster_role = by_kind(docs, "ClusterRole")[0]
    assert cluster_role["rules"] == json.loads(json.dumps(rbac.watching_rules() + rbac.cluster_rules()))
    roles = {r["metadata"]["namespace"]: r["rules"] for r in by_kind(docs, "Role")
             if r["metadata"]["name"] == cluster_role["metadata"]["name"]}
    assert roles == {ns: json.loads(json.dumps(rbac.namespaced_rules())) for ns in ("team-a", "team-b")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")
                if b["roleRef"]["name"] == cluster_role["metadata"]["name"]}
    assert set(bindings) == {"team-a", "team-b"}
    assert bindings["team-a"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "pdscale-operator", "namespace": "pdscale-system"}]
    env = {e["name"]: e.get("value") for e in
           by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDSCALE_WATCH_NAMESPACES"] == "team-a,team-b"
    wide = render("rbac.clusterWide=true")
    assert all(r["metadata"]["name"] != cluster_role["metadata"]["name"] for r in by_kind(wide, "Role"))


def test_watch_namespaces_replace_all_namespaces():
    args = by_kind(render("operator.watchNamespaces={team-a,team-b}"), "Deployment")[0][
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" not in args
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(args)


def test_optional_parts_follow_their_switches():
    assert not by_kind(render(), "ServiceMonitor")
    assert by_kind(render("metrics.serviceMonitor.enabled=true"), "ServiceMonitor")
    dashboards = by_kind(render(), "ConfigMap")
    assert dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(dashboards[0]["data"]["pdscale.json"])
    titles = [p["title"] for p in dashboard["panels"]]
    assert any("TTFT" in t for t in titles) and any("prefill" in t for t in titles)
    assert not by_kind(render("grafana.dashboard.enabled=false"), "ConfigMap")


def test_every_value_is_documented():
    """Every knob of the schema has a comment line right above it in values.yaml, and a
    description in values.schema.json."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    commented: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)([A-Za-z]\w*):", line)
        if not key:
            continue
        indent = len(key.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key.group(2)])
        stack.append((indent, key.group(2)))
        commented[path] = i > 0 and lines[i - 1].strip().startswith("#")

    def knobs(node, prefix=""):
        for name, sub in node.get("properties", {}).items():
            yield f"{prefix}{name}", sub
            yield from knobs(sub, f"{prefix}{name}.")

    missing = [p for p, _ in knobs(schema) if not commented.get(p, False)]
    assert not missing, f"values.yaml keys without a comment above them: {missing}"
    undescribed = [p for p, sub in knobs(schema) if "description" not in sub]
    assert not undescribed, f"schema fields without a description: {undescribed}"


@pytest.mark.cluster
def test_helm_install_gives_the_operator_exactly_its_permissions(cluster, admin_api, namespace):
    release = f"e2e-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--set", "grafana.dashboard.enabled=false", "--set", "rbac.clusterWide=true", "--wait=false")
    try:
        crd = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(
            "pdclusters.pdscale.io")
        assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
        role = client.RbacAuthorizationV1Api(admin_api).read_cluster_role(
            f"pdscale-operator-{namespace}")
        assert [r.to_dict()["verbs"] for r in role.rules] == [r["verbs"] for r in rbac.rules()]

        core = client.CoreV1Api(admin_api)
        token = core.create_namespaced_service_account_token(
            "pdscale-operator", namespace, {"spec": {"expirationSeconds": 600}}).status.token
        cfg = client.Configuration()
        cfg.host = admin_api.configuration.host
        cfg.ssl_ca_cert = admin_api.configuration.ssl_ca_cert
        cfg.api_key = {"authorization": f"Bearer {token}"}
        as_operator = client.ApiClient(cfg)
        client.CustomObjectsApi(as_operator).list_cluster_custom_object(
            "pdscale.io", "v1alpha1", "pdclusters")
        client.AppsV1Api(as_operator).list_deployment_for_all_namespaces()
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(as_operator).list_secret_for_all_namespaces()
        assert refused.value.status == 403
        deployment = client.AppsV1Api(admin_api).read_namespaced_deployment("pdscale-operator", namespace)
        assert deployment.spec.template.spec.service_account_name == "pdscale-operator"
    finally:
        helm("uninstall", release, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig))


def test_the_tenant_policy_is_rendered_from_values_for_admission_and_the_operator():
    docs = render()
    policy = by_kind(docs, "ValidatingAdmissionPolicy")[0]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["tenantPolicy"]
    assert json.loads(variables["imagePrefixes"]) == values["allowedImagePrefixes"]
    assert json.loads(variables["hostPathPrefixes"]) == values["allowedHostPathPrefixes"]
    binding = by_kind(docs, "ValidatingAdmissionPolicyBinding")[0]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    env = {e["name"]: e.get("value") for e in
           by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["PDSCALE_TENANT_POLICY"]) == {k: v for k, v in values.items() if k != "admission"}
    # switches add their rules; admission can be left to the operator alone
    strict = by_kind(render("tenantPolicy.allowEnv=false", "tenantPolicy.allowAffinity=false"),
                     "ValidatingAdmissionPolicy")[0]
    messages = " ".join(v.get("message", "") for v in strict["spec"]["validations"])
    assert "allowEnv: false" in messages and "allowAffinity: false" in messages
    assert not by_kind(render("tenantPolicy.admission=false"), "ValidatingAdmissionPolicy")


def _pdcluster(name: str, **changes) -> dict:
    body = yaml.safe_load((ROOT / "examples" / "sglang-glm-4p8d.yaml").read_text())
    body["metadata"] = {"name": name}
    for dotted, value in changes.items():
        node = body["spec"]
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return body


@pytest.mark.cluster
def test_the_api_server_refuses_what_the_tenant_policy_forbids(cluster, admin_api, namespace):
    release = f"vap-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--set", "grafana.dashboard.enabled=false", "--set", "replicaCount=0",
         "--set", "tenantPolicy.allowPodAnnotations=false",
         "--set", "tenantPolicy.reservedEnvNames={NCCL_DEBUG}", "--wait=false")
    custom = client.CustomObjectsApi(admin_api)

    def create(body: dict) -> ApiException | None:
        try:
            custom.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdclusters", body)
        except ApiException as exc:
            return exc
        return None

    try:
        forbidden = {
            "spec.engine.image": _pdcluster("img", **{"engine.image": "evil.example/miner:1"}),
            "spec.router.image": _pdcluster("rtr", **{"router.image": "evil.example/router:1"}),
            "spec.model.weights.hostPath.path": _pdcluster(
                "host", **{"model.weights": {"hostPath": {"path": "/var/lib/kubelet"}}}),
            "spec.placement.podAnnotations": _pdcluster(
                "ann", **{"placement.podAnnotations": {"team": "a"}}),
            "spec.prefill.env": _pdcluster("env", **{"prefill.env": [{"name": "NCCL_DEBUG", "value": "1"}]}),
        }
        # The policy takes a moment to reach the API server's admission chain, and another
        # release's policy (cluster-wide, from another test) may already refuse the image
        # fields: so each field is waited for, not one probe (CI once saw the image refused
        # and this release's podAnnotations rule not yet loaded).
        deadline = time.monotonic() + 30
        for field, body in forbidden.items():
            while (exc := create(body)) is None and time.monotonic() < deadline:
                custom.delete_namespaced_custom_object("pdscale.io", "v1alpha1", namespace,
                                                       "pdclusters", body["metadata"]["name"])
                time.sleep(1)
            assert exc is not None and exc.status in (403, 422), f"{field}: admitted"
            assert field in exc.body and "tenant policy" in exc.body, exc.body
        assert create(_pdcluster("ok")) is None  # the example itself is allowed
    finally:
        helm("uninstall", release, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig))


def test_the_prometheus_url_and_allow_list_are_the_admins_values():
    docs = render("operator.prometheusURL=http://prom.monitoring:9090",
                  "tenantPolicy.allowedPrometheusURLs={vm.monitoring.svc}")
    env = {e["name"]: e.get("value") for e in
           by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDSCALE_PROMETHEUS_URL"] == "http://prom.monitoring:9090"
    assert json.loads(env["PDSCALE_TENANT_POLICY"])["allowedPrometheusURLs"] == ["vm.monitoring.svc"]
    policy = by_kind(docs, "ValidatingAdmissionPolicy")[0]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["prometheusURLs"]) == ["vm.monitoring.svc"]
    assert any("allowedPrometheusURLs" in v.get("messageExpression", "")
               for v in policy["spec"]["validations"])
    # by default: no operator Prometheus, and no spec may name one
    default = render()
    env = {e["name"]: e.get("value") for e in
           by_kind(default, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PDSCALE_PROMETHEUS_URL"] == ""
    assert json.loads(env["PDSCALE_TENANT_POLICY"])["allowedPrometheusURLs"] == []


#: URLs a spec may name, against the allow-list below: both enforcers must agree on each
PROMETHEUS_ALLOWED = ["http://prom.monitoring:9090", "https://thanos.example/prom/", "vm.monitoring.svc",
                      "mimir.monitoring.svc:8080"]
PROMETHEUS_CORPUS = [
    "http://prom.monitoring:9090", "http://prom.monitoring:9090/", "http://prom.monitoring:9090/x/y",
    "http://prom.monitoring:90901", "http://prom.monitoring:9090@evil.example/",
    "http://prom.monitoring:9090.evil.example/", "https://prom.monitoring:9090",
    "https://thanos.example/prom", "https://thanos.example/prom/api", "https://thanos.example/promx",
    "http://vm.monitoring.svc", "https://vm.monitoring.svc:8428/select/0/prometheus",
    "http://vm.monitoring.svc.evil.example", "http://user@vm.monitoring.svc/",
    "http://vm.monitoring.svc?x=1", "http://vm.monitoring.svc#frag",
    "http://mimir.monitoring.svc:8080/prometheus", "http://mimir.monitoring.svc:8081/prometheus",
    "http://mimir.monitoring.svc/prometheus", "http://169.254.169.254/latest/meta-data",
    "http://kubernetes.default.svc/api", "http://", "https://:9090/",
    "http://prom.monitoring:9090//", "http://VM.monitoring.svc/",
]


@pytest.mark.cluster
def test_admission_and_the_operator_agree_on_every_prometheus_url(cluster, admin_api, namespace):
    """The differential for allowedPrometheusURLs: each URL of the corpus is created through
    the API server under the chart's admission policy, and its verdict compared with the
    operator's (tenant_policy.prometheus_url_allowed)."""
    from pdscale.operator.api.tenant_policy import prometheus_url_allowed

    release = f"vapp-{uuid.uuid4().hex[:6]}"
    helm("install", release, str(CHART), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--set", "grafana.dashboard.enabled=false", "--set", "replicaCount=0",
         "--set-json", f"tenantPolicy.allowedPrometheusURLs={json.dumps(PROMETHEUS_ALLOWED)}",
         "--wait=false")
    custom = client.CustomObjectsApi(admin_api)

    def admitted(name: str, url: str) -> bool:
        body = _pdcluster(name, **{"planner.prometheusURL": url})
        try:
            custom.create_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdclusters", body)
        except ApiException as exc:
            assert exc.status in (403, 422), exc.body
            assert "spec.planner.prometheusURL" in exc.body, exc.body
            return False
        custom.delete_namespaced_custom_object("pdscale.io", "v1alpha1", namespace, "pdclusters", name)
        return True

    try:
        # the policy takes a moment to reach the admission chain: wait until it refuses one;
        # and another test's release (uninstalled just before, but cluster-wide and with an
        # empty allow-list) takes a moment to leave it: wait until an allowed URL is admitted
        # (CI once saw every allowed URL refused by that policy)
        deadline = time.monotonic() + 30
        while admitted("probe", "http://169.254.169.254/") and time.monotonic() < deadline:
            time.sleep(1)
        deadline = time.monotonic() + 60
        while not admitted("probe-ok", PROMETHEUS_ALLOWED[0]) and time.monotonic() < deadline:
            time.sleep(1)
        disagree = {url: (ok, prometheus_url_allowed(url, tuple(PROMETHEUS_ALLOWED)))
                    for i, url in enumerate(PROMETHEUS_CORPUS)
                    if (ok := admitted(f"u{i}", url)) != prometheus_url_allowed(url, tuple(PROMETHEUS_ALLOWED))}
        assert disagree == {}, f"(admission, operator) disagree: {disagree}"
    finally:
        helm("uninstall", release, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig))


def test_the_operator_is_told_its_own_pod_labels_for_the_network_policies():
    docs = render("networkPolicy.monitoringNamespaces={prom}")
    deployment = by_kind(docs, "Deployment")[0]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = json.loads(env["PDSCALE_NETWORK_POLICY"])
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert settings["operatorPodLabels"].items() <= pod_labels.items()  # selects the operator's pods
    assert settings["operatorNamespace"] == "pdscale-system"
    assert settings["monitoringNamespaces"] == ["prom"] and settings["enabled"] is True


@pytest.mark.cluster
def test_with_watch_namespaces_the_operator_cannot_write_outside_them(cluster, admin_api, namespace):
    release = f"ns-{uuid.uuid4().hex[:6]}"
    other = f"{namespace}-other"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": other}})
    helm("install", release, str(CHART), "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--set", "grafana.dashboard.enabled=false", "--set", "replicaCount=0",
         "--set", "tenantPolicy.admission=false", "--set", f"operator.watchNamespaces={{{namespace}}}",
         "--wait=false")
    try:
        token = core.create_namespaced_service_account_token(
            "pdscale-operator", namespace, {"spec": {"expirationSeconds": 600}}).status.token
        cfg = client.Configuration()
        cfg.host = admin_api.configuration.host
        cfg.ssl_ca_cert = admin_api.configuration.ssl_ca_cert
        cfg.api_key = {"authorization": f"Bearer {token}"}
        apps = client.AppsV1Api(client.ApiClient(cfg))
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe"},
                      "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                          "metadata": {"labels": {"a": "b"}},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
        apps.create_namespaced_deployment(namespace, deployment, dry_run="All")  # watched: allowed
        for forbidden in (lambda: apps.create_namespaced_deployment(other, deployment, dry_run="All"),
                          lambda: apps.list_deployment_for_all_namespaces(),
                          lambda: client.CoreV1Api(client.ApiClient(cfg)).list_pod_for_all_namespaces()):
            with pytest.raises(ApiException) as refused:
                forbidden()
            assert refused.value.status == 403
    finally:
        helm("uninstall", release, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig))
        core.delete_namespace(other)


def test_every_pdscale_metric_the_dashboard_queries_is_one_the_operator_exports():
    import importlib

    from prometheus_client import REGISTRY

    importlib.import_module("pdscale.operator.handlers")  # registers the operator's collectors
    exported = {name for name in REGISTRY._names_to_collectors if name.startswith("pdscale_")}
    dashboard = json.loads((CHART / "dashboards" / "pdscale.json").read_text())
    queried = {m for panel in dashboard["panels"] for target in panel["targets"]
               for m in re.findall(r"\bpdscale_[a-z_]+", target["expr"])}
    assert "pdscale_nodes_per_instance" in queried  # the nodes panel: instances x group size
    assert queried <= exported, queried - exported
