"""Hostile clients of `praesto-hooks` for the flood tests (#37 item 5), from other loopback addresses.

Linux routes all of 127.0.0.0/8 to the loopback device, so a client bound to 127.0.0.2 reaches a
server on 127.0.0.1 as another Pod would: a separate client address. Each flood runs on its own
thread, opens again what the server closes (the pressure never lets up) and records what the
server said before closing.

    with SilentLargeBodies(server, count=4, source="127.0.0.2") as attackers:
        ...  # requests of the real client, from 127.0.0.1
    attackers.cut  # status lines of the bodies the server cut
"""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
import ssl
import threading
import time
from typing import Any

from testkit.hook_objects import cache_node, modelcache, sync_request
from testkit.server import RunningServer

SYNC_PATH = "/hooks/modelcache/sync"
DECLARED = 16 << 20  # the chart's hooks.maxRequestBytes: the largest body a head may declare
CONNECT_DEADLINE = 10.0


def address(server: RunningServer) -> tuple[str, int]:
    host, port = server.base_url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def large_node(name: str) -> dict[str, Any]:
    """A Node about as big as a real one: ~12 KiB with 50 image entries and managedFields (chart
    values, hooks.maxRequestBytes)."""
    obj = cache_node(name)
    images = [f"registry.example.com/platform-team/inference/image-{i:02d}" for i in range(50)]
    obj["status"] = {
        "images": [{"names": [f"{image}@sha256:{i:064x}", f"{image}:v1.{i}.0-cuda12"], "sizeBytes": 10**9 + i}
                   for i, image in enumerate(images)],
        "nodeInfo": {"kubeletVersion": "v1.35.0", "containerRuntimeVersion": "containerd://2.1.0"},
    }  # fmt: skip
    obj["metadata"]["managedFields"] = [
        {"manager": "kubelet", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {"f:images": {}, "f:conditions": {f"k:{{\"type\":\"{c}\"}}": {"f:status": {}}
                                                                      for c in ("Ready", "MemoryPressure")}}}}
    ]  # fmt: skip
    return obj


def large_sync_request(nodes: int = 25) -> dict[str, Any]:
    """A local-mode cache's sync request with `nodes` related Nodes (25: about 300 KiB)."""
    return sync_request(modelcache(), nodes=[large_node(f"node-{i:03d}") for i in range(nodes)])


def sync_body(request: dict[str, Any]) -> bytes:
    return json.dumps(request).encode()


def _status_and_message(answer: bytes) -> tuple[bytes, str]:
    head, _, payload = answer.partition(b"\r\n\r\n")
    with contextlib.suppress(ValueError):
        return head.split(b"\r\n", 1)[0], str(json.loads(payload)["error"])
    return head.split(b"\r\n", 1)[0], payload.decode(errors="replace")


class _Flood:
    """A thread that watches its sockets: one the server closes is recorded and opened again."""

    def __init__(self, server: RunningServer, reopen: bool = True) -> None:
        self.server, self.reopen = server, reopen
        self.selector = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.cut: list[bytes] = []  # status lines (or b"" for a close without an answer)
        self.messages: list[str] = []
        self.lock = threading.Lock()

    def _open(self, data: Any) -> None:
        raise NotImplementedError

    def _event(self, key: selectors.SelectorKey, events: int) -> None:
        sock: Any = key.fileobj
        try:
            chunk = sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            return  # TLS 1.3 session tickets, not an answer
        except OSError:
            chunk = b""
        if chunk:
            key.data["answer"] += chunk
            return
        self.selector.unregister(sock)
        sock.close()
        status, message = _status_and_message(key.data["answer"])
        with self.lock:
            self.cut.append(status)
            if status:
                self.messages.append(message)
        if self.reopen and not self.stop.is_set():
            self._open(key.data["kind"])

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for key, events in self.selector.select(timeout=0.2):
                    self._event(key, events)
        finally:
            for key in list(self.selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self.selector.close()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


class SilentLargeBodies(_Flood):
    """`count` TLS connections from `source`, each sending a head that declares a 16 MiB sync body, then nothing."""

    def __init__(self, server: RunningServer, count: int, source: str) -> None:
        super().__init__(server)
        self.count, self.source = count, source
        context = server.ssl_context()
        assert context is not None
        self.context = context

    def _open(self, data: Any) -> None:
        raw = socket.create_connection(address(self.server), timeout=5, source_address=(self.source, 0))
        sock = self.context.wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(f"POST {SYNC_PATH} HTTP/1.1\r\nHost: hooks\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {DECLARED}\r\n\r\n".encode())  # fmt: skip
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, {"kind": data, "answer": b""})

    def __enter__(self) -> SilentLargeBodies:
        for index in range(self.count):
            self._open(index)
        self.thread.start()
        return self

    def wait_holding(self, seconds: float = 0.3) -> None:
        """Give the server time to read the heads (it has no way to tell us it did)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.stop.wait(deadline - time.monotonic())


class HalfOpenFlood(_Flood):
    """`count` connections spread over `sources` addresses (127.0.0.2 up) that send nothing; with
    `partial_head`, TLS connections that finish the handshake and send half a request head."""

    def __init__(
        self,
        server: RunningServer,
        count: int,
        sources: int = 1,
        partial_head: bool = False,
        reopen: bool = True,
    ) -> None:
        super().__init__(server, reopen)
        self.count, self.sources, self.partial_head = count, sources, partial_head
        self.context = server.ssl_context()
        self.connected = 0  # connects finished (the server took them, or they failed)

    def _open(self, data: Any) -> None:
        source = f"127.0.0.{2 + data % self.sources}"
        if self.partial_head:
            assert self.context is not None
            raw = socket.create_connection(address(self.server), timeout=5, source_address=(source, 0))
            sock: Any = self.context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(f"POST {SYNC_PATH} HTTP/1.1\r\nHost: hooks\r\nContent-Len".encode())
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, {"kind": data, "answer": b""})
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((source, 0))
        code = sock.connect_ex(address(self.server))
        assert code in (0, errno.EINPROGRESS), errno.errorcode.get(code)
        self.selector.register(sock, selectors.EVENT_WRITE, {"kind": data, "answer": b""})

    def _event(self, key: selectors.SelectorKey, events: int) -> None:
        if key.events & selectors.EVENT_WRITE:  # the connect finished (or failed)
            with self.lock:
                self.connected += 1
            self.selector.modify(key.fileobj, selectors.EVENT_READ, key.data)
            return
        super()._event(key, events)

    def __enter__(self) -> HalfOpenFlood:
        for index in range(self.count):
            self._open(index)
        self.thread.start()
        return self

    def wait_connected(self) -> None:
        """Until as many connects as `count` have finished (the server took them, shedding others
        to take them, or they failed), at most CONNECT_DEADLINE."""
        deadline = time.monotonic() + CONNECT_DEADLINE
        while self.connected < self.count and time.monotonic() < deadline:
            self.stop.wait(0.05)
