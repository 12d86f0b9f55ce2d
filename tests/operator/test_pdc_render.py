"""`pdscale render -f FILE`: the manifests, or exit 2 with the field-naming message."""

from __future__ import annotations

import pathlib

import yaml

from pdscale.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sglang-glm-4p8d.yaml"


def test_render_prints_every_child(capsys):
    assert main(["render", "-f", str(SAMPLE), "-n", "serving"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("NetworkPolicy", "glm53-engines"), ("NetworkPolicy", "glm53-router"),
        ("ServiceAccount", "glm53-router"), ("Service", "glm53-prefill"),
        ("Deployment", "glm53-prefill"), ("Service", "glm53-decode"),
        ("Deployment", "glm53-decode"), ("Service", "glm53-router"),
        ("Deployment", "glm53-router"),
    ]
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}


def test_render_can_prepend_the_crd(capsys):
    assert main(["render", "-f", str(SAMPLE), "--include-crd"]) == 0
    first = next(yaml.safe_load_all(capsys.readouterr().out))
    assert first["kind"] == "CustomResourceDefinition"


def test_invalid_spec_exits_2_naming_the_field(tmp_path, capsys):
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["kvTransfer"]["bootstrapTimeoutSeconds"] = 300
    doc["spec"]["decode"]["minReplicas"] = 30
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(bad)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [
        "error: pdclusters/glm53: spec.kvTransfer.bootstrapTimeoutSeconds: 300 s is too short: "
        "the slowest prefill (1048576 tokens at 2000 tokens/s plus 50% margin) needs at least 787 s",
        "error: pdclusters/glm53: spec.decode.minReplicas: 30 exceeds maxReplicas 20",
    ]


def test_a_document_of_another_kind_is_refused(tmp_path, capsys):
    f = tmp_path / "x.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    assert main(["render", "-f", str(f)]) == 2
    assert "not a pdscale.io PDCluster" in capsys.readouterr().err


def test_unreadable_file_exits_2(tmp_path, capsys):
    assert main(["render", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_render_holds_the_spec_to_the_tenant_policy_as_the_operator_does(tmp_path, capsys):
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["engine"]["image"] = "registry.corp/sglang:1"
    spec_file = tmp_path / "pdc.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    # the chart's default policy refuses an image from elsewhere, naming field and key
    assert main(["render", "-f", str(spec_file)]) == 2
    err = capsys.readouterr().err
    assert "spec.engine.image" in err and "allowedImagePrefixes" in err
    # the admin's values allow it
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"tenantPolicy": {
        "allowedImagePrefixes": ["registry.corp/", "ghcr.io/lightseekorg/smg:"]}}))
    assert main(["render", "-f", str(spec_file), "--tenant-policy", str(values)]) == 0
    capsys.readouterr()
    # a typo in the policy is refused, never read as "allow everything"
    values.write_text(yaml.safe_dump({"tenantPolicy": {"allowedImagePrefix": ["*"]}}))
    assert main(["render", "-f", str(spec_file), "--tenant-policy", str(values)]) == 2
    assert "allowedImagePrefix" in capsys.readouterr().err
