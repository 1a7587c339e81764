"""The node agent's words for one copy of a cache on this node, shared by its collaborators.

A copy is one ModelCacheNode: `CacheRef` is what a download needs of it, `CacheState`
what the agent remembers about it between reconciles (memory only), `Outcome` how
one download of it ended. Nothing here acts; the reconciler, the disk room, the
removal, the status writer and the job runner all speak these types, so none of
them imports another to learn them (peers and the origin budget need none of them).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from praesto.agent.download import api as dlapi

from praesto import store
from praesto.spec import Source

Key = tuple[str, str]  # (namespace, ModelCacheNode name): one copy
StoreKey = tuple[str, str]  # (namespace, cache): one store directory, shared by copies of one cache


@dataclass(frozen=True)
class CacheRef:
    """The parts of a ModelCacheNode a download needs."""

    namespace: str
    name: str  # the ModelCacheNode
    cache: str  # spec.modelCacheName: the store directory
    source: Source
    size_bytes: int | None  # spec.size
    ttl: float | None  # spec.unusedTTL in seconds
    cache_uid: str = ""  # the owning ModelCache's UID (the controller ownerReference); "" when none

    @property
    def key(self) -> Key:
        return self.namespace, self.name


class Running(Protocol):
    """A download in flight, as the agent holds it: it can be told to stop."""

    @property
    def cancel(self) -> threading.Event: ...


@dataclass
class CacheState:
    """What the agent remembers about one cache between reconciles (memory only)."""

    job: Running | None = None
    attempts: int = 0
    retry_at: float = 0.0
    downloaded: bool = False  # Ready through a download (not a cache hit)
    size_bytes: int | None = None
    evicted: bool = False  # set before the directory goes, so no reconcile re-downloads it meanwhile
    peer_bytes: int | None = None  # bytes the last download got from peers, until Ready shows them
    # (inode, mtime, size, cache UID) of the manifest last found to be this cache's: not read again
    matching_manifest: tuple[int, int, int, str] | None = None


@dataclass
class Outcome:
    ref: CacheRef
    result: dlapi.Result | None = None
    error: dlapi.DownloadError | None = None
    waiting: str | None = None  # why the download waits (a Secret, a credential)
    waiting_reason: str = "WaitingForSecret"  # or WaitingForCredentials
    cancelled: bool = False
    evicted: list[StoreKey] = field(default_factory=list)  # (namespace, cache) made room


def progress_record(phase: str, done: int, total: int, message: str, now: float) -> store.Progress:
    """The progress file the CSI driver reads for a copy (`store.write_progress`)."""
    return store.Progress(phase=phase, bytes_done=done, bytes_total=total, message=message, updated_at=now)
