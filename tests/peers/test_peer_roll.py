"""A rolling update through peers: full agents on the real API server, one local hub.

During a roll each node keeps serving its copy (phase Ready at the old revision) and fetches the new
one beside it (status.next). Peering reads both, so the nodes elect one leader among those rolling
and copy from it as from any first download; a node that rolls later copies the new revision from
the copies the others hold beside theirs (peers/held.py), and a node waiting for a leader says so in
status.next, never by taking its served copy out of Ready.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import names
from testkit.agent_harness import rbac_violations
from testkit.kube_real import RealKube
from testkit.peer_cluster import MCN, NAMESPACE, Cluster, cluster

NODES = ["node-a", "node-b", "node-c", "node-d"]
SHARD = "model-00001-of-00002.safetensors"
FILES = {
    "config.json": b'{"model_type": "tiny"}',
    SHARD: os.urandom(3 << 20),
    "model-00002-of-00002.safetensors": os.urandom((2 << 20) + 12345),
}
NEW_SHARD = os.urandom((3 << 20) + 777)  # the one file the new revision changes
# known by git SHA-1 only: each node takes it from the origin (issue 21 #11)
CONFIG = len(FILES["config.json"])


@pytest.fixture
def c(tmp_path: Path, kube: RealKube) -> Iterator[Cluster]:
    with cluster(kube, tmp_path) as made:
        made.hub.add_repo("org/tiny", FILES)
        made.hub.faults.rate = 8 << 20  # per response: the leader's download lasts long enough to join
        yield made
        made.stop()
        assert rbac_violations(made.kube.requests) == []


def _roll(c: Cluster, node: str, revision: str, switch: bool) -> None:
    """What the sync hook tells a node during a roll (hooks/rolling.py): the pinned commit, and
    whether it may switch once it holds it."""
    spec = {"source": {"revision": revision}, "switch": switch}
    c.kube.patch(MCN, names.modelcachenode_name("tiny", node), {"spec": spec}, NAMESPACE)


def _holds_beside(c: Cluster, node: str, revision: str) -> bool:
    beside = c.status("tiny", node).get("next") or {}
    return beside.get("phase") == names.NEXT_READY and beside.get("resolvedRevision") == revision


def _serving(c: Cluster, node: str, revision: str) -> bool:
    status = c.status("tiny", node)
    return status.get("phase") == names.PHASE_READY and status.get("resolvedRevision") == revision


def test_a_roll_crosses_the_origin_once_and_a_late_node_copies_it_from_copies_held_beside(
    c: Cluster,
) -> None:
    for node in NODES:
        c.start(node)
        c.select("tiny", node)
    c.wait_ready("tiny", NODES)
    first = str(c.status("tiny", "node-a")["resolvedRevision"])
    second = c.hub.commit("org/tiny", {**FILES, SHARD: NEW_SHARD}, branch="v2")
    c.hub.reset_counters()

    for node in NODES[:3]:
        _roll(c, node, second, switch=False)
    phases: set[str] = set()

    def held_and_still_serving() -> bool:
        phases.update(str(c.status("tiny", n).get("phase")) for n in NODES[:3])
        return all(_holds_beside(c, n, second) for n in NODES[:3])

    c.kube.wait_until(held_and_still_serving, 60, "the new revision held beside on three nodes")
    assert phases == {names.PHASE_READY}  # no node took its served copy out of Ready while it waited
    assert c.hub.bytes_served == len(NEW_SHARD) + 3 * CONFIG  # one copy of the changed file, not one per node
    uploads = sum(c.nodes[n].peering.server.bytes_served for n in NODES[:3])
    assert uploads >= 2 * len(NEW_SHARD)  # the two followers copied it

    _roll(c, "node-d", second, switch=False)  # rolls after the others hold it beside
    c.kube.wait_until(lambda: _holds_beside(c, "node-d", second), 30, "node-d holds it beside")
    assert c.hub.bytes_served == len(NEW_SHARD) + 4 * CONFIG  # copied from the copies held beside

    for node in NODES:
        _roll(c, node, second, switch=True)
    c.kube.wait_until(lambda: all(_serving(c, n, second) for n in NODES), 30, "every node switched")
    for node in NODES:
        assert c.files("tiny", node) == {**FILES, SHARD: NEW_SHARD}
    assert first != second
