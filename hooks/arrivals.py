"""Who may keep a praesto-hooks worker busy while a request is still arriving (pure: no sockets, no clock).

`hooks/serving/whole_request_worker.py` reads every request on the worker's event loop before a thread sees
it. What a client holds there is bounded here, per worker and per client address (#37 item 5):

* `Arrivals`: incomplete connections ordered by when each last sent a byte. One address may hold
  `per_client` of them, the worker `connections` (gunicorn's worker_connections) and `buffered`
  bytes; at a bound the connection silent the longest is closed to make room, so a flood of
  half-open connections never stops the worker from accepting `/healthz` or a sync.
* `LargeBodyTurns`: one body over SMALL_BODY is read and parsed at a time per worker (memory);
  the others wait for their turn, which goes round the client addresses (a flood from one
  address gets one turn in two, not all of them).
* `body_due`: a body holding the turn must keep arriving, or it loses the turn (a client that
  declares 16 MiB and sends nothing held it for the whole request deadline before).

The Metacontroller and the API server each call from a few addresses with many requests at once:
their connections finish in milliseconds, so they are never the ones silent the longest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

BODY_GRACE = 0.5  # seconds from its turn to a large body's first bytes (a TCP retransmission fits)
MAX_TURN_MEMORY = 4096  # client addresses whose last turn is remembered (the oldest are forgotten)


@dataclass(frozen=True)
class ArrivalLimits:
    per_client: int  # incomplete connections one client address may hold in a worker
    connections: int  # every connection of the worker (gunicorn's worker_connections)
    buffered: int  # bytes of incomplete requests a worker holds (the large body on its turn aside)


def body_due(turn_started: float, body_received: int, min_rate: int) -> float:
    """When a large body on its turn is late: each byte received buys 1/min_rate seconds after the grace."""
    return turn_started + BODY_GRACE + body_received / min_rate


class Arrivals(Generic[T]):
    """Incomplete connections, least recently active first, overall and per client address."""

    def __init__(self, limits: ArrivalLimits) -> None:
        self.limits = limits
        self.order: dict[T, None] = {}  # insertion order = activity order: the first is the silent longest
        self.by_client: dict[str, dict[T, None]] = {}
        self.client_of: dict[T, str] = {}
        self.bytes_of: dict[T, int] = {}
        self.buffered = 0

    def __len__(self) -> int:
        return len(self.order)

    def add(self, item: T, client: str) -> None:
        self.order[item] = None
        self.by_client.setdefault(client, {})[item] = None
        self.client_of[item], self.bytes_of[item] = client, 0

    def touch(self, item: T, buffered: int) -> None:
        """`item` just sent bytes and now holds `buffered` of them: it becomes the most recently active."""
        if item not in self.order:
            return
        client = self.client_of[item]
        del self.order[item], self.by_client[client][item]
        self.order[item] = None
        self.by_client[client][item] = None
        self.buffered += buffered - self.bytes_of[item]
        self.bytes_of[item] = buffered

    def remove(self, item: T) -> None:
        if item not in self.order:
            return
        client = self.client_of.pop(item)
        del self.order[item], self.by_client[client][item]
        if not self.by_client[client]:
            del self.by_client[client]
        self.buffered -= self.bytes_of.pop(item)

    def count(self, client: str) -> int:
        return len(self.by_client.get(client, ()))

    def victim(self, client: str | None, open_connections: int) -> tuple[T, str] | None:
        """The connection to close to stay within the limits, and why (None: within them).
        `client`: an address that just opened a connection; `open_connections`: the worker's."""
        peers = self.by_client.get(client, {}) if client is not None else {}
        if len(peers) > self.limits.per_client:
            return next(iter(peers)), "client"
        if self.order and open_connections >= self.limits.connections:
            return next(iter(self.order)), "connections"
        if self.order and self.buffered > self.limits.buffered:
            return next(iter(self.order)), "bytes"
        return None


class LargeBodyTurns(Generic[T]):
    """One holder at a time; waiting items are served by client address, the one served longest ago first."""

    def __init__(self) -> None:
        self.holder: T | None = None
        self.waiting: dict[str, deque[T]] = {}
        self.last_turn: dict[str, int] = {}  # client -> serial of its last turn
        self.serial = 0

    def ask(self, item: T, client: str) -> bool:
        """True: `item` holds the turn now; False: it waits (see `release`)."""
        if self.holder is None:
            self._give(item, client)
            return True
        self.waiting.setdefault(client, deque()).append(item)
        return False

    def withdraw(self, item: T, client: str) -> None:
        queue = self.waiting.get(client)
        if queue is not None and item in queue:
            queue.remove(item)
            if not queue:
                del self.waiting[client]

    def release(self) -> T | None:
        """The holder is done: the next holder (now holding the turn), if any waits."""
        self.holder = None
        if not self.waiting:
            return None
        client = min(self.waiting, key=lambda c: self.last_turn.get(c, -1))
        queue = self.waiting[client]
        item = queue.popleft()
        if not queue:
            del self.waiting[client]
        self._give(item, client)
        return item

    def _give(self, item: T, client: str) -> None:
        self.holder = item
        self.last_turn.pop(client, None)
        self.last_turn[client] = self.serial  # re-inserted: the dict stays in turn order
        self.serial += 1
        while len(self.last_turn) > MAX_TURN_MEMORY:  # forgotten ones were served longest ago anyway
            del self.last_turn[next(iter(self.last_turn))]
