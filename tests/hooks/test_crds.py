"""CRDs: seed examples validate, bad ones do not, CEL rules hold, columns are as promised."""

from __future__ import annotations

import copy
import re
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from praesto import names
from praesto.quantity import DURATION_PATTERN, QUANTITY_PATTERN
from praesto.spec import HF_REPO_PATTERN, MAX_PATTERN_CHARS, MAX_PATTERNS, InvalidSpec, parse_spec
from tests.hooks.schemas import ROOT, crd, crd_errors

MC, MCN = names.MODELCACHE_KIND, names.MODELCACHENODE_KIND


def _readme_modelcaches() -> list[dict[str, Any]]:
    text = (ROOT / "README.md").read_text()
    docs = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == MC]


def _schema(kind: str) -> dict[str, Any]:
    return crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _rules(node: Any, path: str = "") -> list[tuple[str, str]]:
    """(schema path, CEL rule) for every x-kubernetes-validations entry."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            out.append((path, rule["rule"]))
        for key, value in node.items():
            out += _rules(value, f"{path}.{key}" if key != "properties" else path)
    return out


# The Kubernetes CEL string library functions our rules use (cel-go ext.Strings, enabled by the
# API server; celpy has only the CEL core). The tiers run the rules in the real API servers.
def _last_index_of(text: celtypes.StringType, sub: celtypes.StringType) -> celtypes.IntType:
    return celtypes.IntType(str(text).rfind(str(sub)))


def _substring(
    text: celtypes.StringType, start: celtypes.IntType, end: celtypes.IntType
) -> celtypes.StringType:
    return celtypes.StringType(str(text)[int(start) : int(end)])


def _split(text: celtypes.StringType, sep: celtypes.StringType) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(p) for p in str(text).split(str(sep))])


K8S_STRINGS: dict[str, Any] = {"lastIndexOf": _last_index_of, "substring": _substring, "split": _split}


def _cel(rule: str, self_value: Any, old: Any = None) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(rule), functions=K8S_STRINGS)
    activation = {"self": json_to_cel(self_value)}
    if old is not None:
        activation["oldSelf"] = json_to_cel(old)
    return program.evaluate(activation)


def test_seed_readme_examples_validate() -> None:
    examples = _readme_modelcaches()
    assert {e["metadata"]["name"] for e in examples} >= {"tinyllama", "tinyllama-rwx"}
    for example in examples:
        assert crd_errors(example) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s["storage"].pop("size"), "size"),
        (lambda s: s["storage"].update(size="five gigs"), "size"),
        (lambda s: s["source"]["huggingface"].update(repo="nope"), "repo"),
        (lambda s: s["source"]["huggingface"].update(token={"secretRef": {"name": "t"}}), "key"),
        (lambda s: s.update(eviction={"unusedTTL": "soon"}), "unusedTTL"),
        (lambda s: s.pop("source"), "source"),
    ],
)
def test_bad_specs_are_refused_by_the_schema(change: Any, field: str) -> None:
    example = copy.deepcopy(_readme_modelcaches()[0])
    change(example["spec"])
    errors = crd_errors(example)
    assert errors and any(field in e for e in errors), errors


def test_patterns_are_the_parsers_own() -> None:
    spec = _schema(MC)["properties"]["spec"]["properties"]
    assert spec["storage"]["properties"]["size"]["pattern"] == QUANTITY_PATTERN
    assert spec["eviction"]["properties"]["unusedTTL"]["pattern"] == DURATION_PATTERN
    assert spec["source"]["properties"]["huggingface"]["properties"]["repo"]["pattern"] == HF_REPO_PATTERN
    node_spec = _schema(MCN)["properties"]["spec"]["properties"]
    assert node_spec["size"]["pattern"] == QUANTITY_PATTERN


def test_pattern_list_bounds_are_the_parsers_own() -> None:
    """Issue 37: the CRDs bound allowPatterns / ignorePatterns where the parser does, and no further."""
    hf = _schema(MC)["properties"]["spec"]["properties"]["source"]["properties"]["huggingface"]["properties"]
    node_source = _schema(MCN)["properties"]["spec"]["properties"]["source"]["properties"]
    for field in ("allowPatterns", "ignorePatterns"):
        for schema in (hf[field], node_source[field]):
            assert schema["maxItems"] == MAX_PATTERNS
            assert schema["items"]["maxLength"] == MAX_PATTERN_CHARS
    longest = "*" * MAX_PATTERN_CHARS
    for field in ("allowPatterns", "ignorePatterns"):
        for patterns in ([longest] * MAX_PATTERNS, ["*"] * (MAX_PATTERNS + 1), [longest + "*"]):
            spec = {"source": {"huggingface": {"repo": "a/b", field: patterns}}, "storage": {"size": "1Gi"}}
            admitted = len(patterns) <= MAX_PATTERNS and all(len(p) <= MAX_PATTERN_CHARS for p in patterns)
            assert (crd_errors({"apiVersion": names.API_VERSION, "kind": MC, "metadata": {"name": "x"},
                                "spec": spec}) == []) == admitted  # fmt: skip
            if admitted:
                parse_spec(spec)
                continue
            with pytest.raises(InvalidSpec) as info:
                parse_spec(spec)
            (error,) = info.value.errors
            assert error.field == f"spec.source.huggingface.{field}"
            assert f"at most {MAX_PATTERNS} patterns of at most {MAX_PATTERN_CHARS} characters" in error.cause


def test_every_cel_rule_compiles() -> None:
    rules = _rules(_schema(MC)) + _rules(_schema(MCN))
    assert len(rules) >= 6
    env = celpy.Environment()
    for _, rule in rules:
        env.compile(rule)


def test_cel_rules_decide_as_documented() -> None:
    rules = dict(_rules(_schema(MC)))
    source_rules = [r for p, r in _rules(_schema(MC)) if p == ".spec.source"]
    one_form = source_rules[0]
    assert _cel(one_form, {"huggingface": {"repo": "a/b"}})
    assert _cel(one_form, {"uri": "hf://a/b"})
    assert not _cel(one_form, {"huggingface": {"repo": "a/b"}, "uri": "hf://a/b"})
    assert not _cel(one_form, {})
    spec = {"source": {"uri": "hf://a/b"}, "storage": {"size": "1Gi"}}
    assert _cel(rules[".spec"], spec, copy.deepcopy(spec))
    assert not _cel(rules[".spec"], spec, {**spec, "storage": {"size": "2Gi"}})
    name_rule = rules[""]
    assert _cel(name_rule, {"metadata": {"name": "tinyllama"}})
    assert not _cel(name_rule, {"metadata": {"name": "x" * 64}})
    assert not _cel(name_rule, {"metadata": {"name": "Bad_Name"}})
    # a rolling update: the Hugging Face revision and updateStrategy may change, nothing else
    source_change = source_rules[1]
    hf = {"huggingface": {"repo": "a/b", "revision": "main", "allowPatterns": ["*.json"]}}
    moved = {"huggingface": {**hf["huggingface"], "revision": "v2"}}
    assert _cel(source_change, moved, hf)
    assert not _cel(source_change, {"huggingface": {**hf["huggingface"], "repo": "a/c"}}, hf)
    assert not _cel(source_change, {"huggingface": {**hf["huggingface"], "allowPatterns": []}}, hf)
    assert _cel(source_change, {"uri": "hf://a/b:v2"}, {"uri": "hf://a/b"})  # the revision in a uri
    assert not _cel(source_change, {"uri": "hf://a/c:v2"}, {"uri": "hf://a/b:v2"})
    assert _cel(source_change, {"uri": "s3://bkt/models/v2"}, {"uri": "s3://bkt/models/v1"})  # a prefix
    assert _cel(source_change, {"uri": "az://bkt"}, {"uri": "az://bkt/v1"})
    assert not _cel(source_change, {"uri": "s3://other/models/v1"}, {"uri": "s3://bkt/models/v1"})
    assert not _cel(source_change, {"uri": "gs://bkt/models/v1"}, {"uri": "s3://bkt/models/v1"})
    oci = {"oci": {"reference": "reg.example.com:5000/team/llama:1.0"}}
    for moved_to in (
        "reg.example.com:5000/team/llama:1.1",
        "reg.example.com:5000/team/llama@sha256:" + "a" * 64,
    ):
        assert _cel(source_change, {"oci": {"reference": moved_to}}, oci)
        assert _cel(source_change, {"uri": f"oci://{moved_to}"}, {"uri": f"oci://{oci['oci']['reference']}"})
    for other in ("reg.example.com:5000/team/other:1.0", "reg.example.com/team/llama:1.0"):
        assert not _cel(source_change, {"oci": {"reference": other}}, oci)
    local = {"source": hf, "storage": {"size": "1Gi"}}
    assert _cel(rules[".spec"], {**local, "source": moved, "updateStrategy": {"switch": "AllNodes"}}, local)
    assert not _cel(rules[".spec"], {**local, "prewarm": True}, local)
    pvc_rule = next(r for p, r in _rules(_schema(MC)) if p == ".spec" and "storageClassName" in r)
    shared = {"source": hf, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    assert not _cel(pvc_rule, {**shared, "source": moved}, shared)
    assert _cel(pvc_rule, {**local, "source": moved}, local)
    node_rule = next(r for p, r in _rules(_schema(MCN)) if p == ".spec")
    node_spec = {"modelCacheName": "a", "nodeName": "n1"}
    assert _cel(node_rule, {**node_spec, "source": {"revision": "x"}}, node_spec)
    assert not _cel(node_rule, {**node_spec, "nodeName": "n2"}, node_spec)


def test_printer_columns_and_names() -> None:
    version = crd(MC)["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "PHASE",
        "MODE",
        "READY",
        "TOTAL",
        "PVC",
        "DOWNLOAD JOB",
        "PROGRESS",
        "REASON",
        "MESSAGE",
        "AGE",
    ]
    assert {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}["PROGRESS"] == (
        ".status.progress.summary"
    )
    node_columns = crd(MCN)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in node_columns] == [
        "CACHE", "NODE", "PHASE", "DONE", "TOTAL", "REVISION", "REASON", "MESSAGE", "AGE"
    ]  # fmt: skip
    for columns in (version["additionalPrinterColumns"], node_columns):  # REASON before AGE on both
        by_name = {c["name"]: c for c in columns}
        assert by_name["REASON"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
        assert by_name["MESSAGE"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].message'
        assert by_name["MESSAGE"]["priority"] == 1 and "priority" not in by_name["REASON"]
    assert crd(MC)["spec"]["names"]["shortNames"] == ["mc"]
    assert crd(MCN)["spec"]["names"]["shortNames"] == ["mcn"]
    for kind in (MC, MCN):
        assert crd(kind)["spec"]["group"] == names.GROUP
        assert version["name"] == names.VERSION
        assert crd(kind)["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_status_schema_holds_every_field_the_hooks_write() -> None:
    """Metacontroller loops forever when the API server prunes a status field it wrote."""
    from tests.hooks import golden
    from tests.hooks.scenarios import SCENARIOS

    status_schema = _schema(MC)["properties"]["status"]
    for name, (hook, _) in SCENARIOS.items():
        if hook == "customize":
            continue
        status = golden.load(name)["response"]["status"]
        _assert_declared(status, status_schema, f"{name}: status")
    node_status = _schema(MCN)["properties"]["status"]["properties"]
    assert set(node_status) >= {
        "phase",
        "localPath",
        "progress",
        "resolvedRevision",
        "sizeBytes",
        "lastUsedTime",
        "message",
        "conditions",
        "observedGeneration",
        "peer",
        "bytesFromPeers",
    }


def _assert_declared(value: Any, schema: dict[str, Any], path: str) -> None:
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            assert key in schema["properties"], f"{path}.{key} is not in the CRD status schema"
            _assert_declared(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _assert_declared(item, schema["items"], f"{path}[]")
