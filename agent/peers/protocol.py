"""The peer wire in one place: paths, header names, and the proof each request carries.

Peers talk plain HTTP, so whatever crosses the wire may be recorded and sent again. A bearer token
alone replayed to the node it was minted for for as long as it lived (issue 37 item 6b). So every
request carries, besides its token, a proof that only the agent that minted the token can make:

    Authorization: Bearer <token>       the asking agent Pod's token (auth.TokenMinter) for the
                                        audience `audience(target node, key)`
    X-Praesto-Peer-Key: <key>           the Ed25519 public key that audience names (32 bytes)
    X-Praesto-Peer-Time: <ms>           when it was signed (milliseconds since the Unix epoch)
    X-Praesto-Peer-Nonce: <nonce>       16 random bytes, never used twice
    X-Praesto-Peer-Signature: <sig>     Ed25519 over `message()`: method, path and query, Range,
                                        the prefix flag, the target node, the time and the nonce

(binary values base64url, unpadded). The private key is made with the token and never leaves the
asking agent's memory. An eavesdropper thus holds a token it cannot sign for: its own key changes the
audience the server reviews the token for (refused by the API server), the captured signature covers
one nonce, one time, one request and one target only, and the server refuses a nonce it has seen
while that time is still accepted (replay.py). The key id in the audience is 128 bits of SHA-256:
another key with the same id is a second preimage, 2^128 work.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from praesto import names

PREFIX = "/v1/caches/"
NOT_YET = 425  # Too Early: a download in flight here has not written that range yet
# Sent by an asker that takes the written prefix of a range still arriving here (206 with a
# shorter Content-Range; it asks again for the rest). Askers without it get 425 for such ranges.
ACCEPT_PREFIX_HEADER = "X-Praesto-Accept-Prefix"
WRITTEN_HEADER = "X-Praesto-Written"  # with 425: bytes written so far, so askers can tell a stall

AUTHORIZATION_HEADER = "Authorization"
SCHEME = "Bearer"
KEY_HEADER = "X-Praesto-Peer-Key"
TIME_HEADER = "X-Praesto-Peer-Time"
NONCE_HEADER = "X-Praesto-Peer-Nonce"
SIGNATURE_HEADER = "X-Praesto-Peer-Signature"
SIGNED_HEADERS = ("Range", ACCEPT_PREFIX_HEADER)  # the request headers that change the answer
VERSION = "praesto-peer-request-v1"  # first field of every signed message
KEY_BYTES, NONCE_BYTES, SIGNATURE_BYTES = 32, 16, 64
KEY_ID_CHARS = 32  # hex digits of SHA-256(public key) in the audience: 128 bits


class Headers(Protocol):
    """A request's headers as read (a dict, or the server's `email.message.Message`)."""

    def get(self, name: str, /) -> str | None: ...


class Refused(Exception):
    """A request the server must not answer with bytes: `status` and a message naming the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# The paths the server matches, built below (one definition of the wire's routes): namespace,
# cache and revision first, then the file's quoted path, or the xorb's CAS key and hash.
_CACHE = PREFIX + r"([^/]+)/([^/]+)/([^/]+)"
FILE_ROUTE = re.compile(rf"^{_CACHE}/files/(.+)$")
PARTS_ROUTE = re.compile(rf"^{_CACHE}/parts$")
XORBS_ROUTE = re.compile(rf"^{_CACHE}/xorbs/([^/]+)/([^/]+)$")
XORBS_QUERY = re.compile(r"^chunks=(\d{1,5})-(\d{1,5})&file=([0-9a-f]{64})$")  # what xorbs_path appends


def file_path(namespace: str, cache: str, revision: str, quoted_path: str) -> str:
    """The request path for one file; `quoted_path` is already URL-quoted."""
    return f"{PREFIX}{namespace}/{cache}/{revision}/files/{quoted_path}"


def parts_path(namespace: str, cache: str, revision: str) -> str:
    """The request path for what a peer holds of one revision."""
    return f"{PREFIX}{namespace}/{cache}/{revision}/parts"


def xorbs_path(
    namespace: str, cache: str, revision: str, cas: str, xorb: str, start: int, end: int, sha256: str
) -> str:
    """The request path for chunks [start, end) of `xorb`, as the asker's reconstruction from the
    CAS keyed `cas` (xetstore.cas_key) named them for the file `sha256` (xorbserve.py)."""
    return f"{PREFIX}{namespace}/{cache}/{revision}/xorbs/{cas}/{xorb}?chunks={start}-{end}&file={sha256}"


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def audience(node: str, public_key: bytes) -> str:
    """The token audience of requests to `node` signed by `public_key`: `praesto-peer/<node>/<key id>`
    (node names are DNS subdomains, so the "/" cannot be part of one)."""
    return f"{names.peer_audience(node)}/{hashlib.sha256(public_key).hexdigest()[:KEY_ID_CHARS]}"


def message(method: str, target: str, headers: Headers, node: str, stamp: int, nonce: bytes) -> bytes:
    """The bytes signed: one JSON array, so no field can run into the next."""
    signed = [headers.get(name) or "" for name in SIGNED_HEADERS]
    fields = [VERSION, method, target, *signed, node, stamp, _b64(nonce)]
    return json.dumps(fields, separators=(",", ":")).encode()


def sign(
    key: Ed25519PrivateKey,
    token: str,
    *,
    node: str,
    method: str,
    target: str,
    headers: Mapping[str, str],
    now: float | None = None,
) -> dict[str, str]:
    """The authentication headers of one request to `node` (`target`: path and query as sent)."""
    stamp = int((time.time() if now is None else now) * 1000)
    nonce = os.urandom(NONCE_BYTES)
    signature = key.sign(message(method, target, headers, node, stamp, nonce))
    return {
        AUTHORIZATION_HEADER: f"{SCHEME} {token}",
        KEY_HEADER: _b64(public_bytes(key)),
        TIME_HEADER: str(stamp),
        NONCE_HEADER: _b64(nonce),
        SIGNATURE_HEADER: _b64(signature),
    }


@dataclass(frozen=True)
class Proof:
    """What a request presents besides its token (read by `read_proof`, checked by `verify`)."""

    key: bytes
    stamp: int  # milliseconds since the epoch
    nonce: bytes
    signature: bytes


def read_proof(headers: Headers) -> Proof:
    """The proof headers of a request; raises `Refused` (401) naming the one missing or malformed."""
    key = _unb64(headers, KEY_HEADER, KEY_BYTES)
    nonce = _unb64(headers, NONCE_HEADER, NONCE_BYTES)
    signature = _unb64(headers, SIGNATURE_HEADER, SIGNATURE_BYTES)
    stamp = headers.get(TIME_HEADER) or ""
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 15):
        raise Refused(401, f"{TIME_HEADER}: missing or not milliseconds since the epoch; {_FIX}")
    return Proof(key, int(stamp), nonce, signature)


def verify(proof: Proof, *, node: str, method: str, target: str, headers: Headers) -> None:
    """Raise `Refused` (401) unless the proof's signature covers this very request to `node`."""
    try:
        Ed25519PublicKey.from_public_bytes(proof.key).verify(
            proof.signature, message(method, target, headers, node, proof.stamp, proof.nonce)
        )
    except (InvalidSignature, ValueError):
        raise Refused(
            401, f"{SIGNATURE_HEADER}: does not sign this request to node {node} with {KEY_HEADER}; {_FIX}"
        ) from None


_FIX = "send peer requests with the agent's own client (agent/peers/transport.py)"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(headers: Headers, name: str, size: int) -> bytes:
    text = headers.get(name) or ""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)) if text.isascii() else b""
    except (binascii.Error, ValueError):
        data = b""
    if len(data) != size or _b64(data) != text:
        raise Refused(401, f"{name}: missing or not {size} bytes of unpadded base64url; {_FIX}")
    return data
