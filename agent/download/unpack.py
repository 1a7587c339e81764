"""Unpack verified OCI archive layers into the staged tree, refusing anything unsafe.

An archive layer (ModelPack `...v1.tar`, `+gzip`, `+zstd`; an `oras push` folder) has
been fetched whole and checked against its digest by the engine; here its members become
files of the model, one pass, streamed (no temporary copy of the uncompressed tar), each
file hashed as it is written, fsync'd, and shared with the content-addressed blob area
like any downloaded file. The archive itself is removed afterwards: the store keeps the
model once, not the layer and the unpacked copy (what a container runtime keeps).

Only folders and regular files are accepted. Refused, naming the layer and the member:
absolute names, `..`, names under Praesto's own `.praesto*` entries, links of any kind
(a model needs none, and a link is how an archive points out of the tree), device files,
FIFOs, a name two layers both write, and more bytes than the plan allows
(`Archive.unpacked_limit`: the ModelPack metadata's size, or the tar's own size).
"""

from __future__ import annotations

import contextlib
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
from praesto.agent.download.api import LastingDownloadError, Plan, RemoteFile
from praesto.agent.download.hfplan import check_repo_path
from praesto.agent.download.http import CHUNK
from praesto.agent.download.publish import add_to_blobs, link_from_blob

from praesto.quantity import format_bytes

DECODE_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)


def unpack_layers(plan: Plan, tree: Path, sha256: dict[str, str], blobs: Path | None) -> Plan:
    """Unpack every archive layer of `plan` staged in `tree`; return the plan of the tree as it
    now is (model files only, the archives in `layers`). `sha256` gains the unpacked files."""
    archives = [f for f in plan.files if f.archive is not None]
    if not archives:
        return plan
    files = {f.path: f for f in plan.files if f.archive is None}
    for layer in archives:
        for unpacked in _unpack(layer, tree, set(files), plan.source.uri, blobs):
            files[unpacked.path] = unpacked
            sha256[unpacked.path] = str(unpacked.sha256)
        staged = tree / layer.path
        staged.unlink(missing_ok=True)
        sha256.pop(layer.path, None)
    with contextlib.suppress(OSError):
        shutil.rmtree(tree / archives[0].path.split("/", 1)[0])
    ordered = tuple(sorted(files.values(), key=lambda f: f.path))
    return Plan(plan.source, plan.revision, ordered, layers=tuple(archives))


def _unpack(layer: RemoteFile, tree: Path, taken: set[str], uri: str, blobs: Path | None) -> list[RemoteFile]:
    assert layer.archive is not None
    digest = f"sha256:{layer.sha256}"
    where = f"{uri}: layer {digest} ({layer.archive.layer_path!r}, {layer.archive.kind})"
    out: list[RemoteFile] = []
    total = 0
    limit = layer.archive.unpacked_limit
    try:
        with open(tree / layer.path, "rb") as raw, _decoded(raw, layer.archive.kind) as stream:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    name = _checked_name(member, where)
                    if member.isdir():
                        (tree / name).mkdir(parents=True, exist_ok=True)
                        continue
                    if not member.isreg():
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
                    source = archive.extractfile(member)
                    assert source is not None  # a regular member always has content
                    out.append(_write(source, tree, name, member.size, digest, blobs))
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


def _write(
    source: IO[bytes], tree: Path, name: str, size: int, digest: str, blobs: Path | None
) -> RemoteFile:
    """One member to `tree/name`, hashed as written and fsync'd; shared with the blob area."""
    target = tree / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # an earlier, interrupted unpack (may be a read-only blob link)
    hasher = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while n := source.readinto(view):  # type: ignore[attr-defined]
            hasher.update(view[:n])
            written = 0
            while written < n:  # a regular file takes it whole, but a short write must not lose bytes
                written += os.write(fd, view[written:n])
        os.fsync(fd)
    finally:
        os.close(fd)
    hex_ = hasher.hexdigest()
    if not link_from_blob(blobs, hex_, size, target):  # the same bytes are already stored: share them
        add_to_blobs(blobs, hex_, target)
    return RemoteFile(name, size, sha256=hex_, layer=digest)
