"""Which cap refuses a connection (agent/peers/conns.py), over real socket objects."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from praesto.agent.peers.conns import PER_CLIENT, TOTAL, Connections


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    yield made
    for sock in made:
        sock.close()


def _admit(conns: Connections, client: str, made: list[socket.socket]) -> str | None:
    sock = socket.socket()
    made.append(sock)
    return conns.admit(sock, client)


def test_a_client_at_its_share_is_told_429_even_while_the_node_is_full(sockets: list[socket.socket]) -> None:
    """A race once answered a greedy client 503 'node full' when another peer's connection had
    not been released yet: the client at its share must hear about its own share."""
    conns = Connections(max_total=3, max_per_client=2)
    assert [_admit(conns, "greedy", sockets) for _ in range(2)] == [None, None]
    assert _admit(conns, "other", sockets) is None  # the node is now full
    assert _admit(conns, "greedy", sockets) == PER_CLIENT
    assert _admit(conns, "third", sockets) == TOTAL  # under its share, refused by the node cap
    assert (conns.refused_client, conns.refused_total) == (1, 1)


def test_release_frees_both_the_node_slot_and_the_clients_share(sockets: list[socket.socket]) -> None:
    conns = Connections(max_total=2, max_per_client=1)
    assert _admit(conns, "a", sockets) is None
    assert _admit(conns, "a", sockets) == PER_CLIENT
    conns.release(sockets[0])
    assert (len(conns), conns.of("a")) == (0, 0)
    assert _admit(conns, "a", sockets) is None
