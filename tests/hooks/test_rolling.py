"""Rolling revision updates in the sync hook (hooks/rolling.py): what each node is told, what the cache says.

Requests in Metacontroller's shape (testkit/hook_objects.py); the node agents' reports are the
ModelCacheNode statuses agent/rolling.py writes (status.next while a revision is beside the served one).
"""

from __future__ import annotations

import copy
from typing import Any

from praesto.hooks import modelcache

from praesto import names
from testkit.hook_objects import COMMIT, NOW, cache_node, mcn, node_status, sync_request
from testkit.hook_objects import modelcache as mc
from tests.hooks import golden

NEW = "b" * 40
NODES = ("node-a", "node-b", "node-c")


def _spec(revision: str = "v2", **strategy: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "revision": revision}},
        "storage": {"size": "5Gi"},
        "nodeSelector": {"praesto.io/cache-node": "true"},
    }
    if strategy:
        spec["updateStrategy"] = strategy
    return spec


def _served(commit: str = COMMIT, **extra: Any) -> dict[str, Any]:
    return node_status(names.PHASE_READY, resolvedRevision=commit, **extra)


def _child(node: str, status: dict[str, Any], told: str = COMMIT) -> dict[str, Any]:
    obj = mcn("tinyllama", node, status)
    obj["spec"]["source"]["revision"] = told
    return obj


def _sync(spec: dict[str, Any], children: list[dict[str, Any]], before: dict[str, Any]) -> dict[str, Any]:
    parent = mc("tinyllama", spec, status=copy.deepcopy(before))
    parent["metadata"]["generation"] = 2
    request = sync_request(parent, nodes=[cache_node(n) for n in NODES], children=children)
    return modelcache.sync(request, golden.CONFIG, NOW)


def _told(response: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {
        c["spec"]["nodeName"]: (c["spec"]["source"]["revision"], c["spec"].get("switch", True))
        for c in response["children"]
        if c["kind"] == names.MODELCACHENODE_KIND
    }


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


BEFORE = {"resolvedRevision": COMMIT, "requestedRevision": "main"}


def test_a_changed_branch_is_asked_unpinned_then_pinned_to_the_commit_a_node_resolved() -> None:
    children = [_child(n, _served()) for n in NODES]
    first = _sync(_spec("v2"), children, BEFORE)
    assert set(_told(first).values()) == {("v2", True)}  # nobody resolved v2 yet
    assert first["status"]["resolvedRevision"] == COMMIT and "nextRevision" not in first["status"]
    assert first["status"]["requestedRevision"] == "main"  # what resolvedRevision answers
    # the node told the old commit, reporting its old copy before it reacted, is no vote for v2
    assert _condition(first["status"], names.CONDITION_ROLLING)["status"] == "True"

    fetching = {"revision": "v2", "resolvedRevision": NEW, "phase": names.NEXT_DOWNLOADING}
    children = [_child("node-a", _served(next=fetching), "v2")] + [
        _child(n, _served(), "v2") for n in NODES[1:]
    ]
    second = _sync(_spec("v2"), children, first["status"])
    assert set(_told(second).values()) == {(NEW, True)}
    status = second["status"]
    assert (status["resolvedRevision"], status["nextRevision"], status["requestedRevision"]) == (
        COMMIT,
        NEW,
        "v2",
    )
    rolling = _condition(status, names.CONDITION_ROLLING)
    assert (rolling["status"], rolling["reason"]) == ("True", names.REASON_ROLLING)
    assert "0 of 3 nodes serve it" in rolling["message"] and "1 fetching" in rolling["message"]
    assert status["phase"] == names.PHASE_READY  # the old revision serves meanwhile

    again = _sync(_spec("v2"), children, second["status"])  # the same pass again: nothing moves
    assert _told(again) == _told(second) and again["status"]["nextRevision"] == NEW


def test_each_node_switches_on_its_own_and_the_roll_ends_when_all_serve_it() -> None:
    before = {**BEFORE, "nextRevision": NEW, "requestedRevision": "v2"}
    children = [_child("node-a", _served(NEW), NEW)] + [_child(n, _served(), NEW) for n in NODES[1:]]
    mid = _sync(_spec("v2"), children, before)
    assert set(_told(mid).values()) == {(NEW, True)}
    assert mid["status"]["revisions"] == [
        {"revision": COMMIT, "readyNodes": 2},
        {"revision": NEW, "readyNodes": 1},
    ]
    done = _sync(_spec("v2"), [_child(n, _served(NEW), NEW) for n in NODES], mid["status"])
    status = done["status"]
    assert status["resolvedRevision"] == NEW and "nextRevision" not in status
    rolled = _condition(status, names.CONDITION_ROLLING)
    assert (rolled["status"], rolled["reason"]) == ("False", names.REASON_ROLLED)


def test_all_nodes_hold_it_before_any_switches() -> None:
    before = {**BEFORE, "nextRevision": NEW, "requestedRevision": "v2"}
    held = {"revision": NEW, "resolvedRevision": NEW, "phase": names.NEXT_READY}
    fetching = {"revision": NEW, "phase": names.NEXT_DOWNLOADING}
    children = [_child(n, _served(next=held), NEW) for n in NODES[:2]]
    children.append(_child("node-c", _served(next=fetching), NEW))
    spec = _spec("v2", switch=names.SWITCH_ALL_NODES)
    waiting = _sync(spec, children, before)
    assert set(_told(waiting).values()) == {(NEW, False)}
    children[2] = _child("node-c", _served(next=held), NEW)
    together = _sync(spec, children, waiting["status"])
    assert set(_told(together).values()) == {(NEW, True)}


def test_max_fetching_keeps_the_other_nodes_on_their_revision() -> None:
    before = {**BEFORE, "nextRevision": NEW, "requestedRevision": "v2"}
    fetching = {"revision": NEW, "phase": names.NEXT_DOWNLOADING}
    children = [_child("node-a", _served(next=fetching), NEW)] + [_child(n, _served()) for n in NODES[1:]]
    response = _sync(_spec("v2", maxFetching=1), children, before)
    assert _told(response) == {"node-a": (NEW, True), "node-b": (COMMIT, True), "node-c": (COMMIT, True)}
    children[0] = _child("node-a", _served(NEW), NEW)  # node-a switched: one slot free
    response = _sync(_spec("v2", maxFetching=1), children, response["status"])
    assert _told(response) == {"node-a": (NEW, True), "node-b": (NEW, True), "node-c": (COMMIT, True)}


def test_a_commit_in_the_spec_is_the_target_at_once_and_a_rollback_is_one_too() -> None:
    children = [_child(n, _served(NEW), NEW) for n in NODES]
    back = _sync(_spec(COMMIT), children, {"resolvedRevision": NEW, "requestedRevision": "v2"})
    assert set(_told(back).values()) == {(COMMIT, True)}
    assert back["status"]["nextRevision"] == COMMIT and back["status"]["resolvedRevision"] == NEW


def test_a_status_from_before_rolling_updates_answers_the_spec_revision() -> None:
    children = [_child(n, _served()) for n in NODES]
    response = _sync(_spec("main"), children, {"resolvedRevision": COMMIT})
    assert set(_told(response).values()) == {(COMMIT, True)}
    status = response["status"]
    assert status["resolvedRevision"] == COMMIT and "nextRevision" not in status
    assert names.CONDITION_ROLLING not in {c["type"] for c in status["conditions"]}


def test_a_node_told_to_fetch_holds_its_slot_before_it_reports() -> None:
    """The pass its own child update triggers may see the new spec but not yet the node's report."""
    before = {**BEFORE, "nextRevision": NEW, "requestedRevision": "v2"}
    children = [_child("node-a", _served(), NEW)] + [_child(n, _served()) for n in NODES[1:]]
    response = _sync(_spec("v2", maxFetching=1), children, before)
    assert _told(response) == {"node-a": (NEW, True), "node-b": (COMMIT, True), "node-c": (COMMIT, True)}


def test_a_branch_changed_before_the_cache_status_knew_the_old_commit_is_not_pinned_to_it() -> None:
    """The cache's status lags its nodes: both copies are Ready on `main`'s commit, the parent's
    last status has no resolvedRevision yet, and the spec moves to `v2`. A copy that answers
    `main` (status.revision) is not a vote for `v2`: the nodes are told `v2` and fetch it."""
    before = {"requestedRevision": "main"}  # written before any node reported
    children = [_child(n, _served(revision="main"), told="main") for n in NODES]
    response = _sync(_spec("v2", maxFetching=1), children, before)
    told = [revision for revision, _ in _told(response).values()]  # one node fetches v2, the others wait
    assert told.count("v2") == 1, told
    # once a copy reports that it answers v2, its commit is the target, pinned for every node
    answered = [_child("node-a", node_status(names.PHASE_DOWNLOADING, resolvedRevision=NEW, revision="v2"),
                       told="v2")] + [_child(n, _served(revision="main"), told="v2") for n in NODES[1:]]  # fmt: skip
    pinned = _sync(_spec("v2"), answered, response["status"])
    assert {revision for revision, _ in _told(pinned).values()} == {NEW}


# Object stores: a new model version is a new prefix in the same bucket; each node lists it itself.
OLD_PREFIX, NEW_PREFIX = "models-bkt/llama/v1", "models-bkt/llama/v2"
LISTING_V1, LISTING_V2, LISTING_V2_LATER = "1" * 64, "2" * 64, "3" * 64


def _store_spec(prefix: str = NEW_PREFIX, **strategy: Any) -> dict[str, Any]:
    spec = _spec(**strategy)
    spec["source"] = {"uri": f"s3://{prefix}"}
    return spec


def _store_child(node: str, status: dict[str, Any], told: str) -> dict[str, Any]:
    obj = mcn("tinyllama", node, status)
    obj["spec"]["source"] = {"uri": f"s3://{told}"}
    return obj


def _store_served(prefix: str, listing: str, **extra: Any) -> dict[str, Any]:
    return node_status(names.PHASE_READY, resolvedRevision=listing, revision=prefix, **extra)


def _told_uris(response: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {
        c["spec"]["nodeName"]: (c["spec"]["source"]["uri"], c["spec"].get("switch", True))
        for c in response["children"]
        if c["kind"] == names.MODELCACHENODE_KIND
    }


def test_an_object_store_prefix_rolls_by_version_and_status_keeps_the_listing_digest() -> None:
    """The new prefix is asked at once (nothing to resolve); the roll is told apart by the version each
    copy answers, so two nodes whose listings of it differ (an object replaced between their fetches)
    still end it; resolvedRevision shows the served prefix's listing digest throughout."""
    before = {"resolvedRevision": LISTING_V1}
    children = [_store_child(n, _store_served(OLD_PREFIX, LISTING_V1), OLD_PREFIX) for n in NODES]
    start = _sync(_store_spec(maxFetching=1), children, before)
    told = _told_uris(start)
    assert sorted(told.values()) == [(f"s3://{OLD_PREFIX}", True)] * 2 + [(f"s3://{NEW_PREFIX}", True)]
    status = start["status"]
    assert (status["resolvedRevision"], status["nextRevision"], status["requestedRevision"]) == (
        LISTING_V1, NEW_PREFIX, NEW_PREFIX,
    )  # fmt: skip
    assert _condition(status, names.CONDITION_ROLLING)["status"] == "True"
    assert "llama/v2" in _condition(status, names.CONDITION_ROLLING)["message"]
    switched = [
        _store_child("node-a", _store_served(NEW_PREFIX, LISTING_V2), NEW_PREFIX),
        _store_child("node-b", _store_served(NEW_PREFIX, LISTING_V2_LATER), NEW_PREFIX),
        _store_child("node-c", _store_served(OLD_PREFIX, LISTING_V1), OLD_PREFIX),
    ]
    mid = _sync(_store_spec(maxFetching=1), switched, status)
    assert mid["status"]["resolvedRevision"] == LISTING_V1 and mid["status"]["nextRevision"] == NEW_PREFIX
    assert _told_uris(mid)["node-c"] == (f"s3://{NEW_PREFIX}", True)  # a slot is free again
    assert {r["revision"]: r["readyNodes"] for r in mid["status"]["revisions"]} == {
        OLD_PREFIX: 1,
        NEW_PREFIX: 2,
    }
    switched[2] = _store_child("node-c", _store_served(NEW_PREFIX, LISTING_V2), NEW_PREFIX)
    done = _sync(_store_spec(maxFetching=1), switched, mid["status"])["status"]
    assert done["resolvedRevision"] == LISTING_V2 and "nextRevision" not in done
    assert _condition(done, names.CONDITION_ROLLING)["reason"] == names.REASON_ROLLED


def test_an_unchanged_object_store_cache_does_not_roll() -> None:
    children = [_store_child(n, _store_served(NEW_PREFIX, LISTING_V2), NEW_PREFIX) for n in NODES]
    status = _sync(_store_spec(), children, {"resolvedRevision": LISTING_V2})["status"]
    assert status["resolvedRevision"] == LISTING_V2 and "nextRevision" not in status
    assert not any(c["type"] == names.CONDITION_ROLLING for c in status["conditions"])
