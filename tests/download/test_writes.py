"""O_DIRECT writes (agent/download/writes.py): which filesystems get them, which chunks, and a download's share.

On the real filesystems of this machine: the test directory's (ext4 on CI: direct) and /dev/shm
(tmpfs: never direct). A download's bytes are checked whole and against the origin's sha256 either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from praesto.agent.download.api import WRITE_BUFFERED
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.writes import (
    ALIGNMENT,
    DIRECT_FILESYSTEMS,
    DirectWrites,
    aligned_buffer,
    direct_writes_possible,
    filesystem_type,
)

from praesto.spec import Source
from testkit.hub import LocalHub
from tests.download.conftest import MiB, options_for, tree_of

MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
35 22 0:31 / /var/lib/kubelet rw shared:9 - xfs /dev/vdb rw
41 35 0:44 / /var/lib/kubelet/pods/x/volumes/kubernetes.io~nfs/models rw - nfs4 srv:/models rw
52 22 0:50 / /mnt/with\\040space rw - tmpfs tmpfs rw
"""


def local_disk(path: Path) -> Path:
    if not direct_writes_possible(path):
        pytest.skip(
            f"{path} is on {filesystem_type(path)}, not a local disk filesystem ({sorted(DIRECT_FILESYSTEMS)})"
        )
    return path


def test_the_filesystem_is_the_longest_mount_point_above_the_path(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert filesystem_type(Path("/var/lib/kubelet/praesto/store"), info) == "xfs"
    assert filesystem_type(Path("/var/lib/kubelet/pods/x/volumes/kubernetes.io~nfs/models/a"), info) == "nfs4"
    assert filesystem_type(Path("/var/lib/kubeletx"), info) == "ext4"  # a name prefix is not a parent
    assert filesystem_type(Path("/mnt/with space/models"), info) == "tmpfs"
    assert filesystem_type(Path("/x"), tmp_path / "missing") is None


def test_network_and_memory_filesystems_are_written_through_the_page_cache() -> None:
    shm = Path("/dev/shm")
    if filesystem_type(shm) != "tmpfs":
        pytest.skip(f"/dev/shm is {filesystem_type(shm)} here, not tmpfs")
    assert not direct_writes_possible(shm)
    for network in ("nfs4", "ceph", "fuse.s3fs", "overlay"):
        assert network not in DIRECT_FILESYSTEMS


def test_only_aligned_chunks_from_aligned_memory_go_to_the_device(tmp_path: Path) -> None:
    path = local_disk(tmp_path) / "staged"
    path.write_bytes(b"")
    direct = DirectWrites.open(path)
    assert direct is not None
    buffer = aligned_buffer(2 * ALIGNMENT)
    buffer[:] = os.urandom(2 * ALIGNMENT)
    view = memoryview(buffer)
    try:
        assert direct.write(ALIGNMENT, view[:ALIGNMENT])  # offset, length and address aligned
        assert not direct.write(1, view[:ALIGNMENT])  # offset not aligned
        assert not direct.write(0, view[: ALIGNMENT - 1])  # length not aligned
        assert not direct.write(0, view[1 : ALIGNMENT + 1])  # address not aligned
        assert not direct.write(0, memoryview(bytes(ALIGNMENT)))  # read-only memory
        assert direct.bytes == ALIGNMENT
    finally:
        view.release()
        direct.close()
    assert path.read_bytes() == bytes(ALIGNMENT) + buffer[:ALIGNMENT]


def test_a_download_on_a_local_disk_writes_its_large_files_direct(hub: LocalHub, tmp_path: Path) -> None:
    """Whole parts go direct; each file's unaligned tail, and the small files, through the page cache."""
    files = {"model.safetensors": os.urandom(5 * MiB + 123), "config.json": b"{}"}
    hub.add_repo("org/direct", files)
    source = Source("hf", "org/direct", "main")
    dest = local_disk(tmp_path) / "direct"
    result = download(plan(source, options_for(hub)), dest, options_for(hub))
    assert tree_of(dest) == files
    assert result.bytes_written_direct == 5 * MiB  # five whole parts; the 123-byte last one: buffered
    buffered = download(
        plan(source, options_for(hub)), tmp_path / "buffered", options_for(hub, write_mode=WRITE_BUFFERED)
    )
    assert tree_of(tmp_path / "buffered") == files
    assert buffered.bytes_written_direct == 0
