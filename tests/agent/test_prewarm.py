"""Prewarm reads a complete copy into the page cache, in path order, within its budget, and stops when told.

Residency is measured with mincore(2) on the real files; the page cache is
emptied per file with POSIX_FADV_DONTNEED (clean pages), not mocked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import threading
from pathlib import Path

import pytest
from praesto.agent.prewarm import Prewarmer, PrewarmResult, cache_files, memory_budget, prewarm

from praesto import names

MiB = 1 << 20
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def resident(path: Path) -> int:
    """Bytes of `path` in the page cache now: mincore(2) over a private mapping no page of which is touched."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)
        try:
            rc = _libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        finally:
            del start  # the mapping cannot close while a ctypes object points into it
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(1 for v in vec if v & 1) * mmap.PAGESIZE


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A complete copy: two 8 MiB shards and a config, with the manifest the downloader writes."""
    cache = tmp_path / "team-a" / "llm"
    cache.mkdir(parents=True)
    files = {"config.json": 300, "model-00001.safetensors": 8 * MiB, "model-00002.safetensors": 8 * MiB}
    for rel, size in files.items():
        (cache / rel).write_bytes(os.urandom(size))
    manifest = {"files": [{"path": rel, "size": size, "sha256": "0" * 64} for rel, size in files.items()]}
    (cache / names.MANIFEST_FILE).write_text(json.dumps(manifest))
    for rel in files:
        evict(cache / rel)
    if any(resident(cache / rel) for rel in files if rel.endswith("safetensors")):
        pytest.skip(
            f"{tmp_path} keeps pages after POSIX_FADV_DONTNEED (tmpfs?): residency cannot be observed"
        )
    return cache


def shards(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.safetensors"))


def test_prewarm_brings_every_file_into_the_page_cache(copy: Path) -> None:
    result = prewarm(copy, threading.Event())
    assert result == PrewarmResult(16 * MiB + 300, 16 * MiB + 300, result.seconds)
    for shard in shards(copy):
        assert resident(shard) == shard.stat().st_size


def test_budget_stops_after_the_first_files_in_path_order(copy: Path) -> None:
    result = prewarm(copy, threading.Event(), budget=4 * MiB, chunk=MiB)
    assert result.stopped == "budget" and 4 * MiB <= result.bytes_read <= 5 * MiB
    first, second = shards(copy)
    assert resident(first) >= 4 * MiB and resident(second) == 0


def test_cancelled_prewarm_reads_nothing_more(copy: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    assert prewarm(copy, cancel).stopped == "cancelled"
    assert all(resident(s) == 0 for s in shards(copy))


def test_files_follow_the_manifest_and_vanished_ones_are_skipped(copy: Path) -> None:
    assert [rel for rel, _ in cache_files(copy)] == [
        "config.json",
        "model-00001.safetensors",
        "model-00002.safetensors",
    ]
    shards(copy)[0].unlink()  # evicted while a prewarm was due
    (copy / "model-00001.safetensors").symlink_to("/etc/hostname")  # never followed
    assert prewarm(copy, threading.Event()).bytes_read == 8 * MiB + 300


def test_one_prewarm_per_cache_at_a_time(copy: Path) -> None:
    gate = threading.Event()
    results: list[PrewarmResult] = []

    def budget() -> int | None:
        gate.wait(10)
        return None

    prewarmer = Prewarmer(budget)
    assert prewarmer.start(("team-a", "llm"), copy, results.append)
    assert not prewarmer.start(("team-a", "llm"), copy, results.append)
    gate.set()
    prewarmer.stop()
    assert not prewarmer.busy() and len(results) == 1
    assert not prewarmer.start(("team-a", "llm"), copy, results.append)  # stopped: no new work


def test_memory_budget_takes_the_smaller_bound(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:    8388608 kB\n")  # 8 GiB
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("1073741824\n")  # a 1 GiB limit, 256 MiB of it anon
    (v2 / "memory.stat").write_text("anon 268435456\nfile 734003200\n")
    assert memory_budget(v2, meminfo) == int(768 * MiB * 0.8)
    (v2 / "memory.max").write_text("max\n")
    assert memory_budget(v2, meminfo) == int(8 * 1024 * MiB * 0.8)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("536870912\n")
    (v1 / "memory" / "memory.stat").write_text("cache 1\nrss 2\ntotal_rss 134217728\n")
    assert memory_budget(v1, meminfo) == int(384 * MiB * 0.8)
    assert memory_budget(tmp_path / "none", tmp_path / "no-meminfo") is None
