"""Ports for the processes tests and benches start, then poll until they listen: the one helper.

A port the kernel hands out (bind to port 0) is in its ephemeral range. Until the process under
test binds it, a client polling it from 127.0.0.1 is given an ephemeral source port too, and when
the two are equal Linux connects the socket to itself (TCP simultaneous open): the client reads
its own request back (`BadStatusLine: GET /healthz HTTP/1.1`, seen once in CI) and the process
can no longer bind. A port outside the ephemeral range is never a source port, so that cannot
happen; it is picked at random so parallel test workers rarely pick the same one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_RANGE = (32768, 60999)
LOWEST = 10000  # below: well-known and registered services a machine may run
ATTEMPTS = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's source-port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE
    return low, high


def free_port(host: str = "0.0.0.0") -> int:
    """A port nothing listens on now and the kernel never uses as a source port."""
    low, high = ephemeral_range()
    chooser = random.SystemRandom()
    for _ in range(ATTEMPTS):
        port = chooser.randrange(LOWEST, 65536)
        if low <= port <= high:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port outside the ephemeral range {low}-{high} after {ATTEMPTS} tries")
