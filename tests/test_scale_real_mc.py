"""The scale tier's real-Metacontroller mode: the controllers repointed, and the recording forwarder.

The binary itself is not here (CI cannot build it: docs/scale.md); these check what the bench
puts between it and praesto-hooks, so a figure it records is what the hooks were sent."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.scale_real_mc import Forwarder, point_hooks_at
from testkit.server import make_tls_files


def test_every_hook_is_pointed_at_the_forwarder_with_its_path_kept() -> None:
    controller = {
        "kind": "CompositeController",
        "spec": {
            "hooks": {
                "sync": {"version": "v2", "webhook": {"url": "https://praesto-hooks.praesto-system.svc:443/hooks/modelcache/sync", "caBundle": {"inline": "old"}}},
                "customize": {"webhook": {"url": "https://h.svc/hooks/modelcache/customize", "timeout": "10s"}},
            }
        },
    }  # fmt: skip
    out = point_hooks_at(controller, "https://127.0.0.1:1234", "PEM")
    hooks = out["spec"]["hooks"]
    assert hooks["sync"]["webhook"] == {
        "url": "https://127.0.0.1:1234/hooks/modelcache/sync",
        "caBundle": {"inline": "PEM"},
    }
    assert hooks["sync"]["version"] == "v2"
    assert hooks["customize"]["webhook"]["url"] == "https://127.0.0.1:1234/hooks/modelcache/customize"
    assert hooks["customize"]["webhook"]["timeout"] == "10s"  # Metacontroller's own timeout is kept


@pytest.fixture
def hooks(tmp_path: Path) -> Iterator[tuple[str, Path, list[bytes]]]:
    """A TLS server answering each POST with its body's length, or 413 past 100 bytes."""
    tls = make_tls_files(tmp_path / "hooks-tls")
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            bodies.append(body)
            status, data = (
                (413, b"too big") if len(body) > 100 else (200, json.dumps({"n": len(body)}).encode())
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(tls.cert_path), str(tls.key_path))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", tls.ca_path, bodies
    finally:
        server.shutdown()


def _post(forwarder: Forwarder, path: str, body: bytes) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(forwarder.tls.ca_path))
    request = urllib.request.Request(forwarder.url + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_forwarder_passes_bodies_through_unchanged_and_records_each_call(
    tmp_path: Path, hooks: tuple[str, Path, list[bytes]]
) -> None:
    url, ca, bodies = hooks
    forwarder = Forwarder(tmp_path, url, ca)
    threading.Thread(target=forwarder.server.serve_forever, daemon=True).start()
    try:
        assert _post(forwarder, "/hooks/modelcache/sync", b'{"parent": {}}') == (200, b'{"n": 14}')
        assert _post(forwarder, "/hooks/modelcache/sync", b"x" * 200) == (413, b"too big")
        calls, failed = forwarder.drain()
    finally:
        forwarder.server.shutdown()
    assert bodies == [b'{"parent": {}}', b"x" * 200]
    assert [(path, size) for path, size, _ in calls] == [("/hooks/modelcache/sync", 14)]
    assert failed == [("/hooks/modelcache/sync", 200, "HTTP 413: b'too big'")]
    assert forwarder.drain() == ([], [])  # drained: a long run keeps no history


def test_other_pods_are_running_replicas_that_ask_for_no_cache() -> None:
    """The background Pods cost Metacontroller memory only: no cache may count them as consumers."""
    from bench.scale_background_pods import NAMESPACES, namespace_of, pod_body, pod_status
    from bench.scale_nodes import node_name

    bodies = [pod_body(i, nodes=3) for i in range(30)]
    assert [b["spec"]["nodeName"] for b in bodies[:4]] == [
        node_name(0),
        node_name(1),
        node_name(2),
        node_name(0),
    ]
    assert len({b["metadata"]["name"] for b in bodies}) == 30
    assert {namespace_of(i) for i in range(30)} == {f"apps-{n:02d}" for n in range(NAMESPACES)}
    for body in bodies:
        assert "annotations" not in body["metadata"]  # no praesto.io/model-mounts: the webhook skips it
        assert not any("praesto.io" in k for k in body["metadata"]["labels"])  # no consumer label
    assert pod_status(7)["phase"] == "Running"


def test_errors_are_read_once_each_from_where_the_last_read_stopped(tmp_path: Path) -> None:
    from bench.scale_real_mc import RealMetacontroller

    hooks_ca = make_tls_files(tmp_path / "hooks-tls").ca_path
    mc = RealMetacontroller(Path("metacontroller"), tmp_path / "kubeconfig", None, "https://127.0.0.1:1",  # type: ignore[arg-type]
                            hooks_ca, [], {}, tmp_path / "mc")  # fmt: skip
    error = '{"level":"error","msg":"sync failed","n":%d}\n'
    with mc.log_path.open("w") as log:
        log.write('{"level":"info"}\n' + error % 1 + '{"level":"err')  # the last line still being written
    assert mc.new_errors() == [(error % 1).strip()]
    with mc.log_path.open("a") as log:
        log.write('or","msg":"sync failed","n":2}\n')
    assert mc.new_errors() == [(error % 2).strip()]
    assert mc.new_errors() == []
    mc.forwarder.server.server_close()
