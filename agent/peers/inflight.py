"""What a node still downloading a cache may serve: written bytes of files in its plan.

The downloader journals a part only after its bytes were written and fsync'd
(download/journal.py), and a whole file once it was verified, so "in the
journal" is exactly "safe to read back". Parts still arriving are noted in
memory as their bytes are written (download/arrivals.py); an asker that says it
takes a prefix (`ACCEPT_PREFIX_HEADER`) gets those too, so a part is passed on
while it arrives. The list of servable files is the origin's plan the node is
downloading (registered by `Peering.attach`), never a directory listing, so no
other path on the node can be named. Anything else is "not yet": the caller
answers 425 and the asker polls, or gives up on a leader whose written bytes
stop growing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from praesto.agent.download.api import Plan
from praesto.agent.download.arrivals import Arrivals
from praesto.agent.download.journal import JOURNAL, Journal
from praesto.agent.download.publish import TREE
from praesto.agent.peers.swarm import SEEDER_COPIES, Fanout


@dataclass(frozen=True)
class Written:
    """The journal's view of one staging: part size, parts per file, verified files."""

    part_size: int
    parts: dict[str, set[int]]
    verified: frozenset[str]
    sizes: dict[str, int]

    def covers(self, path: str, start: int, end: int) -> bool:
        """True when every part overlapping [start, end) of `path` is durably written."""
        if path in self.verified:
            return True
        size = self.sizes.get(path, 0)
        if self.part_size <= 0 or size <= self.part_size:  # single-part files: only once verified
            return False
        done = self.parts.get(path, set())
        return all(i in done for i in range(start // self.part_size, (end - 1) // self.part_size + 1))

    def readable(self, path: str, start: int, end: int, arrivals: Arrivals) -> int:
        """Where the bytes of `path` readable now from `start` end (at most `end`): journaled parts,
        then the written prefix of the part still arriving. `start` when none are."""
        if self.covers(path, start, end):
            return end
        pos, size = start, arrivals.part_size
        while pos < end:
            boundary = min(end, (pos // size + 1) * size) if size > 0 else end
            if self.covers(path, pos, boundary):
                pos = boundary
                continue
            reached = min(arrivals.upto(path, pos), boundary)
            if reached <= pos:
                break
            pos = reached
            if pos < boundary:  # the rest of this part is still on its way
                break
        return pos

    def offer(self, spent: set[tuple[str, int]]) -> dict[str, str | list[int]]:
        """Per file, "all" or the part indices to offer: written, less those sent enough (swarm.Fanout)."""
        size = self.part_size
        files: dict[str, str | list[int]] = {}
        for path in self.verified:
            held = range(-(-self.sizes.get(path, 0) // size)) if size > 0 else range(0)
            taken = any((path, i) in spent for i in held)
            files[path] = [i for i in held if (path, i) not in spent] if taken else "all"
        for path, parts in self.parts.items():
            if path not in self.verified:
                files[path] = sorted(i for i in parts if (path, i) not in spent)
        return files

    @property
    def bytes(self) -> int:
        """Bytes written: grows while the download moves (the asker's stall signal)."""
        total = sum(self.sizes.get(p, 0) for p in self.verified)
        for path, parts in self.parts.items():
            if path not in self.verified:
                size = self.sizes.get(path, 0)
                total += sum(max(0, min(size, (i + 1) * self.part_size) - i * self.part_size) for i in parts)
        return total


@dataclass(frozen=True)
class Flight:
    revision: str
    sizes: dict[str, int]  # plan path -> size
    staging: Path
    arrivals: Arrivals  # parts as far as they are written, before the journal has them
    fanout: Fanout = field(default_factory=Fanout)  # how often each part may go out (swarm.py)
    digests: dict[str, str] = field(default_factory=dict)  # plan sha256 -> path (xorbserve.py)

    def unjournaled(
        self, written: Written | None, spent: set[tuple[str, int]]
    ) -> tuple[dict[str, list[int]], dict[str, dict[int, int]]]:
        """Parts begun here that the journal does not have yet, less those sent enough, per file:
        (written whole, still arriving: index -> the offset written up to)."""
        journaled = written.parts if written is not None else {}
        verified = written.verified if written is not None else frozenset()
        size = self.arrivals.part_size
        whole: dict[str, list[int]] = {}
        arriving: dict[str, dict[int, int]] = {}
        for path, parts in self.arrivals.snapshot().items():
            if path not in self.sizes or path in verified:
                continue
            for i, at in sorted(parts.items()):
                if i in journaled.get(path, set()) or (path, i) in spent:
                    continue
                done = at >= min(self.sizes[path], (i + 1) * size) if size > 0 else at >= self.sizes[path]
                if done:
                    whole.setdefault(path, []).append(i)
                else:
                    arriving.setdefault(path, {})[i] = at
        return whole, arriving

    @property
    def tree(self) -> Path:
        return self.staging / TREE

    def prefix_end(self, written: Written, path: str, span: tuple[int, int], wait: float) -> int | None:
        """Where the bytes from the start of `span` written so far end, for an asker that takes a
        prefix (it asks again for the rest); waits up to `wait` seconds for the first of them.
        None: nothing written there yet (425)."""
        start, end = span
        upto = written.readable(path, start, end, self.arrivals)
        if upto == start and self.arrivals.wait_beyond(path, start, wait):
            upto = written.readable(path, start, end, self.arrivals)
        return upto if upto > start else None

    def claim(self, path: str, span: tuple[int, int] | None, written: Written | None, asker: str) -> bool:
        """May the parts of `span` go out to `asker` now: each only `copies` times per window (swarm.Fanout)."""
        size = written.part_size if written is not None else 0
        if span is None or size <= 0 or self.sizes[path] <= size:
            return True
        parts = [(path, i) for i in range(span[0] // size, (span[1] - 1) // size + 1)]
        return self.fanout.claim(parts, asker, time.monotonic())


class InFlight:
    """Downloads this node has under way, by cache; `written()` reads their journals (cached)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}
        self._seen: dict[str, tuple[tuple[int, int, int], Written]] = {}

    def register(self, namespace: str, cache: str, plan: Plan, staging: Path, part_size: int) -> Flight:
        """Peers may copy `plan` of `namespace`/`cache` from `staging` as the download writes it; the
        download notes its parts' progress in the returned flight's `arrivals`."""
        flight = Flight(plan.revision, {f.path: f.size for f in plan.files}, staging, Arrivals(part_size))
        flight.digests.update({f.sha256: f.path for f in plan.files if f.sha256})
        with self._lock:
            self._flights[f"{namespace}/{cache}"] = flight
        return flight

    def seed(self, namespace: str, cache: str) -> None:
        """This node fetches the cache from the origin for the others: each part goes out once."""
        with self._lock:
            found = self._flights.get(f"{namespace}/{cache}")
            if found is not None:
                found.fanout.copies = SEEDER_COPIES

    def flight(self, namespace: str, cache: str, revision: str) -> Flight | None:
        with self._lock:
            found = self._flights.get(f"{namespace}/{cache}")
        return found if found is not None and found.revision == revision else None

    def written(self, flight: Flight) -> Written | None:
        """What the journal of `flight` records, or None when there is none of this revision (yet)."""
        path = flight.staging / JOURNAL
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        key = str(path)
        with self._lock:
            cached = self._seen.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            with path.open() as handle:
                header = json.loads(handle.readline())
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict) or header.get("revision") != flight.revision:
            return None
        resumed = Journal(flight.staging, header).load()
        if resumed is None:
            return None
        wanted = flight.sizes
        written = Written(
            part_size=int(header.get("partSize") or 0),
            parts={p: i for p, i in resumed.parts.items() if p in wanted},
            verified=frozenset(p for p in resumed.verified if p in wanted),
            sizes=wanted,
        )
        with self._lock:
            self._seen[key] = (stamp, written)
        return written
