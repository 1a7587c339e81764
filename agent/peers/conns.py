"""The peer server's open connections: a node-wide cap, a cap per client address, and a deadline
on each connection that one reaper thread enforces.

A socket timeout bounds only one read or write, so a client that trickles a byte
now and then (one every 1.5 s) keeps a connection, and its thread, forever. Here
every connection has a deadline for what it is doing now (server.py sets it):
reading a request head must end within `Limits.request_seconds` of its start, and
sending a response within a time its size allows at the slowest rate accepted.
When it passes, the reaper shuts the socket down: the handler thread blocked on
it wakes and the connection ends, however the client paces its bytes.

`admit` refuses a connection beyond `max_connections`, or beyond
`max_connections_per_client` from one client address, so a few slow clients of
one Pod cannot take the whole cap from the other peers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("praesto.peers")

TOTAL = "total"  # admit(): the node-wide cap is reached
PER_CLIENT = "per-client"  # admit(): this client address holds its share already


@dataclass
class _Open:
    client: str
    deadline: float | None = None
    doing: str = ""  # what the deadline is for, for the log
    cut: bool = False  # the reaper shut it down


class Connections:
    """`admit` / `release` each socket; `expect` gives it a deadline; `start` runs the reaper."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._open: dict[socket.socket, _Open] = {}
        self._per_client: dict[str, int] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.refused_total = 0  # beyond max_total
        self.refused_client = 0  # beyond max_per_client
        self.reaped = 0  # shut down at their deadline

    def __len__(self) -> int:
        with self._cond:
            return len(self._open)

    def of(self, client: str) -> int:
        """Open connections from `client`."""
        with self._cond:
            return self._per_client.get(client, 0)

    def admit(self, sock: socket.socket, client: str) -> str | None:
        """Register `sock`, or say which cap refuses it (`TOTAL`, `PER_CLIENT`)."""
        with self._cond:
            # A client already at its share is told so first: the answer names its own excess
            # (429, its flag), whatever else happens to be open on the node at that instant.
            if self._per_client.get(client, 0) >= self.max_per_client:
                self.refused_client += 1
                return PER_CLIENT
            if len(self._open) >= self.max_total:
                self.refused_total += 1
                return TOTAL
            self._open[sock] = _Open(client)
            self._per_client[client] = self._per_client.get(client, 0) + 1
            return None

    def release(self, sock: socket.socket) -> None:
        with self._cond:
            found = self._open.pop(sock, None)
            if found is not None:
                left = self._per_client[found.client] - 1
                if left:
                    self._per_client[found.client] = left
                else:
                    del self._per_client[found.client]

    def expect(self, sock: socket.socket, seconds: float | None, doing: str = "") -> None:
        """`sock` must be done with what it does now within `seconds` (None: no deadline)."""
        with self._cond:
            found = self._open.get(sock)
            if found is None:
                return
            found.deadline = None if seconds is None else time.monotonic() + seconds
            found.doing = doing
            self._cond.notify()

    def timed_out(self, sock: socket.socket) -> bool:
        """Whether the reaper has cut `sock` at a deadline."""
        with self._cond:
            found = self._open.get(sock)
            return found is not None and found.cut

    def take_all(self) -> list[socket.socket]:
        """Forget every connection and return them (the server is stopping)."""
        with self._cond:
            socks = list(self._open)
            self._open.clear()
            self._per_client.clear()
            return socks

    def start(self) -> None:
        self._thread = threading.Thread(target=self._reap, name="praesto-peer-deadlines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5)

    def _reap(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                due = [(s, o) for s, o in self._open.items() if o.deadline is not None and o.deadline <= now]
                for sock, found in due:
                    found.deadline, found.cut = None, True
                    self.reaped += 1
                    log.info(
                        f"peer {found.client}: {found.doing or 'connection'} not done by its deadline; closed"
                    )
                    with contextlib.suppress(OSError):  # wakes the handler thread blocked on it
                        sock.shutdown(socket.SHUT_RDWR)
                pending = [o.deadline for o in self._open.values() if o.deadline is not None]
                self._cond.wait(max(0.0, min(pending) - now) + 0.01 if pending else None)


def refusal(refused: str, client: str, per_client: int) -> bytes:
    """The whole answer to a connection `admit` refused: 429 for its client's share, else 503."""
    if refused == PER_CLIENT:
        status, retry = "429 Too Many Requests", 5
        error = (
            f"connection limit per client reached: {client} holds {per_client} connections to this node "
            "(--peer-max-connections-per-client); reuse or close them, or try another peer"
        )
    else:
        status, retry = "503 Service Unavailable", 1
        error = "connection limit reached on this node; try another peer"
    body = json.dumps({"error": error}).encode()
    head = f"HTTP/1.1 {status}\r\nRetry-After: {retry}\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body
