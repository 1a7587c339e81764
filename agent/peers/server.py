"""The peer server: caches' files (complete, or written parts in flight), read-only, with Range.

    GET /v1/caches/<namespace>/<cache>/<resolvedRevision>/files/<path>

A file is found by looking its path up in the manifest of the cache's complete copy of that
revision (the served one, or during a rolling update the one published beside it: held.py),
never by joining the URL onto the filesystem, so nothing else on the node can be
named; another revision, or a path the manifest does not list answers 404.
While this node is still downloading the revision asked for, files of its plan
are served from staging, but only ranges its resume journal records as written
and fsync'd (inflight.py); others answer 425 (Too Early) with Retry-After and
the bytes written so far, never 404, so a follower waits instead of giving up.
    GET /v1/caches/<namespace>/<cache>/<resolvedRevision>/xorbs/<CAS key>/<xorb>?chunks=..&file=..

answers Xet chunks from this node's chunk store for files of that cache (xorbserve.py).
    GET /v1/caches/<namespace>/<cache>/<resolvedRevision>/parts

says what this node can serve of that revision (`{"complete": true}`, or the
part size and, per file, "all" or the journaled part indices), so askers can
pick parts from every peer that has them (swarm.py).

Every request passes `identity.PeerAuthorizer` first: the asking Pod's token minted for
this node's audience and the key that signs the request, whose TokenReview names the
asking node, the signature, and a nonce never answered before (401; protocol.py,
replay.py), and a ModelCacheNode of the cache on that node (403). A node-wide cap on concurrent uploads (503 + Retry-After beyond it)
and on bytes/s keep a node's disk and NIC for its own Pods. Connections are
capped too (`Limits.max_connections`: beyond it a connection gets 503 and is
closed at once, without a thread; beyond `max_connections_per_client` from one
address, 429), every socket has an idle timeout (`Limits.idle_seconds`), and
each request a whole deadline (conns.py): its head must arrive within
`request_seconds`, its response go out at `min_send_rate` or better, so idle or
trickling clients cannot pin threads.
Bytes go out with `sendfile` straight from the page cache.

A little over 400 lines: the handler's checks (authorization, manifest lookup, in-flight ranges,
Range, caps) are one request's path, read top to bottom; limits, replay and the wire format
already live apart (conns.py, replay.py, protocol.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from praesto.agent.peers import xorbserve
from praesto.agent.peers.conns import Connections, refusal
from praesto.agent.peers.held import HeldCopies
from praesto.agent.peers.identity import PeerAuthorizer, Refused
from praesto.agent.peers.inflight import InFlight
from praesto.agent.peers.limits import Limits as Limits  # re-exported: callers import it from here
from praesto.agent.peers.limits import RateLimiter
from praesto.agent.peers.protocol import (
    ACCEPT_PREFIX_HEADER,
    FILE_ROUTE,
    NOT_YET,
    PARTS_ROUTE,
    PREFIX,
    WRITTEN_HEADER,
    XORBS_ROUTE,
)

from praesto import names
from praesto.store import StoreLayout

log = logging.getLogger("praesto.peers")

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
SENDFILE_CHUNK = 4 << 20
PREFIX_WAIT = 1.0  # seconds a prefix asker's request waits for the first new bytes before 425


class PeerServer(ThreadingHTTPServer):
    """`PeerServer(layout, authorizer, (host, port))`, then `start()`; `stop()` also cuts open transfers."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        layout: StoreLayout,
        authorizer: PeerAuthorizer,
        address: tuple[str, int],
        limits: Limits | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.layout = layout
        self.authorizer = authorizer
        self.limits = limits or Limits()
        self.uploads = threading.BoundedSemaphore(max(1, self.limits.max_uploads))
        # Xet chunk answers have their own slots (half as many): a roll's leader asks for chunks on
        # its swarm's critical path, and must not wait behind the file parts the followers copy
        self.chunk_uploads = threading.BoundedSemaphore(max(1, self.limits.max_uploads // 2))
        self.rate = RateLimiter(self.limits.rate)
        self.bytes_served = 0
        self.busy = 0  # uploads under way (told to askers in /parts, so they pick the least busy)
        self.not_yet = 0  # 425 answers: asks for ranges of an in-flight download not written yet
        self.conns = Connections(self.limits.max_connections, self.limits.max_connections_per_client)
        self._lock = threading.Lock()
        self.held = HeldCopies(layout)  # complete copies: the served one and the one beside it
        self.inflight = InFlight()  # downloads under way here: their journaled parts are served too
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> PeerServer:
        self.conns.start()
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="praesto-peer-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every open connection (as a node going away would)."""
        self.shutdown()
        self.server_close()
        self.conns.stop()
        for conn in self.conns.take_all():
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def connections(self) -> int:
        return len(self.conns)

    @property
    def refused_connections(self) -> int:
        """Connections refused by either cap."""
        return self.conns.refused_total + self.conns.refused_client

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to the caps; beyond, an answer and close in this thread."""
        client = str(client_address[0])
        refused = self.conns.admit(request, client)
        if refused is None:
            super().process_request(request, client_address)
            return
        with contextlib.suppress(OSError):
            request.settimeout(0)
            request.send(refusal(refused, client, self.limits.max_connections_per_client))
        super().shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        self.conns.release(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that went away, or was cut at its deadline, is no error of this server."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug(f"peer {client_address[0]}: connection ended: {sys.exc_info()[1]}")
            return
        super().handle_error(request, client_address)

    def count_not_yet(self) -> None:
        with self._lock:
            self.not_yet += 1

    def count_busy(self, n: int) -> None:
        with self._lock:
            self.busy += n

    def served(self, n: int) -> None:
        with self._lock:
            self.bytes_served += n


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PeerServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("peer %s " + format, self.client_address[0], *args)

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.limits.idle_seconds)  # every read and write

    def handle_one_request(self) -> None:
        """The head of the next request must arrive whole by its deadline (conns.py)."""
        limits = self.server.limits
        self.server.conns.expect(self.connection, limits.request_seconds, "request head")
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if self.server.conns.timed_out(self.connection):  # cut mid-head: what came is not a request
            self.close_connection = True
            return False
        # the head is in: from here the response's deadline runs (small answers get idle_seconds)
        self.server.conns.expect(self.connection, self.server.limits.idle_seconds, "response")
        return parsed

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        raw = urlsplit(self.path).path
        try:
            node = self.server.authorizer.authenticate(self.command, self.path, self.headers)
            match = FILE_ROUTE.match(raw) or PARTS_ROUTE.match(raw) or XORBS_ROUTE.match(raw)
            if match is None:
                raise Refused(
                    404,
                    f"{raw}: not a peer path ({PREFIX}<ns>/<cache>/<rev>/files/<path>, .../parts or .../xorbs/...)",
                )
            namespace, cache, revision = (unquote(g) for g in match.groups()[:3])
            if not (names.is_dns_label(namespace) and names.is_dns_label(cache)):
                raise Refused(404, f"{namespace}/{cache}: not a cache name")
            self.server.authorizer.authorise(node, namespace, cache)
        except Refused as refused:
            return self._error(refused.status, refused.message, retry_after="1" * (refused.status == 503))
        if match.re is PARTS_ROUTE:
            return self._parts(namespace, cache, revision)
        if match.re is XORBS_ROUTE:  # Xet chunks from the chunk store (xorbserve.py)
            return xorbserve.serve(
                self, namespace, cache, revision, match[4], match[5], urlsplit(self.path).query
            )
        path = unquote(match.group(4))
        held = self.server.held.at(namespace, cache, revision)
        complete = held is not None
        if held is not None:
            entry = held.files.get(path)
            if entry is None:
                return self._error(404, f"{path!r} is not in the manifest of {namespace}/{cache}")
            root: str | os.PathLike[str] = held.root
        else:
            flight = self.server.inflight.flight(namespace, cache, revision)
            if flight is None:
                return self._error(
                    404, f"cache {namespace}/{cache} at {revision[:12]} is not complete on this node"
                )
            if path not in flight.sizes:
                return self._error(
                    404, f"{path!r} is not in the plan of {namespace}/{cache} at {revision[:12]}"
                )
            entry, root = {"path": path, "size": flight.sizes[path]}, flight.tree
            span = _range(self.headers.get("Range"), flight.sizes[path])
            written = self.server.inflight.written(flight)
            if span is not None and (written is None or not written.covers(path, *span)):
                upto = None  # for an asker taking a prefix: as far as written (it asks again for the rest)
                if written is not None and self.headers.get(ACCEPT_PREFIX_HEADER) == "1":
                    upto = flight.prefix_end(written, path, span, PREFIX_WAIT)
                if upto is None:
                    return self._not_yet(path, written.bytes if written is not None else 0)
                span = span[0], upto
            if not flight.claim(path, span, written, node):
                # sent `copies` times moments ago: the asker finds it at a node that got it
                return self._not_yet(path, written.bytes if written is not None else 0)
        if not self.server.uploads.acquire(blocking=False):
            return self._error(503, "upload limit reached on this node; try another peer", retry_after="1")
        self.server.count_busy(1)
        try:
            self._send_file(root, entry, in_flight=not complete, span=None if complete else span)
        finally:
            self.server.count_busy(-1)
            self.server.uploads.release()

    def _parts(self, namespace: str, cache: str, revision: str) -> None:
        """What of `revision` this node can serve now: all of it, or journaled parts per file."""
        answer: dict[str, Any]
        if self.server.held.at(namespace, cache, revision) is not None:
            answer = {"complete": True, "busy": self.server.busy}
        else:
            flight = self.server.inflight.flight(namespace, cache, revision)
            if flight is None:
                self._error(404, f"cache {namespace}/{cache} at {revision[:12]} is not on this node")
                return
            written = self.server.inflight.written(flight)
            files: dict[str, Any] = {}
            spent = flight.fanout.spent(time.monotonic())
            if written is not None:
                files = written.offer(spent)
            whole, arriving = flight.unjournaled(written, spent)
            for path, parts in whole.items():
                held = files.setdefault(path, [])
                if isinstance(held, list):
                    held.extend(parts)
            answer = {
                "complete": False,
                "partSize": written.part_size if written is not None else flight.arrivals.part_size,
                "written": written.bytes if written is not None else 0,
                "busy": self.server.busy,
                "files": files,
                # per file, [part index, offset written up to]: passed on to askers taking a prefix
                "arriving": {path: sorted(parts.items()) for path, parts in arriving.items()},
            }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_yet(self, path: str, written: int) -> None:
        """425: this node is still downloading and has not written that range yet; ask again later."""
        self.server.count_not_yet()
        self.send_response(NOT_YET)
        self.send_header(WRITTEN_HEADER, str(written))
        body = json.dumps(
            {"error": f"{path!r}: range not written yet on this node (download in progress); retry after 1s"}
        ).encode()
        self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_file(
        self,
        root: str | os.PathLike[str],
        entry: dict[str, Any],
        *,
        in_flight: bool = False,
        span: tuple[int, int] | None = None,
    ) -> None:
        """The file's bytes in the asked Range, or in `span` (a written prefix of it) when given."""
        size = int(entry["size"])
        try:
            fd = os.open(os.path.join(root, entry["path"]), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            if in_flight:  # being published right now: the complete copy answers in a moment
                return self._not_yet(str(entry["path"]), -1)
            return self._error(404, "the file is gone from this node (evicted)")
        try:
            if os.fstat(fd).st_size != size:
                return self._error(404, "the file on this node does not match its manifest")
            span = span or _range(self.headers.get("Range"), size)
            if span is None:
                return self._error(416, "Range not satisfiable", content_range=f"bytes */{size}")
            start, end = span
            partial = self.headers.get("Range") is not None or span != (0, size)  # or a prefix
            self.send_response(206 if partial else 200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            self.wfile.flush()
            self._sendfile(fd, start, end)
        finally:
            os.close(fd)

    def _sendfile(self, fd: int, start: int, end: int) -> None:
        """socket.sendfile: zero-copy, and it honours the socket's idle timeout (a raw os.sendfile
        on a socket with a timeout, which is non-blocking underneath, would fail with EAGAIN).
        The whole response must go out by `Limits.send_seconds`: a reader taking a byte now and
        then is cut there (conns.py)."""
        offset = start
        conns, sock, doing = self.server.conns, self.connection, f"response of {end - start} bytes"
        allowance = self.server.limits.send_seconds(end - start)  # spent only while the asker holds us
        try:
            with os.fdopen(fd, "rb", closefd=False) as handle:
                while offset < end:
                    want = self.server.rate.take(min(SENDFILE_CHUNK, end - offset))
                    began = time.monotonic()
                    conns.expect(sock, allowance, doing)
                    sent = self.connection.sendfile(handle, offset, want)
                    conns.expect(sock, None)  # our own pacing (rate.take) is not the asker's time
                    if allowance is not None:
                        allowance -= time.monotonic() - began
                    if sent == 0:
                        break
                    offset += sent
                    self.server.served(sent)
        except OSError:
            pass  # the client went away or stopped reading (idle timeout), or we are stopping
        if offset < end:
            self.close_connection = True

    def _error(self, status: int, message: str, *, retry_after: str = "", content_range: str = "") -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if retry_after:
            self.send_header("Retry-After", retry_after)
        if content_range:
            self.send_header("Content-Range", content_range)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) for a single-range header (or the whole file); None when unsatisfiable."""
    if header is None:
        return 0, size
    m = _RANGE.match(header.strip())
    if m is None or not (m[1] or m[2]):
        return None
    if m[1]:
        start = int(m[1])
        end = min(int(m[2]) + 1, size) if m[2] else size
    else:
        start, end = max(0, size - int(m[2])), size
    if start >= end:
        return None
    return start, end
