"""A fault-injecting proxy in front of the real kube-apiserver: what the real server cannot do on demand.

This is what remains of the in-memory API emulator (testkit/kube.py and its store,
selector and discovery modules, ~1,100 lines, deleted in #23 item 7): every test that
talked to it now talks to the real kube-apiserver (testkit/kube_real.py); object
semantics, selectors, watches, discovery, TokenRequest/TokenReview and RBAC are the
real server's. Only the faults stay ours, because no real server makes them happen at an
exact moment of a test.

The `kubernetes` client under test talks plain HTTP to this proxy on loopback; the
proxy forwards each request over TLS to the real API server, watches streamed through
event by event. A request carrying its own `Authorization` header (a ServiceAccount
token) is forwarded with it and the real server authenticates and authorises it; one
without goes out as the proxy's default identity (a client certificate: the admin).

On demand:

* `fail_next(count, status, match)`: answer the next `count` matching requests
  with `status` (a Kubernetes `Status` body) without forwarding them;
* `requests`: every request as RBAC sees it (method, path, verb, group,
  resource, namespace, name, query), to prove which calls a code path makes;
* `drop_watches()`: cut every open watch mid-stream (a network failure);
* `expire_watches()`: push an ERROR `410 Gone` event into every open watch and
  end it, as the API server does when etcd compacted the history it was
  serving (`on_expire`: `RealKube.compact`, so the history goes for real too);
* `forget_history(before)`: a watch resumed from a resourceVersion older than
  `before` gets that ERROR 410 event. The real server would answer it from its
  watch cache, which keeps a window of events in memory past an etcd
  compaction: its own 410 comes only once that window has moved on, not on demand;
* `wait_for_watches(n)`, `wait_for_watches_closed()`, `open_watches`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes.client

__all__ = ["FaultProxy", "RequestRecord", "status_body"]

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_FORWARDED_HEADERS = ("Content-Type", "Accept", "Authorization", "User-Agent")
UPSTREAM_TIMEOUT = 60.0  # longer than any watch timeout the code under test asks for


@dataclass(frozen=True)
class RequestRecord:
    """One API call as RBAC sees it."""

    method: str
    path: str
    verb: str  # get list watch create update patch delete deletecollection
    group: str
    resource: str  # plural, with "/<subresource>" when one was addressed
    namespace: str | None
    name: str | None
    query: dict[str, str] = field(default_factory=dict)


def parse_request(method: str, target: str) -> RequestRecord:
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query))
    m = _PATH.match(parts.path)
    if m is None:
        return RequestRecord(method, parts.path, "", "", "", None, None, query)
    name, sub = m["name"], m["sub"]
    watching = query.get("watch", "").lower() in ("true", "1")
    verb = {
        "GET": "get" if name else ("watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, method.lower())
    resource = f"{m['plural']}/{sub}" if sub else m["plural"]
    return RequestRecord(method, parts.path, verb, m["group"] or "", resource, m["ns"], name, query)


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class _Watch:
    client: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)
    upstream: socket.socket | None = None
    ended: bool = False  # the proxy ended it (expired or dropped): the relay writes no more


class FaultProxy:
    """HTTP on 127.0.0.1:<free port>, forwarding to `upstream` (https://host:port); see the module docstring."""

    def __init__(
        self,
        upstream: str,
        ca_path: str,
        client_cert: tuple[str, str] | None = None,
        on_expire: Callable[[], None] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 443
        self._anonymous = ssl.create_default_context(cafile=ca_path)
        self._default = ssl.create_default_context(cafile=ca_path)
        if client_cert is not None:
            self._default.load_cert_chain(*client_cert)
        self.on_expire = on_expire
        self._cond = threading.Condition()
        self._watches: list[_Watch] = []
        self._faults: list[tuple[int, int, Callable[[RequestRecord], bool]]] = []
        self._log: list[RequestRecord] = []
        self._stopping = False
        self._forgotten = 0  # watches from an older resourceVersion get 410 (forget_history)
        self._server: ThreadingHTTPServer | None = None
        self._address = ""

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        host, port = self._server.server_address[:2]
        self._address = f"http://{host!s}:{port}"
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="kube-fault-proxy", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Stop answering (connections are refused from now on); idempotent."""
        with self._cond:
            self._stopping = True
            server, self._server = self._server, None
        self.drop_watches()
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._address, "start() the proxy first"
        return self._address

    def api_client(self, token: str = "") -> kubernetes.client.ApiClient:
        """A client through the proxy: as the proxy's default identity, or as `token`'s bearer."""
        config = kubernetes.client.Configuration()
        config.host = self.url
        if token:
            config.api_key = {"BearerToken": token}
            config.api_key_prefix = {"BearerToken": "Bearer"}
        return kubernetes.client.ApiClient(config)

    def connect(self, authorized: bool) -> http.client.HTTPSConnection:
        context = self._anonymous if authorized else self._default
        return http.client.HTTPSConnection(self._host, self._port, context=context, timeout=UPSTREAM_TIMEOUT)

    # ---- the request log and faults ----------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        with self._cond:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._cond:
            self._log.clear()

    def fail_next(
        self, count: int = 1, status: int = 500, match: Callable[[RequestRecord], bool] | None = None
    ) -> None:
        """Answer the next `count` requests (matching `match`, if given) with `status`."""
        with self._cond:
            self._faults.append((count, status, match or (lambda _r: True)))

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def record(self, record: RequestRecord) -> int | None:
        """Log `record`; the status of the fault it takes, if one matches."""
        with self._cond:
            self._log.append(record)
            for i, (count, status, match) in enumerate(self._faults):
                if match(record):
                    if count <= 1:
                        del self._faults[i]
                    else:
                        self._faults[i] = (count - 1, status, match)
                    return status
        return None

    # ---- watches ---------------------------------------------------------

    @property
    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def wait_for_watches(self, count: int = 1, timeout: float = 10.0) -> None:
        """Block until at least `count` watch connections are open (answered by the real server)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._watches) >= count, timeout):
                raise TimeoutError(f"{len(self._watches)} open watches, wanted {count}")

    def wait_for_watches_closed(self, timeout: float = 10.0) -> None:
        """Block until no watch connection is open (a finished watch is removed asynchronously)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._watches, timeout):
                raise TimeoutError(f"{len(self._watches)} watches still open")

    def opened(self, watch: _Watch) -> bool:
        with self._cond:
            if self._stopping:
                return False
            self._watches.append(watch)
            self._cond.notify_all()
            return True

    def closed(self, watch: _Watch) -> None:
        with self._cond:
            if watch in self._watches:
                self._watches.remove(watch)
            self._cond.notify_all()

    def forget_history(self, before: int) -> None:
        """From now on a watch resumed from a resourceVersion older than `before` gets 410 Gone."""
        with self._cond:
            self._forgotten = max(self._forgotten, before)

    def too_old(self, record: RequestRecord) -> bool:
        since = record.query.get("resourceVersion", "")
        with self._cond:
            return record.verb == "watch" and since.isdigit() and 0 < int(since) < self._forgotten

    def expire_watches(self) -> None:
        """End every open watch with an ERROR 410 event, as the API server does after etcd compaction."""
        if self.on_expire is not None:
            self.on_expire()
        event = {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version")}
        for watch in self._open():
            with watch.lock:
                if watch.ended:
                    continue
                watch.ended = True
                with contextlib.suppress(OSError):
                    watch.client.sendall(_chunk(json.dumps(event).encode() + b"\n") + b"0\r\n\r\n")
            _cut(watch.upstream)

    def drop_watches(self) -> None:
        """Cut every open watch connection without a goodbye (a network failure)."""
        for watch in self._open():
            with watch.lock:
                watch.ended = True
            _cut(watch.client)
            _cut(watch.upstream)

    def _open(self) -> list[_Watch]:
        with self._cond:
            return list(self._watches)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _cut(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        record = parse_request(self.command, self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self.owner.record(record)
        if fault is not None:
            payload = status_body(fault, "InternalError", "injected fault (testkit/kube_faults.py)")
            self._send(fault, json.dumps(payload).encode(), "application/json")
            return
        if self.owner.too_old(record):
            event = {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version")}
            self._send(200, json.dumps(event).encode() + b"\n", "application/json")
            return
        headers = {h: v for h in _FORWARDED_HEADERS if (v := self.headers.get(h)) is not None}
        upstream = self.owner.connect("Authorization" in headers)
        try:
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
            except OSError as err:
                payload = status_body(503, "ServiceUnavailable", f"the API server is unreachable: {err}")
                self._send(503, json.dumps(payload).encode(), "application/json")
                return
            content_type = response.getheader("Content-Type") or "application/json"
            if record.verb == "watch" and response.status == 200:
                self._relay(response, content_type, upstream.sock)
            else:
                self._send(response.status, response.read(), content_type)
        finally:
            upstream.close()

    def _relay(
        self, response: http.client.HTTPResponse, content_type: str, sock: socket.socket | None
    ) -> None:
        """Stream the watch's events through one chunk each, until either side ends it."""
        watch = _Watch(self.connection, upstream=sock)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if not self.owner.opened(watch):  # stopping: a watch arriving now must not outlive the proxy
            self.close_connection = True
            _cut(self.connection)
            return
        try:
            while True:
                try:
                    line = response.readline()
                except (OSError, http.client.HTTPException):
                    line = b""
                with watch.lock:
                    if watch.ended:
                        self.close_connection = True
                        return
                    if not line:  # the server ended the watch (timeoutSeconds): end it here too
                        self.connection.sendall(b"0\r\n\r\n")
                        return
                    self.connection.sendall(_chunk(line))
        except OSError:
            self.close_connection = True
        finally:
            self.owner.closed(watch)
