"""client-go's rate-limited work queue, as Metacontroller's controllers use it (`k8s.io/client-go/util/workqueue`).

A key is queued at most once however often it is added; a key being processed
is not handed to a second worker, and adding it meanwhile queues it once more
after `done`. `add_after` delays an add (`resyncAfterSeconds`); `add_rate_limited`
retries a failed key with the default controller backoff, per item 5 ms
doubling to 1000 s (`DefaultTypedControllerRateLimiter`), reset by `forget`.

Beyond client-go, for tests: every add names its reason, and `get` returns the
reasons gathered since the key was last taken (why a pass ran).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque

BASE_DELAY, MAX_DELAY = 0.005, 1000.0


class ShutDown(Exception):
    """The queue was shut down: the worker ends."""


class WorkQueue:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._reasons: dict[str, list[str]] = {}
        self._waiting: list[tuple[float, int, str, str]] = []  # (ready at, tie-breaker, key, reason)
        self._failures: dict[str, int] = {}
        self._counter = 0
        self._shut = False

    def add(self, key: str, reason: str) -> None:
        with self._lock:
            self._add(key, reason)

    def depth(self) -> int:
        """Keys ready and waiting for a worker (client-go's `workqueue_depth`)."""
        with self._lock:
            return len(self._queue)

    def _add(self, key: str, reason: str) -> None:
        if self._shut:
            return
        self._reasons.setdefault(key, []).append(reason)
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._lock.notify()

    def add_after(self, key: str, delay: float, reason: str) -> None:
        if delay <= 0:
            self.add(key, reason)
            return
        with self._lock:
            self._counter += 1
            heapq.heappush(self._waiting, (time.monotonic() + delay, self._counter, key, reason))
            self._lock.notify()

    def add_rate_limited(self, key: str, reason: str) -> None:
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        self.add_after(key, min(BASE_DELAY * 2**failures, MAX_DELAY), reason)

    def forget(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def get(self) -> tuple[str, list[str]]:
        """The next key and why it was queued; blocks; ShutDown once the queue is shut down."""
        with self._lock:
            while True:
                if self._shut:
                    raise ShutDown
                now = time.monotonic()
                while self._waiting and self._waiting[0][0] <= now:
                    _, _, key, reason = heapq.heappop(self._waiting)
                    self._add(key, reason)
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key, self._reasons.pop(key, [])
                timeout = self._waiting[0][0] - now if self._waiting else None
                self._lock.wait(timeout)

    def done(self, key: str) -> None:
        with self._lock:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._lock.notify()

    def shut_down(self) -> None:
        with self._lock:
            self._shut = True
            self._lock.notify_all()
