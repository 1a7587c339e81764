"""Talking to one OCI registry: where (mirrors, TLS or loopback plain HTTP) and as whom.

`RegistryTransport` is the downloader's own keep-alive `http.client` transport (http.py:
readinto a reused buffer, pwrite, hash) with the registry's `Authorization` instead of a
Hub token, sent to the registry's origin only (a blob redirected to a storage URL never
carries it), and one answer per 401 (a token that expired mid-download is renewed, once).

Endpoints: the registry's mirrors (`PRAESTO_OCI_MIRRORS`, the chart's
`downloads.oci.mirrors`) in order, then the registry itself, as containerd's hosts.toml
does; the first that serves the manifest serves every blob of it. Content never depends on
which: every manifest and blob is checked against its sha256 digest.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from praesto.agent.download.api import LastingDownloadError, Options
from praesto.agent.download.http import Transport, origin
from praesto.agent.download.origins.oci.auth import (
    MAX_TOKEN_ANSWER_BYTES,
    Credential,
    RegistryAuth,
    credential_for,
)

from praesto import names
from praesto.ocireference import Reference


@dataclass(frozen=True)
class Endpoint:
    base: str  # scheme://host[:port], no trailing slash
    mirror: bool

    def url(self, repository: str, kind: str, reference: str) -> str:
        """`/v2/<name>/manifests/<reference>` or `/v2/<name>/blobs/<digest>` (distribution spec)."""
        return f"{self.base}/v2/{repository}/{kind}/{reference}"


def mirrors_of(text: str, host: str) -> list[str]:
    """The mirrors configured for `host` in `text`, PRAESTO_OCI_MIRRORS as the process edge read it
    (`Options.oci_mirrors`); a malformed setting is refused, never ignored."""
    if not text:
        return []
    try:
        table = json.loads(text)
        found = table.get(host, []) if isinstance(table, dict) else None
    except ValueError:
        found = None
    if not isinstance(found, list) or not all(isinstance(m, str) and "://" in m for m in found):
        raise LastingDownloadError(
            "SourceUnavailable",
            f"{names.ENV_OCI_MIRRORS} (downloads.oci.mirrors) must map registry hosts to lists of "
            'https:// URLs, e.g. {"docker.io": ["https://mirror.example.com"]}',
        )
    return [m.rstrip("/") for m in found]


def endpoints(ref: Reference, options: Options) -> list[Endpoint]:
    """Mirrors first, then the registry; plain HTTP only on loopback and only when asked for."""
    if options.plain_http and not ref.loopback:
        raise LastingDownloadError(
            "SourceUnavailable",
            f"{ref}: plain HTTP is allowed only for a registry on this machine (localhost, 127.0.0.1, ::1); "
            "serve the registry over HTTPS and trust its CA with the CA bundle (downloads.caBundle)",
        )
    scheme = "http" if options.plain_http else "https"
    found = [Endpoint(m, True) for m in mirrors_of(options.oci_mirrors, ref.host)]
    return [*found, Endpoint(f"{scheme}://{ref.api_host}", False)]


class RegistryTransport(Transport):
    """`Transport` whose `Authorization` is the registry's (RegistryAuth), renewed on a 401."""

    def __init__(
        self, base: str, ref: Reference, credential: Credential | None, options: Options, *, mirror: bool
    ) -> None:
        # A mirror is the platform's (downloads.oci.mirrors): trusted as configured. The registry,
        # its token realm and every redirect are the tenant's: under the egress rule (egress.py).
        egress = options.egress.trusting(base) if mirror else options.egress
        super().__init__(base, None, ca_bundle=options.ca_bundle, proxies=options.proxies, egress=egress)
        self.auth = RegistryAuth(self, ref.repository, credential)

    def _headers(self, url: str, authorized: bool, extra: dict[str, str]) -> dict[str, str]:
        headers = super()._headers(url, authorized, extra)
        header = self.auth.header
        if authorized and header and origin(url) == self.hub_origin:
            headers["Authorization"] = header
        return headers

    def request(
        self,
        method: str,
        url: str,
        *,
        authorized: bool,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> http.client.HTTPResponse:
        sent = self.auth.header
        resp = super().request(method, url, authorized=authorized, headers=headers, body=body)
        if resp.status != 401 or not authorized or origin(url) != self.hub_origin:
            return resp
        challenge = resp.getheader("WWW-Authenticate", "")
        # The body says nothing we use: drained for the keep-alive connection up to the token answer's
        # bound, and past it the connection is dropped (the registry is the tenant's: issue 37)
        if len(resp.read(MAX_TOKEN_ANSWER_BYTES + 1)) > MAX_TOKEN_ANSWER_BYTES:
            self._drop(url)
        # Asked again with what the challenge wanted; with nothing new to offer, the second 401 is
        # the caller's to explain (ociplan: which credential, and the fix).
        self.auth.answer(challenge, sent)
        return super().request(method, url, authorized=authorized, headers=headers, body=body)


def transport_for(endpoint: Endpoint, ref: Reference, options: Options) -> RegistryTransport:
    host = urlsplit(endpoint.base).netloc
    where = options.credentials_from
    # Each host gets its own login only: a mirror is never handed the registry's.
    credential = credential_for(host if endpoint.mirror else ref.host, options.credentials, where)
    mirror = endpoint.mirror and endpoint.base in mirrors_of(options.oci_mirrors, ref.host)  # as configured
    return RegistryTransport(endpoint.base, ref, credential, options, mirror=mirror)
