"""testkit/ports.py: a port to poll is never one the kernel could pick as the poller's source port."""

from __future__ import annotations

import socket

from testkit.ports import ephemeral_range, free_port


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert not low <= port <= high
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_in_use_is_not_handed_out() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(free_port() != taken for _ in range(200))
