"""Which cache a mount shows, and rebuilding mount records after a restart.

Mount records are files under the base path, so they outlive the driver
process; what can go wrong is a crash between mount(2) and writing the record
(a mount the agent does not know about, so it could evict a cache in use) or
a reboot/unmount behind our back (a record for a mount that is gone, so the
cache is never evicted). Both are settled from the mount table at start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from praesto.csi.mounts import MountInfo, fs_location, is_within
from praesto.csi.storefs import CsiStore, store_dir

from praesto import names, store

RECOVERED_PREFIX = "recovered-"


def revision_at(fd: int) -> str:
    """The commit of the copy open at `fd` (its manifest's resolvedRevision), "" when unreadable."""
    try:
        manifest = os.open(names.MANIFEST_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return ""
    with os.fdopen(manifest, "rb") as handle:
        try:
            data = json.loads(handle.read())
        except (ValueError, OSError):
            return ""
    value = data.get("resolvedRevision") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class CacheLocator:
    """Maps mounts back to `<base>/<ns>/<name>` through (device, filesystem root)."""

    dev: str
    root: str
    base: str  # real path of the base directory in our mount namespace

    @classmethod
    def of(cls, entries: Sequence[MountInfo], base: str) -> CacheLocator | None:
        real = os.path.realpath(base)
        location = fs_location(entries, real)
        return None if location is None else cls(location[0], location[1], real)

    def cache_of(self, entry: MountInfo) -> tuple[str, str] | None:
        """(namespace, name) when `entry` is a bind of a cache directory, else None."""
        if entry.dev != self.dev or not is_within(entry.root, self.root):
            return None
        if is_within(entry.mount_point, self.base):
            return None  # the store's own mounts, never a Pod's view
        # the cache directory, or a copy a revision switch retired while this mount showed it
        return store.copy_owner(os.path.relpath(entry.root, self.root).split("/"))

    def revision_of(self, entry: MountInfo) -> str:
        """The commit of the copy a mount of a cache shows, read from its manifest without following
        a symlink (the driver runs as root); "" when unreadable (the agent then keeps the copy)."""
        if self.cache_of(entry) is None:
            return ""
        parts = os.path.relpath(entry.root, self.root).split("/")
        try:
            with store_dir(Path(self.base), parts) as fd:
                return "" if fd is None else revision_at(fd)
        except OSError:
            return ""

    def cache_mounts(self, entries: Sequence[MountInfo]) -> dict[str, tuple[str, str]]:
        """target path -> cache, for the top mount of every target showing a cache."""
        top: dict[str, MountInfo] = {}
        for entry in entries:
            top[entry.mount_point] = entry  # later lines are stacked on top
        found: dict[str, tuple[str, str]] = {}
        for target, entry in top.items():
            cache = self.cache_of(entry)
            if cache is not None:
                found[target] = cache
        return found


def recovered_volume_id(target_path: str) -> str:
    """A stand-in id for a mount found without a record; unpublish also matches by target."""
    return RECOVERED_PREFIX + names.short_hash(target_path, 32)


@dataclass
class Recovery:
    adopted: list[store.MountRecord] = field(default_factory=list)
    dropped: list[store.MountRecord] = field(default_factory=list)


def rebuild_records(fs: CsiStore, entries: Sequence[MountInfo], now: float | None = None) -> Recovery:
    """Make the mount records match the mount table: drop the gone, adopt the unrecorded."""
    result = Recovery()
    locator = CacheLocator.of(entries, str(fs.layout.base))
    shown = locator.cache_mounts(entries) if locator is not None else {}
    kept_targets: set[str] = set()
    for record in fs.all_mounts():
        if shown.get(record.target_path) == (record.namespace, record.name):
            kept_targets.add(record.target_path)
        else:
            fs.drop_mount(record.volume_id, now)
            result.dropped.append(record)
    when = time.time() if now is None else now
    top = {entry.mount_point: entry for entry in entries}
    for target, (namespace, name) in sorted(shown.items()):
        if target not in kept_targets:
            revision = locator.revision_of(top[target]) if locator is not None else ""
            record = store.MountRecord(recovered_volume_id(target), namespace, name, target, when, revision)
            fs.record_mount(record)
            result.adopted.append(record)
    return result
