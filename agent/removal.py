"""Taking copies off the node that are not (or no longer) a cache's: deletion with the
finalizer, copies no ModelCacheNode owns, and a copy found at a cache's path that is
another cache's. Eviction (TTL, room) is the disk room's (room.py).

`Removal` reads the copies the agent knows (`Copies`), removes under their lock with
eviction's protocol (unpublish, re-check mounts, delete), says why it waits through
the status writer, and takes the finalizer off through the API.
"""

from __future__ import annotations

import contextlib

from praesto.agent import eviction, logs
from praesto.agent import status as st
from praesto.agent.copies import CacheRef, CacheState, Copies, CopyKey, Obj, cache_of, deleting
from praesto.agent.kube import KubeApi, key_of
from praesto.agent.status_writer import StatusWriter

from praesto import names, store
from praesto.kubeerrors import Conflict, NotFound
from praesto.store import StoreLayout


class Removal:
    def __init__(self, layout: StoreLayout, copies: Copies, status: StatusWriter, kube: KubeApi) -> None:
        self.layout, self.copies, self.status, self.kube = layout, copies, status, kube
        self.lock = copies.lock

    # ---- a copy that is not this cache's ----------------------------------------

    def foreign_copy_stays(self, obj: Obj, ref: CacheRef, state: CacheState) -> bool:
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
        # the trust held now is part of it: a replaced key compares the manifest again
        trust = ref.signature.trust if ref.signature else ""
        signature = (seen.st_ino, seen.st_mtime_ns, seen.st_size, ref.cache_uid, trust)
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
            signature=ref.signature,
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
        self.status.set(
            obj,
            names.PHASE_PENDING,
            st.REASON_PENDING,
            f"the copy found on this node is not this cache's ({why}); it is removed and downloaded "
            f"again once its {mounts} Pod mount(s) end",
        )
        return True

    # ---- deletion ------------------------------------------------------------

    def finalize(self, key: CopyKey, obj: Obj, state: CacheState) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        if names.FINALIZER_NODE_AGENT not in finalizers:
            return
        if state.job is not None:
            state.job.cancel.set()  # the finished job wakes us again
            return
        ns, cache = key[0], cache_of(obj)
        if names.is_dns_label(cache):
            mounts = store.mounts_for(self.layout, ns, cache)
            if mounts:
                reason = st.REASON_CACHED if self.layout.is_complete(ns, cache) else st.REASON_PENDING
                message = f"deleting: waiting for {len(mounts)} Pod mount(s) of this cache to end"
                self.status.set(obj, st.phase_of(obj) or names.PHASE_READY, reason, message)
                return
            if not self._shared(key, ns, cache):
                with self.lock:
                    removed = eviction.remove_unless_mounted(self.layout, ns, cache)
                    if removed:
                        eviction.gc_blobs(self.layout)
                if not removed:  # a Pod mounted it in between: wait for it like above
                    message = "deleting: waiting for a Pod mount of this cache to end"
                    self.status.set(obj, st.phase_of(obj) or names.PHASE_READY, st.REASON_CACHED, message)
                    return
        logs.cache_logger(ns, cache, modelCacheNode=key[1]).info("removed from this node")
        with contextlib.suppress(NotFound, Conflict):  # gone, or changed meanwhile: the next event says
            self.kube.set_finalizers(obj, [f for f in finalizers if f != names.FINALIZER_NODE_AGENT])
        with self.lock:
            self.copies.states.pop(key, None)

    def _shared(self, key: CopyKey, ns: str, cache: str) -> bool:
        """Another live ModelCacheNode of this node uses the same store directory."""
        with self.lock:
            return any(
                k != key and k[0] == ns and cache_of(o) == cache and not deleting(o)
                for k, o in self.copies.objects.items()
            )

    def sweep_unowned(self) -> None:
        """Copies on disk that no ModelCacheNode of this node owns go (same protocol as deletion).

        Left by a node that was unreachable while its ModelCacheNodes were released
        (hooks/orphans/) or by a deletion the agent did not see; run after each
        relist, when `objects` is the API server's whole truth for this node.
        """
        if not self.layout.base.is_dir():
            return
        with self.lock:
            owned = {(k[0], cache_of(o)) for k, o in self.copies.objects.items()}
            running = {
                (k[0], cache_of(self.copies.objects.get(k) or {}))
                for k, s in self.copies.states.items()
                if s.job is not None
            }
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

    def forget(self, obj: Obj) -> None:
        """An object vanished without our finalizer (removed by hand): drop what we kept for it."""
        key = key_of(obj)
        cache = cache_of(obj)
        with self.lock:
            current = self.copies.objects.get(key)
            if current is not None and current["metadata"].get("uid") != obj["metadata"].get("uid"):
                return  # deleted and created again under the same name: the new one owns the cache
            state = self.copies.states.pop(key, None)
        if state is not None and state.job is not None:
            state.job.cancel.set()
        ours = (
            names.is_dns_label(cache) and names.is_dns_label(key[0]) and not self._shared(key, key[0], cache)
        )
        if ours and self.layout.base.is_dir():
            with self.lock:  # mounted: the orphan sweep retries
                eviction.remove_unless_mounted(self.layout, key[0], cache)
