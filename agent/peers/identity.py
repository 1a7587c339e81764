"""Who is asking, and may that node read this cache: TokenReview and ModelCacheNode grants.

`PeerAuthorizer` runs, for every peer request:

1. the proof (protocol.py): its time within the window of this node's clock
   (replay.py), its Ed25519 signature over this very request to this node;
2. the token (auth.py), by TokenReview with this node's own audience for the
   presented key (`protocol.audience(node, key)`), so a token minted for another
   node, or presented with another key than the one it was minted for, is refused:
   it must belong to the agent ServiceAccount and be bound to a Pod on a node
   (`names.TOKEN_EXTRA_NODE_NAME`), which is the asking node. Reviews are
   remembered for `review_seconds` under a hash of the token and audience, never the token;
3. the nonce, never seen before (replay.py): a captured request is not answered twice;
4. the cache: the asking node may read `<namespace>/<cache>` only while a
   ModelCacheNode of that cache names it (`spec.nodeName`), so a node reads
   only what the cache's own nodeSelector placed on it; remembered
   `grant_seconds` (refusals `denied_seconds`, so a new copy is not refused long).

Answers: 401 authentication (a replay included), 403 authorisation, 503 when the
API server cannot say, the nonce memory is full, or the request was signed before
this server started (the asker tries another peer or the origin; nothing is served
on doubt).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from praesto.agent.peers import auth, protocol
from praesto.agent.peers.directory import PeerDirectory
from praesto.agent.peers.protocol import Refused as Refused  # re-exported: the server imports it from here
from praesto.agent.peers.replay import Nonces

from praesto import names
from praesto.kubeerrors import Forbidden, Groups, NotFound

log = logging.getLogger("praesto.peers")
API_TIMEOUT = 5.0


@dataclass(frozen=True)
class Expiring:
    value: str  # the node name, or "" for a refusal
    until: float


class Identities:
    """TokenReview and ModelCacheNode lookups with short-lived memory."""

    def __init__(
        self,
        api: Groups,
        service_account: str,
        node: str,
        *,
        review_seconds: float = 60.0,
        grant_seconds: float = 10.0,
        denied_seconds: float = 2.0,
        directory: PeerDirectory | None = None,
    ) -> None:
        """`directory`: the copies of caches downloading here, watched (peering.py); a grant found
        there costs no API call. A refusal is always checked by a direct get."""
        namespace, _, name = service_account.partition("/")
        self.username = f"system:serviceaccount:{namespace}:{name}"
        self.node = node
        self.audience = names.peer_audience(node)  # only tokens minted for this node are accepted
        self.auth = api.authentication  # calls raise praesto.kubeerrors' errors
        self.custom = api.custom
        self.review_seconds = review_seconds
        self.grant_seconds = grant_seconds
        self.denied_seconds = denied_seconds
        self.directory = directory
        self._lock = threading.Lock()
        self._reviews: dict[str, Expiring] = {}  # sha256(audience, token) -> node
        self._grants: dict[tuple[str, str, str], Expiring] = {}  # (namespace, cache, node) -> node or ""
        self.reviews = 0  # TokenReviews sent (tests: the memory works)

    def node_of(self, token: str, public_key: bytes) -> str:
        """The node the agent token, minted for this node and `public_key`, is bound to; raises
        `Refused` (401, or 503 when the API is down)."""
        audience = protocol.audience(self.node, public_key)
        key = auth.token_digest(f"{audience} {token}")
        now = time.monotonic()
        with self._lock:
            seen = self._reviews.get(key)
        if seen is not None and seen.until > now:
            return seen.value
        body = {"spec": {"token": token, "audiences": [audience]}}  # a TokenReview
        try:
            review: Any = self.auth.create_token_review(body, _request_timeout=API_TIMEOUT)
        except Exception as err:
            log.warning("peer TokenReview failed: %s", type(err).__name__)
            raise Refused(503, "cannot check the peer token now (API server unreachable); retry") from None
        with self._lock:
            self.reviews += 1
        status = review.status
        user = status.user if status is not None else None
        if status is None or not status.authenticated or user is None:
            raise Refused(
                401,
                f"peer token not accepted by the API server for audience {audience} (this node's, "
                f"for the presented {protocol.KEY_HEADER}): expired, revoked, minted for another node, "
                "or presented with another key than its own",
            )
        if user.username != self.username:
            raise Refused(401, f"peer token belongs to {user.username}, not the node agent ({self.username})")
        if audience not in (status.audiences or []):
            raise Refused(401, f"peer token lacks this node's audience {audience}")
        nodes = list((user.extra or {}).get(names.TOKEN_EXTRA_NODE_NAME) or [])
        if len(nodes) != 1 or not nodes[0]:
            raise Refused(
                401, "peer token is not bound to a Pod on a node; use the agent Pod's projected token"
            )
        with self._lock:
            if len(self._reviews) > 4096:
                self._reviews = {k: v for k, v in self._reviews.items() if v.until > now}
            self._reviews[key] = Expiring(str(nodes[0]), now + self.review_seconds)
        return str(nodes[0])

    def may_read(self, node: str, namespace: str, cache: str) -> None:
        """Raise `Refused` (403) unless a ModelCacheNode of `namespace/cache` is on `node`."""
        key = (namespace, cache, node)
        now = time.monotonic()
        with self._lock:
            seen = self._grants.get(key)
        if seen is None or seen.until <= now:
            seen = Expiring(self._lookup(namespace, cache, node), 0.0)
            seen = Expiring(seen.value, now + (self.grant_seconds if seen.value else self.denied_seconds))
            with self._lock:
                if len(self._grants) > 4096:
                    self._grants = {k: v for k, v in self._grants.items() if v.until > now}
                self._grants[key] = seen
        if not seen.value:
            raise Refused(
                403,
                f"node {node} holds no copy of {namespace}/{cache} (no ModelCacheNode for it): not served",
            )

    def _lookup(self, namespace: str, cache: str, node: str) -> str:
        watched = self.directory.watched(namespace, cache) if self.directory is not None else None
        if watched is not None and watched.fresh():
            copy = watched.get((namespace, names.modelcachenode_name(cache, node)))
            if copy is not None and _names(copy, node, cache):
                return node
        try:
            obj: Any = self.custom.get_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.MODELCACHENODE_PLURAL,
                names.modelcachenode_name(cache, node),
                _request_timeout=API_TIMEOUT,
            )
        except (Forbidden, NotFound):
            return ""
        except Exception:
            raise Refused(503, "cannot check the asking node's copies now; retry") from None
        return node if _names(obj, node, cache) else ""


def _names(obj: Any, node: str, cache: str) -> bool:
    """Whether ModelCacheNode `obj` is the copy of `cache` on `node`."""
    spec = obj.get("spec") or {}
    return bool(spec.get("nodeName") == node and spec.get("modelCacheName") == cache)


class PeerAuthorizer:
    """Everything a peer request must pass before any byte of a cache is read for it."""

    def __init__(self, identities: Identities, nonces: Nonces | None = None) -> None:
        self.identities = identities
        self.nonces = nonces or Nonces()

    def authenticate(self, method: str, target: str, headers: protocol.Headers) -> str:
        """The asking node of request `method target` (path and query as received); raises
        `Refused` (401, or 503 when the API server cannot say or the nonce memory is full)."""
        token = auth.parse(headers.get(protocol.AUTHORIZATION_HEADER))
        if token is None:
            raise Refused(401, f"Authorization: missing or not '{auth.SCHEME} <token>'")
        proof = protocol.read_proof(headers)
        self.nonces.check_time(proof.stamp)
        node = self.identities.node
        protocol.verify(proof, node=node, method=method, target=target, headers=headers)
        try:
            asking = self.identities.node_of(token, proof.key)
        except Refused as refused:
            prefix = "Authorization: " if refused.status == 401 else ""
            raise Refused(refused.status, prefix + refused.message) from None
        self.nonces.remember(proof.key, proof.nonce, proof.stamp)
        return asking

    def authorise(self, node: str, namespace: str, cache: str) -> None:
        self.identities.may_read(node, namespace, cache)
