"""Staging, dedup and atomic publication of a verified download.

Two destination shapes (design.md, "Node-local store"):
* node cache: `dest` does not exist yet; the staged tree is renamed onto it in one step;
* PVC mode: `dest` is an existing mount point; files are moved in one by one.
Either way the complete marker is written (and fsync'd) last, so a reader that checks
for it never sees a partial model. Published files are read-only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from praesto.agent.download.api import Options, Plan, SignaturePolicy
from praesto.agent.download.crashpoints import COMPLETE_WRITTEN, TREE_MOVED, WRITTEN_NOT_RENAMED, crash_point

from praesto import names, store

STAGING_IN_DEST = ".praesto-staging"
TREE = "tree"
FILE_MODE = 0o444


def staging_for(dest: Path, options: Options) -> tuple[Path, bool]:
    """(staging dir, PVC mode). Staging is on dest's filesystem so the final rename is atomic.

    An existing `dest` is a volume to fill in place (PVC mode, or a copy being replaced);
    a missing one is created by renaming the staged tree onto it.
    """
    if dest.is_dir():
        return dest / STAGING_IN_DEST, True
    if options.staging_dir is not None:
        return options.staging_dir, False
    return dest.parent / f".{dest.name}{STAGING_IN_DEST}", False


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_manifest(dest: Path) -> dict[str, Any] | None:
    if not (dest / names.COMPLETE_FILE).is_file():
        return None
    try:
        data = json.loads((dest / names.MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def signature_recorded(manifest: dict[str, Any], policy: SignaturePolicy | None) -> bool:
    """A complete copy satisfies `policy`: none asked, or verified by the same method and path under
    the same trust (store.signature_mismatch: the comparison the agent's reconcile makes too)."""
    if policy is None:
        return True
    return store.signature_mismatch(manifest.get(names.MANIFEST_SIGNATURE), policy.required) is None


def is_published(
    dest: Path, plan: Plan, cache_uid: str = "", signature: SignaturePolicy | None = None
) -> bool:
    """`dest` already holds exactly this plan (same source, commit and files), for this cache, and
    was verified under `signature` when one is required."""
    manifest = complete_manifest(dest)
    if manifest is None or not signature_recorded(manifest, signature):
        return False
    if cache_uid and manifest.get(names.MANIFEST_CACHE_UID, cache_uid) != cache_uid:
        return False
    # the files the signature did not cover were never published (signature.drop_unsigned)
    record = manifest.get(names.MANIFEST_SIGNATURE)
    dropped = set(record.get(names.MANIFEST_SIGNATURE_EXCLUDED) or ()) if isinstance(record, dict) else set()
    want = {(f.path, f.size) for f in plan.files if f.path not in dropped}
    # An OCI copy lists the files it unpacked from archive layers, and those layers apart: the plan
    # names the layers, so they stand in for the files they held.
    have = {(f.get("path"), f.get("size")) for f in manifest.get("files", []) if "layer" not in f}
    have |= {(f.get("path"), f.get("size")) for f in manifest.get(names.MANIFEST_LAYERS, [])}
    return bool(
        manifest.get("source") == plan.source.uri
        and manifest.get("resolvedRevision") == plan.revision
        and want == have
    )


def manifest_for(
    plan: Plan, sha256: dict[str, str], cache_uid: str = "", signed: dict[str, Any] | None = None
) -> dict[str, Any]:
    files = []
    for f in plan.files:
        entry: dict[str, Any] = {"path": f.path, "size": f.size, "sha256": sha256[f.path]}
        # what vouched for the bytes: the origin's digest, or the origin alone (fetched only from it)
        entry["verifiedBy"] = f.verified_by or "origin-only"
        if f.digest and not f.sha256 and not f.git_sha1:  # the store's checksum: its value and header
            entry["storeDigest"] = {"value": f.digest.value, "from": f.digest.header}
        if f.git_sha1:
            entry["gitBlobSha1"] = f.git_sha1
        if f.etag:  # object stores: exactly which object version was cached
            entry["etag"] = f.etag
        if f.version:
            entry["version"] = f.version
        if f.layer:
            entry["layer"] = f.layer
        files.append(entry)
    layers = [
        {"path": f.path, "size": f.size, "digest": f"sha256:{f.sha256}", "kind": f.archive.kind}
        for f in plan.layers
        if f.archive is not None
    ]
    owner = {names.MANIFEST_CACHE_UID: cache_uid} if cache_uid else {}
    signature = {names.MANIFEST_SIGNATURE: signed} if signed else {}  # absent: none was required
    return {
        **owner,
        **signature,
        **({names.MANIFEST_LAYERS: layers} if layers else {}),
        "source": plan.source.uri,
        "revision": plan.source.revision,
        "resolvedRevision": plan.revision,
        "allowPatterns": list(plan.source.allow_patterns),
        "ignorePatterns": list(plan.source.ignore_patterns),
        "totalBytes": plan.total_bytes,
        "files": files,
        "completedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_synced(path: Path, data: bytes) -> None:
    """Write `path` whole and read-only, or not at all, so that a kill at any step never blocks a retry.

    The temporary file is created read-only (the mode applies to later opens, not to the
    descriptor that creates it), so there is no chmod step. A kill before the rename leaves
    it behind, read-only: the agent (uid 65532, no CAP_DAC_OVERRIDE) cannot reopen it for
    writing, so a leftover is unlinked first, which needs only the folder's write permission.
    """
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    with open(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    crash_point(f"{WRITTEN_NOT_RENAMED}:{path.name}")
    os.replace(tmp, path)


def link_from_blob(blobs: Path | None, sha256: str | None, size: int, target: Path) -> bool:
    """Hard-link known content instead of fetching it; False when absent or not linkable."""
    if blobs is None or sha256 is None:
        return False
    blob = blobs / sha256
    try:
        if blob.stat().st_size != size:
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        os.link(blob, target)
    except OSError:  # absent, or another filesystem (EXDEV): fetch it instead
        return False
    return True


ORIGIN_INDEX = "by-origin"  # below the blob area: origin key -> the sha256 of bytes verified for it


def origin_key(scope: str, source_uri: str, revision: str, path: str, git_sha1: str, size: int) -> str:
    """The name of one small file at one exact revision of one source, for one namespace.

    A small Hugging Face file is known before download only by its git blob SHA-1. SHA-1 can
    be collided on purpose, so content is never shared by SHA-1 alone (another repo could
    plant bytes under a tenant's id); the same path of the same source at the same commit is
    the same bytes, but only within `scope` (the namespace, `Options.dedup_scope`): another
    namespace's bytes for it were verified by that SHA-1 alone, so they are never linked here.
    """
    text = f"{scope}\n{source_uri}\n{revision}\n{path}\n{git_sha1}\n{size}"
    return hashlib.sha256(text.encode()).hexdigest()


def stored_object_key(scope: str, bucket_uri: str, algorithm: str, value: str, size: int) -> str:
    """The name of an object store's bytes by the digest the store published (MD5, SHA-1, sha256),
    within one bucket and one namespace: an unchanged file under a new prefix (a rolling update,
    issue #25) is linked, not fetched again. MD5 can be collided on purpose, but only by whoever
    writes to that bucket, who can change the model anyway; no other bucket or namespace shares it.
    """
    text = f"{scope}\n{bucket_uri}\n{algorithm}\n{value}\n{size}"
    return hashlib.sha256(text.encode()).hexdigest()


def recall_origin(blobs: Path | None, key: str) -> str | None:
    """The sha256 recorded for `key`, if any (the blob itself may be gone: link_from_blob says)."""
    if blobs is None:
        return None
    try:
        value = (blobs / ORIGIN_INDEX / key).read_text().strip()
    except OSError:
        return None
    return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None


def remember_origin(blobs: Path | None, key: str, sha256: str) -> None:
    """Record, atomically, that the verified bytes for `key` are the blob `sha256`."""
    if blobs is None:
        return
    index = blobs / ORIGIN_INDEX
    try:
        index.mkdir(parents=True, exist_ok=True)
        tmp = index / f".{key}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(sha256)
        os.replace(tmp, index / key)
    except OSError:
        return  # dedup is an optimisation; a failure to record must not fail the download


SHARING = ".sharing-"  # a blob's passing second name while it replaces a staged copy (gc_blobs drops strays)


def add_to_blobs(blobs: Path | None, sha256: str, path: Path) -> None:
    """Make the verified file at `path` the blob for `sha256`, or share the blob already there."""
    if blobs is None:
        return
    try:
        blobs.mkdir(parents=True, exist_ok=True)
        os.link(path, blobs / sha256)
    except FileExistsError:
        _share(blobs / sha256, path)
    except OSError:
        return  # dedup is an optimisation; a failure to share must not fail the download


def _share(blob: Path, path: Path) -> None:
    """Another download verified the same bytes first (two caches of one model fetched at once): `path`
    becomes a name of the blob's inode, in one rename, so the node stores the bytes once."""
    passing = blob.with_name(f"{SHARING}{blob.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        theirs, mine = os.stat(blob), os.stat(path)
        if theirs.st_ino == mine.st_ino or theirs.st_size != mine.st_size:
            return
        os.link(blob, passing)
        os.replace(passing, path)
    except OSError:  # e.g. the blob's link limit: both copies stay, each verified
        with contextlib.suppress(OSError):
            os.unlink(passing)


def _folders(paths: Iterable[str]) -> set[str]:
    """Every folder above the given relative POSIX paths, as strings: string splitting, since
    pathlib's parents and is_relative_to cost seconds at 100,000 files (bench.agent_scale_bench)."""
    out: set[str] = set()
    for path in paths:
        folder = path.rpartition("/")[0]
        while folder and folder not in out:
            out.add(folder)
            folder = folder.rpartition("/")[0]
    return out


def publish(
    plan: Plan,
    staging: Path,
    dest: Path,
    pvc: bool,
    sha256: dict[str, str],
    cache_uid: str = "",
    signed: dict[str, Any] | None = None,
) -> None:
    """Move the verified tree into `dest`, then write the markers, complete last.

    `signed`: how the tree's signature was verified (signature.verify_tree), for the manifest.
    """
    tree = staging / TREE
    tree.mkdir(parents=True, exist_ok=True)
    for f in plan.files:
        os.chmod(tree / f.path, FILE_MODE)
    for folder in sorted(_folders(f.path for f in plan.files), key=lambda p: -p.count("/")):
        fsync_dir(tree / folder)
    fsync_dir(tree)
    # Compact: json's C encoder (indent= falls back to pure Python: seconds at 100,000 files).
    manifest = json.dumps(
        manifest_for(plan, sha256, cache_uid, signed), sort_keys=True, separators=(",", ":")
    ).encode()
    owner = json.dumps(
        {
            "writer": "praesto-agent",
            "source": plan.source.uri,
            "resolvedRevision": plan.revision,
            "host": socket.gethostname(),
        }
    ).encode()
    if not pvc:
        _write_synced(tree / names.MANIFEST_FILE, manifest)
        _write_synced(tree / names.OWNER_FILE, owner)
        fsync_dir(tree)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tree, dest)
        fsync_dir(dest.parent)
        crash_point(TREE_MOVED)
    else:
        with contextlib.suppress(FileNotFoundError):
            (dest / names.COMPLETE_FILE).unlink()  # a replaced copy is not complete meanwhile
        fsync_dir(dest)
        for f in plan.files:
            target = dest / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(tree / f.path, target)
        for d in {(dest / f.path).parent for f in plan.files}:
            fsync_dir(d)
        crash_point(TREE_MOVED)
        _write_synced(dest / names.MANIFEST_FILE, manifest)
        _write_synced(dest / names.OWNER_FILE, owner)
    _write_synced(dest / names.COMPLETE_FILE, f"{plan.revision}\n".encode())
    fsync_dir(dest)
    crash_point(COMPLETE_WRITTEN)
    shutil.rmtree(staging, ignore_errors=True)
