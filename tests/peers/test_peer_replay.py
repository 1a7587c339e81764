"""Issue 37 item 6b: a captured peer request replayed to the same node got 200 while its token
lived (600 s). Now each request is signed with the key its token's audience names, and the node
answers each nonce once within ±30 s of its clock (agent/peers/protocol.py, replay.py).

The real API server mints and reviews the tokens (tests/peers/conftest.py); the requests go over
real HTTP to the real peer server, and the legitimate ones come from the agent's own client.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.download.api import Target
from praesto.agent.peers import auth
from praesto.agent.peers.protocol import (
    AUTHORIZATION_HEADER,
    KEY_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIME_HEADER,
    Refused,
    parts_path,
)
from praesto.agent.peers.replay import MAX_NONCES, WINDOW_SECONDS, Nonces
from praesto.agent.peers.server import PeerServer
from praesto.agent.peers.transport import PeerTransport

from tests.peers.conftest import SERVER, Peers
from tests.peers.test_peer_server import DATA, MODEL, REV, eventually, get, serving, url


@pytest.fixture
def server(tmp_path: Path, peers: Peers) -> Iterator[PeerServer]:
    with serving(tmp_path / "store", peers, SERVER) as srv:
        yield srv


def test_the_same_request_replayed_is_refused(server: PeerServer, peers: Peers) -> None:
    captured = peers.signed(MODEL, {"Range": "bytes=0-999"})
    status, _, body = get(server, MODEL, captured, signed=False)
    assert (status, body) == (206, DATA[:1000])
    for _ in range(3):  # within the window: seen; the token is good for minutes yet
        status, _, body = get(server, MODEL, captured, signed=False)
        assert status == 401 and b"nonce seen" in body and DATA[:100] not in body
    assert server.authorizer.nonces.replayed == 3
    eventually(lambda: server.bytes_served == 1000)
    assert server.bytes_served == 1000


def test_the_captured_signature_covers_its_nonce_time_request_and_target(
    server: PeerServer, peers: Peers
) -> None:
    captured = peers.signed(MODEL, {"Range": "bytes=0-999"})
    assert get(server, MODEL, captured, signed=False)[0] == 206
    fresh_nonce = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
    changed = {
        "a fresh nonce": ({NONCE_HEADER: fresh_nonce}, MODEL),
        "a fresh time": ({TIME_HEADER: str(int(captured[TIME_HEADER]) + 1)}, MODEL),
        "another range": ({"Range": "bytes=0-"}, MODEL),
        "no range": ({"Range": ""}, MODEL),
        "the prefix flag": ({"X-Praesto-Accept-Prefix": "1"}, MODEL),
        "another file": ({}, url("sub/dir/tok%20en.json")),
        "another query": ({}, MODEL + "?x=1"),
    }
    for case, (headers, path) in changed.items():
        sent = {k: v for k, v in {**captured, **headers}.items() if v}
        status, _, body = get(server, path, sent, signed=False)
        assert status == 401 and SIGNATURE_HEADER.encode() in body, case
    eventually(lambda: server.bytes_served == 1000)
    assert server.bytes_served == 1000


def test_the_captured_token_with_another_key_is_refused(server: PeerServer, peers: Peers) -> None:
    """The thief signs properly with a key of its own: the token's audience names the agent's key."""
    assert get(server, MODEL)[0] == 200  # the token is reviewed, and the review remembered
    thief = auth.Minted(peers.agent().token, Ed25519PrivateKey.generate())
    status, _, body = get(server, MODEL, peers.signed(MODEL, minted=thief), signed=False)
    assert status == 401 and b"not accepted by the API server for audience praesto-peer/node-a/" in body
    assert server.authorizer.identities.reviews == 2  # remembered per token and audience, not per token


def test_a_bearer_token_alone_is_refused(server: PeerServer, peers: Peers) -> None:
    """The request as it was before item 6b: a good token, no proof."""
    minted = peers.agent()
    status, _, body = get(server, MODEL, {AUTHORIZATION_HEADER: f"Bearer {minted.token}"}, signed=False)
    assert status == 401 and body.startswith(b'{"error": "' + KEY_HEADER.encode() + b": missing")
    assert minted.token.encode() not in body and server.authorizer.identities.reviews == 0


@pytest.mark.parametrize("skew", [-WINDOW_SECONDS - 5, WINDOW_SECONDS + 5, -3600])
def test_a_time_beyond_the_window_is_refused(server: PeerServer, peers: Peers, skew: float) -> None:
    sent = peers.signed(MODEL, now=time.time() + skew)
    status, _, body = get(server, MODEL, sent, signed=False)
    assert status == 401 and TIME_HEADER.encode() in body and b"check NTP" in body
    assert server.authorizer.identities.reviews == 0  # refused before any TokenReview


def test_a_clock_off_within_the_window_is_served(server: PeerServer, peers: Peers) -> None:
    sent = peers.signed(MODEL, now=time.time() + WINDOW_SECONDS - 5)  # this asker's clock is fast
    assert get(server, MODEL, sent, signed=False)[0] == 200


def test_a_request_answered_before_a_restart_is_not_answered_after(tmp_path: Path, peers: Peers) -> None:
    """A restarted agent has forgotten its nonces: what was signed before it started gets 503."""
    with serving(tmp_path / "before", peers, SERVER) as before:
        captured = peers.signed(MODEL)
        assert get(before, MODEL, captured, signed=False)[0] == 200
    with serving(tmp_path / "after", peers, SERVER) as after:
        status, headers, body = get(after, MODEL, captured, signed=False)
        assert (status, headers["retry-after"]) == (503, "1") and b"before this peer server started" in body
        assert get(after, MODEL)[0] == 200  # the asker's retry is signed anew
        eventually(lambda: after.bytes_served == len(DATA))
        assert after.bytes_served == len(DATA)


def test_the_real_client_repeating_a_range_is_answered_every_time(server: PeerServer, peers: Peers) -> None:
    """The agent's own transport: one token and key for the target, a new nonce per request."""
    credentials = peers.credentials()
    transport = PeerTransport(credentials, 5.0, lambda _address: SERVER)
    target = Target(f"http://{server.address}{MODEL}", False)
    got = bytearray(1000)

    def sink(offset: int, chunk: memoryview) -> None:
        got[offset : offset + len(chunk)] = chunk

    try:
        for _ in range(5):
            deadline = time.monotonic() + 30
            assert transport.fetch_by(deadline, target, 0, 1000, sink, threading.Event()) == 1000
            assert bytes(got) == DATA[:1000]
        for _ in range(2):
            resp = transport.request(
                "GET", f"http://{server.address}{parts_path('team-a', 'm', REV)}", authorized=False
            )
            assert resp.status == 200 and json.loads(resp.read())["complete"] is True
    finally:
        transport.close()
    assert credentials.minter.minted == 1 and server.authorizer.identities.reviews == 1
    assert len(server.authorizer.nonces) == 7 and server.authorizer.nonces.replayed == 0


KEY = os.urandom(32)


def test_the_nonce_memory_is_bounded_and_refuses_rather_than_grows() -> None:
    clock = [1_000.0]
    nonces = Nonces(window=30, capacity=100, clock=lambda: clock[0])
    stamp = int(clock[0] * 1000)
    held = [os.urandom(16) for _ in range(100)]
    for nonce in held:
        nonces.remember(KEY, nonce, stamp)
    with pytest.raises(Refused) as full:
        nonces.remember(KEY, os.urandom(16), stamp)
    assert (full.value.status, len(nonces), nonces.full) == (503, 100, 1)
    with pytest.raises(Refused) as seen:  # full, and still a replay is told as one
        nonces.remember(KEY, held[0], stamp)
    assert seen.value.status == 401
    clock[0] += 31  # every held time has left the window: forgotten, and refused by time instead
    with pytest.raises(Refused) as stale:
        nonces.check_time(stamp)
    assert stale.value.status == 401
    nonces.remember(KEY, os.urandom(16), int(clock[0] * 1000))
    assert len(nonces) == 1


def test_a_nonce_is_remembered_per_key() -> None:
    """Another agent reusing a nonce it saw on the wire does not make the first one's request a replay."""
    nonces = Nonces(clock=lambda: 1_000.0)
    nonce = os.urandom(16)
    nonces.remember(KEY, nonce, 1_000_000)
    nonces.remember(os.urandom(32), nonce, 1_000_000)
    with pytest.raises(Refused):
        nonces.remember(KEY, nonce, 1_000_000)


def test_the_nonce_memory_at_its_cap_stays_small() -> None:
    """The bound replay.py states: `MAX_NONCES` nonces in at most 16 MiB (measured: about 14)."""
    nonces = Nonces(clock=lambda: 1_000.0)
    held = [os.urandom(16) for _ in range(MAX_NONCES)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, nonce in enumerate(held):
            nonces.remember(KEY, nonce, 1_000_000 + i % 30_000)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(nonces) == MAX_NONCES and used < 16 << 20, used
    with pytest.raises(Refused):
        nonces.remember(KEY, os.urandom(16), 1_000_000)
