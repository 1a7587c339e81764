"""The shared spec parser: seed examples parse; bad input names field, cause and fix."""

from __future__ import annotations

import pytest

from praesto import names
from praesto.quantity import parse_duration, parse_quantity
from praesto.spec import InvalidSpec, SecretRef, Source, parse_spec, parse_uri


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
