"""A peer connection stays usable after a whole range was read with the deadline reader.

`PeerTransport.fetch_by` (agent/peers/transport.py) reads with `read1` (one socket read per call, so a trickling peer is cut
at its deadline), and http.client's `read1` does not close a response it has read to the end. The
next request on that keep-alive connection then failed with `ResponseNotReady('Request-sent')` and
the peer was dropped for the rest of the download (`bench.p2p_bench` logged it about a hundred
times a run). A real HTTP/1.1 keep-alive server here counts the connections it accepted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from praesto.agent.download.api import Target
from praesto.agent.peers.auth import Credentials, Minted, TokenMinter
from praesto.agent.peers.transport import PeerTransport

DATA = bytes(range(256)) * 4096  # 1 MiB


class _Ranges(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, Content-Length on every answer, as the peer server
    connections: list[str] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(str(self.client_address))

    def do_GET(self) -> None:
        first, last = self.headers["Range"].removeprefix("bytes=").split("-")
        body = DATA[int(first) : int(last) + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _FixedMinter(TokenMinter):
    """A token source that needs no API server: what is under test is the connection, not the token."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()

    def token_for(self, node: str) -> Minted:
        return Minted("token-for-" + node, self.key)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Ranges.connections = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ranges)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_ranges_read_to_the_end_by_deadline_reuse_one_connection(server: ThreadingHTTPServer) -> None:
    host, port = "127.0.0.1", server.server_address[1]
    transport = PeerTransport(Credentials("node-a", _FixedMinter()), 10.0, lambda _address: "node-b")
    target = Target(f"http://{host}:{port}/file", authorized=False)
    got = bytearray(len(DATA))

    def sink(offset: int, chunk: memoryview) -> None:
        got[offset : offset + len(chunk)] = chunk

    half = len(DATA) // 2
    deadline = time.monotonic() + 60
    assert transport.fetch_by(deadline, target, 0, half, sink, threading.Event()) == half
    assert transport.fetch_by(deadline, target, half, len(DATA), sink, threading.Event()) == len(DATA) - half
    assert bytes(got) == DATA
    assert len(_Ranges.connections) == 1  # the second range came over the same keep-alive connection
    transport.close()
