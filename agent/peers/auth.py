"""Peer request authentication: a per-node identity, and a signature bound to one exact request.

Every request carries, in one header,

    Authorization: Praesto-v2 <node> <unix seconds> <nonce> <hmac> <token>

* `<token>`: the asking agent Pod's own ServiceAccount token with audience
  `names.PEER_TOKEN_AUDIENCE`, projected by the kubelet and bound to the Pod, so
  a TokenReview names the agent ServiceAccount and the Pod's node
  (identity.py). This is the per-node identity: the serving agent answers only
  for caches that have a ModelCacheNode on the asking node. A token with this
  audience is refused by the API server itself (wrong audience), so a peer that
  receives one cannot use it against the cluster.
* `<hmac>`: HMAC-SHA256, keyed with the chart's shared peer secret, over the
  method, path, Range header, node, time, nonce and a hash of the token. The
  server refuses a signature older or newer than `SKEW` seconds and remembers
  every nonce it accepted for that long (`Nonces`), so a captured request is
  good for exactly one use, for those bytes only.

Why keep the shared secret next to the token: peers talk plain HTTP, so anyone
who can watch the pod network sees tokens. The secret never travels: without it
a sniffed token cannot be put on any new request (and the HMAC check comes
first, so no TokenReview is spent on strangers). Residual risks, stated plainly:
an agent that is itself compromised holds the secret, and can then act with any
peer token that was sent *to it*, until that token expires (the chart projects
them for `expirationSeconds`, rotated by the kubelet): it can read what those
nodes may read. Before, one leaked secret read every tenant's cache on every
node, forever. mTLS would close this too, at the price of a CA and certificate
rotation in the chart; tokens reuse what the kubelet already rotates.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEME = "Praesto-v2"
SKEW = 60  # seconds a signature stays valid either side of its timestamp
MIN_SECRET_BYTES = 16
NONCE_HEX = 32  # 128 random bits
MAX_NONCES = 1_000_000  # beyond this many live nonces, new requests are refused (memory bound)


class SecretError(ValueError):
    """The peer secret or token file is missing or unusable; the message says which and the fix."""


def load_secret(path: str | Path) -> bytes:
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as err:
        raise SecretError(
            f"--peer-secret-file {path}: {err.strerror}; mount the chart's peer Secret there "
            "or set --peer-port=0 to disable peers"
        ) from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(
            f"--peer-secret-file {path}: the secret has {len(secret)} bytes, at least {MIN_SECRET_BYTES} "
            "are needed; let the chart generate it (nodeAgent.peers)"
        )
    return secret


def token_digest(token: str) -> str:
    """What stands for a token wherever one must be remembered (caches): never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


def _mac(
    secret: bytes, method: str, path: str, span: str, node: str, stamp: str, nonce: str, token: str
) -> str:
    text = "\n".join((method, path, span, node, stamp, nonce, token_digest(token)))
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def sign(
    secret: bytes,
    token: str,
    node: str,
    method: str,
    path: str,
    span: str | None = None,
    *,
    now: float | None = None,
    nonce: str | None = None,
) -> str:
    """The Authorization value for one request: `path` raw (quoted), `span` the exact Range header."""
    stamp = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(NONCE_HEX // 2)
    mac = _mac(secret, method, path, span or "", node, stamp, nonce, token)
    return f"{SCHEME} {node} {stamp} {nonce} {mac} {token}"


@dataclass(frozen=True)
class Signed:
    """A parsed Authorization header; `token` is kept out of repr() (and so out of logs)."""

    node: str
    stamp: int
    nonce: str
    mac: str
    token: str = field(repr=False)


def parse(header: str | None) -> Signed | None:
    fields = (header or "").split(" ")
    if len(fields) != 6 or fields[0] != SCHEME:
        return None
    _, node, stamp, nonce, mac, token = fields
    if not (0 < len(node) <= 253 and stamp.isdigit() and len(stamp) <= 12 and token):
        return None
    if len(nonce) != NONCE_HEX or len(mac) != 64 or not _is_hex(nonce + mac):
        return None
    return Signed(node, int(stamp), nonce, mac, token)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def check(
    secret: bytes, signed: Signed, method: str, path: str, span: str | None, now: float | None = None
) -> str | None:
    """Why `signed` does not authenticate this request (method, path, Range), or None when it does."""
    current = time.time() if now is None else now
    if abs(current - signed.stamp) > SKEW:
        return f"signature time is more than {SKEW}s from this node's clock"
    expected = _mac(
        secret, method, path, span or "", signed.node, str(signed.stamp), signed.nonce, signed.token
    )
    if not hmac.compare_digest(signed.mac, expected):
        return "signature does not match this request (method, path, Range) under the chart's peer secret"
    return None


class Nonces:
    """Nonces of accepted signatures, each kept until its signature expires: a replay is refused."""

    def __init__(self, limit: int = MAX_NONCES) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._order: collections.deque[tuple[float, str]] = collections.deque()

    def first_use(self, signed: Signed, now: float | None = None) -> bool:
        """True the first time this nonce is seen within its window; False for a replay (or when full)."""
        current = time.time() if now is None else now
        expires = signed.stamp + SKEW + 1
        with self._lock:
            while self._order and self._order[0][0] < current:  # oldest first; late ones stay longer
                _, old = self._order.popleft()
                if self._seen.get(old, current + 1) < current:
                    del self._seen[old]
            if signed.nonce in self._seen or len(self._seen) >= self.limit:
                return False
            self._seen[signed.nonce] = expires
            self._order.append((expires, signed.nonce))
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


class Credentials:
    """The asking side: this node's name, the shared secret and its projected token file.

    The kubelet rotates the token by swapping the file; it is read again whenever
    the file changes, and never logged.
    """

    def __init__(self, node: str, secret: bytes, token_file: str | Path) -> None:
        self.node = node
        self.secret = secret
        self.token_file = Path(token_file)
        self._lock = threading.Lock()
        self._token: tuple[tuple[int, int], str] | None = None

    def __repr__(self) -> str:
        return f"Credentials(node={self.node!r}, token_file={str(self.token_file)!r})"

    def token(self) -> str:
        try:
            st = os.stat(self.token_file)
            stamp = (st.st_ino, st.st_mtime_ns)
            with self._lock:
                if self._token is not None and self._token[0] == stamp:
                    return self._token[1]
            token = self.token_file.read_text().strip()
        except OSError as err:
            raise SecretError(
                f"--peer-token-file {self.token_file}: {err.strerror}; the chart projects the agent's "
                "peer token there (nodeAgent.peers)"
            ) from None
        if not token or " " in token:
            raise SecretError(f"--peer-token-file {self.token_file}: not a ServiceAccount token")
        with self._lock:
            self._token = (stamp, token)
        return token

    def header(self, method: str, path: str, span: str | None = None) -> str:
        return sign(self.secret, self.token(), self.node, method, path, span)
