"""Peer request authentication: per-node identity both ways, no shared secret.

Every request carries, in one header,

    Authorization: Bearer <token>

where `<token>` is the asking agent Pod's own ServiceAccount token, minted by the
TokenRequest API for the audience of the **target** node (`names.peer_audience`)
and bound to the asking Pod (`TokenMinter`). So each token names both ends:

* the asker: the API server's TokenReview of a Pod-bound token names the Pod's
  node (`names.TOKEN_EXTRA_NODE_NAME`); the serving agent then answers only for
  caches that have a ModelCacheNode on that node (identity.py);
* the target: only the node the audience names accepts it (its TokenReview asks
  for its own audience), so a request captured on the way to one node, or a
  token an agent received from another, is refused by every other node, and the
  API server refuses it too (wrong audience).

Minting is confined by the chart: a Role allows the agent ServiceAccount to
request tokens for itself only (resourceNames), and a ValidatingAdmissionPolicy
lets it bind them only to its own Pod (the pod-name and pod-uid of the token it
calls the API with) and only for peer audiences. No agent can thus speak as
another node.

What remains, stated plainly: peers talk plain HTTP, so someone who can watch
the traffic between two nodes sees a token and may replay it *to the same target
node* until it expires (`TOKEN_SECONDS`, at most an hour by the policy; deleting
the asking Pod revokes it at once), reading what the asking node may read. Before,
with one shared HMAC secret, an agent holding it could act with any token sent to
it, against every node. mTLS would close the rest at the price of a CA in the chart.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from praesto import names

log = logging.getLogger("praesto.peers")
SCHEME = "Bearer"
TOKEN_SECONDS = 600  # the TokenRequest API's minimum lifetime; renewed at RENEW_AT of it
RENEW_AT = 0.8
MAX_TOKEN_CHARS = 16384
API_TIMEOUT = 5.0


class TokenError(Exception):
    """No peer token could be minted now (API server unreachable, or the chart's grant missing)."""


def token_digest(token: str) -> str:
    """What stands for a token wherever one must be remembered (caches): never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (header or "").partition(" ")
    if scheme != SCHEME or not token or len(token) > MAX_TOKEN_CHARS or " " in token:
        return None
    return token


@dataclass(frozen=True)
class Pod:
    """The agent's own Pod, to which every token it mints is bound (downward API)."""

    namespace: str
    name: str
    uid: str
    service_account: str


class TokenMinter:
    """Peer tokens of this agent Pod, one per target node, each reused until `RENEW_AT` of its life."""

    def __init__(self, api: client.ApiClient, pod: Pod) -> None:
        self.core = client.CoreV1Api(api)
        self.pod = pod
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[float, str]] = {}  # target node -> (renew after, token)
        self.minted = 0  # TokenRequests sent (tests: the reuse works)

    def __repr__(self) -> str:
        return f"TokenMinter(pod={self.pod.namespace}/{self.pod.name})"

    def token_for(self, node: str) -> str:
        now = time.monotonic()
        with self._lock:
            held = self._tokens.get(node)
        if held is not None and held[0] > now:
            return held[1]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [names.peer_audience(node)],
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod.name,
                    "uid": self.pod.uid,
                },
            },
        }
        try:
            made: Any = self.core.create_namespaced_service_account_token(
                self.pod.service_account, self.pod.namespace, body, _request_timeout=API_TIMEOUT
            )
            token = str(made.status.token)
        except Exception as err:
            log.warning("minting a peer token for node %s failed: %s", node, type(err).__name__)
            raise TokenError(f"cannot mint a peer token for node {node} now ({type(err).__name__})") from None
        with self._lock:
            self.minted += 1
            self._tokens[node] = (now + RENEW_AT * TOKEN_SECONDS, token)
        return token


class Credentials:
    """The asking side: this node's name and its minter; `header(target)` for one request."""

    def __init__(self, node: str, minter: TokenMinter) -> None:
        self.node = node
        self.minter = minter

    def __repr__(self) -> str:
        return f"Credentials(node={self.node!r})"

    def header(self, target: str) -> str:
        """The Authorization value for a request to the agent on node `target`; raises TokenError."""
        return f"{SCHEME} {self.minter.token_for(target)}"
