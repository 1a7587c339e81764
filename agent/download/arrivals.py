"""How far each part of a download in flight has been written: what peers may copy before it is whole.

The journal (journal.py) records a part once it is whole and fsync'd: what a resumed run
may trust. A peer needs less. Bytes the engine has `pwrite`n are readable from the
staging file at once (page cache), and every receiver verifies each whole file against
the origin's digest anyway (engine.py; a sender of bad bytes is blamed and dropped). So
the engine notes, per part, the offset it has written up to from the part's start
(bytes arrive in order within a part, and a retry resumes where the last one stopped),
and the peer server passes those bytes on while the rest still arrives (cut-through).
A follower's copy of a part then ends moments after its sender's, not one whole part's
transfer later at every hop: the swarm's tail (issue 24 item 2).

Nothing here is durable and nothing needs to be: after a restart the journal alone says
what is on disk, and a file fetched again after a checksum mismatch is forgotten first.
"""

from __future__ import annotations

import threading


class Arrivals:
    """Per file, per part index: the file offset written up to (contiguously from the part's start).

    Thread-safe: the engine's part threads write, the peer server's request threads read
    and may wait for more (`wait_beyond`)."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self._reached: dict[str, dict[int, int]] = {}
        self._cond = threading.Condition()

    def reached(self, path: str, index: int, offset: int) -> None:
        """Part `index` of `path` is written from its start up to file offset `offset`."""
        with self._cond:
            parts = self._reached.setdefault(path, {})
            if offset > parts.get(index, 0):
                parts[index] = offset
                self._cond.notify_all()

    def forget(self, path: str) -> None:
        """`path` is being written again (its bytes failed verification): nothing of it is offered."""
        with self._cond:
            self._reached.pop(path, None)
            self._cond.notify_all()

    def upto(self, path: str, offset: int) -> int:
        """The offset the part holding `offset` is written up to (<= `offset`: nothing beyond it yet)."""
        if self.part_size <= 0:
            return offset
        with self._cond:
            return self._reached.get(path, {}).get(offset // self.part_size, offset)

    def snapshot(self) -> dict[str, dict[int, int]]:
        """Per file, per part begun: the offset written up to."""
        size = self.part_size
        with self._cond:
            return {
                path: {i: at for i, at in parts.items() if at > i * size}
                for path, parts in self._reached.items()
            }

    def wait_beyond(self, path: str, offset: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds until bytes beyond `offset` of `path` are written."""
        with self._cond:
            return self._cond.wait_for(lambda: self._beyond(path, offset), max(0.0, timeout))

    def _beyond(self, path: str, offset: int) -> bool:
        return (
            self._reached.get(path, {}).get(offset // self.part_size, 0) > offset if self.part_size else False
        )
