"""Taking caches off the node: eviction (TTL or room) and deletion with the finalizer.

A mixin of `reconcile.Agent`, split out to keep each file about one thing; it
uses the agent's objects, states, lock, layout, metrics and status writer.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException
from praesto.agent import capacity, eviction, logs
from praesto.agent import status as st
from praesto.agent.copies import CacheRef, CacheState, Key, Running, progress_record
from praesto.agent.kube import KubeApi, Obj, key_of
from praesto.agent.metrics import AgentMetrics
from praesto.agent.reservations import Reservations
from praesto.agent.worker import Room

from praesto import names, store
from praesto.quota import Quotas
from praesto.store import StoreLayout


class Removal:
    objects: dict[Key, Obj]
    states: dict[Key, CacheState]
    lock: threading.RLock
    layout: StoreLayout
    metrics: AgentMetrics
    kube: KubeApi
    clock: Callable[[], float]
    reserve: str | None
    reservations: Reservations
    quotas: Quotas

    def _set(
        self,
        obj: Obj,
        phase: str,
        reason: str,
        message: str,
        fields: dict[str, Any] | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> None:
        raise NotImplementedError

    def _write_progress(self, namespace: str, cache: str, progress: store.Progress) -> None:
        """Progress for the CSI driver; never under a missing base path (that would create it)."""
        if self.layout.base.is_dir():
            store.write_progress(self.layout, namespace, cache, progress)

    def _job(self, key: Key) -> Running | None:
        state = self.states.get(key)
        return None if state is None else state.job

    # ---- room and eviction --------------------------------------------------

    def _room(self) -> Room:
        return Room(self.reserve, self.lock, self._candidates, self._evict, self.reservations)

    def _usage(self) -> dict[str, int]:
        """Bytes each namespace's complete copies hold on this node (from their manifests)."""
        usage: dict[str, int] = {}
        seen: set[tuple[str, str]] = set()
        for key, obj in self.objects.items():
            ns, cache = key[0], str((obj.get("spec") or {}).get("modelCacheName", ""))
            if (ns, cache) in seen or not names.is_dns_label(cache) or not self.layout.is_complete(ns, cache):
                continue
            seen.add((ns, cache))
            usage[ns] = usage.get(ns, 0) + eviction.cache_size(self.layout, ns, cache)
        return usage

    def _candidates(self, asking: CacheRef) -> list[capacity.Candidate]:
        """Ready caches of this node with no mount and no download running, except the one asking.

        Each says whether its namespace holds more here than its quota (chart
        namespaceQuota), so room is taken from those namespaces first.
        """
        out = []
        with self.lock:
            over = capacity.over_quota(self._usage(), self.quotas.limit) if self.quotas.enabled else set()
            for key, obj in self.objects.items():
                ns, cache = key[0], (obj.get("spec") or {}).get("modelCacheName", "")
                if (ns, cache) == (asking.namespace, asking.cache) or not names.is_dns_label(str(cache)):
                    continue
                if self._job(key) is not None or obj["metadata"].get("deletionTimestamp"):
                    continue
                if not self.layout.is_complete(ns, cache) or store.mounts_for(self.layout, ns, cache):
                    continue
                last = eviction.last_activity(self.layout, ns, cache) or 0.0
                size = eviction.freeable_bytes(self.layout, ns, cache)
                out.append(capacity.Candidate(ns, cache, size, last, over_quota=ns in over))
        return out

    def _evict(self, namespace: str, cache: str, cause: str) -> bool:
        with self.lock:
            states = [self.states.setdefault(k, CacheState()) for k in self._keys_of(namespace, cache)]
            for state in states:
                state.evicted = True
            done = eviction.evict(self.layout, namespace, cache)
            if not done:
                for state in states:
                    state.evicted = False
                return False
        self.metrics.evictions.labels(cause).inc()
        logs.cache_logger(namespace, cache).info("evicted", extra={"cause": cause})
        if cause == "ttl":
            eviction.gc_blobs(self.layout)  # a capacity eviction collects once for all its victims
        self._mark_evicted(namespace, cache, cause)
        return True

    def _keys_of(self, namespace: str, cache: str) -> list[Key]:
        return [
            k
            for k, o in self.objects.items()
            if k[0] == namespace and (o.get("spec") or {}).get("modelCacheName") == cache
        ]

    def _mark_evicted(self, namespace: str, cache: str, cause: str) -> None:
        why = "unused for longer than spec.unusedTTL" if cause == "ttl" else "to make room for another cache"
        message = f"evicted from this node {why}; a Pod that mounts it brings it back"
        self._write_progress(
            namespace, cache, progress_record(names.PHASE_EVICTED, 0, 0, message, self.clock())
        )
        with self.lock:
            found = [self.objects[k] for k in self._keys_of(namespace, cache)]
        for obj in found:
            self._set(
                obj, names.PHASE_EVICTED, st.REASON_EVICTED, message, {"progress": None, "sizeBytes": None}
            )

    # ---- a copy that is not this cache's ----------------------------------------

    def _foreign_copy_stays(self, obj: Obj, ref: CacheRef, state: CacheState) -> bool:
        """Whether a copy that is not this cache's is still at its path (#21 item 9): then wait.

        A completion marker proves only that the copy was complete for someone: a node away
        while the cache was deleted and created again under the same name (maybe with another
        source, by another tenant) finds the old copy at the new cache's path. Its manifest is
        compared with this ModelCacheNode (store.copy_mismatch); a foreign copy is unpublished
        (no new mount starts) and removed, after its last Pod mount ends, and the caller then
        downloads the right one. A manifest found to match is not read again until it changes.
        """
        path = self.layout.manifest_path(ref.namespace, ref.cache)
        try:
            seen = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return False
        signature = (seen.st_ino, seen.st_mtime_ns, seen.st_size, ref.cache_uid)
        if state.matching_manifest == signature:
            return False
        source = ref.source
        why = store.copy_mismatch(
            store.read_json(path) or {},
            source=source.uri,
            revision=source.revision,
            allow_patterns=source.allow_patterns,
            ignore_patterns=source.ignore_patterns,
            cache_uid=ref.cache_uid,
        )
        if why is None:
            state.matching_manifest = signature
            return False
        with self.lock:
            with contextlib.suppress(FileNotFoundError):
                self.layout.complete_marker(ref.namespace, ref.cache).unlink()  # unpublished first
            removed = eviction.remove_unless_mounted(self.layout, ref.namespace, ref.cache)
        if removed:
            logs.cache_logger(ref.namespace, ref.cache, modelCacheNode=ref.name).warning(
                "discarded a copy that is not this cache's; downloading it again", extra={"why": why}
            )
            return False
        mounts = len(store.mounts_for(self.layout, ref.namespace, ref.cache))
        self._set(
            obj,
            names.PHASE_PENDING,
            st.REASON_PENDING,
            f"the copy found on this node is not this cache's ({why}); it is removed and downloaded "
            f"again once its {mounts} Pod mount(s) end",
        )
        return True

    # ---- deletion ------------------------------------------------------------

    def _finalize(self, key: Key, obj: Obj, state: CacheState) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        if names.FINALIZER_NODE_AGENT not in finalizers:
            return
        if state.job is not None:
            state.job.cancel.set()  # the finished job wakes us again
            return
        ns, cache = key[0], str((obj.get("spec") or {}).get("modelCacheName", ""))
        if names.is_dns_label(cache):
            mounts = store.mounts_for(self.layout, ns, cache)
            if mounts:
                self._set(obj, st.phase_of(obj) or names.PHASE_READY, st.REASON_CACHED if self.layout.is_complete(ns, cache) else st.REASON_PENDING,
                          f"deleting: waiting for {len(mounts)} Pod mount(s) of this cache to end")  # fmt: skip
                return
            if not self._shared(key, ns, cache):
                with self.lock:
                    removed = eviction.remove_unless_mounted(self.layout, ns, cache)
                    if removed:
                        eviction.gc_blobs(self.layout)
                if not removed:  # a Pod mounted it in between: wait for it like above
                    self._set(obj, st.phase_of(obj) or names.PHASE_READY, st.REASON_CACHED,
                              "deleting: waiting for a Pod mount of this cache to end")  # fmt: skip
                    return
        logs.cache_logger(ns, cache, modelCacheNode=key[1]).info("removed from this node")
        try:
            self.kube.set_finalizers(obj, [f for f in finalizers if f != names.FINALIZER_NODE_AGENT])
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        with self.lock:
            self.states.pop(key, None)

    def _shared(self, key: Key, ns: str, cache: str) -> bool:
        """Another live ModelCacheNode of this node uses the same store directory."""
        with self.lock:
            return any(
                k != key and k[0] == ns and (o.get("spec") or {}).get("modelCacheName") == cache and not o["metadata"].get("deletionTimestamp")
                for k, o in self.objects.items()
            )  # fmt: skip

    def _sweep_unowned(self) -> None:
        """Copies on disk that no ModelCacheNode of this node owns go (same protocol as deletion).

        Left by a node that was unreachable while its ModelCacheNodes were released
        (hooks/orphans.py) or by a deletion the agent did not see; run after each
        relist, when `objects` is the API server's whole truth for this node.
        """
        if not self.layout.base.is_dir():
            return
        with self.lock:
            owned = {
                (k[0], str((o.get("spec") or {}).get("modelCacheName", ""))) for k, o in self.objects.items()
            }
            running = {(k[0], str((self.objects.get(k) or {}).get("spec", {}).get("modelCacheName", "")))
                       for k, s in self.states.items() if s.job is not None}  # fmt: skip
        for ns_dir in self.layout.base.iterdir():
            if ns_dir.name.startswith(".") or not names.is_dns_label(ns_dir.name) or not ns_dir.is_dir():
                continue
            for cache_dir in ns_dir.iterdir():
                key = (ns_dir.name, cache_dir.name)
                if not names.is_dns_label(cache_dir.name) or key in owned or key in running:
                    continue
                if not any((cache_dir / f).exists() for f in names.MARKER_FILES):
                    continue  # not a copy the agent published: not ours to remove
                with self.lock:
                    if eviction.remove_unless_mounted(self.layout, *key):
                        logs.cache_logger(*key).info("removed a copy no ModelCacheNode owns")
        dropped = eviction.drop_unowned_requests(self.layout, owned)
        if dropped:
            logs.logger("praesto.agent").info(
                "dropped hydration requests no ModelCacheNode of this node owns", extra={"count": dropped}
            )

    def _forget(self, obj: Obj) -> None:
        """An object vanished without our finalizer (removed by hand): drop what we kept for it."""
        key = key_of(obj)
        cache = str((obj.get("spec") or {}).get("modelCacheName", ""))
        with self.lock:
            current = self.objects.get(key)
            if current is not None and current["metadata"].get("uid") != obj["metadata"].get("uid"):
                return  # deleted and created again under the same name: the new one owns the cache
            state = self.states.pop(key, None)
        if state is not None and state.job is not None:
            state.job.cancel.set()
        ours = (
            names.is_dns_label(cache) and names.is_dns_label(key[0]) and not self._shared(key, key[0], cache)
        )
        if ours and self.layout.base.is_dir():
            with self.lock:
                eviction.remove_unless_mounted(
                    self.layout, key[0], cache
                )  # mounted: the orphan sweep retries
