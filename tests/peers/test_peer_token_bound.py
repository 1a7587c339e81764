"""A peer token over 16 KiB is refused before any TokenReview (issue 37): a client cannot make a node
send the API server whatever it likes, as often as it likes, by padding its token.

Service-account JWTs are a kilobyte or so; the bound (agent/peers/auth.py MAX_TOKEN_CHARS) is far
above any real one. The real API server answers the reviews, through the fault proxy whose log
says which were sent.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.peers.auth import MAX_TOKEN_CHARS, Minted

from tests.peers.conftest import SERVER, Peers
from tests.peers.test_peer_server import MODEL, get, serving


def reviews(peers: Peers) -> int:
    return sum(1 for r in peers.kube.requests if r.resource == "tokenreviews")


def test_a_token_over_16_kib_is_refused_without_a_token_review(peers: Peers, tmp_path: Path) -> None:
    assert MAX_TOKEN_CHARS == 16 << 10
    with serving(tmp_path / "store", peers, SERVER) as server:
        before = reviews(peers)
        key = Ed25519PrivateKey.generate()  # requests signed properly: what is refused is the token
        at_the_bound = peers.signed(MODEL, minted=Minted("a" * MAX_TOKEN_CHARS, key))
        status, _, _ = get(server, MODEL, at_the_bound, signed=False)  # reviewed (and refused there)
        assert status == 401 and reviews(peers) == before + 1
        over = peers.signed(MODEL, minted=Minted("a" * (MAX_TOKEN_CHARS + 1), key))
        status, _, body = get(server, MODEL, over, signed=False)
        assert status == 401 and json.loads(body)["error"].startswith("Authorization:")
        assert reviews(peers) == before + 1  # none sent for it
        assert server.authorizer.identities.reviews == 1
        assert server.bytes_served == 0
