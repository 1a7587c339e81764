"""The shared spec parser: seed examples parse; bad input names field, cause and fix."""

from __future__ import annotations

import pytest

from praesto import kinds, names
from praesto.quantity import parse_duration, parse_quantity
from praesto.spec import InvalidSpec, SecretRef, Source, parse_spec, parse_uri
from testkit.helm_chart import CRD_DIR, crd_documents


def test_seed_local_example_parses() -> None:
    spec = parse_spec(
        {
            "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}},
            "storage": {"size": "5Gi"},
            "nodeSelector": {"praesto.io/cache-node": "true"},
        }
    )
    assert spec.mode == names.MODE_NODE
    assert spec.size_bytes == 5 * 2**30
    assert spec.source.uri == "hf://TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert spec.source.revision == "main"


def test_seed_pvc_example_parses() -> None:
    spec = parse_spec(
        {
            "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}},
            "storage": {"size": "5Gi", "storageClassName": "rwx-storage-class"},
        }
    )
    assert spec.mode == names.MODE_PVC


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"source": {"huggingface": {"repo": "a/b"}}, "storage": {"size": "0"}}, "spec.storage.size"),
        ({"source": {"huggingface": {"repo": "a/b"}}, "storage": {}}, "spec.storage.size"),
        (
            {"source": {"huggingface": {"repo": "nope"}}, "storage": {"size": "1Gi"}},
            "spec.source.huggingface.repo",
        ),
        (
            {"source": {"huggingface": {"repo": "a/b"}, "uri": "hf://a/b"}, "storage": {"size": "1Gi"}},
            "spec.source",
        ),
        (
            {
                "source": {"huggingface": {"repo": "a/b", "token": {"secretRef": {"name": "s"}}}},
                "storage": {"size": "1"},
            },
            "spec.source.huggingface.token.secretRef.key",
        ),
        ({"source": {"uri": "ftp://x/y"}, "storage": {"size": "1Gi"}}, "spec.source.uri"),
        (
            {"source": {"uri": "hf://a/b"}, "storage": {"size": "1Gi"}, "eviction": {"unusedTTL": "soon"}},
            "spec.eviction.unusedTTL",
        ),
        ({"source": {"uri": "hf://a/b:bad..rev"}, "storage": {"size": "1Gi"}}, "spec.source.uri"),
    ],
)
def test_refusals_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec)
    assert any(e.field == field for e in info.value.errors), info.value.errors
    assert all(e.cause and e.fix for e in info.value.errors)


def test_uri_forms() -> None:
    hf, errors = parse_uri("hf://org/name:v1.0")
    assert not errors and hf is not None
    assert (hf.location, hf.revision) == ("org/name", "v1.0")
    s3, errors = parse_uri("s3://bucket/some/prefix")
    assert not errors and s3 is not None and s3.location == "bucket/some/prefix"


def test_quantities_and_durations() -> None:
    assert parse_quantity("1.5Gi") == 1610612736
    assert parse_quantity("2G") == 2_000_000_000
    assert parse_duration("1h30m") == 5400
    assert parse_duration("7d") == 7 * 86400


def test_names_are_bounded_and_distinct() -> None:
    long_a = "ip-10-0-0-1." + "x" * 200 + ".a"
    long_b = "ip-10-0-0-1." + "x" * 200 + ".b"
    a, b = names.modelcachenode_name("c" * 63, long_a), names.modelcachenode_name("c" * 63, long_b)
    assert a != b and len(a) <= 63 and names.is_dns_label(a) and names.is_dns_label(b)
    assert names.is_label_value(names.node_label_value(long_a))
    assert len(names.download_job_name("x" * 63)) <= 63
    assert names.ready_label_key("ns", "m").startswith(names.READY_LABEL_PREFIX)


def test_a_source_version_is_what_a_rolling_update_changes() -> None:
    """The revision of a Hub or OCI source, the bucket/prefix of an object store (same bucket only)."""

    def src(uri: str) -> Source:
        parsed, errors = parse_uri(uri)
        assert parsed is not None and not errors
        return parsed

    assert src("hf://org/m:v2").version == "v2" and src("hf://org/m").rolls_to(src("hf://org/m:v2"))
    assert not src("hf://org/m").rolls_to(src("hf://org/n"))
    v1, v2 = src("s3://bkt/llama/v1"), src("s3://bkt/llama/v2")
    assert (v1.version, v1.lineage) == ("bkt/llama/v1", "s3://bkt")
    assert v1.rolls_to(v2) and v1.with_version(v2.version) == v2
    assert v1.rolls_to(src("s3://bkt")) and src("s3://bkt").version == "bkt"
    assert not v1.rolls_to(src("s3://other/llama/v2")) and not v1.rolls_to(src("gs://bkt/llama/v2"))
    with_secret = Source(v2.scheme, v2.location, secret_ref=SecretRef("creds", None))
    assert not v1.rolls_to(with_secret)
    oci = src("oci://reg.example.com/team/m:1.0")
    assert oci.rolls_to(src("oci://reg.example.com/team/m:1.1")) and oci.version == "1.0"


MS = "spec.source.modelscope"


def _ms_refusals(modelscope: object, **source: object) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec({"source": {"modelscope": modelscope, **source}, "storage": {"size": "1Gi"}})
    return [str(e) for e in info.value.errors]


def test_a_modelscope_source_is_one_row_of_the_kind_table() -> None:
    """spec.source.modelscope and ms:// parse like the Hub's: default branch master (modelscope
    1.40.2 DEFAULT_MODEL_REVISION), a 40-hex commit id pins, a branch or tag resolves once and rolls."""
    token = {"secretRef": {"name": "ms-token", "key": "MODELSCOPE_API_TOKEN"}}
    spec = parse_spec(
        {"source": {"modelscope": {"repo": "Qwen/Qwen2.5-0.5B", "token": token}}, "storage": {"size": "1Gi"}}
    )
    source = spec.source
    assert (source.uri, source.revision) == ("ms://Qwen/Qwen2.5-0.5B", "master")
    assert source.secret_ref == SecretRef("ms-token", "MODELSCOPE_API_TOKEN")
    assert not source.pinned and source.resolves and source.is_pin("0123456789abcdef" * 2 + "01234567")
    assert not source.is_pin("sha256:" + "a" * 64)  # an OCI digest names nothing on a hub
    by_uri, errors = parse_uri("ms://Qwen/Qwen2.5-0.5B:v2")
    assert by_uri is not None and not errors and by_uri.version == "v2"
    assert source.with_secret(SecretRef("x")).rolls_to(by_uri.with_secret(SecretRef("x")))
    for other in ("ms://Qwen/other:v2", "hf://Qwen/Qwen2.5-0.5B:v2"):
        moved = parse_uri(other)[0]
        assert moved is not None and not by_uri.rolls_to(moved)


def test_modelscope_refusals_name_the_field_cause_and_fix() -> None:
    assert _ms_refusals({"repo": "no-slash"}) == [
        f"{MS}.repo: Invalid value: 'no-slash': must be org/name; e.g. Qwen/Qwen2.5-0.5B-Instruct"
    ]
    assert _ms_refusals({"repo": "a/b", "revision": "bad..rev"}) == [
        f"{MS}.revision: Invalid value: 'bad..rev': is not a valid git branch, tag or commit; "
        "use a branch such as master, a tag, or a 40-hex commit"
    ]
    assert _ms_refusals({"repo": "a/b", "token": {"secretRef": {"name": "s"}}}) == [
        f"{MS}.token.secretRef.key: secretRef.name and secretRef.key must be configured together; "
        "set both the Secret's name and the key that holds the token"
    ]
    token = {"secretRef": {"name": "s", "key": "k"}}
    assert _ms_refusals({"repo": "a/b", "token": token}, secretRef={"name": "c"}) == [
        "spec.source.secretRef: source.modelscope.token and source.secretRef are both set; "
        "keep one: the token Secret or the credentials Secret"
    ]
    assert _ms_refusals({"repo": "a/b"}, uri="ms://a/b")[0].startswith(
        "spec.source: source.modelscope and source.uri are both set; set one of source.huggingface, "
        "source.oci, source.modelscope or source.uri"
    )
    _, errors = parse_uri("ms://nope")
    assert [str(e) for e in errors] == [
        "spec.source.uri: Invalid value: 'ms://nope': ModelScope repo must be org/name; e.g. ms://org/name"
    ]


def test_the_crds_modelscope_field_and_uri_schemes_are_the_tables_own() -> None:
    schemes = f"^({'|'.join(kinds.URI_SCHEMES)})://.+$"
    for crd in crd_documents(CRD_DIR):
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"].get("spec", {})
        source = spec.get("properties", {}).get("source", {}).get("properties")
        if source is None:
            continue
        assert source["uri"]["pattern"] == schemes, crd["spec"]["names"]["kind"]
        if "modelscope" in source:
            assert source["modelscope"]["properties"]["repo"]["pattern"] == kinds.MS_REPO_PATTERN
            assert set(source) >= set(kinds.SOURCE_FORMS)
