"""The Hugging Face origin's Xet edge: a read token from the Hub, a file's reconstruction from the
CAS, its xorb ranges through the engine's byte transport; `agent/download/xet` judges every byte.

Protocol (hf-xet 1.8.0; https://huggingface.co/docs/xet/api; huggingface_hub 2.4.0 and tag
v1.28.0, utils/_xet.py): the token comes from `GET <hub>/api/models/<repo>/xet-read-token/<commit>`
(`xet_connection_info_refresh_url`) with the Hub token, answering JSON `{"casUrl", "accessToken",
"exp"}` (xet_client/src/hub_client/types.rs `CasJWTInfo`, what hf_xet's `token_refresh_url` reads);
it is refreshed 30 s before `exp` (xet_client/src/cas_client/auth.rs `REFRESH_BUFFER_SEC`) and
once on a 401. The reconstruction is `GET <casUrl>/v2/reconstructions/<file hash>` (v1 on a 404),
with `Authorization: Bearer <token>`; each fetch is a GET of its presigned URL with exactly its
`Range` (remote_client.rs `get_file_term_data`), no credential. (hf_xet asks for the
reconstruction again on a 403, an expired URL; here that is a fallback like any CAS error: URLs
live an hour and a file's ranges are fetched right after its reconstruction.)

Every host here is the tenant's input (the Hub names the CAS, the CAS names the xorb URLs): each
connection is opened under the download's egress rule, the Hub alone trusted as configured. Range
fetches go through the origin budget like `resolve/`'s. Nothing here retries a failure: any one
raises `XetFallback` naming its cause, and the engine fetches that file through `resolve/`, whose
retries are the engine's (xet-core #883, #850: Xet downloads that stall).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import Protocol, runtime_checkable

from praesto.agent.download.api import ByteSource, DownloadError, Options, OriginThrottle, RemoteFile, Target
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressRefused
from praesto.agent.download.http import Expired, Redirect, Transient, Transport, redact
from praesto.agent.download.origins.huggingface.xet import (
    FetchRange,
    Reconstruction,
    XetFormatError,
    parse_reconstruction,
)
from praesto.agent.download.origins.huggingface.xet.assemble import iter_file
from praesto.agent.download.origins.huggingface.xet.limits import MAX_RECONSTRUCTION_JSON_BYTES
from praesto.agent.download.origins.huggingface.xetmemory import RANGES
from praesto.agent.download.origins.huggingface.xetstore import ChunkStore, cas_key

log = logging.getLogger("praesto.download")

REFRESH_BEFORE = 30.0  # seconds before `exp` a token is refreshed (hf_xet auth.rs REFRESH_BUFFER_SEC)
MAX_TOKEN_ANSWER = 64 * 1024  # bytes: a token answer is three short fields
# Why a file left the Xet path (the `cause` of praesto_agent_xet_fallbacks_total):
CAUSE_TOKEN = "token"  # noqa: S105 - the Hub gave no usable read token
CAUSE_CAS = "cas"  # the CAS or a xorb URL answered an error, redirected, or dropped the connection
CAUSE_STALL = "stall"  # nothing arrived for the stall deadline
CAUSE_FORMAT = "format"  # what the CAS served breaks the Xet format or its hashes (XetFormatError)
CAUSE_EGRESS = "egress"  # the CAS or a xorb URL is an address the egress rule refuses
CAUSE_CHECKSUM = "checksum"  # assembled and Xet-verified, yet not the Hub's sha256
CAUSES = (CAUSE_TOKEN, CAUSE_CAS, CAUSE_STALL, CAUSE_FORMAT, CAUSE_EGRESS, CAUSE_CHECKSUM)


class XetFallback(Exception):
    """This file cannot come through Xet now: fetch it through `resolve/`. `cause` is one of CAUSES."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class CasToken:
    cas_url: str
    token: str
    exp: float


def _fallback(error: BaseException, where: str) -> XetFallback:
    """The cause and message of a failure at `where`."""
    if isinstance(error, XetFallback):
        return error
    if isinstance(error, XetFormatError):
        return XetFallback(CAUSE_FORMAT, f"{where}: {error}")
    if isinstance(error, EgressRefused) or (
        isinstance(error, DownloadError) and error.reason == REASON_EGRESS_REFUSED
    ):
        return XetFallback(CAUSE_EGRESS, f"{where}: {error}")
    if isinstance(error, Transient) and "Timeout" in str(error):
        return XetFallback(CAUSE_STALL, f"{where}: nothing arrived in time ({error})")
    return XetFallback(CAUSE_CAS, f"{where}: {type(error).__name__}: {error}")


def _read_capped(transport: Transport, url: str, resp: HTTPResponse, cap: int, what: str) -> bytes:
    """The whole answer, or XetFallback past `cap` bytes (its connection dropped: a body left
    unread would poison the next request on it)."""
    body = resp.read(cap + 1)
    if len(body) > cap:
        transport._drop(url)
        raise XetFallback(CAUSE_CAS, f"{what}: answer longer than {cap} bytes")
    return body


class XetOrigin:
    """One download's way to the Xet CAS behind the Hub at `endpoint`, for `repo` at `revision`.

    Thread-safe: the token is shared (one refresh at a time); connections are per thread
    (http.Transport), so `close()` runs on each fetch thread as it ends.
    """

    def __init__(
        self, endpoint: str, repo: str, revision: str, options: Options, chunks: ChunkStore | None = None
    ) -> None:
        self.chunks = chunks  # the node's chunk store (xetstore.py): chunks on the node are read there
        self.token_url = f"{endpoint}/api/models/{repo}/xet-read-token/{revision}"
        stall = options.xet_stall_seconds
        egress = options.egress.trusting(endpoint)  # the Hub as configured; the CAS it names is checked
        common = {
            "timeout": stall,
            "ca_bundle": options.ca_bundle,
            "proxies": options.proxies,
            "egress": egress,
        }
        self.api = Transport(endpoint, options.token, **common)  # type: ignore[arg-type]
        ranges = Transport(endpoint, None, **common)  # type: ignore[arg-type]
        self.ranges: ByteSource = ranges  # the origin budget wraps them (`behind`), never the token requests
        self._token: CasToken | None = None
        self._lock = threading.Lock()
        self.tokens_fetched = 0
        self.memory = RANGES  # the agent's budget for ranges in memory (a test may give its own)

    def behind(self, throttle: OriginThrottle) -> XetOrigin:
        """This origin with its CAS range requests behind the cluster's origin budget (a copy, made
        before the download starts: nothing is changed once the engine runs)."""
        gated = copy.copy(self)
        gated.ranges = throttle.wrap(self.ranges)
        return gated

    def close(self) -> None:
        self.api.close()
        self.ranges.close()
        if self.chunks is not None and (self.chunks.counters.chunks_read or self.chunks.counters.dropped):
            c = self.chunks.counters
            log.info("xet chunk store: %d chunks (%d bytes) read on the node, %d kept, %d dropped as bad",
                     c.chunks_read, c.bytes_read, c.chunks_written, c.dropped)  # fmt: skip

    def forget_chunks(self, file: RemoteFile) -> None:
        """`file` passed Xet's hashes but not the Hub's sha256: the chunk store must not index it."""
        if self.chunks is not None and self._token is not None and file.sha256:
            self.chunks.forget(cas_key(self._token.cas_url), file.sha256)

    # ---- token ---------------------------------------------------------------------------
    def token(self, stale: CasToken | None = None) -> CasToken:
        """The current token; a new one when it is `stale` (refused by the CAS) or about to expire."""
        with self._lock:
            current = self._token
            if current is None or current is stale or current.exp - time.time() < REFRESH_BEFORE:
                current = self._token = self._fetch_token()
            return current

    def _fetch_token(self) -> CasToken:
        where = f"Xet read token from {redact(self.token_url)}"
        try:
            resp = self.api.request(
                "GET", self.token_url, authorized=True, headers={"Accept": "application/json"}
            )
            body = _read_capped(self.api, self.token_url, resp, MAX_TOKEN_ANSWER, where)
            if resp.status != 200:
                raise XetFallback(CAUSE_TOKEN, f"{where}: HTTP {resp.status}")
            doc = json.loads(body)
        except (Transient, DownloadError, ValueError, OSError) as error:
            raise XetFallback(CAUSE_TOKEN, f"{where}: {error}") from None
        cas, token, exp = doc.get("casUrl"), doc.get("accessToken"), doc.get("exp")
        if not (
            isinstance(cas, str)
            and cas.startswith(("http://", "https://"))
            and isinstance(token, str)
            and 0 < len(token) <= 8192
            and isinstance(exp, int | float)
        ):
            raise XetFallback(CAUSE_TOKEN, f"{where}: not {{casUrl: http(s) URL, accessToken, exp}}")
        self.tokens_fetched += 1
        return CasToken(cas.rstrip("/"), token, float(exp))

    # ---- reconstruction ------------------------------------------------------------------
    def reconstruction(self, file: RemoteFile) -> Reconstruction:
        """The file's terms and fetches, checked against its size (format core)."""
        assert file.xet_hash is not None
        token = self.token()
        for version in (2, 1):
            for attempt in (1, 2):
                url = f"{token.cas_url}/v{version}/reconstructions/{file.xet_hash}"
                where = f"reconstruction of {file.path} from {redact(url)}"
                try:
                    headers = {"Authorization": f"Bearer {token.token}", "Accept": "application/json"}
                    resp = self.api.request("GET", url, authorized=False, headers=headers)
                    body = _read_capped(self.api, url, resp, MAX_RECONSTRUCTION_JSON_BYTES, where)
                except (Transient, DownloadError, EgressRefused) as error:
                    raise _fallback(error, where) from None
                if resp.status == 401 and attempt == 1:
                    token = self.token(stale=token)
                    continue
                if resp.status == 404 and version == 2:
                    break  # a CAS without v2: ask v1
                if resp.status != 200:
                    raise XetFallback(CAUSE_CAS, f"{where}: HTTP {resp.status}")
                try:
                    return parse_reconstruction(json.loads(body), file.size)
                except ValueError as error:  # XetFormatError is a ValueError, so is bad JSON
                    raise XetFallback(CAUSE_FORMAT, f"{where}: {error}") from None
        raise XetFallback(CAUSE_CAS, f"reconstruction of {file.path}: the CAS knows no such file")

    # ---- bytes ---------------------------------------------------------------------------
    def fetch_range(self, source: FetchRange, cancel: threading.Event, wire: Callable[[int], None]) -> bytes:
        """The bytes of one fetch, exactly its Range, into memory (at most a xorb: 64 MiB)."""
        buf = bytearray(source.length)
        got = [0]

        def sink(offset: int, chunk: memoryview) -> None:
            buf[offset - source.first_byte : offset - source.first_byte + len(chunk)] = chunk
            got[0] += len(chunk)

        where = f"xorb {source.xorb} bytes {source.first_byte}-{source.last_byte} from {redact(source.url)}"
        try:
            self.ranges.fetch(
                Target(source.url, False), source.first_byte, source.last_byte + 1, sink, cancel
            )
        except (Transient, DownloadError, EgressRefused, Redirect, Expired) as error:
            raise _fallback(error, where) from None
        if got[0] != source.length:
            raise XetFallback(CAUSE_CAS, f"{where}: {got[0]} of {source.length} bytes arrived")
        wire(source.length)
        return bytes(buf)

    def held_bytes(self, recon: Reconstruction) -> int:
        """How many of the file's bytes the node's chunk store holds (indexes only, nothing read)."""
        if self.chunks is None:
            return 0
        held = self.chunks.file(self.token().cas_url)
        return sum(t.unpacked_length for t in recon.terms if held.holds(t))

    def file_pieces(
        self,
        file: RemoteFile,
        cancel: threading.Event,
        wire: Callable[[int], None],
        *,
        recon: Reconstruction | None = None,
        peers: ChunkPeers | None = None,
        peer_wire: Callable[[int], None] | None = None,
    ) -> Iterator[bytes]:
        """`file`'s bytes in order, each piece verified as the format core verifies it; raises
        XetFallback before the last piece when anything fails (the sha256 is the engine's check).
        `wire(n)`: n bytes of xorb ranges arrived from the origin. `peers`: asked for each range
        the chunk store lacks before the CAS (`peer_wire(n)`: n bytes came from them)."""
        assert file.xet_hash is not None
        recon = recon or self.reconstruction(file)
        cas_url = self.token().cas_url
        held = self.chunks.file(cas_url) if self.chunks is not None else None

        reserved = [0]  # this file's range in memory (xetmemory.py): given back before the next

        def fetch(source: FetchRange) -> bytes:
            self.memory.give(reserved[0])
            reserved[0] = 0
            reserved[0] = self.memory.take(source.length, cancel)
            if peers is not None and file.sha256:
                raw = peers.xorb_range(cas_key(cas_url), file.sha256, source, cancel)
                if raw is not None:
                    if peer_wire is not None:
                        peer_wire(len(raw))
                    return raw
            return self.fetch_range(source, cancel, wire)

        try:
            yield from iter_file(recon, fetch, file.xet_hash, held=held)
        except XetFormatError as error:
            raise XetFallback(CAUSE_FORMAT, f"{file.path}: {error}") from None
        finally:
            self.memory.give(reserved[0])
        if held is not None and file.sha256:  # every chunk verified by the file's Xet hash
            held.verified(file.sha256)


@runtime_checkable
class ChunkPeers(Protocol):
    """Other nodes' chunk stores (agent/peers/xorbsource.py), asked for a xorb range the node lacks.

    Nothing they send is trusted: `xorb_range` answers bytes that decode as the range's chunks
    (else the sender is dropped), the file's Xet hash and sha256 judge them; `blame_chunks` drops
    whoever sent ranges of a file that failed its Xet hash."""

    # whether these peers also offer whole files of this revision (then a file the chunk store holds
    # nothing of is copied whole from them: xetpath.py); False: chunks only (a roll's leader)
    offers_files: bool

    def xorb_range(self, cas: str, sha256: str, source: FetchRange, cancel: threading.Event) -> bytes | None:
        """Chunks [source.start, source.end) of `source.xorb` as a CAS range of them, or None."""
        ...

    def blame_chunks(self, sha256: str) -> bool:
        """Drop the peers that sent ranges of the file `sha256`; whether any did."""
        ...
