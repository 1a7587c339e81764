"""The Xet chunk store's edges on the node, without a CAS: what it refuses to read back, what each CAS
may reach, what collection keeps, the room it gives back under pressure and its scrub.
(tests/xet/test_chunk_store.py drives it through real downloads from the hf_xet-proven double.)"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from praesto.agent import capacity
from praesto.agent.copies import Copies
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.origins.huggingface.xet import Term, chunk_hash
from praesto.agent.download.origins.huggingface.xet.chunks import decode_range
from praesto.agent.download.origins.huggingface.xet.hashing import to_hex
from praesto.agent.room import DiskRoom
from praesto.agent.scrub.scrubber import Scrubber

from praesto import store
from tests.agent.test_disk_room import _copy, _plan

XORB = "ab" * 32
CAS_A, CAS_B = "https://cas-a.example", "https://cas-b.example:8443"


def stored(data: bytes) -> bytes:
    """One chunk as a xorb lays it out: header (version 0, stored length, scheme 0 = plain, length)."""
    n = len(data).to_bytes(3, "little")
    return bytes([0]) + n + bytes([0]) + n + data


def fill(root: Path, cas: str, sha256: str, pieces: list[bytes], xorb: str = XORB) -> list[str]:
    """A verified file of `pieces` (chunks 0.. of `xorb`) as a download leaves it; its chunk hashes."""
    chunks_store = xetstore.ChunkStore(root)
    raw = b"".join(stored(p) for p in pieces)
    chunks = decode_range(raw, 0, len(pieces), xorb)
    chunks_store.write(chunks, raw)
    hashes = [to_hex(c.hash) for c in chunks]
    chunks_store.remember(xetstore.cas_key(cas), sha256, [(xorb, 0, hashes)])
    return hashes


def held(root: Path, cas: str, start: int, end: int, xorb: str = XORB) -> list[bytes] | None:
    found = xetstore.ChunkStore(root).file(cas).chunks(Term(xorb, start, end, 1))
    return None if found is None else [c.data for c in found]


def test_a_stored_chunk_is_read_back_only_as_the_bytes_its_hash_names(tmp_path: Path) -> None:
    pieces = [b"first chunk" * 100, b"second chunk" * 100]
    hashes = fill(tmp_path, CAS_A, "1" * 64, pieces)
    assert held(tmp_path, CAS_A, 0, 2) == pieces
    path = xetstore.ChunkStore(tmp_path).chunk_path(hashes[1])
    path.write_bytes(stored(b"another chunk" * 100))  # well formed, the wrong bytes
    chunks_store = xetstore.ChunkStore(tmp_path)
    assert chunks_store.file(CAS_A).chunks(Term(XORB, 0, 2, 1)) is None  # fetched again
    assert (chunks_store.counters.dropped, path.exists()) == (1, False)
    assert held(tmp_path, CAS_A, 0, 1) == pieces[:1]


def test_an_index_reaches_only_reconstructions_from_the_cas_it_came_from(tmp_path: Path) -> None:
    """Another tenant's CAS naming the same xorb gets nothing from the store: it fetches, and its
    file is checked against its own hashes (docs/security.md, Xet chunk store)."""
    fill(tmp_path, CAS_A, "2" * 64, [b"tenant a's weights" * 50])
    assert held(tmp_path, CAS_A, 0, 1) is not None
    assert held(tmp_path, CAS_B, 0, 1) is None
    assert held(tmp_path, "https://CAS-A.example/another/path", 0, 1) is not None  # scheme and host only
    assert held(tmp_path, CAS_A, 0, 2) is None  # a chunk no index names: fetched


def test_a_hub_stated_sha256_that_is_not_hex_names_no_index(tmp_path: Path) -> None:
    file = xetstore.ChunkStore(tmp_path).file(CAS_A)
    file.terms.append((XORB, 0, [to_hex(chunk_hash(b"x"))]))
    file.verified("../../../etc/passwd")
    assert not (tmp_path / store.XET_FILE_INDEX).exists()


def test_collect_keeps_what_a_blob_needs_and_what_a_download_is_writing(tmp_path: Path) -> None:
    layout = store.StoreLayout(tmp_path)
    layout.blobs_dir.mkdir(parents=True)
    root = layout.xet_chunks_dir
    kept = fill(root, CAS_A, "3" * 64, [b"kept" * 300, b"shared" * 300])
    gone = fill(root, CAS_A, "4" * 64, [b"shared" * 300, b"gone" * 300], xorb="cd" * 32)
    (layout.blobs_dir / ("3" * 64)).write_bytes(b"a copy links it")  # "4"*64: no blob, no copy
    torn = root / store.XET_CHUNK_DATA / "ab" / f"{store.TEMP_PREFIX}x"
    torn.parent.mkdir(parents=True, exist_ok=True)
    torn.write_bytes(b"torn")  # what a kill mid-write leaves
    assert xetstore.collect(root, layout.blobs_dir) == 0  # everything is young: a download may be writing it
    past = time.time() - 2 * xetstore.GRACE_SECONDS
    for path in root.rglob("*"):
        os.utime(path, (past, past))
    assert xetstore.collect(root, layout.blobs_dir) > 0
    left = {p.name for p in (root / store.XET_CHUNK_DATA).rglob("*") if p.is_file()}
    assert left == set(kept) and gone[1] not in left
    assert {p.name for p in root.glob("files/*/*/*")} == {"3" * 64}


def test_under_disk_pressure_the_chunk_store_gives_its_room_before_any_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, copies = store.StoreLayout(tmp_path), Copies()
    total = 1024 * 1024

    def disk(_: Path) -> capacity.Disk:  # a small disk: whatever the base holds is used
        used = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
        return capacity.Disk(total, total - used)

    monkeypatch.setattr(capacity, "disk_usage", disk)
    _copy(layout, copies, "idle", 200 * 1024, used=time.time() - 100)
    fill(layout.xet_chunks_dir, CAS_A, "5" * 64, [os.urandom(100 * 1024) for _ in range(6)])
    room = DiskRoom(layout, copies, "0")
    ref, plan = _plan("asking", 100 * 1024)
    assert room.make_room(ref, plan) == []  # fits as it is: the store keeps its chunks
    assert xetstore.stored_bytes(layout.xet_chunks_dir) > 600 * 1024
    room.release((ref.namespace, ref.cache))
    ref, plan = _plan("bigger", 500 * 1024)
    assert room.make_room(ref, plan) == []  # the chunk store went, the copy stays
    assert xetstore.stored_bytes(layout.xet_chunks_dir) == 0
    assert layout.is_complete("team-a", "idle")


def test_scrub_checks_the_chunk_store_once_an_interval_within_its_budget(tmp_path: Path) -> None:
    hashes = fill(tmp_path, CAS_A, "6" * 64, [b"good" * 400, b"rots" * 400])
    bad = xetstore.ChunkStore(tmp_path).chunk_path(hashes[1])
    bad.write_bytes(bad.read_bytes()[:-1] + b"!")
    now = [1000.0]
    paced: list[int] = []

    def verify(pace: Any, cancel: threading.Event) -> int:
        def counted(n: int) -> None:
            paced.append(n)
            pace(n)

        return xetstore.verify_all(tmp_path, counted, cancel)

    side: Any = SimpleNamespace(copies=Copies(), short_error=str)
    log: Any = SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    scrubber = Scrubber(
        store.StoreLayout(tmp_path), side, 60.0, 10**9, lambda: now[0], log, chunk_store=verify
    )
    assert scrubber.scrub_chunk_store() == 0  # not due yet: a restart does not rescrub at once
    now[0] += 61
    assert scrubber.scrub_chunk_store() == 1 and not bad.exists()
    assert sorted(paced) == sorted(len(stored(b"good" * 400)) for _ in range(2))
    assert scrubber.scrub_chunk_store() == 0  # done for this interval
    assert json.loads(next(tmp_path.glob("files/*/*/*")).read_text())["terms"][0][2] == hashes


def test_a_download_writes_no_more_chunk_bytes_than_its_room_reserved(tmp_path: Path) -> None:
    """A CAS naming smaller or inflated chunks than the estimate assumes cannot write into the
    reserve: past the download's budget (`chunk_store_bytes` of its plan) its chunks are not kept."""
    pieces = [bytes([i]) * 1000 for i in range(10)]
    raw = b"".join(stored(p) for p in pieces)
    chunks = decode_range(raw, 0, len(pieces), XORB)
    budget = 3 * len(stored(pieces[0]))
    kept = xetstore.ChunkStore(tmp_path, budget)
    kept.write(chunks, raw)
    kept.write(chunks, raw)  # asked again: still nothing past the budget
    assert kept.counters.chunks_written == 3
    assert xetstore.stored_bytes(tmp_path) == budget
    unbounded = xetstore.ChunkStore(tmp_path / "other")
    unbounded.write(chunks, raw)
    assert unbounded.counters.chunks_written == 10
