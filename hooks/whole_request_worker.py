"""A gunicorn worker that lets a request reach a thread only once all of it has arrived.

gunicorn 27.0.1 (the version pinned in pyproject.toml), `gunicorn/workers/gthread.py`:
`ThreadWorker.accept` hands every new connection to a pool thread, which waits up to
`DEFAULT_WORKER_DATA_TIMEOUT` (5 s) for a first byte, then does the TLS handshake
(`TConn.init` -> `gunicorn/sock.py` `ssl_wrap_socket` + `do_handshake`) and reads the request
head (`next(conn.parser)`) and body on a blocking socket with no deadline. A client that sends
one byte and stops holds a pool thread for as long as it likes; with 2 workers x 4 threads,
a dozen such connections stop every route (#21 item 14). Closing a connection lingers up to
2 s on the main loop (`gunicorn/util.py` `close_graceful`).

`WholeRequestWorker` keeps the thread pool but moves everything a client controls into the main loop:
the handshake and the reading of the head and the body run non-blocking on the poller, under
one deadline per request (`--request-timeout`), and a request only reaches a pool thread
complete, held in memory. Before any body byte is read:

* a body over `--max-request-bytes` gets 413, a chunked one 411 (the API server and
  Metacontroller always send Content-Length), a head over HEAD_LIMIT 431;
* at most one body over SMALL_BODY per worker is read or being answered at a time
  (parsing JSON costs about five times its size): another gets 503 with Retry-After.

Every refusal is JSON `{"error": ...}` naming the limit and the fix, and closes the connection.
Keep-alive is off (each request is one connection), so no idle or half-sent second request
can hold a thread either; a pool thread's writes time out after WRITE_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
import ssl
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gunicorn import http, util
from gunicorn import sock as gsock
from gunicorn.workers.gthread import TConn, ThreadWorker

HEAD_LIMIT = 64 << 10  # request line and headers; gunicorn's own limits are checked again after
SMALL_BODY = 256 << 10  # admission reviews are a few KiB: they never wait for the large-body slot
WRITE_TIMEOUT = 10.0  # a pool thread waits at most this long for the client to take a response chunk
DEFAULT_REQUEST_TIMEOUT = 10.0  # Metacontroller's hook timeout; the API server's is at most 30 s
DEFAULT_MAX_REQUEST_BYTES = 16 << 20  # see docs and values.yaml hooks.maxRequestBytes


def settings(max_request_bytes: int, request_timeout: float) -> dict[str, Any]:
    """The gunicorn options that make `praesto-hooks` use this worker with these limits."""
    limits = {"max_request_bytes": max_request_bytes, "request_timeout": request_timeout}
    return {
        "worker_class": type("WholeRequestWorker", (WholeRequestWorker,), limits),
        "keepalive": 0,
        "http_protocols": "h1",
    }


class _TimedSocket(socket.socket):
    """`setblocking(True)` in a pool thread means "blocking, but never longer than WRITE_TIMEOUT"."""

    def setblocking(self, flag: bool) -> None:
        self.settimeout(WRITE_TIMEOUT if flag else 0.0)


class _TimedSSLSocket(ssl.SSLSocket):
    def setblocking(self, flag: bool) -> None:
        self.settimeout(WRITE_TIMEOUT if flag else 0.0)


@dataclass(eq=False)
class _ArrivingRequest:
    """One connection whose request is still arriving."""

    sock: socket.socket
    client: Any
    server: Any
    deadline: float
    handshaken: bool
    buf: bytearray = field(default_factory=bytearray)
    need: int | None = None  # head + body length, once the head is in
    large: bool = False  # holds the worker's large-body slot


class _ReadyConn(TConn):  # type: ignore[misc]
    """A connection whose whole request is already in memory: the pool thread parses it from there."""

    def __init__(self, cfg: Any, req: _ArrivingRequest) -> None:
        super().__init__(cfg, req.sock, req.client, req.server)
        self.large = req.large
        self.initialized = True
        self.data_ready = True
        self.parser = http.get_parser(cfg, self.sock, self.client)
        self.parser.unreader.unread(req.buf)
        req.buf = bytearray()  # one copy of a large body in memory, not two

    def close(self, graceful: bool = False) -> None:
        # Never gunicorn's lingering close on the main loop: the request was read whole.
        util.close(self.sock)


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.reason, self.message, self.retry_after = status, reason, message, retry_after


def refusal_bytes(refusal: Refused) -> bytes:
    body = json.dumps({"error": refusal.message}).encode()
    lines = [
        f"HTTP/1.1 {refusal.status} {refusal.reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if refusal.retry_after is not None:
        lines.append(f"Retry-After: {refusal.retry_after}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def body_length(head: bytes, limit: int) -> int:
    """The body length the head declares, or Refused (pure: tested without sockets)."""
    lengths: set[bytes] = set()
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"transfer-encoding":
            raise Refused(
                411, "Length Required", "chunked request bodies are not accepted; send Content-Length"
            )
        if key == b"content-length":
            lengths.add(value.strip())
    if not lengths:
        return 0
    (value,) = lengths if len(lengths) == 1 else (b"x",)
    if not value.isdigit() or len(value) > 18:
        raise Refused(400, "Bad Request", "Content-Length must be one decimal number")
    length = int(value)
    if length > limit:
        raise Refused(
            413,
            "Content Too Large",
            f"request body of {length} bytes is over this server's limit of {limit} bytes "
            "(praesto-hooks --max-request-bytes, chart value hooks.maxRequestBytes)",
        )
    return length


class WholeRequestWorker(ThreadWorker):  # type: ignore[misc]
    max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    request_timeout = DEFAULT_REQUEST_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arriving: set[_ArrivingRequest] = set()
        self.large_busy = False

    def accept(self, listener: socket.socket) -> None:
        try:
            raw, client = listener.accept()
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return
            raise
        self.nr_conns += 1
        conn: socket.socket = _TimedSocket(fileno=raw.detach())
        conn.setblocking(False)
        try:
            if self.cfg.is_ssl:
                context = gsock.ssl_context(self.cfg)  # per connection: a renewed certificate is picked up
                context.sslsocket_class = _TimedSSLSocket
                conn = context.wrap_socket(
                    conn, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=True
                )
            req = _ArrivingRequest(conn, client, listener.getsockname(), time.monotonic() + self.request_timeout,
                         handshaken=not self.cfg.is_ssl)  # fmt: skip
        except (OSError, ValueError):
            self.nr_conns -= 1
            util.close(conn)
            return
        self.arriving.add(req)
        self.poller.register(conn, selectors.EVENT_READ, partial(self._advance, req))

    def _advance(self, req: _ArrivingRequest, _fileobj: Any = None) -> None:
        try:
            if not req.handshaken:
                try:
                    req.sock.do_handshake()  # type: ignore[attr-defined]
                except ssl.SSLWantReadError:
                    return self._wait(req, selectors.EVENT_READ)
                except ssl.SSLWantWriteError:
                    return self._wait(req, selectors.EVENT_WRITE)
                req.handshaken = True
                self._wait(req, selectors.EVENT_READ)
            while True:
                try:
                    chunk = req.sock.recv(1 << 20)
                except (ssl.SSLWantReadError, BlockingIOError):
                    return None
                except ssl.SSLWantWriteError:
                    return self._wait(req, selectors.EVENT_WRITE)
                if not chunk:
                    return self._drop(req)
                req.buf += chunk
                if self._complete(req):
                    return self._hand_over(req)
        except Refused as refusal:
            self._refuse(req, refusal)
        except (OSError, ValueError):  # ssl.SSLError is an OSError: a broken handshake or reset
            self._drop(req)
        return None

    def _complete(self, req: _ArrivingRequest) -> bool:
        if req.need is None:
            end = req.buf.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
            if end < 0:
                if len(req.buf) > HEAD_LIMIT:
                    raise Refused(
                        431, "Request Header Fields Too Large", f"request head over {HEAD_LIMIT} bytes"
                    )
                return False
            length = body_length(bytes(req.buf[:end]), self.max_request_bytes)
            if length > SMALL_BODY:
                if self.large_busy:
                    raise Refused(
                        503,
                        "Service Unavailable",
                        f"another request body over {SMALL_BODY} bytes is being served by this worker; retry",
                        retry_after=1,
                    )
                self.large_busy = req.large = True
            req.need = end + 4 + length
        return len(req.buf) >= req.need

    def _wait(self, req: _ArrivingRequest, events: int) -> None:
        self.poller.modify(req.sock, events, partial(self._advance, req))

    def _forget(self, req: _ArrivingRequest) -> None:
        self.arriving.discard(req)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(req.sock)

    def _drop(self, req: _ArrivingRequest) -> None:
        self._forget(req)
        if req.large:
            self.large_busy = False
        self.nr_conns -= 1
        util.close(req.sock)

    def _refuse(self, req: _ArrivingRequest, refusal: Refused) -> None:
        """Best effort, never blocking: the answer fits the socket's send buffer of a fresh connection."""
        try:
            req.sock.send(refusal_bytes(refusal))
            req.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            pass
        self._drop(req)

    def _hand_over(self, req: _ArrivingRequest) -> None:
        self._forget(req)
        self.enqueue_req(_ReadyConn(self.cfg, req))

    def finish_request(self, conn: Any, fs: Any) -> None:
        if getattr(conn, "large", False):
            self.large_busy = False
        super().finish_request(conn, fs)

    def murder_pending(self) -> None:
        """Called by the main loop at least once a second: a request past its deadline is closed."""
        super().murder_pending()
        now = time.monotonic()
        for req in [g for g in self.arriving if g.deadline <= now]:
            self._refuse(
                req, Refused(408, "Request Timeout", "the request did not arrive within the deadline")
            )
