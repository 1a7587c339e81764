"""Children derive from the status of the same pass (issue 22).

Metacontroller 4.17.2 makes no pass after its own status write when the
controller sets `ignoreStatusChanges` (`pkg/controller/composite/controller.go`
`updateParentObject`), as ours do. So a child field computed from the
*previous* status waits for an unrelated event. The property that rules the
class out: writing a response's status back onto the parent and asking again,
with the same observed world, changes no child. Time-driven changes are asked
for with `resyncAfterSeconds` instead.
"""

from __future__ import annotations

import copy

import pytest
from praesto.hooks import hook_protocol, modelcache, nodes
from praesto.hooks.common import Obj

from praesto import names
from testkit.hook_objects import COMMIT, NOW, cache_node, mcn, node_status, sync_request
from testkit.hook_objects import modelcache as mc
from tests.hooks import golden
from tests.hooks.scenarios import SCENARIOS

SYNC_SCENARIOS = sorted(name for name, (hook, _) in SCENARIOS.items() if hook in ("sync", "finalize"))


@pytest.mark.parametrize("name", SYNC_SCENARIOS)
def test_a_second_pass_after_the_status_write_changes_no_child(name: str) -> None:
    hook, build = SCENARIOS[name]
    first = modelcache.HOOKS[hook](build(), golden.CONFIG, NOW)
    request = build()
    request["parent"]["status"] = copy.deepcopy(first["status"])
    second = modelcache.HOOKS[hook](request, golden.CONFIG, NOW)
    assert second["children"] == first["children"], name
    assert second.get("finalized") == first.get("finalized"), name


def test_the_first_pass_that_learns_the_commit_pins_every_copy() -> None:
    """The reported case: the commit arrives with the agents' status, the parent's status has none yet."""
    parent = mc("tiny")
    assert "status" not in parent
    ready = node_status("Ready", 10, 10, sizeBytes=10, resolvedRevision=COMMIT)
    request = sync_request(
        parent,
        nodes=[cache_node("node-a"), cache_node("node-b")],
        children=[mcn("tiny", "node-a", ready), mcn("tiny", "node-b", ready)],
    )
    response = modelcache.sync(request, golden.CONFIG, NOW)
    assert hook_protocol.check_response("sync", response) == []
    assert response["status"]["phase"] == names.PHASE_READY
    assert response["status"]["resolvedRevision"] == COMMIT
    revisions = {c["spec"]["source"]["revision"] for c in response["children"]}
    assert revisions == {COMMIT}
    assert "resyncAfterSeconds" not in response  # nothing left for a later pass


def test_a_copy_still_downloading_is_pinned_as_soon_as_one_node_resolved() -> None:
    """A node that joins later downloads the commit the first one resolved, not whatever `main` is then."""
    request = sync_request(
        mc("tiny"),
        nodes=[cache_node("node-a"), cache_node("node-b")],
        children=[
            mcn("tiny", "node-a", node_status("Downloading", 1, 10, resolvedRevision=COMMIT)),
            mcn("tiny", "node-b", node_status("Pending")),
        ],
    )
    response = modelcache.sync(request, golden.CONFIG, NOW)
    assert {c["spec"]["source"]["revision"] for c in response["children"]} == {COMMIT}


def test_a_pinned_spec_or_a_non_commit_report_leaves_the_source_alone() -> None:
    branchy = node_status("Ready", 10, 10, resolvedRevision="not-a-commit")
    request = sync_request(
        mc("tiny"), nodes=[cache_node("node-a")], children=[mcn("tiny", "node-a", branchy)]
    )
    response = modelcache.sync(request, golden.CONFIG, NOW)
    assert {c["spec"]["source"]["revision"] for c in response["children"]} == {"main"}
    pinned = mc("tiny")
    pinned["spec"]["source"]["huggingface"]["revision"] = COMMIT
    ready = node_status("Ready", 10, 10, resolvedRevision="b" * 40)
    request = sync_request(pinned, nodes=[cache_node("node-a")], children=[mcn("tiny", "node-a", ready)])
    response = modelcache.sync(request, golden.CONFIG, NOW)
    assert {c["spec"]["source"]["revision"] for c in response["children"]} == {COMMIT}


def _decorator_request(node: Obj, ready_on: list[str]) -> Obj:
    related = {}
    for cache in ready_on:
        child = mcn(cache, node["metadata"]["name"], node_status("Ready"))
        related[f"default/{child['metadata']['name']}"] = child
    return {
        "controller": {"kind": "DecoratorController", "metadata": {"name": "praesto-node-readiness"}},
        "object": node,
        "attachments": {},
        "related": {hook_protocol.MODELCACHENODE: related},
        "finalizing": False,
    }


def test_the_node_decorator_is_a_fixed_point_after_its_own_write() -> None:
    """Labels come from the related copies only: the pass its own label write triggers writes nothing."""
    node = cache_node("node-a")
    first = nodes.sync(_decorator_request(node, ["one", "two"]))
    written = copy.deepcopy(node)
    for key, value in first["labels"].items():
        if value is None:
            written["metadata"]["labels"].pop(key, None)
        else:
            written["metadata"]["labels"][key] = value
    second = nodes.sync(_decorator_request(written, ["one", "two"]))
    assert {k: v for k, v in second["labels"].items() if v is not None} == {
        k: v for k, v in first["labels"].items() if v is not None
    }
    assert all(written["metadata"]["labels"].get(k) == v for k, v in second["labels"].items())
    assert "resyncAfterSeconds" not in second


def test_finalize_asks_for_a_later_pass_only_while_copies_remain() -> None:
    waiting = modelcache.finalize(
        sync_request(mc("tiny"), children=[mcn("tiny", "node-a")], finalizing=True), golden.CONFIG, NOW
    )
    assert waiting["finalized"] is False and waiting["resyncAfterSeconds"] > 0
    done = modelcache.finalize(sync_request(mc("tiny"), finalizing=True), golden.CONFIG, NOW)
    assert done["finalized"] is True and "resyncAfterSeconds" not in done and done["children"] == []


def test_finalize_gives_the_same_status_from_a_stale_parent_as_from_a_fresh_one() -> None:
    """Every write to a deleting parent is an event; a finalize that echoed the status it read would
    put a stale one back from a lagging cache, then the fresh one, for ever."""
    copy_ready = mcn("tiny", "node-a", node_status("Ready", 10, 10, resolvedRevision=COMMIT))
    settled = {"mode": "Node", "resolvedRevision": COMMIT, "sizeBytes": 10}
    stale = mc("tiny", status={**settled, "phase": "Ready", "readyNodes": 2, "totalNodes": 2})
    fresh = mc("tiny", status={**settled, "phase": "Pending", "readyNodes": 0, "totalNodes": 0})
    answers = [
        modelcache.finalize(sync_request(parent, children=[copy_ready], finalizing=True), golden.CONFIG, NOW)
        for parent in (stale, fresh)
    ]
    assert answers[0]["status"] == answers[1]["status"]
    assert answers[0]["status"]["totalNodes"] == 1 and answers[0]["status"]["resolvedRevision"] == COMMIT
    assert hook_protocol.check_response("finalize", answers[0]) == []


def test_an_oci_tag_is_pinned_to_the_manifest_digest_the_first_node_resolved() -> None:
    """The same rule for OCI: a tag moves, so late nodes pull the digest the first one resolved."""
    digest = "sha256:" + "c" * 64
    spec = {
        "source": {"oci": {"reference": "registry.example.com/team/model:1.0"}},
        "storage": {"size": "1Gi"},
    }
    request = sync_request(
        mc("model", spec),
        nodes=[cache_node("node-a"), cache_node("node-b")],
        children=[
            mcn("model", "node-a", node_status("Downloading", 1, 10, resolvedRevision=digest)),
            mcn("model", "node-b", node_status("Pending", resolvedRevision="1.0")),
        ],
    )
    response = modelcache.sync(request, golden.CONFIG, NOW)
    sources = [c["spec"]["source"] for c in response["children"] if c["kind"] == names.MODELCACHENODE_KIND]
    assert sources and all(
        s == {"uri": "oci://registry.example.com/team/model", "revision": digest} for s in sources
    )
    assert response["status"]["resolvedRevision"] == digest
