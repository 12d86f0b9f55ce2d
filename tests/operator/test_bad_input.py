"""`pdscale render -f FILE` on malformed input: exit 2 and a message naming the document and
the field, never a traceback; limits on size, depth and aliases hold before anything is built."""

from __future__ import annotations

import io
import pathlib
import tracemalloc

import pytest
import yaml

from pdscale import spec_file
from pdscale.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sglang-glm-4p8d.yaml"
HEAD = "apiVersion: pdscale.io/v1alpha1\nkind: PDCluster\n"


@pytest.fixture
def render(tmp_path, capsys):
    def go(content: bytes | str, *args: str) -> tuple[int, list[str]]:
        f = tmp_path / "in.yaml"
        f.write_bytes(content.encode() if isinstance(content, str) else content)
        code = main(["render", "-f", str(f), *args])
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        if code != 0:
            assert out.out == ""
        return code, [line.replace(f"{f}: ", "") for line in out.err.splitlines()]
    return go


def sample_with(**meta) -> dict:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"].update(meta)
    return doc


# ---- the file ---------------------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_refused_unread(render):
    code, err = render(b"# " + b"x" * spec_file.MAX_BYTES)
    assert code == 2
    assert err == [f"error: document: the file is larger than {spec_file.MAX_BYTES} bytes"]


@pytest.mark.parametrize("raw", [b"a: \xff\n", "kind: caf\u00e9".encode("latin-1"),
                                 "kind: x".encode("utf-16")])
def test_non_utf8_is_refused(render, raw):
    code, err = render(raw)
    assert code == 2
    assert err[0].startswith("error: document: not UTF-8 text")


def test_a_byte_order_mark_is_fine(render):
    code, _ = render(b"\xef\xbb\xbf" + SAMPLE.read_bytes())
    assert code == 0


def test_deep_nesting_is_refused_at_the_limit(render):
    depth = spec_file.MAX_DEPTH + 1
    code, err = render("x: " + "[" * depth + "]" * depth)
    assert code == 2
    assert f"nested deeper than {spec_file.MAX_DEPTH} levels" in err[0]
    assert err[0].startswith("error: document 1: ")


def test_very_deep_nesting_is_refused_without_recursion(render):
    code, err = render("x: " + "[" * 100_000 + "]" * 100_000)
    assert code == 2
    assert "nest" in err[0]  # ours at MAX_DEPTH, or libyaml's own at 1000


def test_an_alias_bomb_is_refused_before_expansion(render):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    tracemalloc.start()
    code, err = render(HEAD + "\n".join(lines) + "\n")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 2
    assert "once aliases are expanded" in err[0]
    assert peak < 20 * 2**20  # 10^9 values if expanded


def test_too_many_values_are_refused_while_composing(render, monkeypatch):
    monkeypatch.setattr(spec_file, "MAX_NODES", 1000)  # the same check, a smaller file
    code, err = render("x: [" + "1," * 1010 + "1]")
    assert code == 2
    assert "document 1: more than 1000 values in the file line 1, column 1999" in err[0]


def test_too_many_aliases_are_refused(render):
    n = spec_file.MAX_ALIASES + 1
    text = "".join(f"k{i}: &k{i} v\n" for i in range(n)) + "refs: [" + ", ".join(
        f"*k{i}" for i in range(n)) + "]\n"
    code, err = render(text)
    assert code == 2
    assert f"more than {spec_file.MAX_ALIASES} aliases" in err[0]


def test_a_recursive_alias_is_refused(render):
    code, err = render(HEAD + "metadata: &m {name: x, self: *m}\n")
    assert code == 2
    assert "an alias refers to the collection it is in" in err[0]


def test_anchors_and_merge_keys_within_limits_are_fine(render):
    text = SAMPLE.read_text().replace("  prefill:\n    replicas: 4", "  prefill: &role\n    replicas: 4")
    text = text.replace("  decode:\n    replicas: 8", "  decode:\n    <<: *role\n    replicas: 8")
    assert "<<: *role" in text
    code, err = render(text)
    assert (code, err) == (0, [])


@pytest.mark.parametrize(("text", "expected"), [
    ("a: 1\na: 2\n", "duplicate key 'a' (line 2, column 1)"),
    ("a: " + "9" * 5000 + "\n", "an integer of 5000 digits is out of range"),
    ("a: 2001-02-30\n", "not a valid date or time"),
    ('a: "\\ud800"\n', "nvalid Unicode"),  # libyaml's refusal; PyYAML's parser: ours
    ("a: \x00\n", "unacceptable character"),
    ("a: [1\n", "expected ',' or ']'"),
    ("a: !!python/object:os.system x\n", "could not determine a constructor"),
    ("? [a, b]\n: c\n", "unhashable"),
])
def test_yaml_that_cannot_be_read_is_refused(render, text, expected):
    code, err = render(text)
    assert code == 2
    assert err[0].startswith("error: document 1: ")
    assert expected in err[0]


def test_a_lone_surrogate_is_refused_naming_where_it_is():
    assert spec_file._invalid_unicode({"a": ["ok", {"b": "\ud800"}]}, "") == "a[1].b"
    assert spec_file._invalid_unicode({"\udc00": 1}, "") == "document"
    assert spec_file._invalid_unicode({"a": "\u00e9\U0001f680"}, "") is None


def test_stdin_goes_through_the_same_limits():
    raw = io.BytesIO(b"x: " + b"[" * 100 + b"]" * 100)
    with pytest.raises(spec_file.SpecFileError, match="nested deeper"):
        spec_file.read("-", raw)


# ---- the document -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("[1, 2]\n", "document 1: document: must be a mapping (a PDCluster), got list"),
    ("just text\n", "document 1: document: must be a mapping (a PDCluster), got str"),
    ("---\n~\n---\n5\n", "document 2: document: must be a mapping (a PDCluster), got int"),
    (HEAD + "metadata: 5\nspec: {}\n", "document 1: metadata: must be a mapping with at least a name"),
    (HEAD + "metadata: {name: 12}\nspec: {}\n", "document 1: metadata.name: must be a string, got int"),
    (HEAD + "spec: {}\n", "document 1: metadata.name: required"),
    (HEAD + "metadata: {name: x}\nspec: [1]\n", "pdclusters/x: spec: must be a mapping, got list"),
    (HEAD + "metadata: {name: x}\n", "pdclusters/x: spec: required"),
    ("apiVersion: pdscale.io/v2\nkind: PDCluster\nmetadata: {name: x}\n",
     "pdclusters/x: apiVersion: 'pdscale.io/v2' is not served; use pdscale.io/v1alpha1"),
    ("apiVersion: pdscale.io/v1alpha1\nkind: [PDCluster]\n",
     "document 1: kind: not a pdscale.io PDCluster (kind ['PDCluster'])"),
])
def test_a_malformed_document_is_refused_naming_the_field(render, text, expected):
    code, err = render(text)
    assert code == 2
    assert f"error: {expected}" in err


@pytest.mark.parametrize(("meta", "expected"), [
    ({"name": "Glm_53"}, "document 1: metadata.name: a lowercase RFC 1123 subdomain"),
    ({"name": "c" * 254}, "document 1: metadata.name: must be no more than 253 characters"),
    ({"namespace": "Serving"}, "pdclusters/glm53: metadata.namespace: a lowercase RFC 1123 label"),
    ({"namespace": ["a"]}, "pdclusters/glm53: metadata.namespace: must be a string, got list"),
    ({"labels": {"team": "a b"}}, "pdclusters/glm53: metadata.labels[team]: a valid label value"),
])
def test_bad_metadata_is_refused_naming_the_field(render, meta, expected):
    code, err = render(yaml.safe_dump(sample_with(**meta)))
    assert code == 2
    assert any(line.startswith(f"error: {expected}") for line in err), err


def test_an_unknown_top_level_field_is_refused(render):
    doc = sample_with()
    doc["sepc"] = {}
    code, err = render(yaml.safe_dump(doc))
    assert (code, err) == (2, ["error: pdclusters/glm53: sepc: unknown field"])


def test_metadata_and_spec_problems_are_reported_together(render):
    doc = sample_with(namespace="Bad")
    doc["spec"]["engine"]["env"] = [{"name": "1BAD"}]
    code, err = render(yaml.safe_dump(doc))
    assert code == 2
    assert [line.split(": ")[2] for line in err] == ["metadata.namespace", "spec.engine.env[0].name"]


def test_a_bad_namespace_flag_is_refused(render):
    code, err = render(SAMPLE.read_text(), "-n", "Not_A_Namespace")
    assert code == 2
    assert err[0].startswith("error: --namespace: metadata.namespace: a lowercase RFC 1123 label")


def test_a_long_dotted_name_renders_with_valid_child_names(render):
    name = ("serving." * 30 + "glm53")[:253]
    code, err = render(yaml.safe_dump(sample_with(name=name)))
    assert (code, err) == (0, [])


def test_empty_documents_are_skipped(render):
    code, err = render("---\n---\n" + SAMPLE.read_text() + "\n---\n")
    assert (code, err) == (0, [])
