"""Metacontroller's triggers, each on the real API server: what makes a pass happen, and what does not.

No agent runs here: the test writes a ModelCacheNode's status itself, as the
agent would, so every event is one the test made and every pass has a known
cause (`Pass.reasons`). metacontroller/README.md cites the Metacontroller
4.17.2 source of each behaviour.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic.exceptions import ForbiddenError

from praesto import names
from testkit.controlplane import wait_for
from testkit.metacontroller import (
    CompositeController,
    DecoratorController,
    Metacontroller,
    decorator_key,
    gone,
)
from testkit.metacontroller_base import CACHE_FLUSH_INTERVAL, Pass
from tests.cluster.flows import heartbeat, merge_patch, modelcachenodes, phase_is, wait_gone
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "mc-events"
POOL = "test.praesto.io/mc-pool"
POKE = "test.praesto.io/poke"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
RBAC = "rbac.authorization.k8s.io/v1"
Obj = dict[str, Any]
TOKEN_SOURCE = {"huggingface": {"repo": "org/p", "token": {"secretRef": {"name": "hf", "key": "HF_TOKEN"}}}}


@pytest.fixture(scope="module")
def namespace(installed: Installed) -> str:
    return opted_in_namespace(installed.admin, NS)


def copies(installed: Installed, cache: str) -> dict[str, Obj]:
    return modelcachenodes(installed.admin, NS, cache)


def wait_copy(installed: Installed, cache: str, node: str) -> Obj:
    wait_for(
        f"Metacontroller to create the copy of {cache} on {node}",
        lambda: node in copies(installed, cache),
        30,
    )
    return copies(installed, cache)[node]


def test_ready_pins_the_copy_in_the_pass_that_learns_the_commit(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    """Issue 22: the pin must not wait for a pass after Ready, because Metacontroller makes none."""
    ready_node(installed.admin, "mc-pin", {POOL: "pin"})
    installed.admin.create(modelcache("pin", NS, node_selector={POOL: "pin"}))
    copy = wait_copy(installed, "pin", "mc-pin")
    assert copy["spec"]["source"]["revision"] == "main"
    # What the node agent writes when the download is complete: one status write, Ready and the commit.
    status = {"phase": names.PHASE_READY, "resolvedRevision": COMMIT, "sizeBytes": 10,
              "progress": {"bytesDone": 10, "bytesTotal": 10}}  # fmt: skip
    reported = merge_patch(
        installed.admin, names.API_VERSION, names.MODELCACHENODE_KIND, copy["metadata"]["name"],
        {"status": status}, NS, status=True,
    )  # fmt: skip
    parent = composite.wait_parent(NS, "pin", phase_is(names.PHASE_READY), 30)
    assert parent is not None and parent["status"]["resolvedRevision"] == COMMIT
    # No other event comes (the status write is filtered, nothing else changes): the copy must
    # already carry the commit when the cache reads Ready.
    assert copies(installed, "pin")["mc-pin"]["spec"]["source"]["revision"] == COMMIT
    ready = composite.wait_pass(f"{NS}/pin", lambda p: p.triggered_by("update", reported), 30)
    assert f"update ModelCacheNode {NS}/{copy['metadata']['name']}" in ready.writes
    assert ready.response["status"]["phase"] == names.PHASE_READY


def test_a_status_write_of_the_parent_brings_no_pass_a_label_does(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    """`ignoreStatusChanges`: same generation, labels and annotations, not deleting: filtered."""
    installed.admin.create(modelcache("filtered", NS, node_selector={POOL: "nowhere"}))
    key = f"{NS}/filtered"
    composite.wait_parent(NS, "filtered", phase_is(names.PHASE_PENDING), 30)
    written = merge_patch(
        installed.admin, names.API_VERSION, names.MODELCACHE_KIND, "filtered", {"status": {"readyNodes": 7}}, NS,
        status=True,
    )  # fmt: skip
    assert composite.wait_seen("update", written).queued == []
    labelled = merge_patch(
        installed.admin, names.API_VERSION, names.MODELCACHE_KIND, "filtered", {"metadata": {"labels": {POKE: "1"}}}, NS
    )  # fmt: skip
    assert composite.wait_seen("update", labelled).queued == [key]
    composite.wait_pass(key, lambda p: p.triggered_by("update", labelled), 30)
    # That pass wrote the status the hook computes over the stray one.
    composite.wait_parent(
        NS, "filtered", lambda p: ((p or {}).get("status") or {}).get("readyNodes") == 0, 30
    )


def test_an_owned_childs_deletion_brings_a_pass_that_creates_it_again(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    ready_node(installed.admin, "mc-child", {POOL: "child"})
    # Its summary's events bring the cache passes too: one could start after the copy left the cache and
    # before its delete event queued the key, and create it again for another reason. So they come first.
    wait_for("mc-child to be summarized", lambda: summarized(installed, "mc-child"), 30)
    installed.admin.create(modelcache("child", NS, node_selector={POOL: "child"}))
    first = wait_copy(installed, "child", "mc-child")
    installed.admin.delete(names.API_VERSION, names.MODELCACHENODE_KIND, first["metadata"]["name"], NS)
    wait_for(
        "the copy to be created again",
        lambda: (
            (copies(installed, "child").get("mc-child") or first)["metadata"]["uid"]
            != first["metadata"]["uid"]
        ),
        30,
    )
    name = first["metadata"]["name"]

    def creating_passes() -> list[Pass]:
        return [
            p for p in composite.passes(f"{NS}/child") if f"create ModelCacheNode {NS}/{name}" in p.writes
        ]

    # A pass is recorded when it ends (after its status write), which may be after the copy shows.
    wait_for("the pass that created it again to end", lambda: len(creating_passes()) >= 2, 30)
    created = creating_passes()
    assert len(created) == 2, created  # created, deleted by hand, created again
    assert any(r.startswith(f"child delete ModelCacheNode {NS}/{name}@") for r in created[1].reasons)


def summarized(installed: Installed, node: str) -> bool:
    """The decorator has seen the Node's NodeSummary and said so on the Node (hooks/node_summary.py)."""
    got = installed.admin.get("v1", "Node", node) or {}
    return (got.get("metadata", {}).get("labels") or {}).get(names.LABEL_NODE_SUMMARIZED) == "true"


def test_only_a_label_change_of_a_node_brings_a_pass(
    installed: Installed, namespace: str, composite: CompositeController, decorator: DecoratorController
) -> None:
    """Related objects have no status filter, so caches relate NodeSummaries, not Nodes: a heartbeat
    queues no cache (nor the decorator, ignoreStatusChanges); a label change reaches the decorator,
    whose summary update queues the caches that select the Node."""
    ready_node(installed.admin, "mc-rel-in", {POOL: "rel"})
    ready_node(installed.admin, "mc-rel-out")
    for node in ("mc-rel-in", "mc-rel-out"):
        wait_for(f"{node} to be summarized", lambda node=node: summarized(installed, node), 30)  # type: ignore[misc]
    installed.admin.create(modelcache("related", NS, node_selector={POOL: "rel"}))
    key = f"{NS}/related"
    wait_copy(installed, "related", "mc-rel-in")
    for node in ("mc-rel-in", "mc-rel-out"):
        beat = heartbeat(installed.admin, node)
        assert key not in composite.wait_seen("update", beat).queued
        assert decorator.wait_seen("update", beat).queued == []
    joined = merge_patch(installed.admin, "v1", "Node", "mc-rel-out", {"metadata": {"labels": {POOL: "rel"}}})
    assert decorator.wait_seen("update", joined).queued == [decorator_key("v1", "Node", "", "mc-rel-out")]
    assert key not in composite.wait_seen("update", joined).queued  # the Node itself: no
    # ...its summary's update does, and the Node that joined the selection gets its copy.
    wait_copy(installed, "related", "mc-rel-out")

    def summary_passes() -> list[Pass]:
        return [p for p in composite.passes(key) if any("NodeSummary mc-rel-out@" in r for r in p.reasons)]

    # A pass is recorded when it ends (after its status write), which may be after the copy shows.
    try:
        wait_for("the pass its summary queued to end", lambda: bool(summary_passes()), 30)
    except TimeoutError as timeout:
        raise AssertionError(composite.summary(key)) from timeout
    # The customize hook was asked once for this cache: its answer is kept per (uid, generation).
    parent = installed.admin.get(names.API_VERSION, names.MODELCACHE_KIND, "related", NS)
    assert parent is not None
    uid = parent["metadata"]["uid"]
    assert [c for c in composite.customize.calls if c[0] == uid] == [(uid, parent["metadata"]["generation"])]


def created(installed: Installed, obj: Obj) -> bool:
    """Create `obj`; False while the webhook refuses it (its StorageClass cache trails the API server)."""
    try:
        installed.admin.create(obj)
    except ForbiddenError as err:
        if "does not exist" in str(err):
            return False
        raise
    return True


def test_resync_after_seconds_evicts_an_unused_pvc_cache_with_no_event(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    """The hook asks for the pass at the TTL's expiry; nothing else would make it happen."""
    installed.admin.apply(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "mc-events-rwx"},
         "provisioner": "nfs.example.com"}
    )  # fmt: skip
    storage = {"size": "1Gi", "storageClassName": "mc-events-rwx"}
    cache = modelcache("ttl", NS, storage=storage, eviction={"unusedTTL": "10s"})
    wait_for("the admission webhook to know the StorageClass", lambda: created(installed, cache), 30)
    composite.wait_parent(NS, "ttl", phase_is(names.PHASE_EVICTED), 60)
    # the driver records a pass when it ends, after its status write: wait for the record too
    evicting = composite.wait_pass(
        f"{NS}/ttl",
        lambda p: ((p.response.get("status") or {}).get("phase")) == names.PHASE_EVICTED,
        30,
        "answering Evicted",
    )
    assert any(r.startswith("resyncAfterSeconds") for r in evicting.reasons), evicting.reasons
    wait_gone(installed.admin, "v1", "PersistentVolumeClaim", names.pvc_name("ttl"), NS, 30)


@pytest.mark.parametrize("policy", ["Orphan", "Foreground"])
def test_children_are_left_to_the_garbage_collector_under_its_finalizers(
    installed: Installed, namespace: str, composite: CompositeController, policy: str
) -> None:
    """With `orphan` or `foregroundDeletion` present, finalize runs but no child is created or deleted."""
    cache = f"gc-{policy.lower()}"
    # A selected Node with no agent: its copy stays unreported, so the Secret grant exists (hooks/local.py).
    ready_node(installed.admin, "mc-gc", {POOL: "gc"})
    installed.admin.create(modelcache(cache, NS, node_selector={POOL: "gc"}, source=TOKEN_SOURCE))
    role = names.secret_reader_role_name(cache)
    binding = f"create RoleBinding {NS}/{role}"
    composite.wait_pass(f"{NS}/{cache}", lambda p: binding in p.writes, 30, "creating the grant")
    before = installed.admin.get(RBAC, "Role", role, NS)
    assert before is not None
    installed.admin.delete(
        names.API_VERSION, names.MODELCACHE_KIND, cache, NS, body={"propagationPolicy": policy}
    )
    composite.wait_parent(NS, cache, gone, 60)

    def finalize_passes() -> list[Pass]:
        return [p for p in composite.passes(f"{NS}/{cache}") if p.hook == "finalize"]

    # The pass that removed the finalizer is recorded when it ends, which may be after the parent is gone.
    try:
        wait_for("the finalize pass to end", lambda: bool(finalize_passes()), 30)
    except TimeoutError as timeout:
        raise AssertionError(composite.summary(f"{NS}/{cache}")) from timeout
    finalizing = finalize_passes()
    assert [w for p in finalizing for w in p.writes if w.startswith(("delete", "create"))] == []
    if policy == "Orphan":
        for kind in ("Role", "RoleBinding"):
            kept = installed.admin.get(RBAC, kind, role, NS)
            assert kept is not None, kind
            refs = kept["metadata"].get("ownerReferences") or []
            assert before["metadata"]["ownerReferences"][0]["uid"] not in [r["uid"] for r in refs]
    else:
        wait_gone(installed.admin, RBAC, "RoleBinding", role, NS)
        wait_gone(installed.admin, RBAC, "Role", role, NS)


def test_the_resync_period_syncs_every_parent_and_a_steady_one_writes_nothing(
    installed: Installed,
    namespace: str,
    running_metacontroller: Metacontroller,
    composite: CompositeController,
) -> None:
    """`--cache-flush-interval` (30 min by default) made short: a restart with a 2 s resync period."""
    installed.admin.create(modelcache("steady", NS, node_selector={POOL: "nowhere"}))
    composite.wait_parent(NS, "steady", phase_is(names.PHASE_PENDING), 30)
    running_metacontroller.stop()
    try:
        running_metacontroller.start(resync_period=2)
        resync = composite.wait_pass(
            f"{NS}/steady", lambda p: bool(p.reasons) and all(r.startswith("resync ") for r in p.reasons), 30
        )
        assert resync.writes == [] and not resync.error
    finally:
        running_metacontroller.stop()
        running_metacontroller.start(resync_period=CACHE_FLUSH_INTERVAL)
