"""Four full node agents on loopback addresses, one origin: the model crosses the origin once.

Agents run whole (watch, reconcile, status, peer server) against the real API server
through the real `kubernetes` client; the origin is the local hub, whose byte
counters say what it served.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.peers.server import Limits
from praesto.agent.peers.source import Tuning

from praesto import names
from testkit.agent_harness import rbac_violations
from testkit.kube_real import RealKube
from testkit.peer_cluster import Cluster, cluster

NODES = ["node-a", "node-b", "node-c", "node-d"]
FILES = {
    "config.json": b'{"model_type": "tiny"}',
    "model-00001-of-00002.safetensors": os.urandom(3 << 20),
    "model-00002-of-00002.safetensors": os.urandom((2 << 20) + 12345),
    "tokenizer/tokenizer.json": os.urandom(300_000),
}
TOTAL = sum(len(d) for d in FILES.values())
PEERABLE = TOTAL - len(FILES["config.json"])  # a git SHA-1 alone keeps it origin-only (issue 21 #11)
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def c(tmp_path: Path, kube: RealKube) -> Iterator[Cluster]:
    with cluster(kube, tmp_path) as made:
        made.hub.add_repo("org/tiny", FILES)
        yield made
        made.stop()
        assert rbac_violations(made.kube.requests) == []


def peer_metric(c: Cluster, node: str, origin: str) -> float:
    agent = c.nodes[node].agent
    assert agent is not None
    return agent.metrics.value("praesto_agent_downloaded_bytes_total", origin=origin)


def test_four_nodes_selected_at_once_cost_the_origin_one_copy(c: Cluster) -> None:
    for node in NODES:
        c.start(node)
    for node in NODES:
        c.select("tiny", node)
    c.wait_ready("tiny", NODES)

    assert c.hub.bytes_served <= 1.1 * TOTAL, (c.hub.bytes_served, TOTAL)
    for node in NODES:
        assert c.files("tiny", node) == FILES
        status = c.status("tiny", node)
        assert status["peer"]["address"] == c.nodes[node].peering.address
        assert status["peer"]["address"].startswith(c.nodes[node].host + ":")
    from_peers = {n: c.status("tiny", n)["bytesFromPeers"] for n in NODES}
    assert from_peers["node-a"] == 0  # the lowest node name fetches from the origin
    assert sum(from_peers.values()) >= 3 * TOTAL - 0.1 * TOTAL
    assert sum(peer_metric(c, n, "peer") for n in NODES) == sum(from_peers.values())
    assert sum(peer_metric(c, n, "source") for n in NODES) == c.hub.bytes_served
    served = sum(c.nodes[n].peering.server.bytes_served for n in NODES)
    assert served == sum(from_peers.values())


def test_a_node_selected_later_copies_from_every_ready_peer(c: Cluster) -> None:
    for node in NODES[:3]:
        c.start(node)
        c.select("tiny", node)
    c.wait_ready("tiny", NODES[:3])
    c.hub.reset_counters()
    c.start("node-d")
    c.select("tiny", "node-d")
    c.wait_ready("tiny", ["node-d"])
    assert c.hub.bytes_served == TOTAL - PEERABLE  # metadata, and the file known by git SHA-1 only
    assert c.status("tiny", "node-d")["bytesFromPeers"] == PEERABLE
    uploads = {n: c.nodes[n].peering.server.bytes_served for n in NODES[:3]}
    assert sum(1 for v in uploads.values() if v) >= 2, uploads  # files spread over peers


def test_a_lying_peer_is_detected_and_the_file_comes_from_the_origin(c: Cluster) -> None:
    c.start("node-a")
    c.select("tiny", "node-a")
    c.wait_ready("tiny", ["node-a"])
    shard = c.nodes["node-a"].layout.cache_dir("team-a", "tiny") / SHARD
    os.chmod(shard, 0o644)
    with shard.open("r+b") as handle:  # the peer's disk (or the peer) now lies about one file
        handle.seek(1 << 20)
        handle.write(b"\x00" * 4096)
    c.hub.reset_counters()
    c.start("node-b")
    c.select("tiny", "node-b")
    c.wait_ready("tiny", ["node-b"])

    assert c.files("tiny", "node-b") == FILES  # verified against the origin's hashes
    # The bad file comes again, whole, from the origin. The lying peer is then dropped for this
    # download, so files it had not served yet come from the origin too: how many depends on
    # timing, so only the sum is fixed.
    assert c.hub.bytes_by_path[SHARD] == len(FILES[SHARD])
    status = c.status("tiny", "node-b")
    assert status["bytesFromPeers"] > 0
    assert status["bytesFromPeers"] + sum(c.hub.bytes_by_path.values()) >= TOTAL
    assert "dropped for this download" in c.log.getvalue()
    assert "ChecksumMismatch" not in str(status)


def test_a_peer_killed_mid_transfer_falls_back_to_the_origin(c: Cluster) -> None:
    c.start("node-a", limits=Limits(max_uploads=8, rate=1 << 20))  # slow uploads: time to kill it
    c.select("tiny", "node-a")
    c.wait_ready("tiny", ["node-a"])
    c.hub.reset_counters()
    c.start("node-b", tuning=Tuning(min_seconds=60.0))
    c.select("tiny", "node-b")
    server = c.nodes["node-a"].peering.server
    c.kube.wait_until(lambda: server.bytes_served > 0, 20, "node-b copying from node-a")
    server.stop()  # node-a goes away mid-transfer
    c.wait_ready("tiny", ["node-b"])
    assert c.files("tiny", "node-b") == FILES
    status = c.status("tiny", "node-b")
    assert 0 < status["bytesFromPeers"] < TOTAL
    assert c.hub.bytes_served >= TOTAL - status["bytesFromPeers"]


def test_an_agent_claiming_a_node_it_is_not_on_is_refused_and_the_origin_serves(c: Cluster) -> None:
    """Issue 21 item 12: the asking node is the one its Pod-bound token names, checked against the
    copy's node, not what it says: node-b's agent running on node-z holds no copy there."""
    c.start("node-a")
    c.select("tiny", "node-a")
    c.wait_ready("tiny", ["node-a"])
    c.hub.reset_counters()
    c.start("node-b", pod_node="node-z")
    c.select("tiny", "node-b")
    c.wait_ready("tiny", ["node-b"])
    assert c.files("tiny", "node-b") == FILES
    assert c.status("tiny", "node-b")["bytesFromPeers"] == 0
    assert c.nodes["node-a"].peering.server.bytes_served == 0
    assert c.hub.bytes_served == TOTAL
    reviewed = c.nodes["node-a"].peering.authorizer.identities._reviews.values()
    assert {r.value for r in reviewed} == {"node-z"}  # its token names where its Pod runs
    assert "dropped for this download" in c.log.getvalue()


def test_a_stalled_leader_is_not_waited_for_forever(c: Cluster) -> None:
    # node-a claims the cache (status with a peer address) but never makes progress: no agent runs it
    c.select("tiny", "node-a")
    c.kube.patch(
        f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}",
        names.modelcachenode_name("tiny", "node-a"),
        {"status": {"phase": names.PHASE_PENDING, "peer": {"address": "127.0.0.9:1"}}},
        "team-a",
        "status",
    )
    c.start("node-b", stall_seconds=1.0)
    c.select("tiny", "node-b")
    c.kube.wait_until(
        lambda: "waiting for node node-a" in str(c.status("tiny", "node-b").get("message")), 20, "waiting"
    )
    c.wait_ready("tiny", ["node-b"])
    assert c.status("tiny", "node-b")["bytesFromPeers"] == 0
