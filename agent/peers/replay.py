"""A peer request is answered once: its time must be near this node's clock, its nonce new.

A request's time (protocol.TIME_HEADER, signed) must lie within `WINDOW_SECONDS` of this node's
clock. ±30 s: nodes kept by NTP agree within milliseconds, and a request is signed just before it
is sent (at most a connect timeout, 5 s, before its head arrives), so 30 s leaves a clock 25 s off
working, while the memory below stays half of what ±60 s would need. A nonce is remembered until
its request's time leaves the window, so a replay is refused by one rule or the other, and a nonce
needs looking up only among requests signed in the same second (a replay carries the same time).

Bound: `capacity` nonces (`MAX_NONCES`), each about 112 bytes (a 16-byte digest of key and
nonce in a set: 14 MiB at the cap, measured by tests/peers/test_peer_replay.py). A nonce stays
for at most its window, 30 s for synced clocks (60 s for a clock 30 s fast), so the cap holds 4,369 requests/s
sustained on synced clocks, 2,184/s at worst. Beyond, the request is refused with 503 and
Retry-After (the asker tries another peer or the origin), never remembered by growing.

A restarted agent has forgotten the nonces its last process saw: requests signed before this
process started get 503 (retry: a new signature is new), so none accepted then is accepted again.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from praesto.agent.peers.protocol import TIME_HEADER, Refused

WINDOW_SECONDS = 30.0
MAX_NONCES = 1 << 17


class Nonces:
    """`check_time(stamp)` before any work; `remember(key, nonce, stamp)` once signature and token
    are good (so only an agent's own requests take room here)."""

    def __init__(
        self,
        *,
        window: float = WINDOW_SECONDS,
        capacity: int = MAX_NONCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_ms = int(window * 1000)
        self.capacity = capacity
        self.clock = clock
        self.started = int(clock() * 1000)  # ms: requests signed before it may have been seen already
        self._lock = threading.Lock()
        self._seen: dict[int, set[bytes]] = {}  # second of the signed time -> digests of (key, nonce)
        self._count = 0
        self.replayed = 0  # refused as seen (tests, metrics)
        self.full = 0  # refused with the memory full

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def check_time(self, stamp: int) -> None:
        """Raise `Refused` (401) unless a request signed at `stamp` (ms) is within the window now."""
        now = int(self.clock() * 1000)
        if abs(now - stamp) > self.window_ms:
            raise Refused(
                401,
                f"{TIME_HEADER}: signed {(stamp - now) / 1000:+.0f} s from this node's clock, beyond "
                f"±{self.window_ms // 1000} s: a replayed request, or a node clock off (check NTP on both)",
            )

    def remember(self, key: bytes, nonce: bytes, stamp: int) -> None:
        """Record the nonce; raise `Refused` (401) if it was seen, (503) if the memory is full or the
        request was signed before this server started."""
        if stamp < self.started:
            raise Refused(503, "signed before this peer server started (it cannot tell a replay); retry")
        digest = hashlib.blake2b(key + nonce, digest_size=16).digest()
        second = stamp // 1000
        with self._lock:
            if digest in self._seen.get(second, ()):
                self.replayed += 1
                raise Refused(401, "this request was answered already (nonce seen): a replay is not served")
            now = int(self.clock() * 1000)
            if second not in self._seen or self._count >= self.capacity:
                self._forget(now)
            if self._count >= self.capacity:
                self.full += 1
                raise Refused(503, "too many peer requests on this node just now; retry")
            if (second + 1) * 1000 + self.window_ms > now:  # else its time has left: replays are stale
                self._seen.setdefault(second, set()).add(digest)
                self._count += 1

    def _forget(self, now: int) -> None:
        """Drop every second whose requests' times have all left the window (lock held)."""
        for second in [s for s in self._seen if (s + 1) * 1000 + self.window_ms <= now]:
            self._count -= len(self._seen.pop(second))
