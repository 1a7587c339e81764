"""Byte transport: keep-alive `http.client` connections, one set per worker thread.

Why `http.client` and not httpx2 (which `huggingface_hub` uses for metadata): a ranged
GET here is a straight `readinto()` from the socket into a reused 1 MiB per-thread
page-aligned buffer, then `pwrite` (O_DIRECT where it can: writes.py) and hashing from
that same buffer: no per-chunk objects, no extra layers, and every blocking step
releases the GIL. The resulting downloader is
measured against `hf download` (httpx2) and aria2c in bench/download_bench.py; an
httpx2 variant of this module was not benchmarked separately. Connections are per
thread, so no locking is needed, and they are reused across parts (keep-alive).

Auth goes to the Hub's origin only: redirects to a CDN (signed URLs) never carry it,
the same rule `huggingface_hub` follows. Every connection (the origin, each redirect's host,
a token realm) is opened under the egress rule (egress.py): `_create_connection`, the hook
`http.client` dials through, dials only the addresses the rule admits.
"""

from __future__ import annotations

import email.utils
import http.client
import mmap
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from urllib.parse import urljoin, urlsplit

from praesto.agent.download.api import DownloadCancelled, LastingDownloadError, Target
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressPolicy, EgressRefused, connect
from praesto.agent.download.proxies import proxy_for
from praesto.agent.download.writes import aligned_buffer

CHUNK = 1 << 20
MAX_ATTEMPTS = 8
MAX_BACKOFF = 30.0
MAX_RETRY_AFTER = 120.0
USER_AGENT = "praesto-agent/0.7"


class Transient(Exception):
    """Worth another try: 5xx, 429, dropped connection, short read."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


MAX_REDIRECTS = 10  # hops one resolution or one part's fetch follows before the source counts as broken


class Redirect(Exception):
    """The Hub answered a byte request with a redirect (LFS file): fetch from `target`."""

    def __init__(self, target: Target):
        super().__init__(target.url)
        self.target = target


class Expired(Exception):
    """A CDN URL stopped working (signed URLs expire): resolve it again."""


def origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


class Transport:
    def __init__(
        self,
        hub_endpoint: str,
        token: str | None,
        *,
        timeout: float = 60.0,
        ca_bundle: str | None = None,
        proxies: Mapping[str, str] | None = None,
        egress: EgressPolicy | None,
        origin_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.hub_origin = origin(hub_endpoint)
        self._token = token
        # sent like the token, to the origin only (an origin's own auth or API headers); never logged
        self._origin_headers = dict(origin_headers or {})
        self.timeout = timeout
        self.ca_bundle = ca_bundle  # Options.ca_bundle: the process's PRAESTO_CA_BUNDLE
        self.proxies: Mapping[str, str] = proxies or {}  # Options.proxies (download/proxies.py)
        # Options.egress (trusting what the platform configured); None: not a tenant's origin (peers)
        self.egress = egress
        self._local = threading.local()

    # ---- connections -----------------------------------------------------------
    def _conn(self, url: str) -> http.client.HTTPConnection:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        key = origin(url)
        conn = pool.get(key)
        if conn is None:
            scheme, netloc = key
            proxy = proxy_for(scheme, netloc, self.proxies)
            host = proxy or netloc  # through a proxy: connect to it, then CONNECT-tunnel to the origin
            if scheme == "https":
                conn = http.client.HTTPSConnection(
                    host, timeout=self.timeout, context=tls_context(self.ca_bundle)
                )
            else:
                conn = http.client.HTTPConnection(host, timeout=self.timeout)
            if proxy:
                conn.set_tunnel(netloc)
            if self.egress is not None:
                guard(conn, self.egress)
            pool[key] = conn
        return conn

    def _drop(self, url: str) -> None:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.get("pool", {})
        conn = pool.pop(origin(url), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._local.__dict__.pop("pool", {}).values():
            conn.close()

    def _headers(self, url: str, authorized: bool, extra: dict[str, str]) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **extra}
        if authorized and origin(url) == self.hub_origin:
            headers.update(self._origin_headers)
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
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
        """One request on this thread's keep-alive connection; a stale socket is retried once."""
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (1, 2):
            conn = self._conn(url)
            try:
                conn.request(method, target, body=body, headers=self._headers(url, authorized, headers or {}))
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as error:
                self._drop(url)
                if attempt == 2:
                    raise Transient(f"connection to {parts.netloc} dropped: {error}") from None
            except (OSError, http.client.HTTPException) as error:
                self._drop(url)
                raise Transient(f"{parts.netloc}: {type(error).__name__}: {error}") from None
            except EgressRefused as refused:
                self._drop(url)
                raise LastingDownloadError(REASON_EGRESS_REFUSED, str(refused)) from None
        raise AssertionError("unreachable")

    # ---- high level ----------------------------------------------------------------
    def resolve(self, url: str) -> Target:
        """Follow the Hub's redirects (HEAD) to the URL that serves the bytes.

        Stops at the first redirect off the Hub (the CDN): that URL is used as it is.
        """
        for _ in range(MAX_REDIRECTS):
            resp = self.request("HEAD", url, authorized=True)
            resp.read()
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                url = urljoin(url, resp.getheader("Location", ""))
                if origin(url) != self.hub_origin:
                    return Target(url, authorized=False)
                continue
            try:
                check_status(resp, url)
            except Expired:
                raise LastingDownloadError(
                    "Unauthorized", f"{redact(url)}: HTTP {resp.status}; check the token's permissions"
                ) from None
            return Target(url, authorized=True)
        raise LastingDownloadError("SourceUnavailable", f"too many redirects resolving {redact(url)}")

    def fetch(
        self,
        target: Target,
        start: int,
        end: int,
        sink: Callable[[int, memoryview], None],
        cancel: threading.Event,
        extra_headers: dict[str, str] | None = None,
    ) -> int:
        """GET bytes [start, end) into `sink(offset, chunk)`; returns bytes delivered.

        Raises Transient on a short read after delivering what arrived, so the caller
        retries from where the stream stopped, not from the start of the part.
        """
        headers = {"Range": f"bytes={start}-{end - 1}", **(extra_headers or {})}
        resp = self.request("GET", target.url, authorized=target.authorized, headers=headers)
        try:
            if resp.status == 200 and start != 0:
                raise Transient(f"{redact(target.url)} ignored the Range header")
            location = resp.getheader("Location")
            if resp.status in (301, 302, 303, 307, 308) and location:
                resp.read()
                url = urljoin(target.url, location)
                raise Redirect(Target(url, target.authorized and origin(url) == self.hub_origin))
            if resp.status not in (200, 206):
                check_status(resp, target.url)
            buf: mmap.mmap | None = self._local.__dict__.get("buf")
            if buf is None:  # one buffer per thread, reused by every fetch on it
                buf = self._local.buf = aligned_buffer(CHUNK)  # O_DIRECT may write from it
            view = memoryview(buf)
            offset = start
            while offset < end:
                if cancel.is_set():
                    raise DownloadCancelled()
                want = min(CHUNK, end - offset)
                got = 0
                while got < want:
                    n = resp.readinto(view[got:want])
                    if not n:
                        break
                    got += n
                if got:
                    sink(offset, view[:got])
                    offset += got
                if got < want:
                    raise Transient(f"connection closed after {offset - start} of {end - start} bytes")
            return offset - start
        except (OSError, http.client.HTTPException) as error:
            raise Transient(f"reading {redact(target.url)}: {type(error).__name__}") from None
        finally:
            if not resp.isclosed():
                if (
                    resp.length == 0
                ):  # read to the end by read1 (peers' deadline reader), which leaves it open
                    resp.close()  # closed, the keep-alive connection takes the next request
                else:
                    self._drop(target.url)  # unread body: the connection cannot be reused


def guard(conn: http.client.HTTPConnection, policy: EgressPolicy) -> None:
    """Open `conn` under `policy`: directly, only to an address it admits (egress.connect);
    through a proxy (set_tunnel), the proxy is the platform's and the target is checked as written
    before the CONNECT (the proxy resolves it)."""

    def create(
        address: tuple[str, int], timeout: float | None = None, source_address: tuple[str, int] | None = None
    ) -> socket.socket:
        tunnel = conn._tunnel_host  # type: ignore[attr-defined]  # set by set_tunnel (CPython 3.11)
        if tunnel:
            policy.check_literal(tunnel, conn._tunnel_port)  # type: ignore[attr-defined]
            return socket.create_connection(address, timeout, source_address)
        return connect(address[0], address[1], timeout, source_address, policy)

    conn._create_connection = create  # type: ignore[attr-defined]  # what HTTPConnection.connect dials


def tls_context(extra: str | None = None) -> ssl.SSLContext:
    """System roots plus the chart's extra CA bundle (`extra`: PRAESTO_CA_BUNDLE, downloads.caBundle)."""
    context = ssl.create_default_context()
    if extra and os.path.isfile(extra):
        context.load_verify_locations(cafile=extra)
    return context


def redact(url: str) -> str:
    """URL without its query string (signed CDN URLs carry credentials there)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value)))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return None if when is None else min(MAX_RETRY_AFTER, max(0.0, when.timestamp() - time.time()))


def check_status(resp: http.client.HTTPResponse, url: str) -> None:
    """Map an HTTP answer to Transient (retry), Expired (re-resolve) or a terminal DownloadError."""
    status = resp.status
    if status < 300:
        return
    resp.read()
    code = resp.getheader("X-Error-Code", "")
    where = redact(url)
    if status == 429 or status >= 500:
        raise Transient(f"HTTP {status} from {where}", retry_after(resp.getheader("Retry-After")))
    if code == "GatedRepo":
        raise LastingDownloadError(
            "GatedRepo", f"{where}: gated repo; accept its conditions with the token's account"
        )
    if code == "RevisionNotFound":
        raise LastingDownloadError("RevisionNotFound", f"{where}: revision vanished from the repo")
    if code == "RepoNotFound" and status == 404:
        raise LastingDownloadError("RepoNotFound", f"{where}: repo not found or not visible to this token")
    if status == 401 or (code == "RepoNotFound"):
        raise LastingDownloadError(
            "Unauthorized", f"{where}: HTTP 401; the repo is private: give a valid token"
        )
    if status in (403, 410):
        raise Expired(where)  # a signed CDN URL that expired; resolve() turns a Hub 403 terminal
    raise LastingDownloadError("SourceUnavailable", f"{where}: HTTP {status}; the file could not be fetched")


def backoff(attempt: int, hint: float | None, cancel: threading.Event) -> None:
    """Wait before retry `attempt` (1-based): Retry-After when given, else jittered exponential."""
    delay = hint if hint is not None else min(MAX_BACKOFF, 0.25 * 2**attempt) * (0.5 + random.random() / 2)  # noqa: S311
    if cancel.wait(delay):
        raise DownloadCancelled()
