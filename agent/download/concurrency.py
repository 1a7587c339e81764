"""How many parts a download fetches at once, and the CPU meter that tells it when more cannot help.

Kept apart from the engine that obeys it: a pure policy over rates and a clock, tested with a fake
clock (tests/download/test_download_flow.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("praesto.download")
START_CONNECTIONS = 4  # parts in flight at first: enough to keep 2 cores busy on a fast origin
SLOW_CONNECTION = 64e6  # bytes/s: a connection slower than this may be capped by the origin
RATE_WINDOW = 0.3  # seconds over which rates are judged
WIDEN_GAIN = 1.3  # doubling the connections must raise the total rate this much to be kept
BUSY_CPU = 0.8  # this process uses more of its CPUs than this: more connections cannot help
SETTLE_SECONDS = (
    5.0  # a settled PartConcurrency may probe again after this: one window's verdict can be noise
)


class OwnCpuMeter:
    """The share of the CPUs this process may use that it did use, between calls.

    The process's own CPU time (every thread: downloads, hashing, the agent's other work), not
    the machine's: a node whose CPUs are busy with a model server or a compiler still gains from
    more connections to an origin that caps each one (#24 item 5: a machine-wide meter once left
    such a download at half speed). The CPUs it may use are its affinity mask, bounded by its
    cgroup's `cpu.max` quota (a container's CPU limit).
    """

    def __init__(
        self,
        cpu_time: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        cpus: float | None = None,
    ) -> None:
        self.cpu_time, self.clock = cpu_time, clock
        self.cpus = cpus if cpus is not None else usable_cpus()
        self._last = (self.clock(), self.cpu_time())

    def __call__(self) -> float:
        now = (self.clock(), self.cpu_time())
        last, self._last = self._last, now
        wall = now[0] - last[0]
        if wall <= 0 or self.cpus <= 0:
            return 0.0
        return max(0.0, (now[1] - last[1]) / (wall * self.cpus))


def usable_cpus(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> float:
    """CPUs this process may run on: its affinity mask, bounded by a cgroup v2 quota if one is set."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path(cgroup_cpu_max).read_text().split()[:2]
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity mask is the bound
    return cpus


class PartConcurrency:
    """How many parts are fetched at once: starts at `start`, doubles towards `limit` while that pays.

    Why not always `limit`: on a fast origin a few connections already saturate the CPU,
    and every extra one costs CPU per byte: its parts of a file arrive ahead of that
    file's hashing frontier, so they are held or re-read from disk to be hashed in order,
    and more sockets mean more wake-ups (bench/download_bench.py). A connection slower
    than `slow` bytes/s suggests the origin caps each connection (a CDN), where more
    connections mean more bytes/s: the limit doubles, and the next window checks that
    the total rate rose by WIDEN_GAIN; if not (the CPU, disk or link is the limit, not
    the connections) it halves back and settles. Before doubling it also asks `busy`
    (this process's share of its CPUs over the window, `OwnCpuMeter`): when the download
    itself keeps its CPUs nearly all busy, slow connections mean the CPU is the limit
    (loopback, a small node), not the origin, and it
    settles where it is.

    The first window after the start is not judged (connections are starting, and a
    capped origin sends each request's first bytes in a burst, which inflated the rate
    the first doubling was compared with), and settling lasts SETTLE_SECONDS, not for
    good: a wrong verdict held for the whole download once left a capped origin at half
    its connections (bench/p2p_bench.py seeders took 45-52 s instead of 27 s in about
    one run in ten). Longer windows, or skipping one after every doubling, were steadier
    but slowed the climb on a capped origin (download_bench capped: 0.77x aria2c).
    """

    def __init__(
        self,
        start: int,
        limit: int,
        slow: float = SLOW_CONNECTION,
        clock: Callable[[], float] = time.monotonic,
        busy: Callable[[], float] | None = None,
    ) -> None:
        self.clock = clock
        self.busy = busy
        self.limit = max(1, limit)
        self.allowed = min(self.limit, max(1, start))
        self.peak = self.allowed  # the most parts ever allowed in flight (reported, tested)
        self.slow = slow
        self.active = 0
        self._settled_until = float("-inf")
        self._mark: tuple[float, int] | None = None  # (time, total bytes) at the last judgement
        self._probe: float | None = None  # total rate before the last doubling, until judged
        self._ramping = False  # the first window after the start: connections still starting
        self._cond = threading.Condition()

    @property
    def settled(self) -> bool:
        return self.clock() < self._settled_until

    def _settle(self) -> None:
        self._settled_until = self.clock() + SETTLE_SECONDS

    def mark(self, done: int) -> None:
        """Start measuring the total rate now, at `done` bytes (resumed bytes are not a rate)."""
        with self._cond:
            self._mark = (self.clock(), done)
            self._ramping = True  # connections starting: a CDN's first bytes of a request come in a burst

    def enter(self) -> None:
        with self._cond:
            while self.active >= self.allowed:
                self._cond.wait()
            self.active += 1

    def leave(self) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify()

    def observe(self, conn_bytes: int, conn_seconds: float, done: int) -> None:
        """One connection moved `conn_bytes` in `conn_seconds`; `done` bytes are done in total."""
        if self.settled or (self._probe is None and conn_bytes >= self.slow * conn_seconds):
            return
        now = self.clock()
        with self._cond:
            if self._mark is None:
                self._mark = (now, done)
                return
            if now - self._mark[0] < RATE_WINDOW * 0.999:
                return
            rate = (done - self._mark[1]) / (now - self._mark[0])
            self._mark = (now, done)
            if self._ramping:
                self._ramping = False
                return
            if self._probe is not None:
                before, self._probe = self._probe, None
                if rate < before * WIDEN_GAIN:
                    self.allowed = max(1, self.allowed // 2)
                    self._settle()
                    log.debug(
                        "%.0f MB/s did not rise with more connections: %d in flight", rate / 1e6, self.allowed
                    )
                    return
            cpu = self.busy() if self.busy is not None else 0.0
            if self.allowed >= self.limit or conn_bytes >= self.slow * conn_seconds:
                return
            if cpu > BUSY_CPU:
                self._settle()
                log.debug("own CPU use %.0f%%: %d in flight is the most that pays", cpu * 100, self.allowed)
                return
            self._probe = rate
            self.allowed = min(self.limit, self.allowed * 2)
            self.peak = max(self.peak, self.allowed)
            self._cond.notify_all()
        log.debug(
            "connection at %.1f MB/s: trying %d in flight", conn_bytes / conn_seconds / 1e6, self.allowed
        )
