"""Unpack verified OCI archive layers into the staged tree, refusing anything unsafe.

An archive layer (ModelPack `...v1.tar`, `+gzip`, `+zstd`; an `oras push` folder) has
been fetched whole and checked against its digest by the engine; here its members become
files of the model, one pass, streamed (no temporary copy of the uncompressed tar), each
file hashed as it is written and fsync'd, and, once every layer is unpacked, shared with the
content-addressed blob area like any downloaded file (a refused layer leaves no blob). The
archive itself is removed afterwards: the store keeps the model once, not the layer and the
unpacked copy (what a container runtime keeps).

Only folders and regular files are accepted. Refused, naming the layer and the member:
absolute names, `..`, names under Praesto's own `.praesto*` entries, links of any kind
(a model needs none, and a link is how an archive points out of the tree), device files,
FIFOs, a name two layers both write, and more bytes than the layer says it holds
(`Archive.unpacked_limit`: the ModelPack metadata's size, or the tar's own size).

A layer is a few KB that may expand to anything, so what lands is counted as it lands, against
the copy's bound (`Options.max_bytes`: storage.size, the PVC Job's --max-bytes), starting from
what staging already holds (every fetched file and layer: `Plan.disk_bytes`, the number the size
checks, the node's room and the quota count). A member is refused before its first byte when its
header's size would cross the bound, and its bytes are counted again as they are written, so
neither a lying claim nor a lying header takes more than the bound: SizeExceedsRequest, lasting,
and fetch/ removes staging. Entries are bounded too (one inode each, and tarfile keeps every
header in memory): at most one per ENTRY_BYTES of the bound, and MAX_ENTRIES at all; and a pax or
GNU long-name record, which tarfile reads whole into memory, at most MAX_HEADER_BYTES.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import zstandard
from praesto.agent.download.api import MAX_FILES, LastingDownloadError, Plan, RemoteFile
from praesto.agent.download.http import CHUNK
from praesto.agent.download.publish import add_to_blobs, link_from_blob
from praesto.agent.download.repopath import check_repo_path

from praesto.quantity import format_bytes

DECODE_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)
MAX_ENTRIES = MAX_FILES  # files and folders one copy's archives may hold: a plan's file cap (api.py)
ENTRY_BYTES = 4096  # an entry takes an inode and a block at least (ext4's and xfs's default block)
# The archive's own shape, not the disk: a file where a folder is (or under a file), a name too long.
CLASHES = (errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG)
MAX_HEADER_BYTES = 1 << 20  # a pax or GNU long-name record: tarfile holds it whole in memory
_HEADER_RECORDS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                   tarfile.SOLARIS_XHDTYPE)  # fmt: skip


class Allowance:
    """What the unpacked members may still put on disk: bytes and entries, against `bound`.

    `on_disk` starts at what staging holds before the first member (Plan.total_bytes: the fetched
    files and layers), so the same formula as Plan.disk_bytes stops the copy at its bound.
    """

    def __init__(self, bound: int | None, on_disk: int) -> None:
        self.bound, self.on_disk, self.entries = bound, on_disk, 0
        by_bound = MAX_ENTRIES if bound is None else max(1, bound // ENTRY_BYTES)
        self.max_entries = min(MAX_ENTRIES, by_bound)
        self.folders: set[str] = set()  # made so far, named or implied by a member's path

    def entry(self, where: str, name: str, *, folder: bool) -> None:
        """Count a member and every folder above it not made before (mkdir makes them all)."""
        self.entries += 1
        if folder:
            self.folders.add(name)
        parent = name.rpartition("/")[0]
        while parent and parent not in self.folders:
            self.folders.add(parent)
            self.entries += 1
            parent = parent.rpartition("/")[0]
        if self.entries <= self.max_entries:
            return
        if self.max_entries == MAX_ENTRIES:
            raise _refused(
                where, name, f"is entry {self.entries}: a model's layers hold at most {MAX_ENTRIES}"
            )
        raise self._exceeded(
            where, name, f"is entry {self.entries}, past the {self.max_entries} files and folders (one per "
            f"{format_bytes(ENTRY_BYTES)}: each takes an inode and a block)",
        )  # fmt: skip

    def take(self, size: int, where: str, name: str) -> None:
        """Count `size` more bytes on disk, refusing them if they cross the bound."""
        self.on_disk += size
        if self.bound is not None and self.on_disk > self.bound:
            raise self._exceeded(
                where, name, f"takes the copy to {format_bytes(self.on_disk)} ({self.on_disk} bytes) on disk"
            )

    def _exceeded(self, where: str, name: str, cause: str) -> LastingDownloadError:
        bound = self.bound
        return LastingDownloadError(
            "SizeExceedsRequest",
            f"{where}: member {name!r} {cause}, more than spec.storage.size {format_bytes(bound or 0)} "
            f"({bound} bytes) allows (fetched layers count until unpacked); unpacking stopped, nothing was "
            "published; raise storage.size on the ModelCache to at least the model's unpacked size",
        )


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses a pax or GNU long-name record past MAX_HEADER_BYTES before tarfile reads it whole
    into memory: CPython's Lib/tarfile.py (3.11) `TarInfo._proc_member` dispatches every header
    record, and `_proc_pax` / `_proc_gnulong` then read `self.size` bytes at once."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_RECORDS and self.size > MAX_HEADER_BYTES:
            raise tarfile.TarError(f"a header record of {self.size} bytes, more than {MAX_HEADER_BYTES}")
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


def unpack_layers(
    plan: Plan, tree: Path, sha256: dict[str, str], blobs: Path | None, bound: int | None = None
) -> Plan:
    """Unpack every archive layer of `plan` staged in `tree`, the copy held within `bound` bytes on
    disk (Options.max_bytes; None: only the disk bounds it); return the plan of the tree as it now
    is (model files only, the archives in `layers`). `sha256` gains the unpacked files."""
    archives = [f for f in plan.files if f.archive is not None]
    if not archives:
        return plan
    files = {f.path: f for f in plan.files if f.archive is None}
    allowance = Allowance(bound, plan.total_bytes)
    unpacked: list[RemoteFile] = []
    for layer in archives:
        for file in _unpack(layer, tree, set(files), plan.source.uri, allowance):
            files[file.path] = file
            sha256[file.path] = str(file.sha256)
            unpacked.append(file)
        staged = tree / layer.path
        staged.unlink(missing_ok=True)
        sha256.pop(layer.path, None)
    for file in unpacked:  # shared only once all is unpacked: a refused layer leaves no blob behind
        if not link_from_blob(blobs, file.sha256, file.size, tree / file.path):  # already stored: share
            add_to_blobs(blobs, str(file.sha256), tree / file.path)
    with contextlib.suppress(OSError):
        shutil.rmtree(tree / archives[0].path.split("/", 1)[0])
    ordered = tuple(sorted(files.values(), key=lambda f: f.path))
    return Plan(plan.source, plan.revision, ordered, layers=tuple(archives))


def _unpack(
    layer: RemoteFile, tree: Path, taken: set[str], uri: str, allowance: Allowance
) -> list[RemoteFile]:
    assert layer.archive is not None
    digest = f"sha256:{layer.sha256}"
    where = f"{uri}: layer {digest} ({layer.archive.layer_path!r}, {layer.archive.kind})"
    out: list[RemoteFile] = []
    total = 0
    limit = layer.archive.unpacked_limit
    try:
        with open(tree / layer.path, "rb") as raw, _decoded(raw, layer.archive.kind) as stream:
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo) as archive:
                for member in archive:
                    name = _checked_name(member, where)
                    allowance.entry(where, name, folder=member.isdir())
                    if not member.isdir() and not member.isreg():
                        raise _refused(
                            where, name, f"is a {_kind(member)}; model layers may hold only files and folders"
                        )
                    if name in taken:
                        raise _refused(where, name, "is also written by another layer; one layer per file")
                    total += member.size
                    if limit is not None and total > limit:
                        raise _refused(
                            where,
                            name,
                            f"takes the layer past {format_bytes(limit)} ({limit} bytes), the size its "
                            "annotations or its own size allow",
                        )
                    allowance.take(member.size, where, name)  # before its first byte
                    try:
                        if member.isdir():
                            (tree / name).mkdir(parents=True, exist_ok=True)
                            continue
                        source = archive.extractfile(member)
                        assert source is not None  # a regular member always has content
                        out.append(_write(source, tree, name, member.size, digest, where))
                    except OSError as error:
                        if error.errno not in CLASHES:
                            raise  # the disk's (fetch/: ENOSPC is InsufficientDiskSpace)
                        raise _refused(where, name, f"cannot be written ({error.strerror})") from None
                    taken.add(name)
    except DECODE_ERRORS as error:
        raise LastingDownloadError(
            "InvalidRepoFile",
            f"{where}: not a valid {layer.archive.kind} archive ({type(error).__name__}: {error}); "
            "push the layer again",
        ) from None
    return out


@contextlib.contextmanager
def _decoded(raw: IO[bytes], kind: str) -> Iterator[IO[bytes]]:
    if kind == "tar+gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield stream  # type: ignore[misc]  # a GzipFile is a binary file, typeshed says otherwise
    elif kind == "tar+zstd":
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as zstream:
            yield io.BufferedReader(zstream, CHUNK)
    else:
        yield raw


def _checked_name(member: tarfile.TarInfo, where: str) -> str:
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/") if member.isdir() else name
    try:
        return check_repo_path(name)
    except LastingDownloadError:
        raise _refused(where, member.name, "would land outside the model or on a Praesto marker") from None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"hard link to {member.linkname!r}"
    if member.isdev():
        return "device file"
    if member.isfifo():
        return "FIFO"
    return f"tar entry of type {member.type!r}"


def _refused(where: str, name: str, cause: str) -> LastingDownloadError:
    return LastingDownloadError(
        "InvalidRepoFile", f"{where}: member {name!r} {cause}; fix the artifact and push it again"
    )


def _write(source: IO[bytes], tree: Path, name: str, size: int, digest: str, where: str) -> RemoteFile:
    """One member to `tree/name`, hashed as written and fsync'd. Its bytes are counted as they
    come: never more than the `size` already counted against the bound."""
    target = tree / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # an earlier, interrupted unpack (may be a read-only blob link)
    hasher = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    landed = 0
    try:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while n := source.readinto(view):  # type: ignore[attr-defined]
            landed += n
            if landed > size:
                raise _refused(where, name, f"holds more bytes than its header's {size}")
            hasher.update(view[:n])
            written = 0
            while written < n:  # a regular file takes it whole, but a short write must not lose bytes
                written += os.write(fd, view[written:n])
        os.fsync(fd)
    finally:
        os.close(fd)
    return RemoteFile(name, size, sha256=hasher.hexdigest(), layer=digest)
