"""Issue 21 item 13: six sockets trickling a byte every 1.5 s held the peer server at its
connection cap (the idle timeout bounds one read, and each byte reset it). Over real sockets to
the real server: a request head has a whole deadline, a response a minimum rate, and one client
address a share of the connections."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from praesto.agent.peers.limits import Limits
from praesto.agent.peers.protocol import file_path
from praesto.agent.peers.server import PeerServer

from praesto import names
from praesto.store import StoreLayout
from tests.peers.conftest import Peers
from tests.peers.test_peer_server import REV, get_with, make_cache, url

ATTACKER = "127.0.0.2"  # every loopback address is this host's: each is one client address
OTHER = "127.0.0.3"
HEAD = b"GET " + url("model.bin").encode() + b" HTTP/1.1\r\nHost: peer\r\n" + b"X-Pad: " + b"x" * 4096


def wait_until(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        threading.Event().wait(0.02)


def connect_from(source: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def hung_up(sock: socket.socket) -> bool:
    """The server closed `sock` (EOF or reset); False while it is still open and silent."""
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return data == b""


class Trickle:
    """Sends one byte of a never-ending request head to each socket every `every` seconds."""

    def __init__(self, socks: list[socket.socket], every: float) -> None:
        self.socks, self.every, self.sent = socks, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(HEAD[self.sent : self.sent + 1])
            self.sent += 1

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def serving(tmp_path: Path, peers: Peers, limits: Limits, big: int = 0) -> Iterator[PeerServer]:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    if big:
        add_file(layout, "big.bin", os.urandom(big))
    srv = PeerServer(layout, peers.authorizer(), ("127.0.0.1", 0), limits).start()
    srv.peers = peers  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def add_file(layout: StoreLayout, path: str, data: bytes) -> None:
    root = layout.cache_dir("team-a", "m")
    (root / path).write_bytes(data)
    manifest = json.loads((root / names.MANIFEST_FILE).read_text())
    manifest["files"].append({"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (root / names.MANIFEST_FILE).write_text(json.dumps(manifest))


def test_trickling_clients_of_one_address_neither_hold_the_server_nor_outlive_the_deadline(
    tmp_path: Path, peers: Peers
) -> None:
    limits = Limits(max_connections=8, max_connections_per_client=6, request_seconds=4.0, idle_seconds=30)
    with serving(tmp_path, peers, limits) as srv:
        socks = [connect_from(ATTACKER, srv.server_port) for _ in range(8)]
        started = time.monotonic()
        try:
            wait_until("2 of 8 answered", lambda: len(select.select(socks, [], [], 0.05)[0]) == 2, 10)
            assert (srv.conns.of(ATTACKER), srv.conns.refused_client) == (6, 2)
            # the two beyond the share were told so, and closed
            refused = select.select(socks, [], [], 0)[0]
            for sock in refused:
                answer = _read_all(sock)
                assert answer.startswith(b"HTTP/1.1 429 Too Many Requests"), answer
                assert b"Retry-After: 5" in answer and b"--peer-max-connections-per-client" in answer
            admitted = [s for s in socks if s not in refused]
            with Trickle(admitted, every=0.3) as trickle:  # never silent for the 30 s idle timeout
                # meanwhile a peer at another address is served, at once, twice over
                for _ in range(2):
                    status, _, body = get_with(srv, peers, url("model.bin"))
                    assert status == 200 and len(body) == 100_000
                assert srv.conns.of(ATTACKER) == 6  # served while the trickling six still held theirs
                # and a seventh connection from the trickling address is still refused
                extra = connect_from(ATTACKER, srv.server_port)
                assert _read_all(extra).startswith(b"HTTP/1.1 429")
                extra.close()
                # the trickling heads are cut at their deadline though their bytes keep coming
                wait_until("every trickler hung up on", lambda: all(hung_up(s) for s in admitted), 10)
                cut_after = time.monotonic() - started
                assert trickle.sent < len(HEAD)  # none ever finished its head
            assert limits.request_seconds * 0.9 <= cut_after < limits.request_seconds + 5
            assert srv.conns.reaped == 6
            wait_until("no connection left", lambda: srv.connections == 0, 10)
            # the address is welcome again once its connections are gone
            assert _fresh_get(srv, peers, ATTACKER) == 200
        finally:
            for sock in socks:
                sock.close()


def test_a_whole_request_sent_slowly_but_in_time_is_served(tmp_path: Path, peers: Peers) -> None:
    limits = Limits(request_seconds=3.0, idle_seconds=30)
    with serving(tmp_path, peers, limits) as srv:
        head = (
            f"GET {url('empty.txt')} HTTP/1.1\r\nHost: peer\r\n{_signed(peers, url('empty.txt'))}"
            "Connection: close\r\n\r\n"
        ).encode()
        sock = connect_from(OTHER, srv.server_port)
        with sock:
            for i in range(0, len(head), len(head) // 8 + 1):  # in 9 pieces over about a second
                sock.sendall(head[i : i + len(head) // 8 + 1])
                threading.Event().wait(0.1)
            sock.settimeout(10)
            assert _read_all(sock).startswith(b"HTTP/1.1 200")
        assert srv.conns.reaped == 0


def test_a_slow_reader_is_cut_at_the_minimum_rate_a_fast_one_is_served(tmp_path: Path, peers: Peers) -> None:
    size = 4 << 20
    limits = Limits(min_send_rate=1 << 20, idle_seconds=2.0)  # 4 MiB in at most 2 + 4 s
    with serving(tmp_path, peers, limits, big=size) as srv:
        # a small kernel buffer on both ends: what the reader does not take blocks the sender soon
        srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
        status, _, body = get_with(srv, peers, url("big.bin"))
        assert status == 200 and len(body) == size  # a reader that keeps up gets it all
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        sock.connect(("127.0.0.1", srv.server_port))
        with sock:
            request = f"GET {url('big.bin')} HTTP/1.1\r\nHost: peer\r\n{_signed(peers, url('big.bin'))}\r\n"
            sock.sendall(request.encode())
            started, got = time.monotonic(), 0
            sock.settimeout(5)
            while True:  # 4 KiB every 50 ms, about 80 KiB/s: never idle, far below the rate
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += len(chunk)
                threading.Event().wait(0.05)
                assert time.monotonic() - started < limits.idle_seconds + size / limits.min_send_rate + 10
            took = time.monotonic() - started
        assert got < size // 2 and took >= limits.idle_seconds + size / limits.min_send_rate - 0.5
        assert srv.conns.reaped == 1
        wait_until("the cut connection gone", lambda: srv.connections == 0, 10)


def test_waiting_for_this_nodes_own_upload_rate_does_not_count_against_the_asker(
    tmp_path: Path, peers: Peers
) -> None:
    size = 1 << 20
    # 1 MiB paced at 256 KiB/s by this node takes ~4 s; the asker's own allowance is 1.25 s
    limits = Limits(rate=256 << 10, min_send_rate=4 << 20, idle_seconds=1.0)
    with serving(tmp_path, peers, limits, big=size) as srv:
        started = time.monotonic()
        status, _, body = get_with(srv, peers, url("big.bin"))
        assert status == 200 and len(body) == size
        assert time.monotonic() - started > limits.send_seconds(size) + 1  # type: ignore[operator]
        assert srv.conns.reaped == 0


def _fresh_get(srv: PeerServer, peers: Peers, source: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10, source_address=(source, 0))
    try:
        path = file_path("team-a", "m", REV, "empty.txt")
        conn.request("GET", path, headers=peers.signed(path))
        return conn.getresponse().status
    finally:
        conn.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.fixture(autouse=True)
def _loopback_aliases() -> None:
    """127.0.0.2 and .3 are this host's loopback (Linux routes all of 127/8 to lo)."""
    for source in (ATTACKER, OTHER):
        try:
            socket.create_server((source, 0)).close()
        except OSError:
            pytest.skip(f"{source} is not a local address here")


def _signed(peers: Peers, path: str) -> str:
    """The authentication header lines of `GET path`, each ending in CRLF."""
    return "".join(f"{name}: {value}\r\n" for name, value in peers.signed(path).items())
