"""Parsing /proc/self/mountinfo, and finding a cache behind a mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from praesto.csi import mounts
from praesto.csi.recovery import CacheLocator

from testkit.csi_driver import NEEDS_ROOT

SAMPLE = """\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 27 0:50 / /var/lib/kubelet rw,relatime shared:7 - ext4 /dev/vdb rw
41 27 254:16 /data/praesto /var/praesto rw,relatime - xfs /dev/vdc rw
52 40 254:16 /data/praesto/team-a/llm /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/my\\040model/mount ro,nosuid,nodev,relatime shared:9 - xfs /dev/vdc rw
53 40 254:16 /data/praesto/team-a/not_a_label /var/lib/kubelet/pods/u2/x ro - xfs /dev/vdc rw
54 41 254:16 /data/praesto/team-b/bert /var/praesto/team-b/bert ro - xfs /dev/vdc rw
garbage line
"""


def test_parses_fields_and_octal_escapes() -> None:
    entries = mounts.parse_mountinfo(SAMPLE)
    assert len(entries) == 6  # the garbage line is skipped, not fatal
    pod = entries[3]
    assert pod.mount_point == "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/my model/mount"
    assert pod.root == "/data/praesto/team-a/llm"
    assert pod.dev == "254:16"
    assert pod.read_only and "nosuid" in pod.options
    assert pod.fstype == "xfs" and pod.source == "/dev/vdc"
    assert mounts.unescape(r"a\011b\012c\134d") == "a\tb\nc\\d"


def test_fs_location_follows_the_mount_that_shows_a_path() -> None:
    entries = mounts.parse_mountinfo(SAMPLE)
    assert mounts.fs_location(entries, "/var/praesto") == ("254:16", "/data/praesto")
    assert mounts.fs_location(entries, "/var/praesto/team-a") == ("254:16", "/data/praesto/team-a")
    assert mounts.fs_location(entries, "/etc") == ("254:0", "/etc")
    assert mounts.fs_location(entries, "/var/praesto-other") == ("254:0", "/var/praesto-other")


def test_locator_maps_binds_back_to_caches() -> None:
    entries = mounts.parse_mountinfo(SAMPLE)
    locator = CacheLocator("254:16", "/data/praesto", "/var/praesto")
    found = locator.cache_mounts(entries)
    assert found == {"/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/my model/mount": ("team-a", "llm")}


@pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
def test_same_filesystem_bind_is_seen_by_mountinfo_not_ismount(base: Path) -> None:
    source = base / "src"
    target = base.parent / "target dir"  # a space: escaped as \040 by the kernel
    source.mkdir()
    target.mkdir()
    mounts.bind_read_only(str(source), str(target))
    assert not os.path.ismount(target)  # same st_dev as its parent: the reason for mountinfo
    (entry,) = mounts.mounts_at(mounts.read_mountinfo(), str(target))
    assert entry.read_only and {"nosuid", "nodev"} <= set(entry.options)
    mounts.unmount(str(target))
    assert mounts.mounts_at(mounts.read_mountinfo(), str(target)) == []
