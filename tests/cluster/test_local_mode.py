"""Local mode end to end on the real control plane: Metacontroller (event-driven), our hooks, two node agents.

Everything that writes does so under the chart's identities: the driver as the
Metacontroller ServiceAccount, the agents as the node-agent ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from kubernetes import client

from praesto import names
from praesto.store import StoreLayout
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import (
    CONTROLLER_UID,
    LAST_APPLIED,
    CompositeController,
    DecoratorController,
    decorator_key,
    gone,
)
from testkit.metacontroller_base import Pass
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import heartbeat, merge_patch, modelcachenodes, phase_is, start_agents
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, pod, ready_node

POOL = "test.praesto.io/pool"
NS = "local-mode"
NODES = ["local-a", "local-b"]
MCN = names.MODELCACHENODE_KIND
POKE = "test.praesto.io/poke"


@pytest.fixture(scope="module")
def agents(
    installed: Installed, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, AgentProcess]]:
    opted_in_namespace(installed.admin, NS)
    for node in NODES:
        ready_node(installed.admin, node, {POOL: "local"})
    ready_node(installed.admin, "local-outside")  # not selected by the cache
    with ExitStack() as stack:
        yield start_agents(stack, installed, hub, tmp_path_factory.mktemp("agents"), NODES)


def served_by(beat: Any) -> Callable[[Pass], bool]:
    return lambda p: p.triggered_by("update", beat)


def test_cache_becomes_ready_on_every_selected_node(
    installed: Installed, hub: LocalHub, agents: dict[str, AgentProcess], composite: CompositeController
) -> None:
    hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": b"w" * 50_000})
    installed.admin.create(
        modelcache("tiny", NS, node_selector={POOL: "local"}, source={"huggingface": {"repo": "org/tiny"}})
    )
    parent = composite.wait_parent(NS, "tiny", phase_is(names.PHASE_READY), deadline=90)
    assert parent is not None
    status = parent["status"]
    assert (status["readyNodes"], status["totalNodes"]) == (2, 2)
    assert status["observedGeneration"] == parent["metadata"]["generation"]
    # The resolved commit is pinned into every copy's spec by the pass that reports it (#22; an
    # agent's write racing that update is a conflict, and its event brings the next pass, so the
    # pin is waited for; test_metacontroller_events.py pins without agents, exactly). The copies
    # were only ever updated in place: no resync loop, no child churn.
    commit = status["resolvedRevision"]
    wait_for(
        "every copy pinned to the resolved commit",
        lambda: (
            {c["spec"]["source"]["revision"] for c in modelcachenodes(installed.admin, NS, "tiny").values()}
            == {commit}
        ),
        30,
    )
    for child in modelcachenodes(installed.admin, NS, "tiny").values():
        assert child["spec"]["source"]["revision"] == commit
    key = f"{NS}/tiny"
    child_writes = [
        w
        for p in composite.passes(key)
        for w in p.writes
        if not w.startswith(("create ", "update-status ", f"update {names.MODELCACHE_KIND} "))
    ]
    assert all(w.startswith("update ModelCacheNode") for w in child_writes), child_writes
    # A selected Node's heartbeat brings no pass (the cache relates its NodeSummary, not the Node).
    assert key not in composite.wait_seen("update", heartbeat(installed.admin, NODES[0])).queued
    # A pass that changes nothing writes nothing: an annotation on the cache brings one.
    # The agents' last status writes may still be in flight: a pass that also carries one of them,
    # reads a copy its informer updated after the pass was queued, or reads a parent older than the
    # last status write (its conditions' transition times are then computed afresh; the write's event
    # queues the next pass) is not a pass that changes nothing. So poke again until a pass serves the
    # poke alone, reads the copies the pass before it read, and reads the parent as it is live.
    for attempt in range(5):
        poke = {"metadata": {"annotations": {POKE: str(attempt)}}}
        poked = merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, "tiny", poke, NS)
        steady = composite.wait_pass(key, served_by(poked), 30, "after the poke")
        before = [p for p in composite.passes(key) if p.finished and p.finished <= steady.started]
        if (
            len(steady.reasons) == 1
            and before
            and before[-1].children_versions == steady.children_versions
            and steady.parent_version == steady.parent_live_version
        ):
            break
    assert steady.writes == [] and not steady.error, steady.status_changes
    assert steady.response["status"]["phase"] == names.PHASE_READY
    parent_uid = parent["metadata"]["uid"]
    children = modelcachenodes(installed.admin, NS, "tiny")
    assert set(children) == set(NODES)
    for node, child in children.items():
        meta = child["metadata"]
        (ref,) = meta["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (parent_uid, True, True)
        assert meta["labels"][CONTROLLER_UID] == parent_uid
        assert LAST_APPLIED in meta["annotations"]
        assert names.FINALIZER_NODE_AGENT in meta["finalizers"]
        assert child["status"]["phase"] == names.PHASE_READY
        layout = StoreLayout(agents[node].base)
        assert layout.is_complete(NS, "tiny")
        assert (layout.cache_dir(NS, "tiny") / "model.safetensors").read_bytes() == b"w" * 50_000


def test_decorator_labels_the_nodes_where_the_cache_is_ready(
    installed: Installed, agents: dict[str, AgentProcess], decorator: DecoratorController
) -> None:
    key = names.ready_label_key(NS, "tiny")

    def labels(node: str) -> dict[str, str]:
        found = installed.admin.get("v1", "Node", node)
        return dict(((found or {}).get("metadata") or {}).get("labels") or {})

    for node in NODES:
        wait_for(f"the decorator to label {node}", lambda node=node: labels(node).get(key) == "true", 30)  # type: ignore[misc]
        assert labels(node)[key] == "true"
    # A label change is an event the decorator acts on (a status-only one is not): after that
    # pass, the Node outside the selector still has no readiness label.
    poked = merge_patch(installed.admin, "v1", "Node", "local-outside", {"metadata": {"labels": {POKE: "1"}}})
    decorator.wait_pass(
        decorator_key("v1", "Node", "", "local-outside"), lambda p: p.triggered_by("update", poked), 30
    )
    assert key not in labels("local-outside")


def test_another_tenants_pod_creates_no_copy_but_ours_does(
    installed: Installed, agents: dict[str, AgentProcess], composite: CompositeController
) -> None:
    ensure_namespace(installed.admin, "local-other")
    consumer = names.consumer_label_key("tiny")
    core = client.CoreV1Api(installed.admin.api)
    for namespace, name in (("local-other", "intruder"), (NS, "ours")):
        body = pod(name, namespace, labels={consumer: "true"})
        body["spec"]["nodeName"] = "local-outside"  # as if scheduled there
        core.create_namespaced_pod(namespace, body)
    wait_for(
        "the demand copy on local-outside",
        lambda: "local-outside" in modelcachenodes(installed.admin, NS, "tiny"),
        30,
    )
    children = modelcachenodes(installed.admin, NS, "tiny")
    # Only our own Pod's node gets a demand copy; another team's label is not demand.
    assert set(children) == {*NODES, "local-outside"}
    core.delete_namespaced_pod("ours", NS, grace_period_seconds=0)
    wait_for(
        "our pod to go",
        lambda: not core.list_namespaced_pod(NS, field_selector="metadata.name=ours").items,
        30,
    )
    wait_for(
        "the demand copy to go with its Pod",
        lambda: set(modelcachenodes(installed.admin, NS, "tiny")) == set(NODES),
        30,
    )


def test_deleting_the_cache_removes_every_copy_then_the_cache(
    installed: Installed, agents: dict[str, AgentProcess], composite: CompositeController
) -> None:
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "tiny", NS)
    composite.wait_parent(NS, "tiny", gone, deadline=90)
    assert modelcachenodes(installed.admin, NS, "tiny") == {}
    for node in NODES:
        assert not StoreLayout(agents[node].base).cache_dir(NS, "tiny").exists()


def test_kubectl_describe_modelcache_shows_the_nodes_transitions(installed: Installed) -> None:
    """The agents record each transition that matters on the ModelCache too (involvedObject = the cache)."""
    events = client.CoreV1Api(installed.admin.api).list_namespaced_event(
        NS, field_selector=f"involvedObject.kind={names.MODELCACHE_KIND},involvedObject.name=tiny"
    )
    seen = {(e.reason, e.source.host) for e in events.items}
    assert {("Cached", node) for node in NODES} <= seen, seen
