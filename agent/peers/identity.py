"""Who is asking, and may that node read this cache: TokenReview and ModelCacheNode grants.

`PeerAuthorizer` runs, for every peer request:

1. the token (auth.py), by TokenReview with this node's own audience
   (`names.peer_audience(node)`), so a token minted for another node is refused:
   it must belong to the agent ServiceAccount and be bound to a Pod on a node
   (`names.TOKEN_EXTRA_NODE_NAME`), which is the asking node. Reviews are
   remembered for `review_seconds` under a hash of the token, never the token.
2. the cache: the asking node may read `<namespace>/<cache>` only while a
   ModelCacheNode of that cache names it (`spec.nodeName`), so a node reads
   only what the cache's own nodeSelector placed on it; remembered
   `grant_seconds` (refusals `denied_seconds`, so a new copy is not refused long).

Answers: 401 authentication, 403 authorisation, 503 when the API server cannot
say (the asker tries another peer or the origin; nothing is served on doubt).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.agent.peers import auth

from praesto import names

log = logging.getLogger("praesto.peers")
API_TIMEOUT = 5.0


class Refused(Exception):
    """A request the server must not answer with bytes: `status` and a message naming the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Expiring:
    value: str  # the node name, or "" for a refusal
    until: float


class Identities:
    """TokenReview and ModelCacheNode lookups with short-lived memory."""

    def __init__(
        self,
        api: client.ApiClient,
        service_account: str,
        node: str,
        *,
        review_seconds: float = 60.0,
        grant_seconds: float = 10.0,
        denied_seconds: float = 2.0,
    ) -> None:
        namespace, _, name = service_account.partition("/")
        self.username = f"system:serviceaccount:{namespace}:{name}"
        self.audience = names.peer_audience(node)  # only tokens minted for this node are accepted
        self.auth = client.AuthenticationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.review_seconds = review_seconds
        self.grant_seconds = grant_seconds
        self.denied_seconds = denied_seconds
        self._lock = threading.Lock()
        self._reviews: dict[str, Expiring] = {}  # sha256(token) -> node
        self._grants: dict[tuple[str, str, str], Expiring] = {}  # (namespace, cache, node) -> node or ""
        self.reviews = 0  # TokenReviews sent (tests: the memory works)

    def node_of(self, token: str) -> str:
        """The node the agent token is bound to; raises `Refused` (401, or 503 when the API is down)."""
        key = auth.token_digest(token)
        now = time.monotonic()
        with self._lock:
            seen = self._reviews.get(key)
        if seen is not None and seen.until > now:
            return seen.value
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self.audience]))
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
                "peer token not accepted by the API server for this node's audience "
                f"{self.audience} (expired, revoked, or minted for another node)",
            )
        if user.username != self.username:
            raise Refused(401, f"peer token belongs to {user.username}, not the node agent ({self.username})")
        if self.audience not in (status.audiences or []):
            raise Refused(401, f"peer token lacks this node's audience {self.audience}")
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
        try:
            obj: Any = self.custom.get_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.MODELCACHENODE_PLURAL,
                names.modelcachenode_name(cache, node),
                _request_timeout=API_TIMEOUT,
            )
        except ApiException as err:
            if err.status in (403, 404):
                return ""
            raise Refused(503, "cannot check the asking node's copies now; retry") from None
        except Exception:
            raise Refused(503, "cannot check the asking node's copies now; retry") from None
        spec = obj.get("spec") or {}
        return node if spec.get("nodeName") == node and spec.get("modelCacheName") == cache else ""


class PeerAuthorizer:
    """Everything a peer request must pass before any byte of a cache is read for it."""

    def __init__(self, identities: Identities) -> None:
        self.identities = identities

    def authenticate(self, header: str | None) -> str:
        """The asking node; raises `Refused` (401, or 503 when the API server cannot say)."""
        token = auth.parse(header)
        if token is None:
            raise Refused(401, f"Authorization: missing or not '{auth.SCHEME} <token>'")
        try:
            return self.identities.node_of(token)
        except Refused as refused:
            prefix = "Authorization: " if refused.status == 401 else ""
            raise Refused(refused.status, prefix + refused.message) from None

    def authorise(self, node: str, namespace: str, cache: str) -> None:
        self.identities.may_read(node, namespace, cache)
