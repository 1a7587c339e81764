"""API discovery in front of the Kubernetes API emulator, for clients that discover before they call.

Helm's `lookup` (and kubectl) first ask `/api/v1` which resources exist and
whether they are namespaced; the emulator (tests/support/kube.py) serves
objects only. This front answers the discovery documents from the same
resource table the emulator uses and forwards every other request to it
unchanged, so the emulator stays the one store of objects. Request/response
only: a watch would be buffered whole, so watching clients talk to the
emulator directly.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.support.kube import KubeEmulator
from tests.support.kube_store import DEFAULT_RESOURCES, ResourceInfo

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _resource_list(group_version: str, resources: tuple[ResourceInfo, ...]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": _VERBS,
            }
            for r in resources
            if r.api_version == group_version
        ],
    }


def discovery_document(path: str, resources: tuple[ResourceInfo, ...]) -> dict[str, Any] | None:
    """The discovery answer for `path`, or None when the path is not a discovery path."""
    groups = sorted({r.group for r in resources if r.group})
    if path == "/version":
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.0"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/api/v1":
        return _resource_list("v1", resources)
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [
                        {"groupVersion": f"{g}/{v}", "version": v}
                        for v in sorted({r.version for r in resources if r.group == g})
                    ],
                    "preferredVersion": {
                        "groupVersion": f"{g}/{next(r.version for r in resources if r.group == g)}",
                        "version": next(r.version for r in resources if r.group == g),
                    },
                }
                for g in groups
            ],
        }
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "apis":
        return _resource_list(f"{parts[1]}/{parts[2]}", resources)
    return None


@contextmanager
def discovery_front(
    emulator: KubeEmulator, resources: tuple[ResourceInfo, ...] = DEFAULT_RESOURCES
) -> Iterator[str]:
    """Serve discovery + forward to `emulator`; yields the front's base URL."""
    target = urlsplit(emulator.url)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            path = urlsplit(self.path).path
            doc = discovery_document(path, resources) if self.command == "GET" else None
            if doc is not None:
                self._reply(200, json.dumps(doc).encode())
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
            try:
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                self._reply(
                    answer.status, answer.read(), answer.getheader("Content-Type") or "application/json"
                )
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
