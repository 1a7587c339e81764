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

Every copy is compared with the trust held now (`CacheRef.signature`, re-derived at every pass
from the platform's mounted trust: credentials.required_signature), so after a key is replaced or
withdrawn no copy verified only under it serves: the served one is taken out of service at once
(`_withdraw`: into `retired`, where running Pods keep their inode and new mounts cannot find it)
and fetched again, verified under the current trust, or it fails SignatureInvalid; a `next` or
retired copy verified under it is never switched in or rolled back to.

`Rolling.step` decides and does one step; the reconciler starts the download it asks for.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

from praesto.agent import eviction, logs
from praesto.agent.copies import CacheRef, CacheState, Copies, Obj
from praesto.agent.kube import KubeApi
from praesto.agent.status_writer import StatusWriter

from praesto import names, store
from praesto.kinds import ROLLS_PREFIX
from praesto.spec import parse_uri
from praesto.store import StoreLayout

_RENAME_EXCHANGE = 2  # linux/fs.h


class Step(Enum):
    SERVE = "serve"  # the served copy is what the ModelCacheNode asks for (or not a rolling case)
    FETCH = "fetch"  # download the asked revision beside the served copy
    HOLD = "hold"  # the asked revision is held beside; spec.switch says not to serve it yet
    # the served copy was verified under trust no longer held: taken out of service, the cache
    # directory is empty and the reconcile downloads it again (as for a copy never fetched)
    WITHDRAWN = "withdrawn"


def _mismatch(manifest: dict[str, Any], ref: CacheRef, *, revision: bool, signed: bool = True) -> str | None:
    """Why `manifest` is not a copy of this cache at the asked version (`revision`), or at any
    version of its source (not `revision`: an object store's other prefix in the same bucket too),
    verified as spec.verification asks under the trust held now (not `signed`: regardless)."""
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
        signature=ref.signature if signed else None,
    )


def _untrusted(served: dict[str, Any], ref: CacheRef) -> str | None:
    """Why the served copy, this cache's and verified the way spec.verification asks, no longer
    stands: it was verified under trust the agent does not hold now. None otherwise (a copy never
    verified that way, or another cache's, is removal.py's case: it waits for its mounts)."""
    wanted = ref.signature
    if wanted is None or not wanted.trust or _mismatch(served, ref, revision=False, signed=False) is not None:
        return None
    record = served.get(names.MANIFEST_SIGNATURE)
    if store.signature_mismatch(record, replace(wanted, trust="")) is not None:
        return None
    return store.signature_mismatch(record, wanted)


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
    if held is not None and held.kind.rolls == ROLLS_PREFIX:
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
        untrusted = _untrusted(served, ref)
        if untrusted is not None:
            self._withdraw(obj, ref, served, untrusted)
            return Step.WITHDRAWN
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

    def _withdraw(self, obj: Obj, ref: CacheRef, served: dict[str, Any], why: str) -> None:
        """Take the served copy out of service now, not once its Pods end: the complete marker first
        (a CSI publish that opened the directory meanwhile finds none and is retried), then into
        `retired`, where running Pods keep reading their inode until `collect` removes it; it is
        never rolled back to (`_reuse_retired` compares its trust too). The cache directory is then
        empty, and the reconcile fetches the model again and verifies it under the current trust."""
        ns, cache = ref.namespace, ref.cache
        current = self.layout.cache_dir(ns, cache)
        with self.lock:
            with contextlib.suppress(FileNotFoundError):
                (current / names.COMPLETE_FILE).unlink()
            retired = self._free_retired_name(ns, cache, commit_of(served) + ".untrusted")
            retired.parent.mkdir(parents=True, exist_ok=True)
            os.rename(current, retired)
        message = (
            f"the copy at revision {commit_of(served)[:12]} is no longer served: {why}; fetching it again "
            "and verifying it under the current trust (Pods running on it keep it until they end)"
        )
        logs.cache_logger(ns, cache, modelCacheNode=ref.name).warning(
            "copy verified under withdrawn trust taken out of service", extra={"detail": message}
        )
        self.kube.emit_event(obj, "Warning", names.REASON_SIGNATURE_INVALID, message)

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
                marker, aside = path / names.COMPLETE_FILE, path / store.RETIRING
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


def _identity(manifest: Path, ref: CacheRef) -> tuple[int, int, int, str, str, str] | None:
    """(inode, mtime, size) of the served manifest with the asked revision, cache and trust held
    now: while these stay, the served copy need not be read again on every tick; a replaced key
    changes the last one, so every copy is compared again on the next pass."""
    try:
        seen = manifest.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    trust = ref.signature.trust if ref.signature else ""
    return seen.st_ino, seen.st_mtime_ns, seen.st_size, ref.source.version, ref.cache_uid, trust


def _mounted(layout: StoreLayout, ns: str, cache: str, commit: str) -> bool:
    """A mount record of this cache names `commit` (or names none: a record from before rolling
    updates, or unreadable at a restart, keeps every retired copy)."""
    return any(r.revision in (commit, "") for r in store.mounts_for(layout, ns, cache))
