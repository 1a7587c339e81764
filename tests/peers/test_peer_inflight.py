"""Serving a download still in flight: only journaled parts of planned files, "not yet" otherwise.

Server and `PeerSource` over real HTTP against a staging written the way the
engine writes it (real `Journal`), then whole agents: followers copy from a
leader while it is still downloading from a slowed origin, and fall back to the
origin when it dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from praesto.agent.download.api import Plan, RemoteFile
from praesto.agent.download.arrivals import Arrivals
from praesto.agent.download.journal import Journal
from praesto.agent.download.publish import TREE
from praesto.agent.peers.protocol import ACCEPT_PREFIX_HEADER, NOT_YET, WRITTEN_HEADER, file_path, parts_path
from praesto.agent.peers.server import PeerServer
from praesto.agent.peers.source import PeerSource, Tuning

from praesto import names
from praesto.spec import Source
from praesto.store import StoreLayout
from testkit.agent_harness import rbac_violations
from testkit.kube_real import RealKube
from testkit.peer_cluster import Cluster, cluster
from tests.peers.conftest import SERVER, Peers

REV = "b" * 40
PART = 1 << 16
BIG = os.urandom(3 * PART + 100)  # four parts
SMALL = b'{"model_type": "tiny"}'


@dataclass
class Leader:
    server: PeerServer
    journal: Journal
    plan: Plan
    peers: Peers
    arrivals: Arrivals  # where the download's parts have got to, as its engine notes them


def _remote(path: str, data: bytes) -> RemoteFile:
    return RemoteFile(path, len(data), sha256=hashlib.sha256(data).hexdigest())


@contextlib.contextmanager
def _in_flight(
    root: Path, peers: Peers, node: str, plan: Plan, tree: dict[str, bytes]
) -> Iterator[tuple[PeerServer, Journal, Arrivals]]:
    """`node`'s peer server with `plan` of team-a/m in flight: its staging holds `tree`, its journal
    only its header (the caller journals what it wants written)."""
    layout = StoreLayout(root)
    staging = layout.staging_dir("team-a", "m")
    (staging / TREE).mkdir(parents=True)
    for name, data in tree.items():
        (staging / TREE / name).write_bytes(data)
    journal = Journal(staging, {"revision": REV, "partSize": PART, "v": 1})
    journal.open(fresh=True)
    server = PeerServer(layout, peers.authorizer(node), ("127.0.0.1", 0)).start()
    flight = server.inflight.register("team-a", "m", plan, staging, PART)
    try:
        yield server, journal, flight.arrivals
    finally:
        journal.close()
        server.stop()


@pytest.fixture
def leader(tmp_path: Path, peers: Peers) -> Iterator[Leader]:
    """A node mid-download: the big file's parts 0 and 2 journaled, nothing verified yet."""
    plan = Plan(Source("hf", "org/m", "main"), REV, (_remote("big.bin", BIG), _remote("config.json", SMALL)))
    tree = {"big.bin": BIG, "config.json": SMALL, "unplanned.bin": b"on disk, not in the plan"}
    with _in_flight(tmp_path / "store", peers, SERVER, plan, tree) as (server, journal, arrivals):
        journal.parts_done("big.bin", [0, 2])
        yield Leader(server, journal, plan, peers, arrivals)


def get(
    leader: Leader, path: str, span: tuple[int, int] | None = None, *, prefix: bool = False
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", leader.server.server_port, timeout=10)
    try:
        headers = {ACCEPT_PREFIX_HEADER: "1"} if prefix else {}
        if span is not None:
            headers["Range"] = f"bytes={span[0]}-{span[1] - 1}"
        conn.request("GET", path, headers=leader.peers.signed(path, headers))
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def url(path: str, rev: str = REV) -> str:
    return file_path("team-a", "m", rev, path)


def test_journaled_parts_are_served_while_the_download_runs(leader: Leader) -> None:
    status, _, body = get(leader, url("big.bin"), (0, PART))
    assert (status, body) == (206, BIG[:PART])
    status, _, body = get(leader, url("big.bin"), (2 * PART + 5, 3 * PART))
    assert (status, body) == (206, BIG[2 * PART + 5 : 3 * PART])


def test_a_range_not_written_yet_answers_not_yet_with_the_bytes_written(leader: Leader) -> None:
    for span in [(PART, 2 * PART), (0, 2 * PART), (3 * PART, len(BIG))]:
        status, headers, body = get(leader, url("big.bin"), span)
        assert status == NOT_YET == 425, span
        assert headers["retry-after"] == "1"
        assert headers[WRITTEN_HEADER.lower()] == str(2 * PART)
        assert b"not written yet" in body
    status, headers, _ = get(leader, url("config.json"))  # single-part: only once verified
    assert status == 425
    leader.journal.verified([("config.json", hashlib.sha256(SMALL).hexdigest())])
    assert get(leader, url("config.json"))[::2] == (200, SMALL)
    assert get(leader, url("big.bin"), (PART, 2 * PART))[0] == 425


def test_files_outside_the_plan_and_other_revisions_are_refused(leader: Leader) -> None:
    status, _, body = get(leader, url("unplanned.bin"))
    assert status == 404 and b"not in the plan" in body
    assert get(leader, url("../../etc/passwd"))[0] == 404
    assert get(leader, url(".praesto-journal"))[0] == 404
    status, _, body = get(leader, url("big.bin", rev="c" * 40), (0, PART))
    assert status == 404 and b"not complete" in body
    conn = http.client.HTTPConnection("127.0.0.1", leader.server.server_port, timeout=10)
    conn.request("GET", url("big.bin"), headers={"Range": f"bytes=0-{PART - 1}"})
    assert conn.getresponse().status == 401  # in flight or not, requests without a token are refused
    conn.close()
    assert leader.server.bytes_served == 0


def _source(leader: Leader, stall: float, min_seconds: float = 10.0) -> PeerSource:
    tuning = Tuning(min_seconds=min_seconds, timeout=5.0, stall_seconds=stall, not_yet_pause=0.05)
    credentials = leader.peers.credentials()
    return PeerSource({leader.server.address: SERVER}, credentials, "team-a", "m", REV, tuning)


def _copy_part_1(leader: Leader, source: PeerSource, leader_side: Callable[[], None]) -> None:
    """A follower copies part 1 of big.bin from `leader` while `leader_side` (its engine, in a
    thread) writes it; the follower must end up with exactly the leader's bytes."""
    got = bytearray(len(BIG))

    def sink(offset: int, chunk: memoryview) -> None:
        got[offset : offset + len(chunk)] = chunk

    writer = threading.Thread(target=leader_side)
    writer.start()
    try:
        n = source.fetch(leader.plan.files[0], PART, 2 * PART, sink, threading.Event())
    finally:
        writer.join()
        source.close()
    assert n == PART and bytes(got[PART : 2 * PART]) == BIG[PART : 2 * PART]
    assert source.dropped == {}


def test_a_follower_waits_for_a_part_to_be_written_then_copies_it(leader: Leader) -> None:
    def write_part_once_asked() -> None:  # the leader's engine journals part 1 after the first ask
        deadline = time.monotonic() + 10
        while leader.server.not_yet == 0 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        leader.journal.parts_done("big.bin", [1])

    _copy_part_1(leader, _source(leader, stall=30.0), write_part_once_asked)
    assert leader.server.not_yet >= 1


def test_a_leader_whose_written_bytes_stand_still_is_dropped(leader: Leader) -> None:
    """Part 1 is neither journaled nor arriving there: the range waits its own time and
    `stall_seconds` more (a seeder may begin a part late), then the origin takes it."""
    source = _source(leader, stall=0.3, min_seconds=0.5)
    began = time.monotonic()
    try:
        n = source.fetch(leader.plan.files[0], PART, 2 * PART, lambda o, c: None, threading.Event())
    finally:
        source.close()
    assert n == 0  # the origin fetches it
    assert "had not sent 0.3s after it was due" in source.dropped[leader.server.address]
    assert time.monotonic() - began < 10  # bounded: 0.5 s + 0.3 s, plus the last ask's wait


def test_a_part_still_arriving_goes_to_askers_taking_a_prefix_as_far_as_it_is_written(leader: Leader) -> None:
    leader.arrivals.reached("big.bin", 1, PART + 1000)  # part 1: its first 1,000 bytes are written
    assert get(leader, url("big.bin"), (PART, 2 * PART))[0] == 425  # an asker not taking a prefix
    status, headers, body = get(leader, url("big.bin"), (PART, 2 * PART), prefix=True)
    assert (status, body) == (206, BIG[PART : PART + 1000])
    assert headers["content-range"] == f"bytes {PART}-{PART + 999}/{len(BIG)}"
    # journaled part 0, then part 1 as far as it is written
    status, _, body = get(leader, url("big.bin"), (10, 2 * PART), prefix=True)
    assert (status, body) == (206, BIG[10 : PART + 1000])
    # part 1 whole (not journaled yet), then journaled part 2: one answer
    leader.arrivals.reached("big.bin", 1, 2 * PART)
    status, _, body = get(leader, url("big.bin"), (PART, 3 * PART), prefix=True)
    assert (status, body) == (206, BIG[PART : 3 * PART])
    # nothing of part 3 yet: the request waits for its first bytes (PREFIX_WAIT), then says not yet
    status, headers, _ = get(leader, url("big.bin"), (3 * PART, len(BIG)), prefix=True)
    assert status == 425 and headers[WRITTEN_HEADER.lower()] == str(2 * PART)
    leader.arrivals.reached("config.json", 0, len(SMALL))  # a single-part file, not verified yet
    assert get(leader, url("config.json"), prefix=True)[::2] == (200, SMALL)
    leader.arrivals.forget("config.json")
    leader.arrivals.reached("config.json", 0, 5)
    status, headers, body = get(leader, url("config.json"), prefix=True)  # no Range asked: still a prefix
    assert (status, body, headers["content-range"]) == (206, SMALL[:5], f"bytes 0-4/{len(SMALL)}")
    leader.arrivals.forget("big.bin")  # its bytes failed verification: written again from scratch
    assert get(leader, url("big.bin"), (PART, 2 * PART), prefix=True)[0] == 425


def test_the_offer_lists_parts_written_whole_and_parts_arriving(leader: Leader) -> None:
    leader.arrivals.reached("big.bin", 1, 2 * PART)  # whole, not journaled yet
    leader.arrivals.reached("big.bin", 3, 3 * PART + 7)  # under way
    leader.arrivals.reached("big.bin", 2, 2 * PART + PART)  # whole and journaled: listed once
    status, _, body = get(leader, parts_path("team-a", "m", REV))
    answer = json.loads(body)
    assert status == 200 and answer["complete"] is False and answer["partSize"] == PART
    assert sorted(answer["files"]["big.bin"]) == [0, 1, 2]
    assert answer["arriving"] == {"big.bin": [[3, 3 * PART + 7]]}  # index, offset written up to


def test_a_follower_copies_a_part_while_it_arrives(leader: Leader) -> None:
    """Part 1 reaches the leader 4 KiB at a time and is never journaled: the follower has it whole
    as soon as the leader does, from the leader's prefix answers."""
    step = 4096

    def arrive() -> None:
        for upto in range(PART + step, 2 * PART + 1, step):
            leader.arrivals.reached("big.bin", 1, upto)
            threading.Event().wait(0.002)

    _copy_part_1(leader, _source(leader, stall=30.0), arrive)
    # each byte once, over several prefix answers (counted by the server just after it sent them)
    deadline = time.monotonic() + 10
    while leader.server.bytes_served < PART and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert leader.server.bytes_served == PART


def test_the_rest_of_a_part_is_asked_of_the_peer_passing_it_on_not_the_seeder(
    leader: Leader, peers: Peers, tmp_path: Path
) -> None:
    """After a prefix, the follower asks the peer that sent it for the rest (its server waits for the
    next bytes) instead of choosing afresh by that peer's offer, which still shows it written only up
    to where the follower now is: that sent the follower to the seeder for a "not yet" and a pause
    at every prefix, and each hop of the swarm lagged its sender (bench/p2p_bench.py). Offers here
    are polled once (stale from then on), as they are between polls."""
    step = 4096
    leader.arrivals.reached("big.bin", 1, PART + step)  # the relay has begun part 1

    def arrive() -> None:  # the rest arrives once the follower took the first prefix (and the offer)
        deadline = time.monotonic() + 10
        while leader.server.bytes_served < step and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        for upto in range(PART + 2 * step, 2 * PART + 1, step):
            leader.arrivals.reached("big.bin", 1, upto)
            threading.Event().wait(0.002)

    tuning = Tuning(min_seconds=3.0, timeout=5.0, stall_seconds=2.0, not_yet_pause=0.05, offer_seconds=60.0)
    # the seeder has written nothing of part 1: it can only say "not yet"
    with _in_flight(tmp_path / "seeder-store", peers, "node-c", leader.plan, {}) as (seeder, _, _):
        source = PeerSource(
            {leader.server.address: SERVER, seeder.address: "node-c"},
            peers.credentials(),
            "team-a",
            "m",
            REV,
            tuning,
            seeders=[seeder.address],
        )
        _copy_part_1(leader, source, arrive)
        assert seeder.not_yet == 0


# ---- whole agents -----------------------------------------------------------------------

NODES = ["node-a", "node-b", "node-c", "node-d"]
PART_BYTES = 16 << 20  # the agent's part size: the big file has three parts
FILES = {
    "config.json": SMALL,
    "model.safetensors": os.urandom(2 * PART_BYTES + 4096),
    "tokenizer.json": os.urandom(200_000),
}
TOTAL = sum(len(d) for d in FILES.values())
PEERABLE = TOTAL - len(SMALL)  # config.json: a git SHA-1 alone keeps it origin-only (issue 21 #11)


@pytest.fixture
def c(tmp_path: Path, kube: RealKube) -> Iterator[Cluster]:
    with cluster(kube, tmp_path) as made:
        made.hub.add_repo("org/tiny", FILES)
        made.hub.faults.rate = 12 << 20  # per response: the leader downloads for a few seconds
        yield made
        made.stop()
        assert rbac_violations(made.kube.requests) == []


def _downloading(c: Cluster, node: str) -> bool:
    status = c.status("tiny", node)
    return status.get("phase") == names.PHASE_DOWNLOADING and bool(status.get("resolvedRevision"))


def test_followers_copy_from_a_leader_still_downloading(c: Cluster) -> None:
    c.start("node-a", concurrency=1)  # one part after another: early parts are written long before the end
    c.select("tiny", "node-a")
    c.kube.wait_until(lambda: _downloading(c, "node-a"), 20, "node-a downloading")
    for node in NODES[1:]:
        c.start(node)
        c.select("tiny", node)
    server = c.nodes["node-a"].peering.server
    c.kube.wait_until(
        lambda: server.bytes_served > 0 and _downloading(c, "node-a"), 30, "copies while node-a downloads"
    )
    c.wait_ready("tiny", NODES)

    assert c.hub.bytes_served <= 1.1 * TOTAL, (c.hub.bytes_served, TOTAL)  # the leader's copy only
    for node in NODES:
        assert c.files("tiny", node) == FILES
    for node in NODES[1:]:
        assert c.status("tiny", node)["bytesFromPeers"] == PEERABLE
    assert server.not_yet > 0  # followers asked ahead of the leader and waited, not the origin


def test_followers_fall_back_to_the_origin_when_the_leader_dies_mid_download(c: Cluster) -> None:
    c.start("node-a", concurrency=1)
    c.select("tiny", "node-a")
    c.kube.wait_until(lambda: _downloading(c, "node-a"), 20, "node-a downloading")
    for node in NODES[1:3]:
        c.start(node)
        c.select("tiny", node)
    server = c.nodes["node-a"].peering.server
    c.kube.wait_until(lambda: server.not_yet > 0, 30, "followers waiting on node-a")
    agent = c.nodes["node-a"].agent
    assert agent is not None
    agent.stop()  # node-a dies mid-download: its status still says Downloading
    c.nodes["node-a"].agent = None
    c.wait_ready("tiny", NODES[1:3], timeout=90)
    for node in NODES[1:3]:
        assert c.files("tiny", node) == FILES
    # what node-a never wrote came from the origin (a follower may then copy it from the other)
    assert any(c.status("tiny", node)["bytesFromPeers"] < TOTAL for node in NODES[1:3])
    assert "dropped for this download" in c.log.getvalue()


def test_a_node_coming_late_joins_the_download_under_way_even_if_its_name_sorts_first(c: Cluster) -> None:
    # node-b started alone (node-a's agent lagged: a slow watch, a restart); node-a, the lowest
    # name, must copy from it, not fetch a second copy from the origin
    c.start("node-b", concurrency=1)
    c.select("tiny", "node-b")
    c.kube.wait_until(lambda: _downloading(c, "node-b"), 20, "node-b downloading")
    c.start("node-a")
    c.select("tiny", "node-a")
    c.kube.wait_until(
        lambda: c.status("tiny", "node-a").get("phase") == names.PHASE_DOWNLOADING, 20, "node-a downloading"
    )
    assert _downloading(c, "node-b")  # node-a chose while node-b was still downloading
    c.wait_ready("tiny", ["node-a", "node-b"])

    assert c.hub.bytes_served <= 1.1 * TOTAL, (c.hub.bytes_served, TOTAL)
    assert c.files("tiny", "node-a") == FILES
    assert c.status("tiny", "node-a")["bytesFromPeers"] == PEERABLE
    assert "copying team-a/tiny from node node-b while it downloads" in c.log.getvalue()
