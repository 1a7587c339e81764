"""In-order hashing of a file whose byte ranges arrive out of order, without a second pass.

sha256 (and git's blob sha1) can only consume bytes in order. Parts of one file arrive
in parallel, so each chunk is offered here right after it is written: a chunk at the
"frontier" is hashed straight from the network buffer; a chunk ahead of it is kept in
memory while a shared budget allows, otherwise only its location is remembered and it
is read back (from the page cache, normally) when the frontier reaches it. Parts
resumed from an earlier run are such "on disk" ranges too, so only they are re-read.
"""

from __future__ import annotations

import hashlib
import os
import threading

from praesto.agent.download.digests import RunningDigest


class MemoryBudget:
    """Bytes of out-of-order chunks all files may hold together; keeps peak RSS bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class StreamHasher:
    READ_BACK = 1 << 20

    def __init__(self, fd: int, size: int, budget: MemoryBudget, second: RunningDigest | None = None) -> None:
        self.fd = fd
        self.size = size
        self.budget = budget
        self.sha256 = hashlib.sha256()
        self.second = second  # what checks the origin's digest when it is not a sha256 (RemoteFile)
        self.frontier = 0
        self.read_back = 0  # bytes hashed from disk rather than from memory
        self._held: dict[int, bytes] = {}  # offset -> bytes, out of order, in memory
        self._on_disk: dict[int, int] = {}  # offset -> length, written but not held
        self._busy = False  # one thread advances the frontier at a time
        self._lock = threading.Condition()

    def _update(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        if self.second is not None:
            self.second.update(data)

    def add_on_disk(self, offset: int, length: int) -> None:
        """A range already written (resumed part): hash it from disk when its turn comes."""
        with self._lock:
            self._on_disk[offset] = length

    def feed(self, offset: int, chunk: memoryview) -> None:
        """`chunk` was just written at `offset`; it is only valid during this call."""
        with self._lock:
            if offset == self.frontier and not self._busy:
                self._busy = True
                direct = True
            else:
                direct = False
                if self.budget.take(len(chunk)):
                    self._held[offset] = bytes(chunk)
                else:
                    self._on_disk[offset] = len(chunk)
                if self._busy:
                    return
                self._busy = True
        try:
            if direct:
                self._update(chunk)
                with self._lock:
                    self.frontier += len(chunk)
            self._advance()
        except BaseException:
            with self._lock:
                self._busy = False
                self._lock.notify_all()
            raise

    def _advance(self) -> None:
        """Hash whatever is contiguous at the frontier; called with _busy held by this thread."""
        while True:
            with self._lock:
                at = self.frontier
                data = self._held.pop(at, None)
                length = len(data) if data is not None else self._on_disk.pop(at, 0)
                if data is None and not length:
                    self._busy = False
                    self._lock.notify_all()
                    return
            if data is not None:
                self._update(data)
                self.budget.give(len(data))
            else:
                done = 0
                while done < length:
                    piece = os.pread(self.fd, min(self.READ_BACK, length - done), at + done)
                    if not piece:
                        raise OSError(f"short read at {at + done} while hashing")
                    self._update(piece)
                    done += len(piece)
                self.read_back += length
            with self._lock:
                self.frontier = at + length

    def finish(self) -> tuple[str, str | None]:
        """(sha256, the second digest) once every byte was fed; raises if a range is missing."""
        with self._lock:
            while self._busy:  # another thread is still hashing its last chunks
                self._lock.wait()
            self._busy = True
        self._advance()
        if self.frontier != self.size:
            raise OSError(f"hashed {self.frontier} of {self.size} bytes")
        return self.sha256.hexdigest(), None if self.second is None else self.second.hexdigest()

    def discard(self) -> None:
        """Give held memory back (file retried or download aborted)."""
        with self._lock:
            for data in self._held.values():
                self.budget.give(len(data))
            self._held.clear()
            self._on_disk.clear()
