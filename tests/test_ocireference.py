"""OCI references and OCI sources in a ModelCache spec (praesto/ocireference.py, praesto/spec.py)."""

from __future__ import annotations

import pytest

from praesto.ocireference import ReferenceError, is_loopback, parse_reference
from praesto.spec import InvalidSpec, parse_spec, parse_uri, source_from_node_spec

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "host", "repo", "revision"),
    [
        ("registry.example.com/team/llama:1.0", "registry.example.com", "team/llama", "1.0"),
        ("localhost:5000/m", "localhost:5000", "m", "latest"),
        (f"ghcr.io/a/b/c@{DIGEST}", "ghcr.io", "a/b/c", DIGEST),
        (f"ghcr.io/a/b:v1@{DIGEST}", "ghcr.io", "a/b", DIGEST),  # the digest wins, as in docker pull
        ("[::1]:5000/x:y", "[::1]:5000", "x", "y"),
    ],
)
def test_references_parse(text: str, host: str, repo: str, revision: str) -> None:
    ref = parse_reference(text)
    assert (ref.host, ref.repository, ref.revision) == (host, repo, revision)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("team/llama:1.0", "not a registry host"),
        ("ghcr.io", "names no repository"),
        ("ghcr.io/Team/llama", "repository component 'Team'"),
        ("ghcr.io/a@sha256:abc", "not sha256:<64"),
        ("ghcr.io/a@sha512:" + "a" * 128, "not sha256"),
        ("ghcr.io/a:bad tag", "tag"),
    ],
)
def test_bad_references_say_which_part_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ReferenceError, match=says):
        parse_reference(text)


def test_loopback_is_only_this_machine() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost") and is_loopback("[::1]:443")
    assert not is_loopback("10.0.0.1:5000") and not is_loopback("registry.example.com")


def test_spec_oci_form_and_uri_form_are_one_source_pinned_by_digest() -> None:
    spec = parse_spec({"source": {"oci": {"reference": "ghcr.io/team/m:1.0"}}, "storage": {"size": "1Gi"}})
    assert (spec.source.scheme, spec.source.location, spec.source.revision) == (
        "oci",
        "ghcr.io/team/m",
        "1.0",
    )
    assert not spec.source.pinned and spec.source.resolves and spec.source.is_pin(DIGEST)
    same, errors = parse_uri("oci://ghcr.io/team/m:1.0")
    assert not errors and same == spec.source
    carried = source_from_node_spec(spec.source.with_revision(DIGEST).to_dict())
    assert carried.pinned and carried.revision == DIGEST and carried.uri == "oci://ghcr.io/team/m"


def test_spec_refusals_name_the_field() -> None:
    with pytest.raises(InvalidSpec) as bad:
        parse_spec({"source": {"oci": {"reference": "llama:1.0"}}, "storage": {"size": "1Gi"}})
    assert "spec.source.oci.reference" in str(bad.value) and "registry" in str(bad.value)
    with pytest.raises(InvalidSpec, match=r"source\.huggingface and source\.oci are both set"):
        parse_spec(
            {
                "source": {"huggingface": {"repo": "a/b"}, "oci": {"reference": "ghcr.io/a/b"}},
                "storage": {"size": "1Gi"},
            }
        )
