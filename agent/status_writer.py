"""The one writer of this node's ModelCacheNode statuses, and of the progress files beside them.

Every part of the agent that says something about a copy says it here: the
reconciler's phases, a download's progress (throttled: at most one status patch
per copy every `progress_seconds`, one progress file every half second; the rate and
time left measured over a sliding window, praesto/progress.py), the disk
room's evictions, the removal's waits and pod-start accounting's `podStarts`.
A phase change is logged, and Ready, Failed, Evicted and WaitingForSecret become
Events on the object. A status the API server could not take (restarting,
unreachable) is kept and written again by `resend()` on each tick. Every answer
updates the shared view (`Copies.keep`), so the next patch is computed from it.
The statuses' shape is status.py's (pure).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from praesto.agent import logs
from praesto.agent import status as st
from praesto.agent.copies import CacheRef, Copies, CopyKey, Obj, cache_of, progress_record
from praesto.agent.kube import KubeApi, is_transient, key_of, short_error

from praesto import names, progress, store
from praesto.quantity import format_bytes
from praesto.store import StoreLayout

_EVENT_PHASES = (names.PHASE_READY, names.PHASE_FAILED, names.PHASE_EVICTED)
Fields = dict[str, Any]


class StatusWriter:
    def __init__(
        self,
        kube: KubeApi,
        copies: Copies,
        layout: StoreLayout,
        clock: Callable[[], float],
        progress_seconds: float,
        base_fields: Callable[[], Fields] = dict,
        node: str = "",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.copies, self.layout, self.clock = kube, copies, layout, clock
        self.monotonic = monotonic  # the rate's clock: wall-clock steps must not make bytes/s
        self.rates: dict[CopyKey, progress.RateWindow] = {}  # per running download, under copies.lock
        self.base_fields = base_fields  # written with every phase (the peer address)
        self.throttle = st.Throttle(progress_seconds)
        self.file_throttle = st.Throttle(min(0.5, progress_seconds))
        self.log = logs.logger("praesto.agent", node=node)
        # Statuses the API server could not take (restarting, unreachable): written again each tick.
        self._unsent: dict[CopyKey, tuple[Any, ...]] = {}

    # ---- phases -----------------------------------------------------------------

    def set(
        self,
        obj: Obj,
        phase: str,
        reason: str,
        message: str,
        fields: Fields | None = None,
        extra: list[dict[str, Any]] | None = None,
    ) -> None:
        """Patch status to this state (nothing when already there); log and record transitions."""
        ns, name = key_of(obj)
        cache = cache_of(obj)
        if phase != names.PHASE_DOWNLOADING:
            with self.copies.lock:
                self.rates.pop((ns, name), None)  # the download is over: the next one measures afresh
        base = {
            "localPath": str(self.layout.cache_dir(ns, cache)),
            "observedGeneration": obj["metadata"].get("generation"),
            **self.base_fields(),
        }
        patch, changed = st.desired(
            obj.get("status") or {}, phase, reason, message, self.clock(), {**base, **(fields or {})}, extra
        )
        if not patch:
            return
        if changed:
            logs.cache_logger(ns, cache, modelCacheNode=name).info(
                "status", extra={"phase": phase, "reason": reason, "detail": message}
            )
            if phase in _EVENT_PHASES or reason == st.REASON_WAITING_FOR_SECRET:
                kind = "Warning" if phase == names.PHASE_FAILED else "Normal"
                self.kube.emit_event(obj, kind, reason, message)
        try:
            self.copies.keep(self.kube.patch_status(ns, name, patch))
        except Exception as err:
            if not is_transient(err):
                raise
            with self.copies.lock:
                self._unsent[(ns, name)] = (phase, reason, message, fields, extra)
            self.log.warning(
                "could not write status; retrying on the next tick",
                extra={"namespace": ns, "modelCacheNode": name, "error": short_error(err)},
            )
            return
        with self.copies.lock:
            self._unsent.pop((ns, name), None)

    def set_key(self, key: CopyKey, phase: str, reason: str, message: str) -> None:
        """`set` on the copy as last seen; nothing when it is gone."""
        obj = self.copies.get(key)
        if obj is not None:
            self.set(obj, phase, reason, message)

    def resend(self) -> None:
        """Write again what the API server could not take; forget it for copies gone."""
        with self.copies.lock:
            for key in [k for k in self._unsent if k not in self.copies.objects]:
                del self._unsent[key]  # the object is gone: nothing to report on
            unsent = [(self.copies.objects.get(key), args) for key, args in self._unsent.items()]
        for obj, args in unsent:
            if obj is not None:
                try:
                    self.set(obj, *args)
                except Exception as err:
                    self.log.warning("could not write status", extra={"error": short_error(err)})

    def merge(self, key: CopyKey, fields: Fields) -> None:
        """Patch these status fields as they are (pod-start accounting); raises when refused."""
        self.copies.keep(self.kube.patch_status(key[0], key[1], fields))

    def set_next(self, key: CopyKey, fields: Fields) -> None:
        """Replace status.next (a revision beside the served copy) with `fields` as a whole: keys of
        an earlier report (a failure's reason, a download's progress) do not linger; nothing is
        written when it already says this."""
        obj = self.copies.get(key)
        old = ((obj or {}).get("status") or {}).get("next") or {}
        if old != fields:
            self.merge(key, {"next": {**dict.fromkeys(old), **fields}})

    def evicted(self, namespace: str, cache: str, cause: str) -> None:
        """Every copy of a store directory the disk room took off the node says so (and how to undo it)."""
        why = "unused for longer than spec.unusedTTL" if cause == "ttl" else "to make room for another cache"
        message = f"evicted from this node {why}; a Pod that mounts it brings it back"
        self.write_progress(
            namespace, cache, progress_record(names.PHASE_EVICTED, 0, 0, message, self.clock())
        )
        with self.copies.lock:
            found = [self.copies.objects[k] for k in self.copies.keys_of(namespace, cache)]
        for obj in found:
            self.set(
                obj, names.PHASE_EVICTED, st.REASON_EVICTED, message, {"progress": None, "sizeBytes": None}
            )

    # ---- progress -----------------------------------------------------------------

    def write_progress(self, namespace: str, cache: str, record: store.Progress) -> None:
        """Progress for the CSI driver; never under a missing base path (that would create it)."""
        if self.layout.base.is_dir():
            store.write_progress(self.layout, namespace, cache, record)

    def started(self, ref: CacheRef, total: int, revision: str) -> None:
        """A download's bytes start: reported at once, with the revision (peers copy from it)."""
        self.throttle.forget(ref.name)
        self.file_throttle.forget(ref.name)
        self.progress(ref, 0, total, force=True, revision=revision)
        with self.copies.lock:  # the rate starts at the first count (resumed bytes are no transfer)
            self.rates.pop(ref.key, None)

    def progress(
        self, ref: CacheRef, done: int, total: int, force: bool = False, revision: str | None = None
    ) -> None:
        """Called from downloader threads: progress file always, status at most every few seconds."""
        if ref.beside:
            self._next_progress(ref, done, total, force, revision)
            return
        with self.copies.lock:
            window = self.rates[ref.key] = self.rates.get(ref.key, progress.RateWindow()).add(
                self.monotonic(), done
            )
            to_file = self.file_throttle.allow(ref.name) or force
            allowed = self.throttle.allow(ref.name) or force
            obj = self.copies.objects.get(ref.key)
            state = self.copies.states.get(ref.key)
            repairing = state.scrub_findings if state is not None else None
        counts = progress.progress_fields(done, total, window.rate())
        eta = counts.get(progress.ETA_SECONDS)
        fields: Fields = {"progress": counts, "sizeBytes": total}
        message = f"downloading {progress.summary(done, total, eta=eta) or f'{format_bytes(done)} so far'}"
        if repairing:  # what a new mount is told: why this Ready copy downloads again
            bad = ", ".join(f.partition(":")[0] for f in repairing[: names.SCRUB_MISMATCHED_MAX])
            message = f"{names.SCRUB_REPAIR_PROGRESS} ({bad}): {message}"
        if to_file:  # each write is an fsync'd replace: not once per MiB
            record = progress_record(names.PHASE_DOWNLOADING, done, total, message, self.clock(), eta)
            self.write_progress(ref.namespace, ref.cache, record)
        if allowed and obj is not None:
            if revision is not None:  # with the spec revision it answers (hooks/rolling.py votes on it)
                fields["resolvedRevision"], fields["revision"] = revision, ref.source.version
            try:  # progress is best-effort: a refused status write must not stop the download
                self.set(obj, names.PHASE_DOWNLOADING, st.REASON_DOWNLOADING, message, fields)
            except Exception as err:
                self.log.warning(
                    "could not report progress", extra={"cache": ref.cache, "error": short_error(err)}
                )

    def _next_progress(self, ref: CacheRef, done: int, total: int, force: bool, revision: str | None) -> None:
        """A revision fetched beside the served copy: status.next only; the served copy stays Ready
        (phase, readiness label, CSI progress file untouched), so new Pods keep starting meanwhile."""
        with self.copies.lock:
            allowed = self.throttle.allow(ref.name) or force
        if not allowed:
            return
        beside: Fields = {
            "revision": ref.source.version,
            "phase": names.NEXT_DOWNLOADING,
            "progress": {"bytesDone": done, "bytesTotal": total},
        }
        if revision is not None:
            beside["resolvedRevision"] = revision
        try:
            self.merge(ref.key, {"next": beside})
        except Exception as err:  # best effort, as above
            self.log.warning(
                "could not report progress", extra={"cache": ref.cache, "error": short_error(err)}
            )
