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
* one body over SMALL_BODY per worker is read or being answered at a time (parsing JSON costs
  about five times its size); the others wait their turn, which goes round the client
  addresses, and a body on its turn that arrives slower than `--min-body-rate` (after
  BODY_GRACE) loses it with 408 (#37 item 5: four heads declaring 16 MiB held both workers'
  turns for the whole deadline, and a cache's sync over a few dozen Nodes passes 256 KiB).

A flood of connections never stops the worker from accepting (gunicorn stops at
`worker_connections`, and `/healthz` then waits in the kernel's backlog): a client address may
hold `--max-connections-per-client` incomplete connections, the worker WORKER_CONNECTIONS and
ARRIVING_BYTES of incomplete requests; at a bound the connection silent the longest is closed
(hooks/arrivals.py). Every refusal is JSON `{"error": ...}` naming the limit and the fix, and
closes the connection. Keep-alive is off (each request is one connection), so no idle or
half-sent second request can hold a thread either; a pool thread's writes time out after
WRITE_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import ssl
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gunicorn import http, util
from gunicorn.workers.gthread import TConn, ThreadWorker
from praesto.hooks.arrivals import BODY_GRACE, ArrivalLimits, Arrivals, LargeBodyTurns, body_due
from praesto.hooks.refusals import Refused, body_length, refusal_bytes
from praesto.hooks.tls_contexts import TlsContexts

HEAD_LIMIT = 64 << 10  # request line and headers; gunicorn's own limits are checked again after
SMALL_BODY = 256 << 10  # admission reviews are a few KiB: they never wait for the large-body turn
WRITE_TIMEOUT = 10.0  # a pool thread waits at most this long for the client to take a response chunk
DEFAULT_REQUEST_TIMEOUT = 10.0  # Metacontroller's hook timeout; the API server's is at most 30 s
DEFAULT_MAX_REQUEST_BYTES = 16 << 20  # see docs and values.yaml hooks.maxRequestBytes
# Per worker. Metacontroller calls with at most its sync workers at once (5 per controller by
# default, the chart has 2 controllers), the API server with at most its mutating requests in
# flight (--max-mutating-requests-inflight, 200) spread over every replica's workers; each of
# their requests arrives whole in milliseconds, so a silent one is never theirs for long.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 100
# Per worker (gunicorn's default is 1000): a flood of 2,200 half-open connections from 22
# addresses fits without closing anyone; a client address may fill at most a quarter of it.
WORKER_CONNECTIONS = 4000
DEFAULT_MIN_BODY_RATE = 4 << 20  # bytes/s: a 16 MiB body in 4.5 s; in-cluster links send 100x that
ARRIVING_BYTES = 16 << 20  # incomplete requests per worker, within the chart's 128Mi base of memory
READ_CHUNK = 1 << 20
ACCEPT_BATCH = 64  # connections accepted per wake-up: a flood in the backlog drains fast
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def settings(
    max_request_bytes: int,
    request_timeout: float,
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    min_body_rate: int = DEFAULT_MIN_BODY_RATE,
    worker_connections: int = WORKER_CONNECTIONS,
) -> dict[str, Any]:
    """The gunicorn options that make `praesto-hooks` use this worker with these limits
    (`worker_connections`: what the open-files limit leaves of WORKER_CONNECTIONS)."""
    limits = {
        "max_request_bytes": max_request_bytes,
        "request_timeout": request_timeout,
        "max_connections_per_client": max_connections_per_client,
        "min_body_rate": min_body_rate,
    }
    return {
        "worker_class": type("WholeRequestWorker", (WholeRequestWorker,), limits),
        "worker_connections": worker_connections,
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
    host: str  # the client address: limits and turns are per address
    buf: bytearray = field(default_factory=bytearray)
    need: int | None = None  # head + body length, once the head is in
    body_start: int = 0
    large: bool = False  # its body is over SMALL_BODY: it needs the worker's turn
    waiting: bool = False  # large, head read, its turn not yet come (not read meanwhile)
    turn_started: float | None = None  # large and holding the turn since
    released: bool = False  # closed, or handed to a thread: the event loop no longer touches it


class _ReadyConn(TConn):  # type: ignore[misc]
    """A connection whose whole request is already in memory: the pool thread parses it from there."""

    def __init__(self, cfg: Any, req: _ArrivingRequest) -> None:
        super().__init__(cfg, req.sock, req.client, req.server)
        self.turn_holder = req if req.large else None
        self.initialized = True
        self.data_ready = True
        self.parser = http.get_parser(cfg, self.sock, self.client)
        self.parser.unreader.unread(req.buf)
        req.buf = bytearray()  # one copy of a large body in memory, not two

    def close(self, graceful: bool = False) -> None:
        # Never gunicorn's lingering close on the main loop: the request was read whole.
        util.close(self.sock)


def _host(client: Any) -> str:
    return str(client[0]) if isinstance(client, tuple) and client else "local"


class WholeRequestWorker(ThreadWorker):  # type: ignore[misc]
    max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    request_timeout = DEFAULT_REQUEST_TIMEOUT
    max_connections_per_client = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    min_body_rate = DEFAULT_MIN_BODY_RATE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = ArrivalLimits(self.max_connections_per_client, self.worker_connections, ARRIVING_BYTES)
        self.arriving: Arrivals[_ArrivingRequest] = Arrivals(limits)
        self.turns: LargeBodyTurns[_ArrivingRequest] = LargeBodyTurns()
        self.by_deadline: deque[_ArrivingRequest] = (
            deque()
        )  # accept order: every deadline is accept + timeout
        self.tls = TlsContexts(_TimedSSLSocket)

    # --- accepting, within the connection limits ---------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self._accept_one(listener):
                return

    def _accept_one(self, listener: socket.socket) -> bool:
        if not self._shed(None, self.nr_conns + 1) and self.nr_conns + 1 >= self.worker_connections:
            return False  # every connection is a request being answered: gunicorn stops accepting
        try:
            raw, client = listener.accept()
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE):
                self._shed(None, self.worker_connections)  # out of descriptors: room for the next one
                return False
            if err.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return err.errno == errno.ECONNABORTED
            raise
        self.nr_conns += 1
        conn: socket.socket = _TimedSocket(fileno=raw.detach())
        conn.setblocking(False)  # TLS is wrapped at its first bytes (_advance): a flood costs no TLS
        req = _ArrivingRequest(conn, client, listener.getsockname(), time.monotonic() + self.request_timeout,
                               handshaken=not self.cfg.is_ssl, host=_host(client))  # fmt: skip
        self.arriving.add(req, req.host)
        self.by_deadline.append(req)
        self.poller.register(conn, selectors.EVENT_READ, partial(self._advance, req))
        self._shed(req.host, 0)
        return True

    def _shed(self, host: str | None, open_connections: int) -> bool:
        """Close the connection silent the longest if `host` or the worker is over a limit."""
        found = self.arriving.victim(host, open_connections)
        if found is None:
            return False
        req, limit = found
        self._refuse(req, Refused(408, "Request Timeout", self._shed_message(req.host, limit)))
        return True

    def _shed_message(self, host: str, limit: str) -> str:
        held = {
            "client": f"{self.max_connections_per_client} connections from {host} are still sending their "
            "requests (praesto-hooks --max-connections-per-client, chart value hooks.maxConnectionsPerClient)",
            "connections": f"this worker holds {self.worker_connections} connections",
            "bytes": f"incomplete requests hold over {ARRIVING_BYTES} bytes of this worker",
        }[limit]
        return f"closed to make room: {held}, and this one was silent the longest; send the whole request at once"

    # --- reading a request on the event loop --------------------------------------------------

    def _advance(self, req: _ArrivingRequest, _fileobj: Any = None) -> None:
        if req.released:  # a deferred call after a poller event handed it over: a thread owns it now
            return None
        try:
            if not req.handshaken:
                if not isinstance(req.sock, ssl.SSLSocket):  # per connection: a renewed certificate is used
                    self._unregister(req)
                    req.sock = self.tls.get(self.cfg).wrap_socket(
                        req.sock, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=True
                    )
                    self.poller.register(req.sock, selectors.EVENT_READ, partial(self._advance, req))
                try:
                    req.sock.do_handshake()
                except ssl.SSLWantReadError:
                    return self._wait(req, selectors.EVENT_READ)
                except ssl.SSLWantWriteError:
                    return self._wait(req, selectors.EVENT_WRITE)
                req.handshaken = True
                self.arriving.touch(req, 0)
                self._wait(req, selectors.EVENT_READ)
            while not (req.waiting or req.released):
                # Before its length is known, no more than a head: a waiting body stays in the socket.
                want = READ_CHUNK if req.need is not None else HEAD_LIMIT + 5 - len(req.buf)
                try:
                    chunk = req.sock.recv(want)
                except (ssl.SSLWantReadError, BlockingIOError):
                    return None
                except ssl.SSLWantWriteError:
                    return self._wait(req, selectors.EVENT_WRITE)
                if not chunk:
                    return self._drop(req)
                req.buf += chunk
                if self._complete(req):
                    return self._hand_over(req)
                holding = req.turn_started is not None
                self.arriving.touch(req, 0 if holding else len(req.buf))
                self._shed(None, 0)  # over the worker's bytes: the silent longest, not this one
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
            req.body_start, req.need = end + 4, end + 4 + length
            if length > SMALL_BODY:
                req.large = True
                if not self.turns.ask(req, req.host):
                    req.waiting = True  # read again when its turn comes (_next_turn)
                    self._unregister(req)
                    return False
                req.turn_started = time.monotonic()
        return len(req.buf) >= req.need

    def _wait(self, req: _ArrivingRequest, events: int) -> None:
        self.poller.modify(req.sock, events, partial(self._advance, req))

    def _unregister(self, req: _ArrivingRequest) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(req.sock)

    def _drop(self, req: _ArrivingRequest, told: bool = False) -> None:
        """Close it; with a reset when nothing was said (an eighth of a graceful close's cost on a
        flood: no FIN exchange, no TIME_WAIT)."""
        if req.released:
            return
        req.released = True
        self.arriving.remove(req)
        self._unregister(req)
        if req.waiting:
            self.turns.withdraw(req, req.host)
        elif self.turns.holder is req:
            self._next_turn()
        self.nr_conns -= 1
        req.buf = bytearray()
        if not told:
            with contextlib.suppress(OSError, ValueError):
                req.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        util.close(req.sock)

    def _refuse(self, req: _ArrivingRequest, refusal: Refused) -> None:
        """Best effort, never blocking: the answer fits the socket's send buffer of a fresh connection."""
        told = False
        if req.handshaken and not req.released:
            try:
                req.sock.send(refusal_bytes(refusal))
                req.sock.shutdown(socket.SHUT_WR)
                told = True
            except (OSError, ValueError):
                pass
        self._drop(req, told)

    def _hand_over(self, req: _ArrivingRequest) -> None:
        req.turn_started = None  # a holder keeps the turn until answered (finish_request), with no pace
        req.released = True
        self.arriving.remove(req)
        self._unregister(req)
        self.enqueue_req(_ReadyConn(self.cfg, req))

    # --- the large-body turn ----------------------------------------------------------------

    def _next_turn(self) -> None:
        req = self.turns.release()
        if req is None:
            return
        req.waiting, req.turn_started = False, time.monotonic()
        self.arriving.touch(req, 0)
        self.poller.register(req.sock, selectors.EVENT_READ, partial(self._advance, req))
        self.method_queue.defer(self._advance, req)  # what TLS already decrypted raises no event

    def finish_request(self, conn: Any, fs: Any) -> None:
        if getattr(conn, "turn_holder", None) is not None and self.turns.holder is conn.turn_holder:
            self._next_turn()
        super().finish_request(conn, fs)

    def _late_holder(self) -> tuple[_ArrivingRequest, float] | None:
        """The holder of the turn while its body arrives, and when it is late."""
        req = self.turns.holder
        if req is None or req.turn_started is None or req.released:
            return None  # none, or handed over to a thread
        return req, body_due(req.turn_started, len(req.buf) - req.body_start, self.min_body_rate)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        late = self._late_holder()
        if late is not None:
            timeout = max(0.0, min(timeout, late[1] - time.monotonic()))
        super().wait_for_and_dispatch_events(timeout)
        late = self._late_holder()
        if late is None or time.monotonic() < late[1]:
            return
        self._advance(late[0])  # what has arrived counts, however busy this loop was
        late = self._late_holder()
        if late is not None and time.monotonic() >= late[1]:
            self._refuse(late[0], Refused(408, "Request Timeout", self._late_message()))

    def _late_message(self) -> str:
        return (
            f"the request body arrived slower than {self.min_body_rate} bytes/s (after {BODY_GRACE:g} s): "
            f"a body over {SMALL_BODY} bytes holds this worker's turn while it arrives, so it must keep "
            "coming (praesto-hooks --min-body-rate, chart value hooks.minBodyBytesPerSecond)"
        )

    def murder_pending(self) -> None:
        """Called by the main loop after every wake-up: a request past its deadline is closed."""
        super().murder_pending()
        now = time.monotonic()
        while self.by_deadline and (self.by_deadline[0].released or self.by_deadline[0].deadline <= now):
            req = self.by_deadline.popleft()
            if req.released:
                continue
            waited = " (it waited for this worker's large-body turn; retry)" if req.waiting else ""
            message = f"the request did not arrive within the deadline{waited}"
            self._refuse(req, Refused(408, "Request Timeout", message))
