"""Issue 21 item 2: credentials.sources match whole segments of a source URI, for every reader."""

from __future__ import annotations

import pytest

from praesto.credscope import CredentialScope, source_within


@pytest.mark.parametrize(
    ("uri", "prefix", "inside"),
    [
        ("s3://models", "s3://models", True),
        ("s3://models/llama", "s3://models", True),
        ("s3://models-private/llama", "s3://models", False),  # the reported case
        ("s3://modelsx", "s3://models", False),
        ("s3://models/shared/llama", "s3://models/shared", True),
        ("s3://models/shared-private/llama", "s3://models/shared", False),
        ("s3://models/shared/llama", "s3://models/shared/", True),
        ("hf://my-org/llama", "hf://my-org", True),
        ("hf://my-org-evil/llama", "hf://my-org", False),
        ("hf://my-org/llama", "hf://my-org/llama", True),
        ("hf://my-org/llama-private", "hf://my-org/llama", False),
        ("gs://models/a", "s3://models", False),
    ],
)
def test_a_prefix_covers_whole_segments_only(uri: str, prefix: str, inside: bool) -> None:
    assert source_within(uri, [prefix]) is inside


def test_no_prefixes_cover_every_source_but_no_namespace_is_entitled_unless_listed() -> None:
    assert source_within("s3://anything/at/all", [])
    assert not CredentialScope().entitled("default", "s3://anything")
    scope = CredentialScope(("ml-prod",), ("s3://models",))
    assert scope.entitled("ml-prod", "s3://models/llama")
    assert not scope.entitled("ml-prod", "s3://models-private/llama")
    assert not scope.entitled("ml-dev", "s3://models/llama")
