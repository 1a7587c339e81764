"""Rolling revision updates on one node (issue #25 part 1): a new revision beside the served one.

When a ModelCacheNode asks for another version of the same source (same repo or bucket, filters
and owning cache; `Source.version` is a revision, or an object store's prefix) than the copy the
node serves, that copy keeps serving while the new version is published beside it, in
`<base>/.praesto/next/<ns>_<cache>` (files whose content did not change are hard links to the
blobs the served copy already holds, so only changed bytes move).
Once the node holds it and `spec.switch` allows, the two trade places: the served copy is
renamed into `.praesto/retired/<ns>_<cache>/<commit>` and the new one onto the cache
directory. A rename keeps the inode, so a Pod that mounted the old copy keeps reading it; new
mounts open the cache directory and get the new revision. A retired copy goes once no CSI mount
record names its commit (with eviction's protocol: marker aside, records re-read). Asking for
a revision a retired copy holds moves it back to `next`: a rollback fetches nothing.

`Rolling.step` decides and does one step; the reconciler starts the download it asks for.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
from enum import Enum
from pathlib import Path
from typing import Any

from praesto.agent import eviction, logs
from praesto.agent.copies import CacheRef, CacheState, Copies, Obj
from praesto.agent.kube import KubeApi
from praesto.agent.status_writer import StatusWriter

from praesto import names, store
from praesto.spec import parse_uri
from praesto.store import StoreLayout

RETIRING = ".praesto-retiring"  # the complete marker, set aside while a retired copy's mounts are read
_RENAME_EXCHANGE = 2  # linux/fs.h


class Step(Enum):
    SERVE = "serve"  # the served copy is what the ModelCacheNode asks for (or not a rolling case)
    FETCH = "fetch"  # download the asked revision beside the served copy
    HOLD = "hold"  # the asked revision is held beside; spec.switch says not to serve it yet


def _mismatch(manifest: dict[str, Any], ref: CacheRef, *, revision: bool) -> str | None:
    """Why `manifest` is not a copy of this cache at the asked version (`revision`), or at any
    version of its source (not `revision`: an object store's other prefix in the same bucket too)."""
    source = ref.source
    uri = source.uri
    if not revision:
        held = parse_uri(str(manifest.get("source") or ""))[0]
        if held is not None and held.lineage == source.lineage:
            uri = held.uri
    return store.copy_mismatch(
        manifest,
        source=uri,
        revision=source.revision if revision else "",
        allow_patterns=source.allow_patterns,
        ignore_patterns=source.ignore_patterns,
        cache_uid=ref.cache_uid,
        signature=(ref.verification.method, ref.verification.path) if ref.verification else None,
    )


def complete_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a complete copy at `path`, None when it is not one."""
    if not (path / names.COMPLETE_FILE).is_file():
        return None
    return store.read_json(path / names.MANIFEST_FILE)


def commit_of(manifest: dict[str, Any] | None) -> str:
    return str((manifest or {}).get("resolvedRevision") or "")


def version_of(manifest: dict[str, Any]) -> str:
    """The spec version a copy answers (`Source.version`, reported as status.revision): the
    revision it was asked for, or for an object store the bucket/prefix it was listed from."""
    held = parse_uri(str(manifest.get("source") or ""))[0]
    if held is not None and held.object_store:
        return held.version
    return str(manifest.get("revision") or "")


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE): a CSI publish opening `a`
    finds either copy, never nothing. Where the kernel or filesystem lacks it, two renames
    through a free name (a publish in between is refused as retryable and the kubelet retries)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None:
        done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
        if done == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(a))
    aside = a.with_name(a.name + ".exchanging")
    os.rename(a, aside)
    os.rename(b, a)
    os.rename(aside, b)


class Rolling:
    def __init__(self, layout: StoreLayout, copies: Copies, status: StatusWriter, kube: KubeApi) -> None:
        self.layout, self.copies, self.status, self.kube = layout, copies, status, kube
        self.lock = copies.lock

    def step(self, obj: Obj, ref: CacheRef, state: CacheState) -> Step:
        """One step for a copy whose cache directory is complete (the caller checked)."""
        ns, cache = ref.namespace, ref.cache
        nxt = self.layout.next_dir(ns, cache)
        seen = _identity(self.layout.manifest_path(ns, cache), ref)
        if seen is not None and state.served_revision == seen and not nxt.exists():
            self.collect(ns, cache)  # the usual tick: the served copy is still the one asked for
            return Step.SERVE
        served = complete_manifest(self.layout.cache_dir(ns, cache)) or {}
        if _mismatch(served, ref, revision=True) is None:
            state.served_revision = seen
            self._retire_next(ref)  # asked back to the served revision before a switch
            self.collect(ns, cache)
            return Step.SERVE
        if _mismatch(served, ref, revision=False) is not None:
            return Step.SERVE  # another cache's copy, not an older revision: removal.py's case
        held = complete_manifest(nxt)
        if held is not None and _mismatch(held, ref, revision=True) is not None:
            self._retire_next(ref)  # another revision was asked meanwhile
            held = None
        if held is None:
            held = self._reuse_retired(ref)
        self.collect(ns, cache)
        if held is None:
            return Step.FETCH
        if not ref.switch:
            self.status.set_next(ref.key, self._next_status(ref, held, names.NEXT_READY))
            return Step.HOLD
        self._switch(obj, ref, served, held)
        return Step.SERVE

    def _next_status(self, ref: CacheRef, manifest: dict[str, Any], phase: str) -> dict[str, Any]:
        return {"revision": ref.source.version, "resolvedRevision": commit_of(manifest), "phase": phase}

    def _switch(self, obj: Obj, ref: CacheRef, served: dict[str, Any], held: dict[str, Any]) -> None:
        ns, cache = ref.namespace, ref.cache
        current, nxt = self.layout.cache_dir(ns, cache), self.layout.next_dir(ns, cache)
        with self.lock:
            exchange(current, nxt)  # new mounts now get the new revision; old mounts keep theirs
            retired = self._free_retired_name(ns, cache, commit_of(served))
            retired.parent.mkdir(parents=True, exist_ok=True)
            os.rename(nxt, retired)
        old, new = commit_of(served)[:12], commit_of(held)[:12]
        message = f"switched from revision {old} to {new}; Pods running on {old} keep it until they end"
        logs.cache_logger(ns, cache, modelCacheNode=ref.name).info(
            "revision switched", extra={"detail": message}
        )
        self.kube.emit_event(obj, "Normal", names.REASON_REVISION_SWITCHED, message)

    def _free_retired_name(self, ns: str, cache: str, commit: str) -> Path:
        path = self.layout.retired_dir(ns, cache, commit or "unknown")
        n = 0
        candidate = path
        while candidate.exists():
            n += 1
            candidate = path.with_name(f"{path.name}.{n}")
        return candidate

    def _retire_next(self, ref: CacheRef) -> None:
        """A `next` copy not asked for any more becomes a retired one (kept only while it could serve
        a rollback; nothing mounts it, so the next collect removes it)."""
        nxt = self.layout.next_dir(ref.namespace, ref.cache)
        if not nxt.exists():
            return
        with self.lock:
            held = complete_manifest(nxt)
            if held is None:
                shutil.rmtree(nxt, ignore_errors=True)
                return
            retired = self._free_retired_name(ref.namespace, ref.cache, commit_of(held))
            retired.parent.mkdir(parents=True, exist_ok=True)
            os.rename(nxt, retired)

    def _reuse_retired(self, ref: CacheRef) -> dict[str, Any] | None:
        """A retired copy holding the asked revision goes back to `next`: a rollback moves no byte."""
        root = self.layout.retired_root(ref.namespace, ref.cache)
        if not root.is_dir():
            return None
        for path in sorted(root.iterdir()):
            manifest = complete_manifest(path)
            if manifest is not None and _mismatch(manifest, ref, revision=True) is None:
                with self.lock:
                    os.rename(path, self.layout.next_dir(ref.namespace, ref.cache))
                logs.cache_logger(ref.namespace, ref.cache, modelCacheNode=ref.name).info(
                    "rollback: the asked revision was still on disk", extra={"revision": commit_of(manifest)}
                )
                return manifest
        return None

    def collect(self, ns: str, cache: str) -> int:
        """Remove the retired copies of this cache no mount record names; how many went.

        Eviction's protocol: the complete marker is set aside first, then the records are read;
        the CSI driver records a mount before it looks for the marker through its open directory,
        so a mount of a retired copy either is seen here (the copy stays) or is refused there.
        """
        root = self.layout.retired_root(ns, cache)
        if not root.is_dir():
            return 0
        removed = 0
        for path in sorted(root.iterdir()):
            with self.lock:
                commit = commit_of(store.read_json(path / names.MANIFEST_FILE))
                marker, aside = path / names.COMPLETE_FILE, path / RETIRING
                with contextlib.suppress(FileNotFoundError):
                    os.rename(marker, aside)
                if _mounted(self.layout, ns, cache, commit):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(aside, marker)
                    continue
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        with contextlib.suppress(OSError):
            root.rmdir()  # only when empty
        if removed:
            with self.lock:
                eviction.gc_blobs(self.layout)  # the blobs only the retired copies linked
            logs.cache_logger(ns, cache).info(
                "removed retired revisions no Pod mounts", extra={"count": removed}
            )
        return removed


def _identity(manifest: Path, ref: CacheRef) -> tuple[int, int, int, str, str] | None:
    """(inode, mtime, size) of the served manifest with the asked revision and cache: while these
    stay, the served copy need not be read again on every tick."""
    try:
        seen = manifest.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return seen.st_ino, seen.st_mtime_ns, seen.st_size, ref.source.version, ref.cache_uid


def _mounted(layout: StoreLayout, ns: str, cache: str, commit: str) -> bool:
    """A mount record of this cache names `commit` (or names none: a record from before rolling
    updates, or unreadable at a restart, keeps every retired copy)."""
    return any(r.revision in (commit, "") for r in store.mounts_for(layout, ns, cache))
