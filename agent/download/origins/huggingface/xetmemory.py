"""How many bytes of Xet xorb ranges the agent holds in memory at once, across all its downloads.

A file through Xet holds one fetched range at a time (a xorb's chunks, up to 64 MiB and a header
per chunk) and its decoded chunks until they are written. The engine runs up to `concurrency` (32)
work items at once and a node up to `maxParallelCaches` downloads, so without a bound a model of
many large Xet files (say 30 shards of 5 GB, whose every range is a whole 64 MiB xorb) would hold
tens of ranges at once, gigabytes, and the agent (512Mi limit) would be OOM-killed on every node
that fetches it. So every range is taken from one process-wide budget before it is fetched and
given back before the file's next one (assemble.py lets the previous range go first, so a file
waiting holds nothing and no two files can wait on each other). A range larger than the whole
budget still goes when nothing else is held. Measured (bench/xet_memory.py): 16 files of 64 MiB
through Xet peaked the process at +777 MiB unbounded; with this budget see docs/xet.md.
"""

from __future__ import annotations

import threading

from praesto.agent.download.api import DownloadCancelled
from praesto.agent.download.origins.huggingface.xet.limits import MAX_XORB_STORED_BYTES

# About 1.5 full xorb ranges: the Xet path's work is CPU-bound (decode, hash, chunk store), so
# more ranges at once add memory, not speed. Memory for it is about twice this (ranges and their
# decoded chunks).
RANGE_MEMORY_BYTES = MAX_XORB_STORED_BYTES * 3 // 2
WAIT_SLICE = 0.2  # seconds between looks at `cancel` while waiting


class RangeMemory:
    """A byte budget: `take(n)` waits until n fits (or nothing is held), `give(n)` returns it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (for tests and the bench)
        self._cond = threading.Condition()

    def take(self, n: int, cancel: threading.Event) -> int:
        with self._cond:
            while self.held and self.held + n > self.limit:
                if cancel.is_set():
                    raise DownloadCancelled()
                self._cond.wait(WAIT_SLICE)
            self.held += n
            self.peak = max(self.peak, self.held)
            return n

    def give(self, n: int) -> None:
        if n:
            with self._cond:
                self.held -= n
                self._cond.notify_all()


RANGES = RangeMemory(RANGE_MEMORY_BYTES)  # the agent's one budget (one process: one agent)
