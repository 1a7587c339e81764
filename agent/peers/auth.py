"""Peer request signatures: HMAC-SHA256 over method, path and time, with a shared secret.

Why a chart-generated shared secret and not ServiceAccount TokenReview: it needs
no extra RBAC (tokenreviews create) and no API call per request or a cache of
reviews, keeps working while the API server is slow or down, and the secret is
mounted into the agent container only. A signature covers one path for a short
window (`SKEW` seconds either side), so a captured header cannot read another
file and stops working soon; the secret itself never travels.

    Authorization: Praesto <unix seconds>.<hex hmac(secret, METHOD \\n path \\n seconds)>
"""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

SCHEME = "Praesto"
SKEW = 60  # seconds a signature stays valid either side of its timestamp
MIN_SECRET_BYTES = 16


class SecretError(ValueError):
    """The peer secret file is missing or too short; the message says which and the fix."""


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


def _mac(secret: bytes, method: str, path: str, stamp: str) -> str:
    return hmac.new(secret, f"{method}\n{path}\n{stamp}".encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, now: float | None = None) -> str:
    """The Authorization header value for one request to `path` (the raw, quoted request path)."""
    stamp = str(int(time.time() if now is None else now))
    return f"{SCHEME} {stamp}.{_mac(secret, method, path, stamp)}"


def verify(secret: bytes, header: str | None, method: str, path: str, now: float | None = None) -> bool:
    """True when `header` was made by `sign` with this secret for this request, recently."""
    if not header or not header.startswith(SCHEME + " "):
        return False
    stamp, _, mac = header[len(SCHEME) + 1 :].strip().partition(".")
    if not stamp.isdigit() or len(stamp) > 12 or len(mac) != 64:
        return False
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > SKEW:
        return False
    return hmac.compare_digest(mac, _mac(secret, method, path, stamp))
