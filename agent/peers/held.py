"""The complete copies of a cache this node can serve peers: the one it serves, and the next
revision published beside it during a rolling update (agent/rolling.py).

A copy counts once its directory holds the complete marker (written last by the downloader), and
its files are the paths its manifest lists, never paths joined from a request. During a roll a
node holds the new revision in `.praesto/next/<ns>_<cache>` until `spec.switch` allows the trade
(the default waits for every selected node): until then it is a peer of that revision like any
other, so a node that starts the roll later copies it from the nodes that hold it, not from the
origin. Manifests are read again only when the marker or the manifest changed (stamped by inode
and mtime), so a busy server does not parse JSON per request.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from praesto import names
from praesto.store import StoreLayout, read_json

Stamp = tuple[int, int, int]


@dataclass(frozen=True)
class Held:
    """One complete copy: path -> manifest entry, the revision it answers, the folder it is in."""

    files: dict[str, dict[str, Any]]
    revision: str
    root: Path


class HeldCopies:
    """The complete copies of each cache on this node, read from their manifests (cached)."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._read: dict[Path, tuple[Stamp, Held]] = {}

    def copies(self, namespace: str, cache: str) -> list[Held]:
        """The served copy (first) and the one beside it, those that are complete."""
        if not (names.is_dns_label(namespace) and names.is_dns_label(cache)):
            return []
        roots = (self.layout.cache_dir(namespace, cache), self.layout.next_dir(namespace, cache))
        return [held for held in (self._held(root) for root in roots) if held is not None]

    def at(self, namespace: str, cache: str, revision: str) -> Held | None:
        """The complete copy of `revision`, served or beside, or None."""
        return next((h for h in self.copies(namespace, cache) if h.revision == revision), None)

    def digests(self, namespace: str, cache: str) -> set[str]:
        """The sha256 of every file of this cache's complete copies (whatever their revision)."""
        return {
            str(entry["sha256"])
            for held in self.copies(namespace, cache)
            for entry in held.files.values()
            if isinstance(entry.get("sha256"), str)
        }

    def _held(self, root: Path) -> Held | None:
        try:
            marker = os.stat(root / names.COMPLETE_FILE)
            manifest = os.stat(root / names.MANIFEST_FILE)
        except OSError:
            return None
        stamp = (marker.st_mtime_ns, manifest.st_ino, manifest.st_mtime_ns)
        with self._lock:
            cached = self._read.get(root)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        data = read_json(root / names.MANIFEST_FILE) or {}
        files = {
            str(f["path"]): f
            for f in data.get("files") or []
            if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
        }
        held = Held(files, str(data.get("resolvedRevision") or ""), root)
        with self._lock:
            self._read[root] = (stamp, held)
        return held
