"""A Kubernetes API emulator for tests: real HTTP, real `kubernetes` client.

Why not `kmock`: its `KubernetesEmulator._handle` mutates the stored object
*before* any handler a subclass could add runs, so resourceVersion
preconditions (409), status-subresource isolation and merge-patch `null`
deletion cannot be added by overriding; its watch replays every object on each
connection and has no history to resume from or expire. Subclassing it would
replace every handler and keep only its aiohttp server and a loop thread.
A synchronous stdlib `ThreadingHTTPServer` with an in-memory store is smaller,
needs no event loop, and gives the semantics the product code relies on:

* objects with uid, creationTimestamp, generation and a cluster-wide,
  monotonically increasing `resourceVersion` (also on lists);
* list/watch filtered by label selectors (equality and set-based) and the
  `metadata.name` / `metadata.namespace` field selectors, all namespaces or one;
* watch resume from `resourceVersion=`, `410 Gone` for versions older than the
  last `compact()`, `expire_watches()` to push a 410 into open watches,
  `timeoutSeconds` honoured, `drop_watches()` to cut connections;
* PUT, JSON merge patch (RFC 7386), JSON patch and (approximated by merge
  patch) strategic merge patch, with `metadata.resourceVersion` preconditions;
* `/status` subresource: writes there change only `.status`, writes to the main
  resource never change `.status`;
* finalizers: delete sets `deletionTimestamp` while finalizers remain, the
  object goes away when the last one is removed;
* namespaced and cluster-scoped resources (nodes, storageclasses, ...);
* a request log (method, path, verb, resource, namespace, name) for RBAC
  assertions, and fault injection (`fail_next`);
* TokenReview answered from `tokens` (the peer agents' identities; the real
  API server's answers for Pod-bound tokens are tested in tests/cluster), and
  TokenRequest (serviceaccounts/token) adding to them, bound to a stored Pod.

Sync API for tests: `create`, `get`, `list`, `patch`, `delete`, `requests`,
`api_client()`. Use as a context manager or through the `kube` fixture.

Where it is still used, and why the real API server (tests/cluster/) cannot stand in:

* `tests/agent/` (harness.py): the agent's reaction to faults on demand: `fail_next`
  on one call, `expire_watches()` into an open watch, `drop_watches()` mid-stream,
  and a request log to prove which calls a code path makes. The same agent runs on
  the real API server in tests/cluster/test_agent.py and test_local_mode.py.
* `tests/admission/test_lookup_watch.py`, `test_admission_server.py`: the lookups'
  cold, stale and resumed watches, made to happen at exact moments.
* `tests/chart/test_chart_tls.py`, `test_chart_peers.py` (through kube_discovery.py):
  Helm's `lookup` during a render, with a Secret planted or left out.
* `tests/support/peer_cluster.py`: four agents and their peer discovery, fast.
Everything about API semantics, RBAC, admission, scheduling and garbage
collection is tested on the real control plane instead.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import jsonpatch
import kubernetes.client
import pytest

from praesto import names
from tests.support.kube_faults import RequestRecord
from tests.support.kube_store import (
    DEFAULT_RESOURCES,
    ApiError,
    Obj,
    ResourceInfo,
    Store,
    gone,
    merge_patch,
    selector_matches,
)

__all__ = ["ApiError", "KubeEmulator", "RequestRecord", "ResourceInfo", "kube", "selector_matches"]


@dataclass
class _Watch:
    sock: socket.socket
    expired: bool = False


class KubeEmulator(Store):
    """In-memory API server on 127.0.0.1:<free port>; see the module docstring."""

    def __init__(self, resources: tuple[ResourceInfo, ...] = DEFAULT_RESOURCES):
        super().__init__(resources)
        self._watches: list[_Watch] = []
        self._faults: list[tuple[int, int, Callable[[RequestRecord], bool]]] = []
        self._log: list[RequestRecord] = []
        # TokenReview: token -> status.user ({username, extra}) and the audiences it was made for.
        self.tokens: dict[str, tuple[Obj, tuple[str, ...]]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> KubeEmulator:
        emulator = self

        class Handler(_Handler):
            api = emulator

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the emulator first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def configuration(self) -> kubernetes.client.Configuration:
        config = kubernetes.client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.client.ApiClient(self.configuration())

    def _review(self, body: Any) -> Obj:
        """A TokenReview answered from `tokens`, audiences intersected as the API server does."""
        spec = (body or {}).get("spec") or {}
        user, made_for = self.tokens.get(str(spec.get("token")), ({}, ()))
        audiences = [a for a in spec.get("audiences") or [] if a in made_for]
        status: Obj = {"authenticated": False}
        if user and audiences:
            status = {"authenticated": True, "user": user, "audiences": audiences}
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
            "status": status,
        }

    def _token_request(self, namespace: str, service_account: str, body: Any) -> Obj:
        """A TokenRequest, as the API server answers it: bound to a Pod of that ServiceAccount,
        the token's review names the Pod's node, name and UID (see `tokens`)."""
        spec = (body or {}).get("spec") or {}
        bound = spec.get("boundObjectRef") or {}
        identity: Obj = {"username": f"system:serviceaccount:{namespace}:{service_account}"}
        if bound:
            pod = self.get("pods", str(bound.get("name")), namespace)
            pod_spec = (pod or {}).get("spec") or {}
            if pod is None or pod_spec.get("serviceAccountName") != service_account:
                raise ApiError(404, "NotFound", f"pods {bound.get('name')!r} not found for {service_account}")
            uid = (pod.get("metadata") or {}).get("uid")
            if bound.get("uid") and bound["uid"] != uid:
                raise ApiError(409, "Conflict", "the bound Pod's uid does not match")
            identity["extra"] = {
                names.TOKEN_EXTRA_NODE_NAME: [pod_spec.get("nodeName", "")],
                names.TOKEN_EXTRA_POD_NAME: [bound.get("name")],
                names.TOKEN_EXTRA_POD_UID: [uid],
            }
        token = secrets.token_urlsafe(32)
        self.tokens[token] = (identity, tuple(spec.get("audiences") or ()))
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"},
        }

    @property
    def requests(self) -> list[RequestRecord]:
        with self._cond:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._cond:
            self._log.clear()

    def fail_next(
        self,
        count: int = 1,
        status: int = 500,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> None:
        """Answer the next `count` requests (matching `match`, if given) with `status`."""
        with self._cond:
            self._faults.append((count, status, match or (lambda _r: True)))

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def _take_fault(self, record: RequestRecord) -> int | None:
        with self._cond:
            for i, (count, status, match) in enumerate(self._faults):
                if match(record):
                    if count <= 1:
                        del self._faults[i]
                    else:
                        self._faults[i] = (count - 1, status, match)
                    return status
        return None

    @property
    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def wait_for_watches(self, count: int = 1, timeout: float = 10.0) -> None:
        """Block until at least `count` watch connections are open."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._watches) >= count, timeout):
                raise TimeoutError(f"{len(self._watches)} open watches, wanted {count}")

    def wait_for_watches_closed(self, timeout: float = 10.0) -> None:
        """Block until no watch connection is open (a finished watch is removed asynchronously)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._watches, timeout):
                raise TimeoutError(f"{len(self._watches)} watches still open")

    def expire_watches(self) -> None:
        """Compact, then end every open watch with an ERROR 410 event, as etcd compaction does."""
        with self._cond:
            self.compact()
            for w in self._watches:
                w.expired = True
            self._cond.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch connection without a goodbye (a network failure)."""
        with self._cond:
            watches = list(self._watches)
        for w in watches:
            with contextlib.suppress(OSError):
                w.sock.shutdown(socket.SHUT_RDWR)


# ---- HTTP ------------------------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


class _Handler(BaseHTTPRequestHandler):
    api: KubeEmulator
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

    def _send(self, code: int, payload: Obj) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _parse(self) -> tuple[RequestRecord, ResourceInfo | None]:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        m = _PATH.match(parts.path)
        if m is None:
            return RequestRecord(self.command, parts.path, "", "", "", None, None, query), None
        group = m["group"] or ""
        ns, plural, name, sub = m["ns"], m["plural"], m["name"], m["sub"]
        info = self.api._resources.get((group, plural))
        verb = {
            "GET": "get"
            if name
            else ("watch" if query.get("watch", "").lower() in ("true", "1") else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(self.command, self.command.lower())
        resource = f"{plural}/{sub}" if sub else plural
        return RequestRecord(self.command, parts.path, verb, group, resource, ns, name, query), info

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:
            raise ApiError(400, "BadRequest", "request body is not JSON") from None

    def _serve(self) -> None:
        record, info = self._parse()
        with self.api._cond:
            self.api._log.append(record)
        try:
            body = self._body() if self.command in ("POST", "PUT", "PATCH") else None
            fault = self.api._take_fault(record)
            if fault is not None:
                raise ApiError(fault, "InternalError", "injected fault")
            if (record.group, record.resource, record.verb) == (
                "authentication.k8s.io",
                "tokenreviews",
                "create",
            ):
                self._send(201, self.api._review(body))
                return
            if (record.group, record.resource, record.verb) == ("", "serviceaccounts/token", "create"):
                self._send(201, self.api._token_request(record.namespace or "", record.name or "", body))
                return
            if info is None:
                raise ApiError(
                    404, "NotFound", f"the server could not find the requested resource ({self.path})"
                )
            scoped_ok = (
                record.namespace is None
                if not info.namespaced
                else (record.namespace is not None or record.verb in ("list", "watch"))
            )
            if not scoped_ok:
                raise ApiError(
                    404, "NotFound", f"{info.plural} is {'' if info.namespaced else 'not '}namespaced"
                )
            if record.verb == "watch":
                self._watch(info, record)
                return
            self._send(*self._dispatch(info, record, body))
        except ApiError as err:
            self._send(err.code, err.status())

    def _dispatch(self, info: ResourceInfo, r: RequestRecord, body: Any) -> tuple[int, Obj]:
        api, ns, sub = self.api, r.namespace, r.resource.partition("/")[2]
        if sub and (sub != "status" or not info.status):
            raise ApiError(404, "NotFound", f"no subresource {sub!r} on {info.plural}")
        if r.verb == "list":
            return 200, api._list(
                info, ns, r.query.get("labelSelector", ""), r.query.get("fieldSelector", "")
            )
        if r.verb == "create":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "create needs an object")
            return 201, api._create(info, ns, body)
        assert r.name is not None
        if r.verb == "get":
            return 200, api._get(info, ns, r.name)
        if r.verb == "delete":
            return 200, api._delete(info, ns, r.name)
        if r.verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "update needs an object")
            return 200, api._write(info, ns, r.name, lambda _old: copy.deepcopy(body), sub)
        if r.verb == "patch":
            return 200, api._write(info, ns, r.name, self._patcher(body), sub)
        raise ApiError(405, "MethodNotAllowed", f"{r.verb} is not supported by the emulator")

    def _patcher(self, body: Any) -> Callable[[Obj], Obj]:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")

            def apply(obj: Obj) -> Obj:
                try:
                    result: Obj = jsonpatch.apply_patch(obj, body)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                    raise ApiError(422, "Invalid", f"the JSON patch does not apply: {err}") from None
                return result

            return apply
        if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch is an object")
            return lambda obj: merge_patch(obj, body)
        raise ApiError(
            415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}"
        )

    def _watch(self, info: ResourceInfo, r: RequestRecord) -> None:
        since = r.query.get("resourceVersion", "")
        if since and not since.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}")
        timeout = float(r.query.get("timeoutSeconds") or 0) or None
        deadline = time.monotonic() + timeout if timeout else None
        events = self.api._watch_events(
            info,
            r.namespace,
            r.query.get("labelSelector", ""),
            r.query.get("fieldSelector", ""),
            since,
        )
        watch = _Watch(self.connection)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with self.api._cond:
            stopping = self.api._stopping
            if not stopping:
                self.api._watches.append(watch)
            self.api._cond.notify_all()
        if stopping:  # stop() already cut the open watches: one arriving now must not outlive it
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        try:
            for event in events:
                if watch.expired:
                    self._chunk({"type": "ERROR", "object": gone(0, self.api._compacted)})
                    break
                if event is not None:
                    self._chunk(event)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            with self.api._cond:
                self.api._watches.remove(watch)
                self.api._cond.notify_all()

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """A running emulator; `kube.api_client()` gives a real `kubernetes` ApiClient for it."""
    with KubeEmulator() as emulator:
        yield emulator
