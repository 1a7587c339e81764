"""Peer identities for server-level tests: the real API server answers TokenRequests and TokenReviews
(through the fault proxy, whose log the tests read) and holds the copies.

The server under test runs as node `SERVER`. `Peers.signed()` is what `auth.Credentials` sends:
a token of node `ASKER`'s agent Pod minted for `SERVER`'s audience and a key of its own, and the
request signed with that key (protocol.py; `ASKER` has a ModelCacheNode of `team-a/m`, so it may
read that cache); `Peers.credentials()` mints them through the TokenRequest API, as an agent does.
`Peers.minted` holds every token made, to check none is echoed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.kube import Door
from praesto.agent.peers import auth, protocol
from praesto.agent.peers.identity import Identities, PeerAuthorizer

from praesto import names
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from testkit.peer_cluster import AGENT_SERVICE_ACCOUNT, MCN, agent_client, agent_pod, peer_token

ASKER = "node-b"
SERVER = "node-a"


@dataclass
class Peers:
    kube: RealKube
    tokens: dict[tuple[str, str], auth.Minted]  # (asking node, target) -> its token and key
    minted: list[str] = field(default_factory=list)  # every token `token()` made

    def authorizer(self, node: str = SERVER) -> PeerAuthorizer:
        return PeerAuthorizer(Identities(Door(agent_client(self.kube)), AGENT_SERVICE_ACCOUNT, node))

    def token(
        self,
        node: str = ASKER,
        *,
        user: str | None = None,
        bound: bool = True,
        target: str = SERVER,
        audience: str = "",
        key: Ed25519PrivateKey | None = None,
    ) -> str:
        """A token for `target` and `key`'s public half (or `audience`); see testkit `peer_token`."""
        public = protocol.public_bytes(key) if key is not None else b""
        token = peer_token(
            self.kube, node, user=user, bound=bound, target=target, audience=audience, key=public
        )
        self.minted.append(token)
        return token

    def agent(self, node: str = ASKER, target: str = SERVER) -> auth.Minted:
        """`node`'s agent token and key for requests to `target` (minted once)."""
        if (node, target) not in self.tokens:
            key = Ed25519PrivateKey.generate()
            self.tokens[node, target] = auth.Minted(self.token(node, target=target, key=key), key)
        return self.tokens[node, target]

    def signed(
        self,
        path: str,
        headers: dict[str, str] | None = None,
        *,
        node: str = ASKER,
        target: str = SERVER,
        minted: auth.Minted | None = None,
        now: float | None = None,
    ) -> dict[str, str]:
        """`headers` and the authentication of `GET path` from `node`'s agent to `target`
        (with `minted`'s token and key instead, when given; signed at `now`)."""
        minted = minted or self.agent(node, target)
        sent = dict(headers or {})
        proof = protocol.sign(
            minted.key, minted.token, node=target, method="GET", target=path, headers=sent, now=now
        )
        return {**sent, **proof}

    def credentials(self, node: str = ASKER) -> auth.Credentials:
        """`node`'s agent credentials, minting through the TokenRequest API."""
        pod = agent_pod(self.kube, node, node)
        return auth.Credentials(node, auth.TokenMinter(Door(agent_client(self.kube)), pod))

    def place(self, cache: str, node: str, namespace: str = "team-a") -> None:
        """The ModelCacheNode the sync hook makes for `cache` on `node` (what grants reads)."""
        self.kube.create(modelcachenode(cache, node, namespace, source={"uri": "hf://org/m"}))
        assert self.kube.get(MCN, names.modelcachenode_name(cache, node), namespace)


@pytest.fixture
def peers(kube: RealKube) -> Peers:
    made = Peers(kube, {})
    made.place("m", ASKER)
    return made
