"""Peer identities for server-level tests: the API emulator answers TokenReviews and holds the copies.

`Peers.header(path)` signs a request the way `auth.Credentials` does, as node
`ASKER` (which has a ModelCacheNode of `team-a/m`, so it may read that cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from praesto.agent.peers import auth
from praesto.agent.peers.identity import Gate, Identities

from praesto import names
from tests.support.kube import KubeEmulator
from tests.support.objects import modelcachenode
from tests.support.peer_cluster import AGENT_SERVICE_ACCOUNT, MCN, peer_token

SECRET = b"s3cret-shared-by-every-agent-0123"
ASKER = "node-b"


@dataclass
class Peers:
    kube: KubeEmulator
    tokens: dict[str, str]  # node -> its peer token

    def gate(self) -> Gate:
        return Gate(SECRET, Identities(self.kube.api_client(), AGENT_SERVICE_ACCOUNT))

    def token(self, node: str = ASKER, *, user: str | None = None, bound: bool = True) -> str:
        return peer_token(self.kube, node, user=user, bound=bound)

    def header(self, path: str, span: str | None = None, *, node: str = ASKER, secret: bytes = SECRET) -> str:
        if node not in self.tokens:
            self.tokens[node] = self.token(node)
        return auth.sign(secret, self.tokens[node], node, "GET", path, span)

    def place(self, cache: str, node: str, namespace: str = "team-a") -> None:
        """The ModelCacheNode the sync hook makes for `cache` on `node` (what grants reads)."""
        self.kube.create(modelcachenode(cache, node, namespace, source={"uri": "hf://org/m"}))
        assert self.kube.get(MCN, names.modelcachenode_name(cache, node), namespace)


@pytest.fixture
def peers() -> Iterator[Peers]:
    with KubeEmulator() as kube:
        made = Peers(kube, {})
        made.place("m", ASKER)
        yield made
