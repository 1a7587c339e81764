"""Named points where a test can kill the downloader, to prove what a hard kill there leaves behind.

`PRAESTO_CRASH_AT=<name>` in the environment makes the process SIGKILL itself when
it reaches `crash_point(<name>)`: the same end as an OOM kill, a kill after the
grace period or a node losing power, but at an exact step instead of by chance.
The process edge reads the variable once and calls `arm` (agent/cli.py `main`); unarmed
(always, outside tests) a point costs one comparison.
"""

from __future__ import annotations

import os
import signal

from praesto import names

ENV = "PRAESTO_CRASH_AT"
# In the order a download passes them (engine.py, publish.py):
STAGING_CREATED = "staging-created"  # staging and the journal's header exist, nothing fetched
PARTS_JOURNALED = "parts-journaled"  # some parts are fsync'd and journaled
FILE_READ_ONLY = "file-read-only"  # a verified file was made read-only; the journal does not say so yet
TREE_MOVED = "tree-moved"  # the verified tree is at the destination; no completion marker yet
COMPLETE_WRITTEN = "complete-written"  # the marker is written; staging not cleaned up yet
# Each small file the publisher writes (manifest, owner, complete marker) is written whole to a
# temporary name and renamed: a kill between the two leaves `<file>.tmp` behind.
WRITTEN_NOT_RENAMED = "written-not-renamed"  # point name: f"{WRITTEN_NOT_RENAMED}:{file name}"
MARKER_FILES = (names.MANIFEST_FILE, names.OWNER_FILE, names.COMPLETE_FILE)
MARKER_POINTS = tuple(f"{WRITTEN_NOT_RENAMED}:{name}" for name in MARKER_FILES)
POINTS = (STAGING_CREATED, PARTS_JOURNALED, FILE_READ_ONLY, *MARKER_POINTS, TREE_MOVED, COMPLETE_WRITTEN)
# Not on every download's way (so not in POINTS): a Xet file's chunks are in the chunk store
# (origins/huggingface/xetstore.py), its index is not written yet.
XET_CHUNKS_WRITTEN = "xet-chunks-written"


_armed: str | None = None  # the point this process dies at, set once by its edge


def arm(point: str | None) -> None:
    """Die at `point` (PRAESTO_CRASH_AT, read by the process edge); None or "": never."""
    global _armed
    _armed = point or None


def crash_point(name: str) -> None:
    if _armed is not None and _armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
