"""Peer request authentication: per-node identity both ways, no shared secret.

Every request carries

    Authorization: Bearer <token>

where `<token>` is the asking agent Pod's own ServiceAccount token, minted by the
TokenRequest API for the audience of the **target** node and of a key pair made
with it (`protocol.audience`: `praesto-peer/<node>/<key id>`) and bound to the
asking Pod (`TokenMinter`), and a proof signed with that key (protocol.py). So
each token names both ends, and the key that must sign each use of it:

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

Replay (issue 37 item 6b): peers talk plain HTTP, so someone who can watch the
traffic between two nodes sees tokens. Until item 6b a captured request replayed
to the same target node with 200 while its token lived (600 s). Now a token is
good only with the Ed25519 key its audience names, whose private half never
leaves the asking agent's memory (a new pair with each token, `TokenMinter`):
each request is signed over its method, path, Range, target node, time and a
nonce, and the serving node answers each nonce once, within ±30 s of its clock
(replay.py). A captured request replayed is refused as seen; with a new nonce or
time its signature fails; the token with another key fails the TokenReview.

What remains, stated plainly: the traffic is not encrypted, so an eavesdropper
reads the bytes that pass (files of caches the asking node may read), and one
that can alter traffic can change a response (the asker checks every byte
against the origin's hashes, so it can spoil a peer transfer, not poison a copy).
mTLS would close that at the price of a CA in the chart.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.peers import protocol

from praesto.kubeerrors import Groups

log = logging.getLogger("praesto.peers")
SCHEME = protocol.SCHEME
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
class Minted:
    """A peer token and the private key its audience names: used together, renewed together."""

    token: str
    key: Ed25519PrivateKey = field(repr=False)


@dataclass(frozen=True)
class Pod:
    """The agent's own Pod, to which every token it mints is bound (downward API)."""

    namespace: str
    name: str
    uid: str
    service_account: str


class TokenMinter:
    """Peer tokens of this agent Pod, one per target node, each reused until `RENEW_AT` of its life."""

    def __init__(self, api: Groups, pod: Pod) -> None:
        self.core = api.core  # calls raise praesto.kubeerrors' errors
        self.pod = pod
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[float, str]] = {}  # audience -> (renew after, token)
        # peer node -> (renew after, key, the audience naming it): a new key with each token
        self._keys: dict[str, tuple[float, Ed25519PrivateKey, str]] = {}
        self.minted = 0  # TokenRequests sent (tests: the reuse works)

    def __repr__(self) -> str:
        return f"TokenMinter(pod={self.pod.namespace}/{self.pod.name})"

    def token_for(self, node: str) -> Minted:
        """A token for the agent on `node` and the key its audience names (`protocol.audience`): a
        new pair at `RENEW_AT` of a token's life, so a token is renewed only with a new key;
        raises TokenError."""
        now = time.monotonic()
        with self._lock:
            held = self._keys.get(node)
            if held is None or held[0] <= now:
                if held is not None:
                    self._tokens.pop(held[2], None)  # its audience is never asked for again
                key = Ed25519PrivateKey.generate()
                audience = protocol.audience(node, protocol.public_bytes(key))
                held = self._keys[node] = (now + RENEW_AT * TOKEN_SECONDS, key, audience)
        return Minted(self.token_for_audience(held[2]), held[1])

    def token_for_audience(self, audience: str) -> str:
        """A token of this Pod for `audience` (a peer's, or the credentials broker's); raises TokenError."""
        now = time.monotonic()
        with self._lock:
            held = self._tokens.get(audience)
        if held is not None and held[0] > now:
            return held[1]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
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
            log.warning("minting a token for audience %s failed: %s", audience, type(err).__name__)
            raise TokenError(
                f"cannot mint a token for audience {audience} now ({type(err).__name__})"
            ) from None
        with self._lock:
            self.minted += 1
            self._tokens[audience] = (now + RENEW_AT * TOKEN_SECONDS, token)
        return token


class Credentials:
    """The asking side: this node's name and its minter; `sign(target, ...)` for one request."""

    def __init__(self, node: str, minter: TokenMinter) -> None:
        self.node = node
        self.minter = minter

    def __repr__(self) -> str:
        return f"Credentials(node={self.node!r})"

    def sign(self, target: str, method: str, path: str, headers: Mapping[str, str]) -> dict[str, str]:
        """The authentication headers of request `method path` (path and query as sent; `headers`:
        the others it carries) to the agent on node `target`; raises TokenError."""
        minted = self.minter.token_for(target)
        token, key = minted.token, minted.key
        return protocol.sign(key, token, node=target, method=method, target=path, headers=headers)
