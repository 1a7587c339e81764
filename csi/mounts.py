"""Mount table parsing and the bind-mount syscalls the node plugin needs.

Why syscalls (through libc via ctypes) and not the `mount` binary: a publish
is two mount(2) calls and an unpublish one umount2(2); calling them directly
costs microseconds instead of three fork/execs, gives the exact errno (EROFS,
EBUSY, EINVAL) instead of parsing a tool's stderr, sets exactly the flags we
ask for (no /etc/fstab lookups, no helper programs), and keeps util-linux out
of the image. The bind source is passed as `/proc/self/fd/N` of a directory
opened without following symlinks (praesto.csi.storefs's walk), so what gets
mounted is the directory we checked, not whatever a path points to a moment later.

Why /proc/self/mountinfo and not os.path.ismount: a bind mount of a directory
on the same filesystem has the same st_dev as its parent, so ismount misses
it; mountinfo lists every mount with its filesystem-relative root, which is
also what lets a restarted driver find which cache a mount shows.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/<pid>/mountinfo (see proc(5))."""

    mount_id: int
    parent_id: int
    dev: str  # "major:minor" of the filesystem
    root: str  # the directory of that filesystem this mount shows
    mount_point: str
    options: tuple[str, ...]  # per-mount options (ro, nosuid, ...)
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (\\040 space, \\011 tab, \\012 newline, \\134 backslash)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_line(line: str) -> MountInfo | None:
    """Parse one mountinfo line; None for anything malformed (never raise on kernel text)."""
    fields = line.split()
    try:
        sep = fields.index("-", 6)
        return MountInfo(
            mount_id=int(fields[0]),
            parent_id=int(fields[1]),
            dev=fields[2],
            root=unescape(fields[3]),
            mount_point=unescape(fields[4]),
            options=tuple(fields[5].split(",")),
            fstype=fields[sep + 1],
            source=unescape(fields[sep + 2]) if len(fields) > sep + 2 else "",
        )
    except (ValueError, IndexError):
        return None


def parse_mountinfo(text: str) -> list[MountInfo]:
    return [entry for entry in map(parse_line, text.splitlines()) if entry is not None]


def read_mountinfo(path: Path = MOUNTINFO) -> list[MountInfo]:
    return parse_mountinfo(path.read_text())


def mounts_at(entries: Iterable[MountInfo], mount_point: str) -> list[MountInfo]:
    """Every mount stacked on exactly this path, bottom first."""
    return [e for e in entries if e.mount_point == mount_point]


def is_within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def fs_location(entries: Sequence[MountInfo], path: str) -> tuple[str, str] | None:
    """(device, path inside that filesystem) for an absolute, symlink-free path.

    The mount that shows `path` is the one with the longest mount point above
    it (the last such line when mounts are stacked). A bind mount's `root`
    field is written in these terms, which is how a mount is traced back to a
    cache directory whatever path it was made from.
    """
    best: MountInfo | None = None
    for entry in entries:
        if is_within(path, entry.mount_point) and (
            best is None or len(entry.mount_point) >= len(best.mount_point)
        ):
            best = entry
    if best is None:
        return None
    rest = path[len(best.mount_point) :].lstrip("/") if best.mount_point != "/" else path.lstrip("/")
    inside = os.path.join(best.root, rest) if rest else best.root
    return best.dev, os.path.normpath(inside)


# ---- syscalls ---------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str, path: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} {path}: {os.strerror(err)}", path)


def mount(source: str, target: str, flags: int) -> None:
    _check(_libc.mount(source.encode(), target.encode(), None, flags, None), "mount", target)


def unmount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), "umount", target)


def bind_read_only(source: str, target: str) -> None:
    """Bind `source` on `target`, then make that mount read-only, nosuid, nodev.

    A bind mount ignores MS_RDONLY on its first call; the flags only take on a
    remount of the bind itself. If the remount fails the bind is undone, so a
    writable view never stays behind.
    """
    mount(source, target, MS_BIND)
    try:
        mount("none", target, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError:
        unmount(target, MNT_DETACH)
        raise
