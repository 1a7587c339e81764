"""The node's Xet chunk store: chunks a download already has on the node are read here, not fetched.

Layout (names from praesto/store.py, beside the blob store: `<base>/.praesto/blobs/xet/`):

    chunks/<2 hex>/<chunk hash>     one chunk as a xorb stores it (8-byte header + its compressed
                                    bytes), named by its Xet chunk hash (hashing.chunk_hash)
    files/<CAS key>/<xorb>/<file sha256>   the chunks one file Xet assembled and verified takes
                                    from that xorb: its terms as [xorb, first index, [chunk hash, ...]]

Why this shape: a reconstruction names chunks as (xorb, index), never by their hash, so the store
needs a map from the one to the other, one folder per xorb (a download reads only the xorbs its
files name, never the whole store), and only a verified file may write it: its chunk hashes
are bound to the Xet file hash the Hub named, which the format core checked. A chunk file is
content-addressed and checked on every read (decoded, hashed, compared with its name); one that
fails is dropped and its term fetched again. An index is reachable only under the CAS it came from
(`CAS key`, a hash of the CAS URL's scheme and host): a tenant's reconstruction comes from that
CAS, answered for its own token, so the store serves it only bytes that CAS names to it and would
serve it itself (docs/security.md, "Xet chunk store").

Crash safety: every file is written under a temporary name and renamed; an index is fsync'd (file
and folder) after the chunks it names were written, so an index never survives without its
chunks unless the disk lost them, which the read check finds. A crash between the chunks and the
index leaves chunks no index names, and temporary files: `collect` drops both.

Lifetime: an index lives while the blob store holds its file (a copy links it: `gc_blobs`), a
chunk while an index names it; `collect` runs with the blob store's garbage collection, so every
eviction and deletion covers it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from praesto.agent.download.api import Plan
from praesto.agent.download.crashpoints import XET_CHUNKS_WRITTEN, crash_point
from praesto.agent.download.origins.huggingface.xet import (
    Chunk,
    FetchRange,
    Term,
    XetFormatError,
    decode_range,
)
from praesto.agent.download.origins.huggingface.xet.hashing import from_hex, to_hex
from praesto.agent.download.origins.huggingface.xet.limits import CHUNK_HEADER_SIZE, MIN_CHUNK_SIZE

from praesto import store

log = logging.getLogger("praesto.download")
SHA256 = re.compile(r"[0-9a-f]{64}")
GRACE_SECONDS = 3600.0  # what `collect` leaves alone: younger than any download's file takes to finish


def chunk_store_bytes(plan: Plan) -> int:
    """The most the plan's Xet files write to the node's chunk store besides the files themselves:
    each chunk as the xorb stores it, at most its bytes (an incompressible chunk is stored plain)
    plus its header, with hf_xet's smallest chunk (a file's last may be shorter). The node's room
    reserves this much (agent/room.py), and a download's `ChunkStore` writes no more than this: a
    CAS naming smaller or inflated chunks gets the rest of its chunks not kept, never the reserve."""
    return sum(f.size + (f.size // MIN_CHUNK_SIZE + 1) * CHUNK_HEADER_SIZE for f in plan.files if f.xet_hash)


def cas_key(cas_url: str) -> str:
    """The folder of one CAS's indexes: scheme and host, hashed (a safe name from any URL)."""
    parts = urlsplit(cas_url)
    return hashlib.sha256(f"{parts.scheme}://{parts.netloc}".lower().encode()).hexdigest()[:32]


def _write_atomic(path: Path, data: bytes, durable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{store.TEMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class Counters:
    chunks_read: int = 0  # chunks served from the store
    bytes_read: int = 0  # their bytes as the file holds them
    chunks_written: int = 0
    dropped: int = 0  # stored chunks that failed their check on the way back


class ChunkStore:
    """The chunk store at `root` (store.xet_chunks_beside(blobs dir)); one per download, thread-safe.
    `budget`: the most this download writes to it (`chunk_store_bytes` of its plan; None: readers
    such as the peer server and the scrub, which write nothing)."""

    def __init__(self, root: Path, budget: int | None = None) -> None:
        self.root = root
        self.budget = budget
        self._spent = 0  # bytes of chunks this download wrote
        self.counters = Counters()
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], dict[int, str]] = {}  # (CAS key, xorb) -> index -> chunk hash

    def chunk_path(self, chunk_hash: str) -> Path:
        return self.root / store.XET_CHUNK_DATA / chunk_hash[:2] / chunk_hash

    def index_path(self, cas: str, xorb: str, sha256: str) -> Path:
        return self.root / store.XET_FILE_INDEX / cas / xorb / sha256

    def _map(self, cas: str, xorb: str) -> dict[int, str]:
        """Every chunk of `xorb` the CAS's verified files name, read once per download."""
        with self._lock:
            known = self._index.get((cas, xorb))
            if known is None:
                known = self._index[(cas, xorb)] = {}
                for entry in _entries(self.root / store.XET_FILE_INDEX / cas / xorb):
                    if not entry.name.startswith(store.TEMP_PREFIX):
                        known.update(
                            {i: h for (x, i), h in _read_index(Path(entry.path)).items() if x == xorb}
                        )
            return known

    def file(self, cas_url: str) -> FileChunks:
        """What one file's assembly asks and tells (assemble.Held)."""
        return FileChunks(self, cas_key(cas_url))

    def read(self, xorb: str, index: int, chunk_hash: str) -> Chunk | None:
        """The stored chunk, checked against its hash; a bad one is dropped (None: fetch it)."""
        found = self.read_raw(xorb, index, chunk_hash)
        return found[1] if found is not None else None

    def read_raw(self, xorb: str, index: int, chunk_hash: str) -> tuple[bytes, Chunk] | None:
        """The stored chunk as the xorb stores it (what a peer is sent) and decoded, checked against
        its hash; a bad one is dropped (None)."""
        path = self.chunk_path(chunk_hash)
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        try:
            [chunk] = decode_range(raw, index, 1, xorb)
            if chunk.hash != from_hex(chunk_hash):
                raise XetFormatError(f"its bytes hash to {to_hex(chunk.hash)}")
        except XetFormatError as error:
            log.warning("xet chunk store: dropped chunk %s (%s); fetching it again", chunk_hash, error)
            with contextlib.suppress(OSError):
                path.unlink()
            with self._lock:
                self.counters.dropped += 1
            return None
        return raw, chunk

    def held_by(self, cas: str, xorb: str, files: Container[str]) -> dict[int, str]:
        """Chunk index -> hash of `xorb` as the indexes of `files` (sha256s) under CAS key `cas` name
        them, read afresh (the peer server: only files of the cache asked for)."""
        known: dict[int, str] = {}
        if not (SHA256.fullmatch(xorb) and re.fullmatch(r"[0-9a-f]{32}", cas)):
            return known
        for entry in _entries(self.root / store.XET_FILE_INDEX / cas / xorb):
            if entry.name in files:
                known.update({i: h for (x, i), h in _read_index(Path(entry.path)).items() if x == xorb})
        return known

    def write(self, chunks: list[Chunk], raw: bytes) -> None:
        """Each chunk of a fetched range as the xorb stores it, unless already here."""
        offset = 0
        for chunk in chunks:
            piece, offset = raw[offset : offset + chunk.stored_size], offset + chunk.stored_size
            path = self.chunk_path(to_hex(chunk.hash))
            if path.exists():
                continue
            with self._lock:
                if self.budget is not None and self._spent + len(piece) > self.budget:
                    if self._spent <= self.budget:  # said once per download
                        log.warning(
                            "xet chunk store: this download's %d bytes of chunks are spent; "
                            "its other chunks are not kept",
                            self.budget,
                        )
                    self._spent = self.budget + 1
                    return
                self._spent += len(piece)
            try:
                _write_atomic(path, piece, durable=False)  # checked on every read; the index is durable
            except OSError as error:  # the store is an optimisation: a full disk must not fail the file
                log.warning("xet chunk store: could not keep a chunk (%s)", error)
                return
            with self._lock:
                self.counters.chunks_written += 1

    def remember(self, cas: str, sha256: str, terms: list[tuple[str, int, list[str]]]) -> None:
        """The chunks of a verified file, durable, after its chunks were written: one index per xorb."""
        by_xorb: dict[str, list[tuple[str, int, list[str]]]] = {}
        for term in terms:
            by_xorb.setdefault(term[0], []).append(term)
        for xorb, its in by_xorb.items():
            if not SHA256.fullmatch(xorb):  # a path part: the format core let only hex hashes through
                return
            try:
                _write_atomic(self.index_path(cas, xorb, sha256), json.dumps({"terms": its}).encode(), True)
            except OSError as error:
                log.warning("xet chunk store: could not index %s (%s)", sha256, error)
                return
            with self._lock:
                known = self._index.get((cas, xorb))
                if known is not None:  # read already: this download's later files see these too
                    for _, start, hashes in its:
                        known.update({start + i: h for i, h in enumerate(hashes)})

    def forget(self, cas: str, sha256: str) -> None:
        """A file Xet verified but the Hub's sha256 refused: its indexes go (its chunks with `collect`)."""
        for index in (self.root / store.XET_FILE_INDEX / cas).glob(f"*/{sha256}"):
            with contextlib.suppress(OSError):
                index.unlink()
        with self._lock:
            self._index = {k: v for k, v in self._index.items() if k[0] != cas}


@dataclass
class FileChunks:
    """One file's assembly against the store (assemble.Held): what it read, fetched and must index."""

    store: ChunkStore
    cas: str
    terms: list[tuple[str, int, list[str]]] = field(default_factory=list)

    def holds(self, term: Term) -> bool:
        """Whether the indexes name every chunk of `term` (not read: a cheap look before fetching)."""
        known = self.store._map(self.cas, term.xorb)
        return all(i in known for i in range(term.start, term.end))

    def chunks(self, term: Term) -> list[Chunk] | None:
        known = self.store._map(self.cas, term.xorb)
        hashes = [known.get(i) for i in range(term.start, term.end)]
        found: list[Chunk] = []
        for index, chunk_hash in zip(range(term.start, term.end), hashes, strict=True):
            chunk = self.store.read(term.xorb, index, chunk_hash) if chunk_hash is not None else None
            if chunk is None:
                return None
            found.append(chunk)
        with self.store._lock:
            self.store.counters.chunks_read += len(found)
            self.store.counters.bytes_read += sum(len(c.data) for c in found)
        return found

    def keep(self, source: FetchRange, raw: bytes, chunks: list[Chunk]) -> None:
        self.store.write(chunks, raw)

    def used(self, term: Term, chunks: list[Chunk]) -> None:
        self.terms.append((term.xorb, term.start, [to_hex(c.hash) for c in chunks]))

    def verified(self, sha256: str) -> None:
        """The file's Xet hash matched: its chunks are indexed under its sha256 (a Hub-stated name,
        so checked to be 64 hex digits before it names a file)."""
        if SHA256.fullmatch(sha256):
            crash_point(XET_CHUNKS_WRITTEN)
            self.store.remember(self.cas, sha256, self.terms)


def _read_index(path: Path) -> dict[tuple[str, int], str]:
    """An index's (xorb, index) -> chunk hash; an unreadable one names nothing (and goes at `collect`)."""
    try:
        doc = json.loads(path.read_bytes())
        return {
            (xorb, start + i): h
            for xorb, start, hashes in doc["terms"]
            for i, h in enumerate(hashes)
            if isinstance(xorb, str) and isinstance(start, int) and isinstance(h, str) and SHA256.fullmatch(h)
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def collect(root: Path, blobs_dir: Path, grace: float = GRACE_SECONDS) -> int:
    """Drop indexes whose file the blob store no longer holds (no copy links it), then chunks no
    index names and temporary files a crash left; bytes freed. Anything younger than `grace`
    seconds stays: a download running now writes chunks before its index, its index before its blob."""
    freed = 0
    named: set[str] = set()
    young = time.time() - grace
    for cas in _entries(root / store.XET_FILE_INDEX):
        for xorb in _entries(Path(cas.path)):
            for entry in _entries(Path(xorb.path)):
                if _mtime(entry) > young:
                    named.update(_read_index(Path(entry.path)).values())
                    continue
                index = {} if entry.name.startswith(store.TEMP_PREFIX) else _read_index(Path(entry.path))
                if not index or not (blobs_dir / entry.name).is_file():
                    freed += _unlink(entry)
                    continue
                named.update(index.values())
            with contextlib.suppress(OSError):  # only when empty
                os.rmdir(xorb.path)
        with contextlib.suppress(OSError):
            os.rmdir(cas.path)
    for fan in _entries(root / store.XET_CHUNK_DATA):
        for entry in _entries(Path(fan.path)):
            if entry.name not in named and _mtime(entry) <= young:
                freed += _unlink(entry)
        with contextlib.suppress(OSError):
            os.rmdir(fan.path)
    return freed


def clear(root: Path) -> int:
    """Disk pressure: the whole store gives its room back before any copy is evicted (it holds only
    bytes a later download can fetch again); bytes freed."""
    freed = 0
    for folder in (store.XET_FILE_INDEX, store.XET_CHUNK_DATA):
        for parent, dirs, files in os.walk(root / folder, topdown=False):
            for name in files:
                with contextlib.suppress(OSError):
                    path = os.path.join(parent, name)
                    size = os.lstat(path).st_size
                    os.unlink(path)
                    freed += size
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))
    return freed


def stored_bytes(root: Path) -> int:
    """What the store holds on disk (chunks and indexes)."""
    total = 0
    for folder in (store.XET_FILE_INDEX, store.XET_CHUNK_DATA):
        for parent, _dirs, files in os.walk(root / folder):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(parent, name)).st_size
    return total


def verify_all(
    root: Path, pace: Callable[[int], None] | None = None, cancel: threading.Event | None = None
) -> int:
    """Scrub: every stored chunk decoded and hashed against its name, `pace(n)` before reading n
    bytes (the scrub's budget); the bad ones dropped. Returns how many were dropped (a read drops
    them the same way: scrub only finds them before a download needs them)."""
    chunks = ChunkStore(root)
    for fan in _entries(root / store.XET_CHUNK_DATA):
        for entry in _entries(Path(fan.path)):
            if cancel is not None and cancel.is_set():
                return chunks.counters.dropped
            if SHA256.fullmatch(entry.name):
                if pace is not None:
                    pace(_size(entry))
                chunks.read("scrub", 0, entry.name)
    return chunks.counters.dropped


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0


def _unlink(entry: os.DirEntry[str]) -> int:
    try:
        size = entry.stat(follow_symlinks=False).st_size
        os.unlink(entry.path)
    except OSError:
        return 0
    return size
