"""Prewarm: read a Ready cache's files into the page cache before the model server does.

When a Pod mounts a cache whose ModelCache sets `spec.prewarm: true`, the node
agent reads the copy's files once, in the background, so the model server's
own load (seconds later, after its image and runtime start) finds them in
memory instead of on disk. It never blocks the mount, stops when asked
(agent shutdown) and reads at most a memory budget:

* the node's MemAvailable: reading more than fits only pushes out what was
  read first;
* the agent container's own memory limit: page cache is charged to the cgroup
  of the process that reads it, so pages beyond the agent's limit are
  reclaimed from the agent again. With the chart's default limit only that
  much stays warm; `nodeAgent.resources.limits.memory` bounds prewarm.

Files are read in the manifest's path order (config and tokenizer first, then
the shards in their numbered order, as loaders read them), each with
POSIX_FADV_SEQUENTIAL and one reused buffer, so the cost is the disk reads plus
one memcpy per byte.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from praesto import names, store

CHUNK = 4 << 20
SHARE = 0.8  # of the smaller memory bound: leave room for everything else
CGROUP = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class PrewarmResult:
    bytes_read: int
    bytes_total: int
    seconds: float
    stopped: str = ""  # "", "budget" or "cancelled"


def cache_files(cache_dir: Path) -> list[tuple[str, int]]:
    """(relative path, size) of a complete copy's model files, from its manifest, in path order."""
    manifest = store.read_json(cache_dir / names.MANIFEST_FILE) or {}
    out = []
    for entry in manifest.get("files") or []:
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("size"), int)
        ):
            out.append((entry["path"], entry["size"]))
    return sorted(out)


def _read_int(path: Path, key: str | None = None) -> int | None:
    """An integer file (`memory.max`) or one `key value` line of a stat file; None when unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if key is None:
        value = text.strip()
        return _UNLIMITED if value == "max" else int(value) if value.isdigit() else None
    for line in text.splitlines():
        fields = line.split()  # "anon 1234" (memory.stat), "MemAvailable:   8388608 kB" (meminfo)
        if len(fields) >= 2 and fields[0] == key and fields[1].isdigit():
            return int(fields[1])
    return None


def memory_budget(cgroup: Path = CGROUP, meminfo: Path = MEMINFO) -> int | None:
    """Bytes prewarm may read: a share of the smaller of MemAvailable and this cgroup's room; None: no bound known."""
    bounds = []
    available = _read_int(meminfo, "MemAvailable:")
    if available is not None:
        bounds.append(available * 1024)  # kB
    for limit_file, stat_key in (
        (cgroup / "memory.max", "anon"),  # cgroup v2
        (cgroup / "memory" / "memory.limit_in_bytes", "total_rss"),  # cgroup v1
    ):
        limit = _read_int(limit_file)
        if limit is not None and limit < _UNLIMITED:
            used = _read_int(limit_file.with_name("memory.stat"), stat_key) or 0
            bounds.append(max(0, limit - used))
            break
    return int(min(bounds) * SHARE) if bounds else None


def prewarm(
    cache_dir: Path, cancel: threading.Event, budget: int | None = None, chunk: int = CHUNK
) -> PrewarmResult:
    """Read the copy's files once (into the page cache) until done, over `budget`, or cancelled."""
    started = time.monotonic()
    files = cache_files(cache_dir)
    total = sum(size for _, size in files)
    buffer = bytearray(min(chunk, max(total, 1)))
    view = memoryview(buffer)
    done = 0
    for rel, _size in files:
        try:
            fd = os.open(cache_dir / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # evicted meanwhile, or not a plain file: nothing to warm
        try:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while True:
                if cancel.is_set():
                    return PrewarmResult(done, total, time.monotonic() - started, "cancelled")
                if budget is not None and done >= budget:
                    return PrewarmResult(done, total, time.monotonic() - started, "budget")
                got = os.readv(fd, [view])
                if got <= 0:
                    break
                done += got
        finally:
            os.close(fd)
    return PrewarmResult(done, total, time.monotonic() - started)


class Prewarmer:
    """At most one prewarm per cache at a time, each on its own daemon thread; `stop()` cancels all."""

    def __init__(self, budget: Callable[[], int | None] = memory_budget) -> None:
        self._budget = budget
        self._cancel = threading.Event()
        self._guard = threading.Lock()
        self._running: dict[tuple[str, str], threading.Thread] = {}

    def start(self, key: tuple[str, str], cache_dir: Path, done: Callable[[PrewarmResult], None]) -> bool:
        """Begin prewarming `cache_dir` unless this cache is being prewarmed already."""
        with self._guard:
            if self._cancel.is_set() or key in self._running:
                return False
            thread = threading.Thread(
                target=self._run, args=(key, cache_dir, done), name=f"praesto-prewarm-{key[1]}", daemon=True
            )
            self._running[key] = thread
        thread.start()
        return True

    def _run(self, key: tuple[str, str], cache_dir: Path, done: Callable[[PrewarmResult], None]) -> None:
        try:
            done(prewarm(cache_dir, self._cancel, self._budget()))
        finally:
            with self._guard:
                self._running.pop(key, None)

    def busy(self) -> bool:
        with self._guard:
            return bool(self._running)

    def stop(self, timeout: float = 5.0) -> None:
        self._cancel.set()
        with self._guard:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout)
