"""The hooks against Metacontroller 4.17.2's semantics (metacontroller/README.md cites the source).

Each test here failed on the hooks written for 4.12.13: the related rules, the
tenant boundary of consumer Pods, and the strict response checker.
"""

from __future__ import annotations

from typing import Any

import pytest
from praesto.hooks import hook_protocol, modelcache
from praesto.hooks.common import Obj

from praesto import names
from testkit.hook_objects import NOW, consumer, customize_request, node, sync_request
from testkit.hook_objects import modelcache as mc
from tests.hooks.golden import CONFIG


def rules(parent: Obj) -> dict[str, Obj]:
    response = modelcache.customize(customize_request(parent), CONFIG, NOW)
    assert hook_protocol.check_response("customize", response) == []
    return {rule["resource"]: rule for rule in response["relatedResources"]}


def test_pods_rule_is_confined_to_the_parents_namespace() -> None:
    """labelSelector alone lists every namespace in 4.17.2 (selectByLabels)."""
    pods = rules(mc(namespace="team-a"))["pods"]
    assert pods["namespace"] == "team-a"
    assert pods["labelSelector"] == {"matchLabels": {names.consumer_label_key("tinyllama"): "true"}}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [({"praesto.io/cache-node": "true"}, {"praesto.io/cache-node": "true"}), ({}, {}), (None, {})],
)
def test_nodes_are_related_by_the_caches_node_selector(
    selector: dict[str, str] | None, expected: dict[str, str]
) -> None:
    """Through their NodeSummaries, and whole only until summarized (hooks/node_summary.py)."""
    parent = mc()
    if selector is None:
        parent["spec"].pop("nodeSelector", None)
    else:
        parent["spec"]["nodeSelector"] = selector
    found = rules(parent)
    assert found[names.NODESUMMARY_PLURAL] == {
        "apiVersion": names.API_VERSION,
        "resource": names.NODESUMMARY_PLURAL,
        "labelSelector": {"matchLabels": expected},
    }
    unsummarized = {"key": names.LABEL_NODE_SUMMARIZED, "operator": "DoesNotExist"}
    assert found["nodes"] == {
        "apiVersion": "v1",
        "resource": "nodes",
        "labelSelector": {"matchLabels": expected, "matchExpressions": [unsummarized]},
    }
    assert "namespace" not in found["nodes"]  # "*" matched all Nodes only by accident


def test_a_malformed_node_selector_relates_no_nodes() -> None:
    parent = mc()
    parent["spec"]["nodeSelector"] = {"zone": 3}
    assert "nodes" not in rules(parent)
    assert names.NODESUMMARY_PLURAL not in rules(parent)


def test_pvc_mode_relates_no_nodes() -> None:
    parent = mc()
    parent["spec"]["storage"]["storageClassName"] = "nfs"
    assert set(rules(parent)) == {"pods"}


def _foreign(pod: Obj, namespace: str) -> Obj:
    pod["metadata"]["namespace"] = namespace
    return pod


def test_another_tenants_pod_creates_no_demand_even_if_related() -> None:
    """Defence in depth: a Metacontroller that ignored the rule's namespace still cannot cross tenants."""
    parent = mc(
        spec={
            "source": {"huggingface": {"repo": "org/m"}},
            "storage": {"size": "1Gi"},
            "nodeSelector": {"pool": "gpu"},
        }
    )
    ours = consumer("tinyllama", "ours", "node-a")
    theirs = _foreign(consumer("tinyllama", "theirs", "node-b"), "other-team")
    response = modelcache.sync(
        sync_request(parent, nodes=[node("node-a"), node("node-b")], pods=[ours, theirs]), CONFIG, NOW
    )
    targets = {c["spec"]["nodeName"] for c in response["children"] if c["kind"] == names.MODELCACHENODE_KIND}
    assert targets == {"node-a"}


def test_another_tenants_pod_is_not_a_pvc_consumer() -> None:
    spec: dict[str, Any] = {
        "source": {"huggingface": {"repo": "org/m"}},
        "storage": {"size": "1Gi", "storageClassName": "nfs"},
    }
    theirs = _foreign(consumer("tinyllama", "theirs", "node-b"), "other-team")
    alone = modelcache.sync(sync_request(mc(spec=spec)), CONFIG, NOW)
    with_foreign = modelcache.sync(sync_request(mc(spec=spec), pods=[theirs]), CONFIG, NOW)
    assert with_foreign == alone


@pytest.mark.parametrize(
    ("rule", "ok"),
    [
        (
            {"apiVersion": "v1", "resource": "pods", "namespace": "a", "labelSelector": {"matchLabels": {}}},
            True,
        ),
        ({"apiVersion": "v1", "resource": "pods", "namespaceSelector": {"matchLabels": {"t": "a"}}}, True),
        ({"apiVersion": "v1", "resource": "pods", "namespace": "a", "names": ["p"]}, True),
        ({"apiVersion": "v1", "resource": "pods", "names": ["p"], "labelSelector": {}}, False),
        ({"apiVersion": "v1", "resource": "pods", "namespace": "a", "namespaceSelector": {}}, False),
        ({"apiVersion": "v1", "resource": "pods", "labelSelector": {"matchFields": {}}}, False),
        ({"apiVersion": "v1", "resource": "pods", "fieldSelector": "x"}, False),
    ],
)
def test_checker_follows_4_17_2_selection_types(rule: Obj, ok: bool) -> None:
    problems = hook_protocol.check_response("customize", {"relatedResources": [rule]})
    assert (problems == []) is ok, problems


def test_sync_and_finalize_share_one_response_type() -> None:
    """`finalized` decodes in a sync response too (one CompositeHookResponse); unknown keys never do."""
    assert hook_protocol.check_response("sync", {"status": {}, "children": [], "finalized": False}) == []
    assert hook_protocol.check_response("finalize", {"finalized": True}) == []
    assert hook_protocol.check_response("sync", {"status": {}, "events": []}) == ["unknown key 'events'"]
