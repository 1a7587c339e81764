"""The scrub's pure core: a copy's manifest and the files on disk -> what is wrong with them.

Bytes rot after they were verified (a bad sector, a tool that wrote into the store, a person who
"fixed" a file); a model server loads them silently. So each Ready copy is re-hashed against the
sha256 its manifest recorded at download. Nothing here writes: the findings drive the repair
(agent/scrub/repair.py). A published name may share its inode with the blob area and with other
caches' copies (dedup), so a finding also says which blob holds the same bad inode.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 1 << 20

CHANGED = "changed"  # same size, other bytes
SIZE = "size"  # wrong size (truncated, appended)
MISSING = "missing"
NOT_REGULAR = "not-regular"  # a symlink, a directory, a device... where a file was published
LINKED = "linked"  # hard-linked to another blob's inode (other content)


@dataclass(frozen=True)
class Expected:
    """One file the manifest says the copy holds."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Finding:
    path: str
    kind: str
    detail: str
    inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the bad file, when it is a file

    def describe(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass
class Report:
    files_checked: int = 0
    bytes_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings


class ManifestError(ValueError):
    """The manifest cannot be scrubbed against (no digests, an unsafe path)."""


def expected_files(manifest: dict[str, Any]) -> list[Expected]:
    """The files to check, from the manifest publish.manifest_for wrote; raises ManifestError naming
    the entry when one cannot be checked (a path leaving the copy, no sha256)."""
    out = []
    for entry in manifest.get("files") or []:
        if not isinstance(entry, dict):
            raise ManifestError(f"manifest files: {entry!r} is not an object")
        path, size, digest = entry.get("path"), entry.get("size"), entry.get("sha256")
        if not isinstance(path, str) or not safe_path(path):
            raise ManifestError(f"manifest files: path {path!r} is not a relative path inside the copy")
        if not isinstance(size, int) or size < 0:
            raise ManifestError(f"manifest files: {path} has no size")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ManifestError(f"manifest files: {path} has no sha256 to check against")
        out.append(Expected(path, size, digest.lower()))
    return out


def safe_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def scrub(
    copy_dir: Path,
    files: list[Expected],
    read_budget: Callable[[int], None] = lambda n: None,
    cancel: threading.Event | None = None,
    blob_inodes: Callable[[], dict[tuple[int, int], str]] = dict,
) -> Report:
    """Check every file of `files` under `copy_dir`; `read_budget(n)` is called before each chunk of
    n bytes is read (the pacer); stops early (an incomplete report) when `cancel` is set.
    `blob_inodes` maps (dev, ino) -> blob sha256, asked only once a mismatch needs naming."""
    report = Report()
    inodes: dict[tuple[int, int], str] | None = None
    for want in files:
        if cancel is not None and cancel.is_set():
            break
        finding = check_file(copy_dir, want, read_budget, report, cancel)
        report.files_checked += 1
        if finding is None:
            continue
        if finding.kind in (CHANGED, SIZE) and finding.inode is not None:
            inodes = blob_inodes() if inodes is None else inodes
            other = inodes.get(finding.inode)
            if other is not None and other != want.sha256:
                finding = Finding(
                    want.path,
                    LINKED,
                    f"is a hard link to blob {other[:12]}, not {want.sha256[:12]}",
                    finding.inode,
                )
        report.findings.append(finding)
    return report


def check_file(
    copy_dir: Path,
    want: Expected,
    read_budget: Callable[[int], None],
    report: Report,
    cancel: threading.Event | None,
) -> Finding | None:
    path = copy_dir / want.path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Finding(want.path, MISSING, "is missing")
    except NotADirectoryError:
        return Finding(want.path, MISSING, "is missing (a folder above it is not a folder)")
    if not stat.S_ISREG(st.st_mode):
        return Finding(want.path, NOT_REGULAR, "is not a regular file")
    inode = (st.st_dev, st.st_ino)
    if st.st_size != want.size:
        return Finding(want.path, SIZE, f"is {st.st_size} bytes, the manifest says {want.size}", inode)
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        return Finding(want.path, NOT_REGULAR, f"cannot be opened ({err.strerror})", inode)
    try:
        with open(fd, "rb", closefd=True) as handle:
            while True:
                if cancel is not None and cancel.is_set():
                    return None
                read_budget(CHUNK)
                chunk = handle.read(CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                report.bytes_checked += len(chunk)
    except OSError as err:  # EIO: the disk could not read it
        return Finding(want.path, CHANGED, f"cannot be read ({err.strerror})", inode)
    if digest.hexdigest() != want.sha256:
        return Finding(
            want.path, CHANGED, f"has sha256 {digest.hexdigest()[:12]}, not {want.sha256[:12]}", inode
        )
    return None


def blob_inode_index(blobs_dir: Path) -> dict[tuple[int, int], str]:
    """(dev, ino) -> sha256 of every blob (one stat each; only asked once a copy mismatches)."""
    out: dict[tuple[int, int], str] = {}
    try:
        entries = list(os.scandir(blobs_dir))
    except OSError:
        return out
    for entry in entries:
        if len(entry.name) != 64:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        out[(st.st_dev, st.st_ino)] = entry.name
    return out
