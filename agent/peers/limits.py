"""What one node's peer server gives other nodes at most: the defaults here are the only ones
(the `--peer-*` flags and the chart's `nodeAgent.peers` values default to them; a chart test
keeps the values equal)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_uploads: int = 8  # concurrent file responses (Xet chunk answers: half as many more); more get 503
    rate: int = 0  # bytes/s over all uploads of this node; 0 = unlimited
    max_connections: int = 128  # open connections; more are answered 503 and closed, no thread
    # open connections from one client address; more get 429. One agent opens at most one per
    # download thread (--concurrency 8 x --max-parallel-caches 2) and one asking /parts
    max_connections_per_client: int = 24
    idle_seconds: float = 30.0  # a socket that sends or takes nothing this long is closed
    # a request head (request line and headers; the server reads no bodies) must arrive whole
    # within this long of the connection waiting for it, however its bytes are paced
    request_seconds: float = 10.0
    # a response must go out at least this fast on average (bytes/s), after `idle_seconds` of
    # grace; time this node's own `rate` makes it wait does not count against the asker
    min_send_rate: int = 256 << 10

    def send_seconds(self, size: int) -> float | None:
        """How long a response of `size` bytes may take to send (None: no bound)."""
        if self.min_send_rate <= 0:
            return None
        return self.idle_seconds + size / self.min_send_rate


class RateLimiter:
    """Node-wide token bucket: `take(n)` returns how many bytes may go now (waits if none)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        """Waits until a whole chunk (`want`, at most a 20th of a second's worth) may go: never a
        trickle of tiny sends, each a system call, when the bucket runs dry."""
        if self.rate <= 0:
            return want
        chunk = max(1, min(want, self.rate // 20))
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= chunk:
                    self._tokens -= chunk
                    return chunk
                wait = (chunk - self._tokens) / self.rate
            time.sleep(max(wait, 0.001))
