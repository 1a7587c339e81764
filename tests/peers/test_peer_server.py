"""The peer server over real HTTP: per-node tokens, manifest-only paths, Range, caps, idle timeouts.

(Signed requests and their replays: test_peer_replay.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.peers import auth
from praesto.agent.peers.protocol import AUTHORIZATION_HEADER, file_path
from praesto.agent.peers.server import Limits, PeerServer

from praesto import names
from praesto.store import StoreLayout
from tests.peers.conftest import ASKER, SERVER, Peers

REV = "a" * 40
DATA = os.urandom(100_000)
FILES = {"model.bin": DATA, "sub/dir/tok en.json": b'{"x": 1}', "empty.txt": b""}


def make_cache(layout: StoreLayout, namespace: str = "team-a", cache: str = "m") -> Path:
    root = layout.cache_dir(namespace, cache)
    for path, data in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    (root / "not-listed.bin").write_bytes(b"on disk, not in the manifest")
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in FILES.items()]
    (root / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": REV, "files": entries}))
    (root / names.COMPLETE_FILE).write_text(REV + "\n")
    return root


@pytest.fixture
def server(tmp_path: Path, peers: Peers) -> Iterator[PeerServer]:
    with serving(tmp_path / "store", peers, SERVER) as srv:
        yield srv


@contextlib.contextmanager
def serving(base: Path, peers: Peers, node: str) -> Iterator[PeerServer]:
    """Node `node`'s peer server, holding team-a/m and another tenant's cache."""
    layout = StoreLayout(base)
    make_cache(layout)
    make_cache(layout, "team-b", "secret-model")  # another tenant's cache on the same node
    (base.parent / "secret-outside.txt").write_text("never served")
    srv = PeerServer(layout, peers.authorizer(node), ("127.0.0.1", 0), Limits(max_uploads=2)).start()
    srv.peers = peers  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def get(
    srv: PeerServer, path: str, headers: dict[str, str] | None = None, *, signed: bool = True
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        sent = dict(headers or {})
        if signed:
            peers: Peers = srv.peers  # type: ignore[attr-defined]
            sent = peers.signed(path, sent)
        conn.request("GET", path, headers=sent)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def url(path: str, cache: str = "m", rev: str = REV) -> str:
    return file_path("team-a", cache, rev, path)


def test_signed_request_gets_the_whole_file(server: PeerServer) -> None:
    status, headers, body = get(server, url("model.bin"))
    assert (status, body) == (200, DATA)
    assert headers["content-length"] == str(len(DATA)) and headers["accept-ranges"] == "bytes"
    status, _, body = get(server, url("sub/dir/tok%20en.json"))
    assert (status, body) == (200, FILES["sub/dir/tok en.json"])
    assert get(server, url("empty.txt"))[::2] == (200, b"")
    # Counted by the handler thread after its last write: the client may read the body first.
    served = len(DATA) + len(FILES["sub/dir/tok en.json"])
    eventually(lambda: server.bytes_served == served)


# Headers are made when the test runs (not at import): the test ids are the same in every xdist worker.
MODEL = url("model.bin")
Token = Callable[[Peers, Ed25519PrivateKey], str]  # a token made for a request signed with the key


def _signed(
    token: Token, authorization: Callable[[str], str] = lambda value: value
) -> Callable[[Peers], dict[str, str]]:
    """A request to MODEL signed properly with a new key, carrying `token(key)` (Authorization
    changed by `authorization`): what is refused is the token, not the signature."""

    def made(peers: Peers) -> dict[str, str]:
        key = Ed25519PrivateKey.generate()
        sent = peers.signed(MODEL, minted=auth.Minted(token(peers, key), key))
        return {**sent, AUTHORIZATION_HEADER: authorization(sent[AUTHORIZATION_HEADER])}

    return made


def _agent(peers: Peers, key: Ed25519PrivateKey) -> str:
    return peers.token(key=key)


BAD_HEADERS: dict[str, Callable[[Peers], dict[str, str]]] = {
    "missing": lambda p: {},
    "empty-bearer": _signed(_agent, lambda _: "Bearer "),
    "old-scheme": lambda p: {
        "Authorization": "Praesto-v2 node-b 1 " + "0" * 32 + " " + "0" * 64 + " " + p.token()
    },
    "token-with-spaces": _signed(_agent, lambda value: value + " more"),
    "token-the-api-server-does-not-know": _signed(lambda p, k: "forged.jwt.token"),
    "token-of-another-service-account": _signed(
        lambda p, k: p.token(user="system:serviceaccount:team-x:default", key=k)
    ),
    "token-bound-to-no-pod": _signed(lambda p, k: p.token(bound=False, key=k)),
    # issue 21 item 12: a token is good for the node it was minted for, and no other
    "token-minted-for-another-node": _signed(lambda p, k: p.token(target="node-c", key=k)),
    # the one audience every agent accepted before item 12 (`praesto-peer`)
    "token-with-the-old-shared-audience": _signed(lambda p, k: p.token(audience=names.PEER_TOKEN_AUDIENCE)),
    # issue 37 item 6b: this node's audience before tokens named a key (any key signed with it)
    "token-for-this-node-naming-no-key": _signed(lambda p, k: p.token(audience=names.peer_audience(SERVER))),
    "token-for-another-key": _signed(lambda p, k: p.token(key=Ed25519PrivateKey.generate())),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_unauthenticated_or_not_for_this_node_is_401(server: PeerServer, peers: Peers, case: str) -> None:
    status, _, body = get(server, MODEL, BAD_HEADERS[case](peers), signed=False)
    assert status == 401, case
    error = json.loads(body)["error"]
    assert DATA[:100] not in body and error.startswith("Authorization:")
    assert not any(token in error for token in peers.minted)  # tokens never echoed
    assert server.bytes_served == 0


def test_a_captured_request_does_not_replay_to_another_node(
    server: PeerServer, peers: Peers, tmp_path: Path
) -> None:
    """Issue 21 item 12: nonces were per server and the signature did not name the target, so a
    request captured on its way to one node was good at every other node for 60 s."""
    captured = peers.signed(MODEL)
    assert get(server, MODEL, captured, signed=False)[0] == 200
    with serving(tmp_path / "store-c", peers, "node-c") as other:
        status, _, body = get(other, MODEL, captured, signed=False)
        assert status == 401 and b"request to node node-c" in body  # signed for node-a
        # and even signed for node-c by its own key, the token is node-a's only
        status, _, body = get(
            other, MODEL, peers.signed(MODEL, target="node-c", minted=peers.agent()), signed=False
        )
        assert status == 401 and b"praesto-peer/node-c/" in body
        assert other.bytes_served == 0


def test_a_node_reads_only_caches_placed_on_it(server: PeerServer, peers: Peers) -> None:
    """Issue 12: one secret shared by all agents read every tenant's cache from every node."""
    other_tenant = file_path("team-b", "secret-model", REV, "model.bin")
    status, _, body = get(server, other_tenant)
    assert status == 403 and b"holds no copy of team-b/secret-model" in body
    peers.place("secret-model", "node-c", "team-b")  # another node's copy grants nothing to node-b
    assert get(server, other_tenant)[0] == 403
    assert get(server, MODEL)[0] == 200  # its own copy's cache: served
    peers.place("secret-model", ASKER, "team-b")
    deadline = time.monotonic() + 10  # a refusal is remembered for a moment only
    while (status := get(server, other_tenant)[0]) == 403 and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert status == 200
    eventually(lambda: server.bytes_served == 2 * len(DATA))  # counted just after the last byte left


def eventually(check: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        threading.Event().wait(0.02)


def test_token_reviews_are_remembered_by_hash_not_repeated(server: PeerServer, peers: Peers) -> None:
    for _ in range(5):
        assert get(server, url("empty.txt"))[0] == 200
    assert server.authorizer.identities.reviews == 1
    reviewed = [r for r in peers.kube.requests if r.resource == "tokenreviews"]
    assert len(reviewed) == 1
    assert not any(peers.agent().token in key for key in server.authorizer.identities._reviews)


def test_idle_and_excess_connections_hold_no_threads(tmp_path: Path, peers: Peers) -> None:
    """Issue 12: 300 idle unauthenticated sockets held 300 threads, forever."""
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    limits = Limits(max_connections=8, idle_seconds=0.5)
    srv = PeerServer(layout, peers.authorizer(), ("127.0.0.1", 0), limits).start()
    before = threading.active_count()
    socks = [socket.create_connection(("127.0.0.1", srv.server_port), timeout=10) for _ in range(60)]
    try:
        refused = 0
        for sock in socks[8:]:  # beyond the cap: answered 503 and closed at once, no thread
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer, answer
            refused += 1
        assert refused == 52 and srv.refused_connections == 52
        assert threading.active_count() <= before + 8
        deadline = time.monotonic() + 10
        while srv.connections and time.monotonic() < deadline:  # idle ones are closed by the server
            threading.Event().wait(0.05)
        assert srv.connections == 0
        for sock in socks[:8]:
            assert sock.recv(4096) == b""  # EOF: the server hung up
        assert get_with(srv, peers, url("empty.txt"))[0] == 200  # and it still serves
    finally:
        for sock in socks:
            sock.close()
        srv.stop()


def get_with(srv: PeerServer, peers: Peers, path: str) -> tuple[int, dict[str, str], bytes]:
    srv.peers = peers  # type: ignore[attr-defined]
    return get(srv, path)


@pytest.mark.parametrize(
    "path",
    [
        url("not-listed.bin"),
        url(names.MANIFEST_FILE),
        url(names.COMPLETE_FILE),
        url("../../secret-outside.txt"),
        url("%2e%2e/%2e%2e/secret-outside.txt"),
        url("sub/../model.bin"),
        url("/etc/passwd"),
        url("model.bin", rev="b" * 40),
        file_path("..", "..", REV, "secret-outside.txt"),
        file_path("team-a", "m", REV, "..%2f..%2fteam-b/secret-model/model.bin"),
        "/v1/caches/team-a/m/" + REV + "/model.bin",
        "/secret-outside.txt",
    ],
)
def test_only_manifest_files_of_complete_caches_are_served(server: PeerServer, path: str) -> None:
    status, _, body = get(server, path)
    assert status == 404, path
    assert b"never served" not in body and b"on disk" not in body


def test_incomplete_cache_is_not_served(server: PeerServer) -> None:
    server.layout.complete_marker("team-a", "m").unlink()
    assert get(server, url("model.bin"))[0] == 404


def test_the_revision_held_beside_during_a_roll_is_served_once_complete(server: PeerServer) -> None:
    """A rolling update's new revision, published beside the served copy (`.praesto/next`), is
    served at its own revision once its complete marker is written (peers/held.py); the served
    copy's revision still answers; an incomplete copy beside, or a path its manifest does not list,
    is a 404."""
    layout, beside_rev, new = server.layout, "c" * 40, os.urandom(5000)
    beside = layout.next_dir("team-a", "m")
    beside.mkdir(parents=True)
    (beside / "model.bin").write_bytes(new)
    (beside / "not-listed.bin").write_bytes(b"on disk, not in the manifest")
    entry = {"path": "model.bin", "size": len(new), "sha256": hashlib.sha256(new).hexdigest()}
    (beside / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": beside_rev, "files": [entry]}))
    assert get(server, url("model.bin", rev=beside_rev))[0] == 404  # no complete marker yet
    (beside / names.COMPLETE_FILE).write_text(beside_rev + "\n")
    assert get(server, url("model.bin", rev=beside_rev))[::2] == (200, new)
    assert get(server, url("not-listed.bin", rev=beside_rev))[0] == 404
    assert get(server, url("model.bin"))[::2] == (200, DATA)  # the served revision still answers
    status, _, body = get(server, f"/v1/caches/team-a/m/{beside_rev}/parts")
    assert (status, json.loads(body)["complete"]) == (200, True)
    assert server.held.digests("team-a", "m") >= {entry["sha256"], hashlib.sha256(DATA).hexdigest()}


def test_a_file_changed_under_the_manifest_is_not_served(server: PeerServer) -> None:
    target = server.layout.cache_dir("team-a", "m") / "model.bin"
    target.write_bytes(DATA[:10])
    assert get(server, url("model.bin"))[0] == 404


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [("bytes=0-0", 0, 1), ("bytes=10-19", 10, 20), ("bytes=99990-", 99990, 100_000),
     ("bytes=-7", 100_000 - 7, 100_000), ("bytes=50000-999999", 50000, 100_000)],
)  # fmt: skip
def test_ranges(server: PeerServer, header: str, start: int, end: int) -> None:
    status, headers, body = get(server, url("model.bin"), {"Range": header})
    assert status == 206
    assert body == DATA[start:end]
    assert headers["content-range"] == f"bytes {start}-{end - 1}/{len(DATA)}"
    assert headers["content-length"] == str(end - start)


@pytest.mark.parametrize("header", ["bytes=100000-", "bytes=5-2", "bytes=-", "items=0-1", "bytes=0-1,4-5"])
def test_unsatisfiable_ranges_are_416(server: PeerServer, header: str) -> None:
    status, headers, _ = get(server, url("model.bin"), {"Range": header})
    assert status == 416 and headers["content-range"] == f"bytes */{len(DATA)}"


def test_upload_cap_answers_busy_with_retry_after(tmp_path: Path, peers: Peers) -> None:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    srv = PeerServer(layout, peers.authorizer(), ("127.0.0.1", 0), Limits(max_uploads=1, rate=20_000)).start()
    try:
        first = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
        first.request("GET", MODEL, headers=peers.signed(MODEL))
        resp = first.getresponse()
        assert resp.status == 200 and resp.read(100) == DATA[:100]  # in flight, paced at 20 kB/s
        status, headers, _ = get_with(srv, peers, url("empty.txt"))
        assert (status, headers["retry-after"]) == (503, "1")
        first.close()
    finally:
        srv.stop()


def test_stop_cuts_transfers_in_flight(tmp_path: Path, peers: Peers) -> None:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    srv = PeerServer(layout, peers.authorizer(), ("127.0.0.1", 0), Limits(rate=20_000)).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    conn.request("GET", MODEL, headers=peers.signed(MODEL))
    resp = conn.getresponse()
    got = resp.read(100)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    with pytest.raises(http.client.IncompleteRead):
        got += resp.read()
    stopper.join(10)
    assert len(got) < len(DATA)
