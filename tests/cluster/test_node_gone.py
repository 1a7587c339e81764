"""Deleting a ModelCache finishes even when a node holding a copy was deleted (the autoscaler removed it).

No agent is left to clear its finalizer from that node's ModelCacheNode; praesto-orphans (the chart's
orphans Deployment, running here as the chart configures it, as its own ServiceAccount:
tests/cluster/installed.py) releases it.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from kubernetes import client

from praesto import names
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, gone
from tests.cluster.flows import modelcachenodes, phase_is, start_agents
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "node-gone"
NODE = "gone-node"
POOL = "test.praesto.io/pool"
BOUND_SECONDS = 30  # from the ModelCache's delete to its disappearance, with the Node already gone


def test_cache_deletion_finishes_after_its_node_was_deleted(
    installed: Installed, hub: LocalHub, composite: CompositeController, tmp_path_factory: object
) -> None:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "gone"})
    hub.add_repo("org/gone", {"config.json": b"{}"})
    cache = modelcache("gone", NS, node_selector={POOL: "gone"}, source={"huggingface": {"repo": "org/gone"}})
    installed.admin.create(cache)
    with ExitStack() as stack:
        start_agents(stack, installed, hub, installed.workdir / "gone-agent", [NODE])
        composite.wait_parent(NS, "gone", phase_is(names.PHASE_READY), deadline=60)
    # The agent is gone with its node; the copy still carries the agent's finalizer.
    (copy,) = modelcachenodes(installed.admin, NS, "gone").values()
    assert names.FINALIZER_NODE_AGENT in copy["metadata"]["finalizers"]
    client.CoreV1Api(installed.admin.api).delete_node(NODE)
    started = time.monotonic()
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "gone", NS)
    composite.wait_parent(NS, "gone", gone, deadline=BOUND_SECONDS)
    assert time.monotonic() - started < BOUND_SECONDS
    assert modelcachenodes(installed.admin, NS, "gone") == {}
