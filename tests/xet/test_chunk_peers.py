"""Peers share Xet chunks (issue 40 item 3): a follower rolling a revision takes the changed chunks
from a peer's chunk store, the CAS only what no peer had; a peer sending a corrupt range is refused,
dropped, and the range comes from the CAS; a node without a copy of the cache gets 403; a range the
peer does not hold is a 404 and comes from the CAS.

The model is uploaded by the real hf_xet client (tests/xet/test_chunk_store.py's uploads); both
agents' download engines are the real ones, the peer server is the real one on loopback, behind
the real API server's TokenReviews (tests/peers/conftest.py). The CAS double counts what it served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download import PartSources
from praesto.agent.download.api import Result
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.origins.huggingface.xet import Chunk
from praesto.agent.peers import xorbserve
from praesto.agent.peers.protocol import xorbs_path
from praesto.agent.peers.server import PeerServer
from praesto.agent.peers.source import PeerSource, Tuning

from praesto import names
from praesto.spec import Source
from praesto.store import StoreLayout
from testkit.hub import LocalHub
from tests.download.conftest import tree_of
from tests.peers.conftest import SERVER, Peers, peers
from tests.xet.test_chunk_store import NAME, REPO, SIZE, Uploads, hub, node_options, uploads

__all__ = ["hub", "peers", "uploads"]  # fixtures shared with the chunk store's and the peer tests
TUNING = Tuning(min_seconds=10.0, timeout=10.0, stall_seconds=5.0, not_yet_pause=0.05, offer_seconds=0.05)


def fetch(
    hub: LocalHub, uploads: Uploads, node: Path, dest: Path, peer: PeerSource | None = None
) -> tuple[Result, int]:
    """One download of REPO's head on the node at `node` (asking `peer`): its result, the CAS's bytes."""
    before = uploads.double.store.counters.range_bytes_served
    options = node_options(hub, node)
    planned = plan(Source("hf", REPO, "main", (), ()), options)
    result = download(planned, dest, options, PartSources(peers=peer))
    return result, uploads.double.store.counters.range_bytes_served - before


def publish(node: Path, dest: Path, revision: str) -> None:
    """Node `node`'s copy of team-a/m made complete at `revision` from the download at `dest` (what
    the agent's publish leaves: the files, the manifest with their sha256, the complete marker)."""
    layout = StoreLayout(node)
    root = layout.cache_dir("team-a", "m")
    root.mkdir(parents=True, exist_ok=True)
    data = (dest / NAME).read_bytes()
    (root / NAME).write_bytes(data)
    entry = {"path": NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (root / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": revision, "files": [entry]}))
    (root / names.COMPLETE_FILE).write_text(revision + "\n")


@contextlib.contextmanager
def serving(node: Path, peers: Peers, name: str = SERVER) -> Iterator[PeerServer]:
    """Node `node`'s peer server, as the node called `name`."""
    srv = PeerServer(StoreLayout(node), peers.authorizer(name), ("127.0.0.1", 0)).start()
    try:
        yield srv
    finally:
        srv.stop()


def head(hub: LocalHub) -> str:
    return plan(Source("hf", REPO, "main", (), ()), node_options(hub, Path("/nonexistent"))).revision


def asker(srv: PeerServer, peers: Peers, revision: str) -> PeerSource:
    """Node ASKER's peer source for team-a/m at `revision`, asking node SERVER only."""
    return PeerSource({srv.address: SERVER}, peers.credentials(), "team-a", "m", revision, TUNING)


def assert_rolled_by_chunks(
    hub: LocalHub, uploads: Uploads, node: Path, result: Result, served: int, source: PeerSource
) -> None:
    """The node's roll to v2 came through Xet: the CAS served about the changed chunks (10 % of the
    bytes changed), peers the rest, nothing went whole through resolve/ or fell back."""
    changed = SIZE - sum(x == y for x, y in zip(uploads.files["v1"], uploads.files["v2"], strict=True))
    assert tree_of(node / "v2") == {NAME: uploads.files["v2"]}
    assert (result.xet_files, result.xet_fallbacks, source.dropped) == (1, {}, {})
    assert hub.bytes_by_path.get(NAME, 0) == 0, "no file went whole through resolve/"
    assert 0 < served <= 0.15 * SIZE, f"the CAS served {served} bytes; {changed} bytes changed"
    assert result.bytes_from_peers + served >= SIZE - changed  # the rest came from the peers' chunks


@pytest.fixture
def nodes(hub: LocalHub, uploads: Uploads, tmp_path: Path) -> tuple[Path, Path]:
    """Two nodes holding v1 through Xet (so their chunk stores hold its chunks); then v2 is pushed."""
    a, b = tmp_path / "node-a", tmp_path / "node-b"
    for node in (a, b):
        fetch(hub, uploads, node, node / "v1")
    publish(a, a / "v1", head(hub))
    hub.commit(REPO, {NAME: uploads.files["v2"]})
    return a, b


def test_a_follower_rolling_takes_the_changed_chunks_from_a_peer_that_rolled(
    nodes: tuple[Path, Path], hub: LocalHub, uploads: Uploads, peers: Peers
) -> None:
    a, b = nodes
    _, served_a = fetch(hub, uploads, a, a / "v2")  # the peer rolls first, from the CAS
    assert 0 < served_a <= 0.15 * SIZE
    publish(a, a / "v2", head(hub))
    with serving(a, peers) as srv:
        source = asker(srv, peers, head(hub))
        result, served = fetch(hub, uploads, b, b / "v2", source)
        source.close()
    assert tree_of(b / "v2") == {NAME: uploads.files["v2"]}
    assert (result.xet_files, result.xet_fallbacks, source.dropped) == (1, {}, {})
    assert served == 0, f"the CAS served {served} bytes a peer held"
    assert result.bytes_from_peers == served_a, "the peer sent exactly the ranges the CAS sent it"
    assert hub.bytes_by_path.get(NAME, 0) == 0
    deadline = time.monotonic() + 10  # the server counts a write after the asker may have read it
    while srv.bytes_served < served_a and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.bytes_served == served_a


@pytest.mark.parametrize("where", ["data", "header"])
def test_a_peer_sending_a_corrupt_range_is_dropped_and_the_cas_serves_it(
    nodes: tuple[Path, Path],
    hub: LocalHub,
    uploads: Uploads,
    peers: Peers,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flipped byte in a chunk's data decodes (random bytes are stored plain) and fails the file's
    Xet hash: every peer that sent ranges of it is dropped and the file assembled again without them;
    one in a chunk's header fails to decode: that peer is dropped at once and the CAS serves the range."""
    a, b = nodes
    _, served_a = fetch(hub, uploads, a, a / "v2")
    publish(a, a / "v2", head(hub))

    class Lying(xetstore.ChunkStore):
        def read_raw(self, xorb: str, index: int, chunk_hash: str) -> tuple[bytes, Chunk] | None:
            found = super().read_raw(xorb, index, chunk_hash)
            if found is None:
                return None
            raw = bytearray(found[0])
            raw[-1 if where == "data" else 0] ^= 0x01
            return bytes(raw), found[1]

    monkeypatch.setattr(xorbserve, "ChunkStore", Lying)  # the serving side only
    with serving(a, peers) as srv:
        source = asker(srv, peers, head(hub))
        result, served = fetch(hub, uploads, b, b / "v2", source)
        source.close()
    assert tree_of(b / "v2") == {NAME: uploads.files["v2"]}
    assert (result.xet_files, result.xet_fallbacks) == (1, {})  # no fallback to resolve/
    assert list(source.dropped) == [srv.address], source.dropped
    assert served == served_a, "the CAS served the ranges the liar sent"
    assert hub.bytes_by_path.get(NAME, 0) == 0


def test_a_range_the_peer_does_not_hold_is_a_404_and_comes_from_the_cas(
    nodes: tuple[Path, Path], hub: LocalHub, uploads: Uploads, peers: Peers
) -> None:
    a, b = nodes  # the peer holds v1 only: v2's new chunks are nowhere but the CAS
    with serving(a, peers) as srv:
        source = asker(srv, peers, head(hub))
        result, served = fetch(hub, uploads, b, b / "v2", source)
        source.close()
    assert tree_of(b / "v2") == {NAME: uploads.files["v2"]}
    assert (result.xet_files, result.xet_fallbacks, source.dropped) == (1, {}, {})
    assert 0 < served <= 0.15 * SIZE and result.bytes_from_peers == 0


def test_a_node_without_a_copy_of_the_cache_gets_403_and_bad_asks_are_refused(
    nodes: tuple[Path, Path], hub: LocalHub, uploads: Uploads, peers: Peers
) -> None:
    a, _ = nodes
    [index] = [p for p in (StoreLayout(a).xet_chunks_dir / "files").rglob("*") if p.is_file()]
    cas, xorb, sha256 = index.parent.parent.name, index.parent.name, index.name
    terms = json.loads(index.read_text())["terms"]
    start, end = terms[0][1], terms[0][1] + len(terms[0][2])
    rev = head(hub)
    with serving(a, peers) as srv:

        def get(path: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
            try:
                conn.request("GET", path, headers=peers.signed(path))
                resp = conn.getresponse()
                return resp.status, resp.read()
            finally:
                conn.close()

        status, body = get(xorbs_path("team-a", "m", rev, cas, xorb, start, end, sha256))
        assert status == 200 and len(body) == sum(
            xetstore.ChunkStore(StoreLayout(a).xet_chunks_dir).chunk_path(h).stat().st_size
            for h in terms[0][2]
        )
        status, body = get(xorbs_path("team-b", "secret-model", rev, cas, xorb, start, end, sha256))
        assert status == 403 and b"holds no copy of team-b/secret-model" in body  # no ModelCacheNode there
        status, _ = get(xorbs_path("team-a", "m", rev, cas, "0" * 64, start, end, sha256))
        assert status == 404  # a xorb this cache's files do not name
        status, _ = get(xorbs_path("team-a", "m", rev, "f" * 32, xorb, start, end, sha256))
        assert status == 404  # the chunks under another CAS's key are another CAS's
        status, body = get(xorbs_path("team-a", "m", rev, cas, xorb, 0, 9000, sha256))
        assert status == 400 and b"within a xorb" in body
        # cut-through: while this node downloads v2, a range of v2's file it will index says "not yet"
        planned = plan(Source("hf", REPO, "main", (), ()), node_options(hub, a))
        srv.inflight.register("team-a", "m", planned, a / "staging", 1 << 20)
        v2 = uploads.uploaded["v2"].sha256
        status, _ = get(xorbs_path("team-a", "m", planned.revision, cas, "0" * 64, 0, 1, v2))
        assert status == 425
        status, _ = get(xorbs_path("team-a", "m", planned.revision, cas, "0" * 64, 0, 1, "e" * 64))
        assert status == 404  # a file not in its plan: nothing to wait for


def test_a_node_holding_nothing_of_a_file_copies_it_whole_from_peers(
    nodes: tuple[Path, Path], hub: LocalHub, uploads: Uploads, peers: Peers, tmp_path: Path
) -> None:
    """The chunk store holds nothing of it (a first download): ranges in parallel from the peer's
    copy (passed on as they arrive when in flight, "not yet" waited on by the swarm's rules) beat
    chunks decoded one range at a time."""
    a, _ = nodes
    fetch(hub, uploads, a, a / "v2")
    publish(a, a / "v2", head(hub))
    cold = tmp_path / "cold"
    with serving(a, peers) as srv:
        source = asker(srv, peers, head(hub))
        result, served = fetch(hub, uploads, cold, cold / "v2", source)
        source.close()
    assert tree_of(cold / "v2") == {NAME: uploads.files["v2"]}
    assert (served, result.xet_files, result.xet_fallbacks, source.dropped) == (0, 0, {}, {})
    assert result.bytes_from_peers == SIZE and hub.bytes_by_path.get(NAME, 0) == 0


def test_a_node_that_copied_a_revision_whole_seeds_the_next_roll_from_peers_chunks(
    hub: LocalHub, uploads: Uploads, peers: Peers, tmp_path: Path
) -> None:
    """B copied v1 whole from A (so its chunk store holds nothing), then leads the roll to v2: its
    chunk peers (peering.py `_chunk_source`) are A, which downloaded v1 through Xet, and C, which
    holds nothing and answers 404; the CAS serves only about the changed chunks, A the unchanged."""
    a, b, c = tmp_path / "node-a", tmp_path / "node-b", tmp_path / "node-c"
    v1 = head(hub)
    fetch(hub, uploads, a, a / "v1")  # A: v1 through Xet, its chunks indexed
    publish(a, a / "v1", v1)
    with serving(a, peers) as srv:
        source = asker(srv, peers, v1)
        copied, served = fetch(hub, uploads, b, b / "v1", source)  # B: v1 copied whole from A
        source.close()
    assert (served, copied.xet_files, copied.bytes_from_peers) == (0, 0, SIZE)
    assert not any(p.is_file() for p in StoreLayout(b).xet_chunks_dir.rglob("*"))

    hub.commit(REPO, {NAME: uploads.files["v2"]})
    c.mkdir()
    with serving(a, peers) as srv, serving(c, peers, "node-c") as empty:
        both = {srv.address: SERVER, empty.address: "node-c"}
        source = PeerSource(both, peers.credentials(), "team-a", "m", head(hub), TUNING, chunks_only=True)
        result, served = fetch(hub, uploads, b, b / "v2", source)
        source.close()
    assert_rolled_by_chunks(hub, uploads, b, result, served, source)
    deadline = time.monotonic() + 10  # the server counts a write after the asker may have read it
    while srv.bytes_served < result.bytes_from_peers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.bytes_served == result.bytes_from_peers and empty.bytes_served == 0
    _, rolled = fetch(hub, uploads, a, a / "v2")  # A rolls from its own chunk store, no peers
    assert served == rolled, "B took from the CAS what a node holding v1's chunks takes"


def test_a_roll_leader_takes_chunks_from_a_node_at_another_revision_without_waiting_on_it(
    hub: LocalHub, uploads: Uploads, peers: Peers, tmp_path: Path
) -> None:
    """The roll's leader asks chunk holders only (peering.py `_chunk_source`: nodes whose last
    download went through Xet, whatever revision they serve). B copied v1 whole and leads the roll;
    A holds v1's chunks and rolls too, as B's follower (its download of v2 is registered, so it
    answers "not yet" for the changed chunks of the file: it waits for B). B takes the unchanged
    chunks from A and the changed ones from the CAS at once, and copies nothing whole."""
    a, b = tmp_path / "node-a", tmp_path / "node-b"
    v1 = head(hub)
    fetch(hub, uploads, a, a / "v1")
    publish(a, a / "v1", v1)
    with serving(a, peers) as srv:
        source = asker(srv, peers, v1)
        fetch(hub, uploads, b, b / "v1", source)  # B: v1 copied whole from A, no chunks kept
        source.close()
    hub.commit(REPO, {NAME: uploads.files["v2"]})
    patient = dataclasses.replace(TUNING, stall_seconds=120.0)  # waiting on A's "not yet" would show
    with serving(a, peers) as srv:
        rolling = plan(Source("hf", REPO, "main", (), ()), node_options(hub, a))
        srv.inflight.register("team-a", "m", rolling, a / "staging", 1 << 20)  # A follows B's roll
        source = PeerSource(
            {srv.address: SERVER}, peers.credentials(), "team-a", "m", rolling.revision, patient,
            chunks_only=True,
        )  # fmt: skip
        began = time.monotonic()
        result, served = fetch(hub, uploads, b, b / "v2", source)
        took = time.monotonic() - began
        source.close()
    assert_rolled_by_chunks(hub, uploads, b, result, served, source)
    assert srv.not_yet > 0  # A said "not yet" for the changed chunks ...
    assert took < patient.stall_seconds  # ... and B did not wait on it
