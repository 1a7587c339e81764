"""Local mode end to end on the real control plane: Metacontroller's algorithm, our hooks, two node agents.

Everything that writes does so under the chart's identities: the driver as the
Metacontroller ServiceAccount, the agents as the node-agent ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from kubernetes import client

from praesto import names
from praesto.store import StoreLayout
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import modelcachenodes, phase_is, start_agents
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, pod, ready_node
from tests.support.chart_install import ensure_namespace
from tests.support.controlplane import wait_for
from tests.support.hub import LocalHub
from tests.support.metacontroller import CONTROLLER_UID, LAST_APPLIED, CompositeDriver, DecoratorDriver

POOL = "test.praesto.io/pool"
NS = "local-mode"
NODES = ["local-a", "local-b"]
MCN = names.MODELCACHENODE_KIND


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


def test_cache_becomes_ready_on_every_selected_node(
    installed: Installed, hub: LocalHub, agents: dict[str, AgentProcess], composite: CompositeDriver
) -> None:
    hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": b"w" * 50_000})
    installed.admin.create(
        modelcache("tiny", NS, node_selector={POOL: "local"}, source={"huggingface": {"repo": "org/tiny"}})
    )
    result = composite.sync_until(NS, "tiny", phase_is(names.PHASE_READY), deadline=90)
    assert result is not None and result.parent is not None
    status = result.parent["status"]
    assert (status["readyNodes"], status["totalNodes"]) == (2, 2)
    assert status["observedGeneration"] == result.parent["metadata"]["generation"]
    # Once Ready, the resolved commit is pinned into every copy's spec (one InPlace update each);
    # after that a sync that changes nothing writes nothing: no resync loop, no child churn.
    pinned = composite.sync(NS, "tiny")
    assert pinned is not None and pinned.parent is not None
    commit = pinned.parent["status"]["resolvedRevision"]
    assert all(w.startswith("update ModelCacheNode") for w in pinned.writes)
    for child in modelcachenodes(installed.admin, NS, "tiny").values():
        assert child["spec"]["source"]["revision"] == commit
    steady = composite.sync(NS, "tiny")
    assert steady is not None and steady.writes == []
    assert steady.parent is not None and steady.parent["status"]["phase"] == names.PHASE_READY
    parent_uid = result.parent["metadata"]["uid"]
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
    installed: Installed, agents: dict[str, AgentProcess], decorator: DecoratorDriver
) -> None:
    key = names.ready_label_key(NS, "tiny")
    for node in NODES:
        labels = decorator.sync("v1", "Node", node)["metadata"]["labels"]
        assert labels[key] == "true"
    assert key not in (decorator.sync("v1", "Node", "local-outside")["metadata"].get("labels") or {})


def test_another_tenants_pod_creates_no_copy_but_ours_does(
    installed: Installed, agents: dict[str, AgentProcess], composite: CompositeDriver
) -> None:
    ensure_namespace(installed.admin, "local-other")
    consumer = names.consumer_label_key("tiny")
    core = client.CoreV1Api(installed.admin.api)
    for namespace, name in (("local-other", "intruder"), (NS, "ours")):
        body = pod(name, namespace, labels={consumer: "true"})
        body["spec"]["nodeName"] = "local-outside"  # as if scheduled there
        core.create_namespaced_pod(namespace, body)
    composite.sync(NS, "tiny")
    children = modelcachenodes(installed.admin, NS, "tiny")
    # Only our own Pod's node gets a demand copy; another team's label is not demand.
    assert set(children) == {*NODES, "local-outside"}
    core.delete_namespaced_pod("ours", NS, grace_period_seconds=0)
    wait_for(
        "our pod to go",
        lambda: not core.list_namespaced_pod(NS, field_selector="metadata.name=ours").items,
        30,
    )
    composite.sync(NS, "tiny")
    wait_for(
        "the demand copy to go with its Pod",
        lambda: set(modelcachenodes(installed.admin, NS, "tiny")) == set(NODES),
        30,
    )


def test_deleting_the_cache_removes_every_copy_then_the_cache(
    installed: Installed, agents: dict[str, AgentProcess], composite: CompositeDriver
) -> None:
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "tiny", NS)
    composite.sync_until(NS, "tiny", lambda result: result is None, deadline=90)
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
