"""Slow and oversize clients against a real `praesto-hooks` (gunicorn) over TLS (#21 item 14).

Before hooks/serving/whole_request_worker.py, gunicorn's gthread worker did the TLS handshake and read the request head
on a pool thread with no deadline: a dozen half-open connections held every thread, and a
100 MiB body was read whole into the worker. Here the server runs with one worker and two
threads, so a single held thread would show.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.hooks.arrivals import BODY_GRACE
from praesto.hooks.refusals import Refused, body_length

from testkit.server import RunningServer, half_client_hello, hooks_server, post_json

REQUEST_TIMEOUT = 2.0
SERVE_DEADLINE = 1.0
LIMIT = 4 << 20
PATH = "/hooks/modelcache/sync"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ("--request-timeout", str(REQUEST_TIMEOUT), "--max-request-bytes", str(LIMIT))
    with hooks_server(
        tmp_path_factory.mktemp("slow"), tls=True, workers=1, threads=2, extra_args=args
    ) as running:
        yield running


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.base_url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def _tls(server: RunningServer) -> socket.socket:
    context = server.ssl_context()
    assert context is not None
    return context.wrap_socket(
        socket.create_connection(_address(server), timeout=5), server_hostname="127.0.0.1"
    )


def _half_open(server: RunningServer, kind: int) -> socket.socket:
    """Three ways to stop half-way: nothing sent, half a ClientHello, a handshake then half a head."""
    if kind == 2:
        sock = _tls(server)
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Len".encode())
        return sock
    sock = socket.create_connection(_address(server), timeout=5)
    if kind == 1:
        sock.sendall(half_client_hello())
    return sock


def _timed_post(server: RunningServer, body: object) -> tuple[int, float]:
    started = time.monotonic()
    status, _ = post_json(server, "/admission/mutate-pod", body, timeout=5)
    return status, time.monotonic() - started


def _raw_exchange(server: RunningServer, head: bytes, body: bytes = b"") -> tuple[bytes, bytes]:
    """Send `head` (+ `body`, stopping quietly when the server closes) and return (status line, body)."""
    with _tls(server) as sock:
        sock.sendall(head)
        try:
            for start in range(0, len(body), 1 << 16):
                sock.sendall(body[start : start + (1 << 16)])
        except OSError:
            pass  # refused before the body: the server closed its side
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (OSError, ssl.SSLError):
            pass
    head_out, _, payload = answer.partition(b"\r\n\r\n")
    return head_out.split(b"\r\n", 1)[0], payload


def _worker_rss(server: RunningServer) -> int:
    """Resident KiB of the gunicorn worker (the master's only child besides none: workers=1)."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    assert children, "the worker process is gone"
    status = Path(f"/proc/{children[0]}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))


def test_half_open_tls_connections_do_not_stop_the_server(server: RunningServer) -> None:
    held = [_half_open(server, i % 3) for i in range(15)]
    try:
        for _ in range(5):
            status, took = _timed_post(server, {"kind": "AdmissionReview"})
            assert status in (200, 400)
            assert took < SERVE_DEADLINE, (
                f"an answer took {took:.2f}s behind {len(held)} half-open connections"
            )
        # Each half-open connection is closed by the server once its request deadline passes.
        deadline = time.monotonic() + REQUEST_TIMEOUT + 3
        for sock in held:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while sock.recv(4096):
                    pass  # a 408 answer, then end of stream
            except (ssl.SSLError, ConnectionResetError):
                pass
            assert time.monotonic() < deadline
    finally:
        for sock in held:
            sock.close()


def test_a_trickled_request_is_cut_at_its_deadline(server: RunningServer) -> None:
    with _tls(server) as sock:
        started = time.monotonic()
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\n".encode())
        sock.settimeout(0.5)
        answer = b""
        while time.monotonic() - started < REQUEST_TIMEOUT + 3:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # one header line every half second, forever
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                break
            if not chunk:
                break
            answer += chunk
        elapsed = time.monotonic() - started
    assert elapsed < REQUEST_TIMEOUT + 2.5
    assert answer.startswith(b"HTTP/1.1 408")


def test_an_oversize_body_gets_413_unread_and_the_worker_stays_small(server: RunningServer) -> None:
    before = _worker_rss(server)
    size = 100 << 20
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    )
    status, payload = _raw_exchange(server, head.encode(), b"[" + b"0," * (16 << 20))
    assert status.startswith(b"HTTP/1.1 413"), status
    message = json.loads(payload)["error"]
    assert str(size) in message and str(LIMIT) in message and "hooks.maxRequestBytes" in message
    assert _worker_rss(server) - before < 8 << 10, "the worker read the refused body"


def test_a_chunked_body_is_refused_with_411(server: RunningServer) -> None:
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    status, payload = _raw_exchange(server, head, b"5\r\nhello\r\n")
    assert status.startswith(b"HTTP/1.1 411")
    assert "Content-Length" in json.loads(payload)["error"]


def test_a_body_within_the_limit_is_answered(server: RunningServer) -> None:
    body = json.dumps({"parent": None, "pad": "x" * (LIMIT // 2)}).encode()
    status, answer = post_json(server, PATH, None, raw=body)
    assert status == 400 and "parent" in json.dumps(answer)  # read whole and judged by the hook


def test_one_large_body_at_a_time_per_worker_and_a_stalled_one_loses_its_turn(server: RunningServer) -> None:
    size = LIMIT - 1024
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()
    with _tls(server) as first:
        first.sendall(head + b"{")  # takes the worker's large-body turn, then stalls
        small_status, took = _timed_post(server, {"kind": "AdmissionReview"})
        assert small_status in (200, 400) and took < SERVE_DEADLINE  # small bodies never wait for it
        started = time.monotonic()
        status, payload = _raw_exchange(server, head, b"x" * size)  # waits its turn, then is read whole
        waited = time.monotonic() - started
        assert status.startswith(b"HTTP/1.1 400"), (status, payload)  # judged by the hook: not JSON
        assert BODY_GRACE * 0.8 <= waited < REQUEST_TIMEOUT, waited  # within its own deadline
        first.settimeout(5)
        answer = first.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert "bytes/s" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 10\r\nContent-Length: 11", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: 101", 413),
    ],
)
def test_body_length_refusals(head: bytes, status: int) -> None:
    with pytest.raises(Refused) as caught:
        body_length(head, 100)
    assert caught.value.status == status


def test_body_length_accepts_one_declared_length() -> None:
    assert body_length(b"POST / HTTP/1.1\r\nContent-Length: 100\r\ncontent-length: 100", 100) == 100
    assert body_length(b"GET /healthz HTTP/1.1\r\nHost: x", 100) == 0
