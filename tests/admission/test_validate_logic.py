"""Validating ModelCache webhook: every rule, warnings and immutability, in process."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from praesto.hooks.admission import review
from praesto.hooks.admission.lookup import StaticLookups
from praesto.hooks.admission.validate import changed_fields, validate

from praesto import names
from testkit.admission_objects import NS, Obj, denial

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LOOKUPS = StaticLookups(
    storageclasses={"nfs-rwx"}, node_labels=[{"praesto.io/cache-node": "true"}, {"gpu": "a100"}]
)


def cache(spec: Any, name: str = "llama") -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def hf_spec(**extra: Any) -> Obj:
    spec: Obj = {
        "source": {"huggingface": {"repo": "org/model", "revision": COMMIT}},
        "storage": {"size": "5Gi"},
    }
    spec.update(extra)
    return spec


def run(obj: Obj, operation: str = "CREATE", old: Obj | None = None, lookups: StaticLookups = LOOKUPS) -> Obj:
    body = {
        "apiVersion": review.API_VERSION,
        "kind": review.KIND,
        "request": {"uid": "u", "operation": operation, "namespace": NS, "object": obj, "oldObject": old},
    }
    return validate(review.parse_review(body), lookups)


def test_pinned_local_cache_is_allowed_without_warnings() -> None:
    assert run(cache(hf_spec()))["response"] == {"uid": "u", "allowed": True}


INVALID: list[tuple[str, Any, str]] = [
    ("no spec", None, "spec: Required value"),
    (
        "zero size",
        hf_spec(storage={"size": "0"}),
        "spec.storage.size: Invalid value: '0': must be greater than zero",
    ),
    (
        "bad size",
        hf_spec(storage={"size": "lots"}),
        "spec.storage.size: Invalid value: 'lots': is not a quantity",
    ),
    ("two sources", hf_spec(source={"huggingface": {"repo": "a/b"}, "uri": "hf://a/b"}), "are both set"),
    ("no source", hf_spec(source={}), "spec.source: Required value"),
    ("repo form", hf_spec(source={"huggingface": {"repo": "justname"}}), "spec.source.huggingface.repo"),
    (
        "revision",
        hf_spec(source={"huggingface": {"repo": "a/b", "revision": "a..b"}}),
        "is not a valid git branch",
    ),
    (
        "patterns",
        hf_spec(source={"huggingface": {"repo": "a/b", "allowPatterns": "*.json"}}),
        "allowPatterns: must be a list",
    ),
    (
        "secret pair",
        hf_spec(source={"huggingface": {"repo": "a/b", "token": {"secretRef": {"name": "hf"}}}}),
        "secretRef.name and secretRef.key must be configured together",
    ),
    ("ttl", hf_spec(eviction={"unusedTTL": "-5m"}), "spec.eviction.unusedTTL"),
    ("ttl form", hf_spec(eviction={"unusedTTL": "soon"}), "is not a duration"),
    ("scheme", hf_spec(source={"uri": "ftp://host/x"}), "unsupported scheme 'ftp'"),
]


@pytest.mark.parametrize(
    ("spec", "expected"), [(s, e) for _, s, e in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_specs_are_refused_naming_the_field(spec: Any, expected: str) -> None:
    code, message = denial(run(cache(spec)))
    assert code == 400
    assert message.startswith("spec: invalid ModelCache: ")
    assert expected in message


def test_every_problem_is_listed_at_once() -> None:
    message = denial(run(cache({"source": {"uri": "ftp://x"}, "storage": {"size": "0"}})))[1]
    assert "unsupported scheme" in message and "greater than zero" in message


def test_name_must_be_a_dns_label() -> None:
    code, message = denial(run(cache(hf_spec(), name="x" * 64)))
    assert code == 400 and message.startswith("metadata.name: ") and "at most 63" in message


def test_pvc_mode_needs_an_existing_storage_class() -> None:
    ok = run(cache(hf_spec(storage={"size": "5Gi", "storageClassName": "nfs-rwx"})))
    assert ok["response"]["allowed"] is True
    code, message = denial(run(cache(hf_spec(storage={"size": "5Gi", "storageClassName": "missing"}))))
    assert code == 403
    assert message.startswith("spec.storage.storageClassName: StorageClass 'missing' does not exist")


def test_storage_class_lookup_unavailable_is_refused_with_retry_advice() -> None:
    lookups = StaticLookups(unavailable="timed out")
    spec = hf_spec(storage={"size": "5Gi", "storageClassName": "nfs-rwx"})
    code, message = denial(run(cache(spec), lookups=lookups))
    assert code == 503
    assert "could not read StorageClass nfs-rwx from the Kubernetes API: timed out; retry" in message


def test_warnings() -> None:
    branch = hf_spec(source={"huggingface": {"repo": "org/model"}})
    warnings = run(cache(branch))["response"]["warnings"]
    assert len(warnings) == 1 and "revision 'main' is a branch or tag, not a pinned commit" in warnings[0]
    none_match = run(cache(hf_spec(nodeSelector={"gpu": "h100"})))["response"]
    assert none_match["allowed"] is True
    assert none_match["warnings"] == [
        "spec.nodeSelector gpu=h100 matches no nodes right now; nothing is downloaded until a node has "
        "these labels (or a consuming Pod is scheduled)"
    ]
    assert "warnings" not in run(cache(hf_spec(nodeSelector={"gpu": "a100"})))["response"]
    pvc = hf_spec(storage={"size": "1Gi", "storageClassName": "nfs-rwx"}, nodeSelector={"gpu": "h100"})
    assert run(cache(pvc))["response"]["warnings"] == [
        "spec.nodeSelector is ignored in shared PVC mode (storageClassName is set)"
    ]
    local_downloader = hf_spec(downloader={"image": "x"})
    assert (
        "spec.downloader is ignored in local mode" in run(cache(local_downloader))["response"]["warnings"][0]
    )
    s3 = {"source": {"uri": "s3://bucket/prefix"}, "storage": {"size": "1Gi"}}
    assert "warnings" not in run(cache(s3))["response"]


def test_node_warning_is_skipped_when_nodes_are_unknown() -> None:
    lookups = StaticLookups(unavailable="cold")
    response = run(cache(hf_spec(nodeSelector={"gpu": "h100"})), lookups=lookups)
    assert response["response"] == {"uid": "u", "allowed": True}


def test_spec_is_immutable_on_update_naming_changed_fields() -> None:
    old = cache(hf_spec(nodeSelector={"a": "1"}))
    new = copy.deepcopy(old)
    new["spec"]["storage"]["size"] = "10Gi"
    new["spec"]["nodeSelector"]["b"] = "2"
    code, message = denial(run(new, "UPDATE", old))
    assert code == 400
    assert message.startswith("spec.nodeSelector.b, spec.storage.size: field is immutable")
    assert "delete the ModelCache and create it again" in message


def test_the_revision_and_update_strategy_may_change_in_local_mode_only() -> None:
    old = cache(hf_spec())
    new = copy.deepcopy(old)
    new["spec"]["source"]["huggingface"]["revision"] = "v2"  # a rolling update
    new["spec"]["updateStrategy"] = {"switch": names.SWITCH_ALL_NODES, "maxFetching": 1}
    assert run(new, "UPDATE", old)["response"]["allowed"] is True
    new["spec"]["source"]["huggingface"]["repo"] = "org/other"
    code, message = denial(run(new, "UPDATE", old))
    assert code == 400 and message.startswith("spec.source.huggingface.repo: field is immutable")
    assert "but for the source's revision" in message
    bad = copy.deepcopy(old)
    bad["spec"]["updateStrategy"] = {"switch": "Sometimes"}
    code, message = denial(run(bad, "UPDATE", old))
    assert code == 400 and "spec.updateStrategy.switch" in message and names.SWITCH_EACH_NODE in message
    shared = cache(hf_spec(storage={"size": "5Gi", "storageClassName": "rwx"}))
    moved = copy.deepcopy(shared)
    moved["spec"]["source"]["huggingface"]["revision"] = "v2"
    code, message = denial(run(moved, "UPDATE", shared))
    assert code == 400 and message.startswith("spec.source.huggingface.revision: a shared PVC")


@pytest.mark.parametrize(
    ("before", "after", "allowed"),
    [
        ({"uri": "hf://org/model"}, {"uri": "hf://org/model:v2"}, True),
        ({"uri": "hf://org/model:main"}, {"uri": "hf://org/other:main"}, False),
        ({"oci": {"reference": "reg.example.com:5000/team/llama:1.0"}},
         {"oci": {"reference": "reg.example.com:5000/team/llama@sha256:" + "a" * 64}}, True),
        ({"oci": {"reference": "reg.example.com/team/llama:1.0"}}, {"oci": {"reference": "reg.example.com/team/other:1.0"}}, False),
        ({"oci": {"reference": "reg.example.com/team/llama:1.0"}}, {"oci": {"reference": "mirror.example.com/team/llama:1.0"}}, False),
        ({"uri": "oci://reg.example.com/team/llama:1.0"}, {"uri": "oci://reg.example.com/team/llama:1.1"}, True),
        ({"uri": "s3://bucket/models/v1"}, {"uri": "s3://bucket/models/v2"}, True),
        ({"uri": "gs://bucket/v1"}, {"uri": "gs://bucket"}, True),
        ({"uri": "s3://bucket/models/v1"}, {"uri": "s3://other/models/v1"}, False),
        ({"uri": "s3://bucket/models/v1"}, {"uri": "gs://bucket/models/v1"}, False),
        ({"uri": "s3://bucket/v1", "secretRef": {"name": "a"}}, {"uri": "s3://bucket/v2", "secretRef": {"name": "b"}}, False),
        ({"uri": "hf://org/model"}, {"huggingface": {"repo": "org/model", "revision": "v2"}}, False),
    ],
)  # fmt: skip
def test_a_revision_may_change_wherever_it_is_written_and_nothing_else(
    before: Obj, after: Obj, allowed: bool
) -> None:
    """The revision of an hf:// uri, the tag or digest of an OCI reference and an object store's
    prefix within its bucket roll like huggingface.revision; the repository, registry, bucket,
    secret or the source's form do not."""
    old = cache({"source": before, "storage": {"size": "5Gi"}})
    new = cache({"source": after, "storage": {"size": "5Gi"}})
    response = run(new, "UPDATE", old)
    assert response["response"]["allowed"] is allowed, response
    if not allowed:
        code, message = denial(response)
        assert code == 400 and "field is immutable" in message and message.startswith("spec.source.")


def test_metadata_and_status_updates_are_allowed_even_if_now_invalid() -> None:
    # A StorageClass deleted later must never block removing a finalizer.
    old = cache(hf_spec(storage={"size": "5Gi", "storageClassName": "gone"}))
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    new["status"] = {"phase": "Ready"}
    assert run(new, "UPDATE", old)["response"]["allowed"] is True


def test_delete_is_allowed() -> None:
    assert run(cache(None), "DELETE")["response"]["allowed"] is True


def test_changed_fields() -> None:
    assert changed_fields({"a": {"b": 1, "c": [1]}}, {"a": {"b": 1, "c": [2]}, "d": None}) == ["spec.a.c"]
    assert changed_fields(None, {"x": 1}) == ["spec"]
