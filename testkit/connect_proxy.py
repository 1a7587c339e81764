"""A minimal HTTP CONNECT proxy on loopback: tunnels bytes and counts the tunnels it opened.

`routes` sends a requested "host:port" elsewhere ("ghcr.io:443" -> "127.0.0.1:<port>"), so a
client that honours HTTPS_PROXY reaches a local stand-in under the public name it was given
(the TLS handshake still names that host: the stand-in's certificate must be for it)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from socketserver import StreamRequestHandler, ThreadingTCPServer


class _Proxy(ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, routes: Mapping[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.tunnels: list[str] = []
        self.routes = dict(routes)


class _Tunnel(StreamRequestHandler):
    server: _Proxy

    def handle(self) -> None:
        request = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if len(request) < 2 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = self.server.routes.get(request[1], request[1]).rpartition(":")
        self.server.tunnels.append(request[1])
        with socket.create_connection((host, int(port)), timeout=30) as upstream:
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            pump = threading.Thread(target=_copy, args=(upstream, self.connection), daemon=True)
            pump.start()
            pending = self.rfile.peek() if hasattr(self.rfile, "peek") else b""
            if pending:
                upstream.sendall(self.rfile.read(len(pending)))
            _copy(self.connection, upstream)
            pump.join(timeout=30)


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@contextmanager
def connect_proxy(routes: Mapping[str, str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """(proxy URL, list of "host:port" clients asked for, filled as they connect)."""
    server = _Proxy(routes or {})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.tunnels
    finally:
        server.shutdown()
        server.server_close()
