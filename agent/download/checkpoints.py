"""The thread that checkpoints a download beside its fetch threads.

A checkpoint (engine.py `_checkpoint`) fdatasyncs the files with newly completed parts,
then journals them: what a resumed run trusts. It waits for the disk, and on a disk
shared with other writers for their data too (ext4's ordered-mode journal commit
flushes every file's pending blocks), so it must not run on a fetch thread: a
connection that waited on it started its next part late (bench/p2p_bench.py: eight
agents on one disk slowed the seeder's capped origin connections).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Checkpointer:
    """Calls `checkpoint` after parts complete (`due`), at most every `interval` seconds, on its own
    thread; `stop` ends it (the caller then checkpoints once more, for the last parts). An error of
    `checkpoint` (the journal's disk failed) goes to `failed` and ends the thread."""

    def __init__(
        self, checkpoint: Callable[[], None], interval: float, failed: Callable[[BaseException], None]
    ) -> None:
        self.checkpoint, self.interval, self.failed = checkpoint, interval, failed
        self._due = threading.Event()  # a part completed since the last checkpoint
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="praesto-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def due(self) -> None:
        self._due.set()

    def stop(self) -> None:
        self._stopping.set()
        self._due.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            self._due.wait()
            if self._stopping.is_set():
                return
            self._due.clear()
            try:
                self.checkpoint()
            except BaseException as error:
                self.failed(error)
                return
            if self._stopping.wait(self.interval):
                return
