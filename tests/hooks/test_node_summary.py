"""NodeSummary (hooks/node_summary.py): what a summary holds, what a cache relates, and the move from
Nodes to summaries, in which no copy may be deleted for want of a summary."""

from __future__ import annotations

import json
from typing import Any

import pytest
from praesto.hooks import hook_protocol, modelcache, node_summary, nodes

from praesto import names
from testkit.hook_objects import NOW, customize_request, node, sync_request
from testkit.hook_objects import modelcache as mc
from testkit.hook_objects import node_summary as summary
from tests.hooks.golden import CONFIG

SELECTOR = {"pool": "gpu"}
GPU = {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
NFD_LABELS = {f"feature.node.kubernetes.io/cpu-cpuid.FEATURE{i:02d}": "true" for i in range(80)}


def cache(selector: dict[str, str] | None = None) -> dict[str, object]:
    parent = mc()
    parent["spec"]["nodeSelector"] = dict(SELECTOR if selector is None else selector)
    return parent


def copies(response: dict[str, object]) -> list[str]:
    children = response["children"]
    assert isinstance(children, list)
    return sorted(c["spec"]["nodeName"] for c in children if c["kind"] == names.MODELCACHENODE_KIND)


def sync(**kwargs: object) -> dict[str, object]:
    response = modelcache.sync(sync_request(cache(), **kwargs), CONFIG, NOW)  # type: ignore[arg-type]
    assert hook_protocol.check_response("sync", response) == []
    return response


@pytest.mark.parametrize(
    ("key", "excluded"),
    [
        ("feature.node.kubernetes.io/cpu-cpuid.AVX512F", True),
        ("vendor.feature.node.kubernetes.io/thing", True),  # NFD's extra label namespaces
        ("ready.praesto.io/0123456789abcdef", True),
        (names.LABEL_NODE_SUMMARIZED, True),
        ("nvidia.com/gfd.timestamp", True),
        ("nvidia.com/gpu.product", False),
        ("kubernetes.io/hostname", False),
        ("pool", False),
        ("notfeature.node.kubernetes.io/x", False),
    ],
)
def test_which_node_labels_a_summary_leaves_out(key: str, excluded: bool) -> None:
    assert node_summary.excluded_key(key) is excluded


def test_a_summary_is_the_nodes_labels_less_nfd_and_ours_and_small() -> None:
    labels = {
        **GPU,
        **NFD_LABELS,
        names.ready_label_key("ml", "llama"): "true",
        names.LABEL_NODE_SUMMARIZED: "true",
    }
    got = node_summary.summary_for(node("gpu-1", labels))
    assert got == {
        "apiVersion": names.API_VERSION,
        "kind": names.NODESUMMARY_KIND,
        "metadata": {"name": "gpu-1", "labels": GPU},
    }
    assert len(json.dumps(got)) < 300  # the whole Node with NFD's labels is ~26.5 KB as served


def test_a_cache_relates_summaries_and_only_unsummarized_nodes() -> None:
    rules = modelcache.customize(customize_request(cache()), CONFIG, NOW)["relatedResources"]
    by_resource = {r["resource"]: r for r in rules}
    assert by_resource[names.NODESUMMARY_PLURAL]["labelSelector"] == {"matchLabels": SELECTOR}
    assert by_resource["nodes"]["labelSelector"] == {
        "matchLabels": SELECTOR,
        "matchExpressions": [{"key": names.LABEL_NODE_SUMMARIZED, "operator": "DoesNotExist"}],
    }


def test_a_selector_naming_a_label_summaries_leave_out_relates_whole_nodes() -> None:
    selector = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    rules = modelcache.customize(customize_request(cache(selector)), CONFIG, NOW)["relatedResources"]
    assert [r for r in rules if r["resource"] in ("nodes", names.NODESUMMARY_PLURAL)] == [
        {"apiVersion": "v1", "resource": "nodes", "labelSelector": {"matchLabels": selector}}
    ]


def test_copies_come_from_summaries() -> None:
    response = sync(summaries=[summary("a", SELECTOR), summary("b", SELECTOR)])
    assert copies(response) == ["a", "b"]


def test_mid_move_every_node_is_seen_as_a_node_or_a_summary_and_keeps_its_copy() -> None:
    """Upgrade: some Nodes summarized, others not yet; the copies made from whole Nodes stay."""
    before = sync(nodes=[node("a", SELECTOR), node("b", SELECTOR), node("c", SELECTOR)])
    assert copies(before) == ["a", "b", "c"]
    observed = before["children"]
    assert isinstance(observed, list)
    during = sync(
        nodes=[node("c", SELECTOR)],  # not summarized yet
        summaries=[summary("a", SELECTOR), summary("b", SELECTOR)],
        children=observed,
    )
    assert copies(during) == ["a", "b", "c"]


def test_a_node_seen_both_ways_gets_one_copy() -> None:
    response = sync(nodes=[node("a", SELECTOR)], summaries=[summary("a", SELECTOR)])
    assert copies(response) == ["a"]


def test_a_summary_not_written_by_metacontroller_for_its_node_is_ignored() -> None:
    forged = summary("ghost", SELECTOR)
    forged["metadata"]["ownerReferences"] = []
    wrong_owner = summary("other", SELECTOR)
    wrong_owner["metadata"]["ownerReferences"][0]["name"] = "a"
    assert copies(sync(summaries=[forged, wrong_owner])) == []


def test_a_summary_the_selector_does_not_match_makes_no_copy() -> None:
    assert copies(sync(summaries=[summary("a", {"pool": "cpu"})])) == []


def decorate(labels: dict[str, str], attachments: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"object": node("n1", labels), "attachments": attachments or {}, "related": {}}
    response = nodes.sync(body)
    assert set(response) <= nodes.SYNC_KEYS
    return response


def test_the_decorator_wants_the_summary_and_marks_the_node_only_once_it_exists() -> None:
    first = decorate({**GPU, **NFD_LABELS})
    assert first["attachments"] == [node_summary.summary_for(node("n1", GPU))]
    assert first["labels"][names.LABEL_NODE_SUMMARIZED] is None
    seen = {hook_protocol.NODESUMMARY: {"n1": summary("n1", GPU)}}
    second = decorate({**GPU, **NFD_LABELS}, seen)
    assert second["labels"][names.LABEL_NODE_SUMMARIZED] == "true"
    assert second["attachments"] == first["attachments"]


def test_a_summary_gone_unmarks_the_node_so_caches_see_it_whole_again() -> None:
    response = decorate({**GPU, names.LABEL_NODE_SUMMARIZED: "true"})
    assert response["labels"][names.LABEL_NODE_SUMMARIZED] is None
    assert response["resyncAfterSeconds"] == nodes.MARKER_RETRY_SECONDS


def test_a_pending_marker_write_asks_for_another_pass_and_a_written_one_does_not() -> None:
    """Metacontroller drops a conflicting write of the Node, and the status write behind the conflict
    wakes nobody (ignoreStatusChanges): only a resync makes sure the marker lands."""
    seen = {hook_protocol.NODESUMMARY: {"n1": summary("n1", GPU)}}
    pending = decorate(GPU, seen)
    assert pending["resyncAfterSeconds"] == nodes.MARKER_RETRY_SECONDS
    assert "resyncAfterSeconds" not in decorate({**GPU, names.LABEL_NODE_SUMMARIZED: "true"}, seen)
    assert "resyncAfterSeconds" not in decorate(GPU)  # no summary yet: its add event brings the pass
