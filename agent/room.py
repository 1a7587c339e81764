"""Disk room on this node: the reserve kept free, disk promised to downloads, and eviction.

`DiskRoom` owns the reservations (reservations.py) and decides, under the one
store lock (`Copies.lock`), whether a planned download fits above the reserve,
evicting least recently used unused copies first (namespaces over their quota
give first: capacity.py); the Xet chunk store, bytes a download can fetch again,
is emptied before any copy goes. A download's Xet chunks count in its reservation beside its
files (`xetstore.chunk_store_bytes`); when they do not fit above the reserve even with the store emptied,
the download keeps none (`stores_chunks`) rather than evict a copy for them or dip into the
reserve. It reads only the disk and the copies the agent knows
(`Copies`); what an eviction means for a copy's status is the caller's, told
through `on_evicted` - so it runs, and is tested, without an API server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from praesto.agent import capacity, eviction, logs
from praesto.agent.copies import CacheRef, Copies, cache_of, deleting
from praesto.agent.download import api as dlapi
from praesto.agent.download.origins.huggingface.xetstore import chunk_store_bytes
from praesto.agent.reservations import Reservations, StoreKey

from praesto import names, store
from praesto.quota import Quotas
from praesto.store import StoreLayout

Evicted = Callable[[str, str, str], None]  # (namespace, cache, cause: "ttl" or "capacity")


def staged_bytes(path: Path) -> int:
    """Disk already allocated to a resumable download (pre-allocated parts count)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


class DiskRoom:
    def __init__(
        self,
        layout: StoreLayout,
        copies: Copies,
        reserve: str | None,
        quotas: Quotas | None = None,
        on_evicted: Evicted | None = None,
    ) -> None:
        self.layout, self.copies, self.reserve = layout, copies, reserve  # reserve None: capacity's default
        self.quotas = quotas or Quotas()
        self.on_evicted = on_evicted
        self.reservations = Reservations()  # disk promised to downloads in flight; under `lock`
        self.no_chunk_room: set[StoreKey] = set()  # downloads in flight that keep no Xet chunks

    @property
    def lock(self) -> threading.RLock:
        return self.copies.lock

    def make_room(self, ref: CacheRef, plan: dlapi.Plan) -> list[StoreKey]:
        """Evict least recently used unused caches until the model fits above the reserve.

        Raises InsufficientDiskSpace (with the numbers) when even that is not enough.
        On success the model's bytes are reserved until `release`, so a download
        planned meanwhile counts them as already spent. Its Xet chunks are reserved too when they
        fit without evicting a copy; otherwise the download keeps none (`stores_chunks`).
        """
        key = (ref.namespace, ref.cache)
        base = self.layout.base

        def written(k: StoreKey) -> int:
            return staged_bytes(self.layout.staging_dir(*k))

        with self.copies.lock:
            disk = capacity.disk_usage(base)
            reserve = capacity.reserve_bytes(self.reserve, disk.total)
            promised = plan.disk_bytes(ref.size_bytes)  # what check_request let through, unpacked
            chunks = chunk_store_bytes(plan)
            needed = max(0, promised - written(key))
            in_flight = self.reservations.outstanding(written, excluding=key)
            candidates = self.candidates(ref)
            chosen = capacity.choose_evictions(needed + chunks, _minus(disk, in_flight), reserve, [])
            if chosen is None and eviction.clear_xet_chunks(self.layout):
                # short of room: the Xet chunk store gives its bytes back before any copy goes
                disk = capacity.disk_usage(base)
                chosen = capacity.choose_evictions(needed + chunks, _minus(disk, in_flight), reserve, [])
            keeps_chunks = chosen is not None  # no copy is evicted for chunks: they are a cache
            if not keeps_chunks:
                chunks = 0
                chosen = capacity.choose_evictions(needed, _minus(disk, in_flight), reserve, candidates)
            if chosen is None:
                evictable = sum(c.size for c in candidates)
                raise dlapi.LastingDownloadError(
                    "InsufficientDiskSpace",
                    capacity.shortage_message(needed, disk, reserve, evictable, in_flight),
                )
            evicted = [(c.namespace, c.name) for c in chosen if self.evict(c.namespace, c.name, "capacity")]
            if len(evicted) < len(chosen):  # a mount appeared meanwhile: check again with what is left
                disk = capacity.disk_usage(base)
                if capacity.choose_evictions(needed, _minus(disk, in_flight), reserve, []) is None:
                    raise dlapi.LastingDownloadError(
                        "InsufficientDiskSpace",
                        capacity.shortage_message(needed, disk, reserve, 0, in_flight)
                        + " (a cache chosen for eviction is in use)",
                    )
            if evicted:
                eviction.gc_blobs(self.layout)
            self.reservations.reserve(key, promised + chunks)
            if keeps_chunks:
                self.no_chunk_room.discard(key)
            else:
                self.no_chunk_room.add(key)
            return evicted

    def stores_chunks(self, key: StoreKey) -> bool:
        """Whether the download `make_room` last admitted for `key` may write Xet chunks."""
        with self.copies.lock:
            return key not in self.no_chunk_room

    def release(self, key: StoreKey) -> None:
        """A download ended (however): its promise no longer holds back other plans."""
        with self.copies.lock:
            self.reservations.release(key)
            self.no_chunk_room.discard(key)

    def usage(self) -> dict[str, int]:
        """Bytes each namespace's complete copies hold on this node (from their manifests)."""
        usage: dict[str, int] = {}
        seen: set[StoreKey] = set()
        with self.copies.lock:
            for key, obj in self.copies.objects.items():
                ns, cache = key[0], cache_of(obj)
                if (
                    (ns, cache) in seen
                    or not names.is_dns_label(cache)
                    or not self.layout.is_complete(ns, cache)
                ):
                    continue
                seen.add((ns, cache))
                usage[ns] = usage.get(ns, 0) + eviction.cache_size(self.layout, ns, cache)
        return usage

    def candidates(self, asking: CacheRef) -> list[capacity.Candidate]:
        """Ready caches of this node with no mount and no download running, except the one asking.

        Each says whether its namespace holds more here than its quota (chart
        namespaceQuota), so room is taken from those namespaces first.
        """
        out = []
        with self.copies.lock:
            over = capacity.over_quota(self.usage(), self.quotas.limit) if self.quotas.enabled else set()
            for key, obj in self.copies.objects.items():
                ns, cache = key[0], cache_of(obj)
                if (ns, cache) == (asking.namespace, asking.cache) or not names.is_dns_label(cache):
                    continue
                if self.copies.running(key) is not None or deleting(obj):
                    continue
                if not self.layout.is_complete(ns, cache) or store.mounts_for(self.layout, ns, cache):
                    continue
                last = eviction.last_activity(self.layout, ns, cache) or 0.0
                size = eviction.freeable_bytes(self.layout, ns, cache)
                out.append(capacity.Candidate(ns, cache, size, last, over_quota=ns in over))
        return out

    def evict(self, namespace: str, cache: str, cause: str) -> bool:
        """Take a complete, unmounted copy off the node; False (left intact) when a mount appeared."""
        with self.copies.lock:
            states = [self.copies.state(k) for k in self.copies.keys_of(namespace, cache)]
            for state in states:
                state.evicted = True
            done = eviction.evict(self.layout, namespace, cache)
            if not done:
                for state in states:
                    state.evicted = False
                return False
        logs.cache_logger(namespace, cache).info("evicted", extra={"cause": cause})
        if cause == "ttl":
            eviction.gc_blobs(self.layout)  # a capacity eviction collects once for all its victims
        if self.on_evicted is not None:
            self.on_evicted(namespace, cache, cause)
        return True


def _minus(disk: capacity.Disk, promised: int) -> capacity.Disk:
    return capacity.Disk(disk.total, disk.free - promised)
