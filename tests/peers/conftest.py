"""Peer identities for server-level tests: the real API server answers TokenRequests and TokenReviews
(through the fault proxy, whose log the tests read) and holds the copies.

The server under test runs as node `SERVER`. `Peers.header()` is what `auth.Credentials` sends:
a token of node `ASKER`'s agent Pod minted for `SERVER`'s audience (`ASKER` has a ModelCacheNode
of `team-a/m`, so it may read that cache); `Peers.credentials()` mints them through the
TokenRequest API, as an agent does. `Peers.minted` holds every token made, to check none is echoed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from praesto.agent.peers import auth
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
    tokens: dict[str, str]  # node -> its peer token for SERVER
    minted: list[str] = field(default_factory=list)  # every token `token()` made

    def authorizer(self, node: str = SERVER) -> PeerAuthorizer:
        return PeerAuthorizer(Identities(agent_client(self.kube), AGENT_SERVICE_ACCOUNT, node))

    def token(
        self,
        node: str = ASKER,
        *,
        user: str | None = None,
        bound: bool = True,
        target: str = SERVER,
        audience: str = "",
    ) -> str:
        token = peer_token(self.kube, node, user=user, bound=bound, target=target, audience=audience)
        self.minted.append(token)
        return token

    def header(self, node: str = ASKER) -> str:
        if node not in self.tokens:
            self.tokens[node] = self.token(node)
        return f"{auth.SCHEME} {self.tokens[node]}"

    def credentials(self, node: str = ASKER) -> auth.Credentials:
        """`node`'s agent credentials, minting through the TokenRequest API."""
        pod = agent_pod(self.kube, node, node)
        return auth.Credentials(node, auth.TokenMinter(agent_client(self.kube), pod))

    def place(self, cache: str, node: str, namespace: str = "team-a") -> None:
        """The ModelCacheNode the sync hook makes for `cache` on `node` (what grants reads)."""
        self.kube.create(modelcachenode(cache, node, namespace, source={"uri": "hf://org/m"}))
        assert self.kube.get(MCN, names.modelcachenode_name(cache, node), namespace)


@pytest.fixture
def peers(kube: RealKube) -> Peers:
    made = Peers(kube, {})
    made.place("m", ASKER)
    return made
