"""Removing caches from the store: deletion, eviction and blob (and Xet chunk) garbage collection.

The agent may only ever remove `<base>/<ns>/<name>` and its own staging,
progress and request files; every path comes from the layout's owner (praesto/store.py),
is rebuilt from validated DNS labels and is reached without following a symlink
(praesto.csi.storefs's walk) before anything is deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.publish import recall_origin
from praesto.csi import storefs

from praesto import names, store
from praesto.store import StoreLayout


class UnsafePath(Exception):
    """A cache path that is not a plain directory inside the base path."""


def _checked(layout: StoreLayout, namespace: str, name: str) -> Path:
    if not (names.is_dns_label(namespace) and names.is_dns_label(name)):
        raise UnsafePath(f"{namespace}/{name}: namespace and cache name must be DNS labels")
    path = layout.cache_dir(namespace, name)
    try:
        with storefs.store_dir(layout.base, (namespace, name)):
            pass
    except OSError as err:  # ELOOP or ENOTDIR: a part is a symlink or not a directory
        raise UnsafePath(
            f"{path} or its namespace directory is a symlink or not a directory; refusing to delete through it"
        ) from err
    return path


def ready_time(layout: StoreLayout, namespace: str, name: str) -> float | None:
    """When the cache became complete (mtime of its marker), None if it is not."""
    try:
        return layout.complete_marker(namespace, name).stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None


def last_activity(layout: StoreLayout, namespace: str, name: str) -> float | None:
    """Last unmount or readiness, whichever is later (a rehydrated cache starts fresh)."""
    times = [t for t in (store.last_used(layout, namespace, name), ready_time(layout, namespace, name)) if t]
    return max(times) if times else None


def ttl_expired(layout: StoreLayout, namespace: str, name: str, ttl: float, now: float) -> bool:
    if store.mounts_for(layout, namespace, name):
        return False
    last = last_activity(layout, namespace, name)
    return last is not None and now - last >= ttl


def evict(layout: StoreLayout, namespace: str, name: str) -> bool:
    """Unpublish (marker first, so no new mount starts), re-check mounts, then delete.

    False, with the cache left intact, when a mount appeared in between.
    """
    path = _checked(layout, namespace, name)
    marker = layout.complete_marker(namespace, name)
    try:
        content = marker.read_bytes()
    except FileNotFoundError:
        return False
    marker.unlink()
    if store.mounts_for(layout, namespace, name):
        _restore(marker, content)
        return False
    shutil.rmtree(path, ignore_errors=True)
    store.clear_progress(layout, namespace, name)
    return True


def _restore(marker: Path, content: bytes) -> None:
    tmp = marker.with_name(marker.name + ".restore")
    tmp.write_bytes(content)
    os.replace(tmp, marker)


def remove_unless_mounted(layout: StoreLayout, namespace: str, name: str) -> bool:
    """Deletion's removal, with eviction's protocol: unpublish first, re-check mounts, then delete.

    False, with the cache left complete, when a Pod mount exists or appears meanwhile
    (the CSI plugin records a mount, then looks for the marker again).
    """
    if layout.is_complete(namespace, name) and not evict(layout, namespace, name):
        return False
    if store.mounts_for(layout, namespace, name):
        return False
    remove_all(layout, namespace, name)
    return True


def remove_all(layout: StoreLayout, namespace: str, name: str) -> None:
    """Everything the agent keeps for one cache (the ModelCacheNode is being deleted)."""
    shutil.rmtree(_checked(layout, namespace, name), ignore_errors=True)
    shutil.rmtree(layout.staging_dir(namespace, name), ignore_errors=True)
    for beside in (layout.next_dir, layout.next_staging_dir, layout.retired_root):  # rolling updates
        shutil.rmtree(beside(namespace, name), ignore_errors=True)
    store.clear_progress(layout, namespace, name)
    store.clear_hydration_request(layout, namespace, name)
    # the cache's records: its use stamp, where its bytes came from, its last scrub
    for record in (layout.used_stamp(namespace, name), layout.copy_record(namespace, name),
                   layout.scrub_record(namespace, name)):  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
    ns_dir = layout.base / namespace
    with contextlib.suppress(OSError):
        ns_dir.rmdir()  # only when empty


def drop_unowned_requests(layout: StoreLayout, owned: set[tuple[str, str]]) -> int:
    """Remove the CSI driver's hydration requests for caches this node holds no ModelCacheNode of.

    A Pod that mounts a cache not assigned to this node (or one deleted since) leaves a
    request nobody will ever answer; called after a relist, when `owned` is the whole truth.
    Malformed requests go too. Returns how many were removed.
    """
    dropped = 0
    try:
        with storefs.store_dir(layout.base, (store.INTERNAL_DIR, store.REQUESTS)) as fd:
            if fd is None:
                return 0
            for file_name in storefs.record_names(fd):
                owner = store.request_owner(file_name, storefs.read_json_at(fd, file_name))
                if owner is None or owner not in owned:
                    dropped += storefs.unlink_at(fd, file_name)
    except OSError:  # the driver's directory is a symlink or not one: nothing of the driver's to drop
        return dropped
    return dropped


def gc_blobs(layout: StoreLayout) -> int:
    """Drop content-addressed copies no cache links to any more (link count 1); bytes freed."""
    freed = 0
    if not layout.blobs_dir.is_dir():
        return 0
    for entry in os.scandir(layout.blobs_dir):
        try:
            st = entry.stat(follow_symlinks=False)
            if entry.name.startswith(store.BLOB_SHARING_PREFIX):  # a share a crash interrupted: not a blob
                os.unlink(entry.path)
            elif entry.is_file(follow_symlinks=False) and st.st_nlink == 1:
                os.unlink(entry.path)
                freed += st.st_size
        except FileNotFoundError:
            continue
    index = layout.blob_origin_index  # origin keys of small files: drop those whose blob went
    if index.is_dir():
        for entry in os.scandir(index):
            blob = recall_origin(layout.blobs_dir, entry.name)
            if blob is None or not (layout.blobs_dir / blob).is_file():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with contextlib.suppress(OSError):  # only when empty
            index.rmdir()
    # the Xet chunk store: indexes of files no blob holds any more, then chunks no index names
    return freed + xetstore.collect(layout.xet_chunks_dir, layout.blobs_dir)


def clear_xet_chunks(layout: StoreLayout) -> int:
    """Disk pressure: the whole Xet chunk store gives its room back (bytes a download can fetch
    again) before any copy is evicted; bytes freed."""
    return xetstore.clear(layout.xet_chunks_dir)


def cache_size(layout: StoreLayout, namespace: str, name: str) -> int:
    """Bytes a complete cache holds, from its manifest (no tree walk)."""
    manifest = store.read_json(layout.manifest_path(namespace, name)) or {}
    total = manifest.get("totalBytes")
    if isinstance(total, int):
        return total
    files = manifest.get("files") or []
    return sum(int(f.get("size", 0)) for f in files if isinstance(f, dict))


def freeable_bytes(layout: StoreLayout, namespace: str, name: str) -> int:
    """Bytes evicting this cache would give back: files no other cache links to.

    A file shared by dedup has links from this cache, the blob area and another
    cache (3+); only files linked from this cache and at most the blob come back.
    """
    freed = 0
    for root, _dirs, files in os.walk(layout.cache_dir(namespace, name)):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(root, f))
                if st.st_nlink <= 2:
                    freed += st.st_size
    return freed
