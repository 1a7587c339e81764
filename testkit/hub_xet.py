"""The local Hub's Xet side: which files a `XetDouble` holds, and the read-token endpoint.

As huggingface.co does (huggingface_hub 2.4.0, the pinned client, and tag v1.28.0 of
github.com/huggingface/huggingface_hub agree): a Xet file's tree entry carries `xetHash`
(hf_api.py `RepoFile`), its `resolve/` answer carries `X-Xet-Hash` and a `Link: <token URL>;
rel="xet-auth"` (constants.py `HUGGINGFACE_HEADER_X_XET_HASH`, `HUGGINGFACE_HEADER_LINK_XET_AUTH_KEY`;
utils/_xet.py `parse_xet_file_data_from_response`), and `GET /api/models/<repo>/xet-read-token/<rev>`
(utils/_xet.py `xet_connection_info_refresh_url`) answers the CAS URL, a token and its expiry both
as headers (`X-Xet-Cas-Url`, `X-Xet-Access-Token`, `X-Xet-Token-Expiration`: what huggingface_hub
reads) and as JSON `{"casUrl", "accessToken", "exp"}` (what hf_xet's `token_refresh_url` reads,
xet_client/src/hub_client/types.rs `CasJWTInfo`, hf-xet 1.8.0).

Knobs for Praesto's downloader tests: `cas_url` (point the token answer elsewhere: a refused
address), `stale_tokens` (the next N tokens are already expired at the CAS although their `exp`
says an hour: a revoked token), `tokens` (how many were issued).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from testkit.xet import Uploaded, XetDouble

HEADER_HASH = "X-Xet-Hash"
HEADER_CAS_URL = "X-Xet-Cas-Url"
HEADER_TOKEN = "X-Xet-Access-Token"
HEADER_EXPIRATION = "X-Xet-Token-Expiration"
LINK_AUTH = "xet-auth"


@dataclass
class HubXet:
    """The files (by sha256) whose bytes `double` holds, as hf_xet uploaded them."""

    double: XetDouble
    hashes: dict[str, str] = field(default_factory=dict)  # sha256 -> Xet file hash
    cas_url: str | None = None
    stale_tokens: int = 0
    tokens: int = 0

    def add(self, uploaded: Iterable[Uploaded]) -> None:
        for u in uploaded:
            self.hashes[u.sha256] = u.hash

    def hash_of(self, sha256: str) -> str | None:
        return self.hashes.get(sha256)

    def token_answer(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(JSON body, headers) of one read-token answer."""
        ttl = self.double.token_ttl
        self.tokens += 1
        if self.stale_tokens > 0:
            self.stale_tokens -= 1
            token, _ = self.double.token(-1.0)  # already expired at the CAS
            exp = int(time.time() + ttl)  # ... but the answer says otherwise
        else:
            token, exp = self.double.token(ttl)
        cas = self.cas_url or self.double.url
        body = {"casUrl": cas, "accessToken": token, "exp": exp}
        headers = {HEADER_CAS_URL: cas, HEADER_TOKEN: token, HEADER_EXPIRATION: str(exp)}
        return body, headers

    def file_headers(self, sha256: str, token_url: str) -> dict[str, str]:
        """What `resolve/` adds for a Xet file (nothing for any other)."""
        xet_hash = self.hash_of(sha256)
        if xet_hash is None:
            return {}
        return {HEADER_HASH: xet_hash, "Link": f'<{token_url}>; rel="{LINK_AUTH}"'}
