"""Where a download's bytes go to disk: straight to the device when they can, through the page cache otherwise.

Why: on a fast origin the page cache is the download's largest cost. Every byte is copied into a
page-cache page by `pwrite`, then written back by the kernel; with the receive copy and sha256 that
kept both cores busy (bench/download_bench.py: 2.6-2.9 s of system time in a 3.4 s warm download
of 2 GiB, against 1.0 s with O_DIRECT). A multi-gigabyte download's dirty pages also push out
whatever else the node caches, such as the pages of the model a GPU node is serving right now.
With O_DIRECT the disk reads the bytes straight from the receive buffer, which is also the buffer
they are hashed from: no copy, nothing dirty left for the checkpoint's or the final fsync.

When: only on local disk filesystems (DIRECT_FILESYSTEMS). On NFS, CephFS or a FUSE volume (RWX
caches, PVC mode) an O_DIRECT write is a synchronous round trip per call, and tmpfs or overlay
gain nothing; there writes stay buffered. O_DIRECT needs the file offset, the length and the
buffer's address aligned to the device's logical block: chunks from `aligned_buffer` at
part-aligned offsets are; a file's unaligned tail, a short read and a peer's odd-sized chunk go
through the page cache (the kernel keeps the two coherent on the same file). If the filesystem
refuses O_DIRECT anyway (EINVAL at open or at a write), that file's writes stay buffered.

A reader sees the bytes as soon as `write` returns either way (peers copying a part in flight, the
hasher's read-back): a direct write has reached the device and dropped any stale cached page.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from pathlib import Path

# Local block filesystems whose O_DIRECT writes go straight to the device, asynchronously queued.
DIRECT_FILESYSTEMS = frozenset({"ext4", "ext3", "xfs", "btrfs", "f2fs"})
ALIGNMENT = 4096  # the largest common logical block size; 512-byte devices accept it too
MOUNTINFO = Path("/proc/self/mountinfo")


def aligned_buffer(size: int) -> mmap.mmap:
    """`size` bytes of page-aligned anonymous memory: a receive buffer O_DIRECT can write from."""
    return mmap.mmap(-1, size)


def filesystem_type(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the filesystem `path` is on (mountinfo's longest mount point above it); None: unknown."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not tail:
            continue
        mount_point = _unescape(parts[4])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), tail.split()[0])
    return None if best is None else best[1]


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def direct_writes_possible(directory: Path) -> bool:
    """Whether files under `directory` are written with O_DIRECT (its filesystem is a local disk)."""
    return hasattr(os, "O_DIRECT") and filesystem_type(directory) in DIRECT_FILESYSTEMS


def _aligned(offset: int, chunk: memoryview) -> bool:
    if offset % ALIGNMENT or len(chunk) % ALIGNMENT or not len(chunk) or chunk.readonly:
        return False
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(chunk))
    except (TypeError, ValueError):  # not a plain contiguous byte buffer
        return False
    return address % ALIGNMENT == 0


class DirectWrites:
    """A second descriptor of one staged file, opened O_DIRECT, for the aligned chunks of its download.

    The engine keeps its own buffered descriptor for everything else (the unaligned rest,
    preallocation, fdatasync and read-back); both name the same inode. Several fetch threads
    write parts of one file at once, so the descriptor stays open until the engine closes it
    (after the file's last part): a refusal only stops its use, never closes it under a writer.
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        self.refused = False  # the filesystem refused an aligned write: buffered from then on
        self.bytes = 0  # written directly, for Result.bytes_written_direct
        self._counting = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> DirectWrites | None:
        """None when the filesystem refuses O_DIRECT after all: the file's writes stay buffered."""
        try:
            return cls(path)
        except OSError as error:
            if error.errno == errno.EINVAL:
                return None
            raise

    def write(self, offset: int, chunk: memoryview) -> bool:
        """Write `chunk` at `offset` to the device if both are aligned; False: the caller writes it buffered."""
        if self.refused or self.fd < 0 or not _aligned(offset, chunk):
            return False
        written = 0
        try:
            while written < len(chunk):
                written += os.pwrite(self.fd, chunk[written:], offset + written)
        except OSError as error:
            if error.errno != errno.EINVAL or written:
                raise
            self.refused = True  # e.g. a logical block above ALIGNMENT: buffered from now on
            return False
        with self._counting:
            self.bytes += written
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
