"""The node agent's control loop: one level-triggered reconcile per ModelCacheNode.

Every watch event and every tick (about once a second) re-derives what a cache
should be from the object, the disk and the CSI driver's records, and does the
one next step: add the finalizer, clean up on deletion, report BasePathMissing,
mark a complete copy Ready, evict one whose unusedTTL passed, or start a
download (bounded by `max_parallel_caches`) that reports progress as it goes.
Hydration requests from the CSI driver bring an Evicted cache back.

`Reconciler` owns the event queue and the loop, and nothing else: what it knows of
the copies is `Copies`', what it says goes through the `StatusWriter`, eviction is
the `DiskRoom`'s, deletion and the sweep the `Removal`'s, downloads the
`JobRunner`'s; node_agent.py wires them and runs the loop on its thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from praesto.agent import baselock, eviction, logs
from praesto.agent import status as st
from praesto.agent.coldstart_reporter import record_copy
from praesto.agent.copies import CacheRef, CacheState, Copies, CopyKey, Obj, Outcome, progress_record, ref_of
from praesto.agent.credentials import required_signature
from praesto.agent.jobs import JobRunner
from praesto.agent.kube import KubeApi, key_of, short_error
from praesto.agent.metrics import AgentMetrics
from praesto.agent.removal import Removal
from praesto.agent.rolling import Rolling, Step, version_of
from praesto.agent.room import DiskRoom
from praesto.agent.scrub import schedule as scrub_schedule
from praesto.agent.settings import AgentSettings
from praesto.agent.status_writer import StatusWriter
from praesto.agent.trust_material import TRUST_SECRET_RECHECK_SECONDS as TRUST_RECHECK
from praesto.agent.trust_material import NamespaceTrust, TrustObject, trust_object

from praesto import names, store
from praesto.quantity import QuantityError, format_bytes
from praesto.reflector import Backoff
from praesto.spec import InvalidSpec
from praesto.store import StoreLayout
from praesto.verification import verification_from_node_spec


@dataclass(frozen=True)
class LoopTuning:
    """The control loop's timing. Not settings: no flag, variable or chart value sets these (the
    defaults serve); tests shorten them. What `praesto-agent run` is configured with is
    `AgentSettings` (agent/settings.py), passed whole beside this."""

    tick_seconds: float = 1.0
    progress_seconds: float = 3.0  # at most one status patch per cache this often while downloading
    retry_initial: float = 5.0
    retry_max: float = 600.0
    last_used_refresh: float = 60.0  # while mounted, lastUsedTime moves at most this often
    watch_backoff: Backoff = field(default_factory=Backoff)  # praesto.reflector's one constant set
    # a trust Secret is read again this often (agent/trust_material.py; tests shorten it)
    trust_secret_recheck_seconds: float = TRUST_RECHECK


class Reconciler:
    """Events (watch, relist, finished jobs, ticks) -> one step per copy, on one thread."""

    def __init__(
        self,
        settings: AgentSettings,
        tuning: LoopTuning,
        kube: KubeApi,
        copies: Copies,
        status: StatusWriter,
        room: DiskRoom,
        removal: Removal,
        jobs: JobRunner,
        metrics: AgentMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.settings, self.tuning, self.kube, self.copies, self.status = (
            settings,
            tuning,
            kube,
            copies,
            status,
        )
        self.room, self.removal, self.jobs, self.metrics, self.clock = room, removal, jobs, metrics, clock
        self.layout = StoreLayout(settings.base_path)
        self.rolling = Rolling(self.layout, copies, status, kube)
        self.lock = copies.lock
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.log = logs.logger("praesto.agent", node=settings.node_name)
        # the Secrets and ConfigMaps copies name as trust material, followed (a ConfigMap by watch, a
        # Secret by a GET every tuning.trust_secret_recheck_seconds): a change wakes the loop
        self.trust = NamespaceTrust(
            kube, self.wake, tuning.watch_backoff, logs.logger("praesto.agent.kube", node=settings.node_name),
            tuning.trust_secret_recheck_seconds,
        )  # fmt: skip

    def on_relisted(self) -> None:
        """After every (re)list: the store holds no copy that no ModelCacheNode of this node owns."""
        self.events.put(("sweep", None))

    def on_watch(self, type_: str, obj: Obj) -> None:
        key = key_of(obj)
        if type_ == "DELETED":
            with self.lock:
                self.copies.objects.pop(key, None)
                self.events.put(("deleted", obj))
            return
        self.copies.seen(key, obj)
        self.events.put(("dirty", key))

    def run(
        self, stop: threading.Event, hold_store: Callable[[], object], fail: Callable[[str], None]
    ) -> None:
        """The loop, until `stop`: `hold_store` (the base path lock) before each pass; when it
        raises (another agent holds the store) `fail` is told why and the loop ends."""
        next_tick = 0.0
        while not stop.is_set():
            try:
                hold_store()  # a base path created after start: lock it before touching it
            except (baselock.BasePathInUse, OSError) as err:
                fail(str(err))
                return
            try:
                items = [self.events.get(timeout=self.tuning.tick_seconds)]
            except queue.Empty:
                items = []
            while not self.events.empty():
                items.append(self.events.get_nowait())
            dirty: set[CopyKey] = set()
            for kind, payload in items:
                try:
                    if kind == "dirty":
                        dirty.add(payload)
                    elif kind == "deleted":
                        self.removal.forget(payload)
                    elif kind == "done":
                        dirty.add(self._finish(payload))
                    elif kind == "sweep":
                        self.removal.sweep_unowned()
                except Exception as err:  # this thread must outlive any one event
                    self.log.warning(
                        "event handling failed", extra={"event": kind, "error": short_error(err)}
                    )
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.tuning.tick_seconds
                self.status.resend()
                with self.lock:
                    dirty.update(self.copies.objects)
                    named = [self._trust_object(o) for o in self.copies.objects.values()]
                self.trust.retain(t for t in named if t is not None)
            for key in sorted(dirty):
                if stop.is_set():
                    return
                try:
                    self.reconcile(key)
                except Exception as err:  # one cache's trouble must not stop the others
                    self.log.warning(
                        "reconcile failed; retrying on the next tick",
                        extra={"namespace": key[0], "modelCacheNode": key[1], "error": short_error(err)},
                    )

    # ---- reconcile ------------------------------------------------------

    def reconcile(self, key: CopyKey) -> None:
        with self.lock:
            obj = self.copies.objects.get(key)
            state = self.copies.state(key)
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            self.removal.finalize(key, obj, state)
            return
        if names.FINALIZER_NODE_AGENT not in (meta.get("finalizers") or []):
            self.copies.keep(
                self.kube.set_finalizers(obj, [*(meta.get("finalizers") or []), names.FINALIZER_NODE_AGENT])
            )
            return  # the watch brings the object back; continue from there
        ref = self._parse(obj)
        if ref is None or state.job is not None:
            return
        if not self.layout.base.is_dir():
            self.status.set(
                obj, names.PHASE_FAILED, st.REASON_BASE_PATH_MISSING, self._base_missing_message()
            )
            return
        if self.layout.is_complete(ref.namespace, ref.cache):
            step = self.rolling.step(obj, ref, state)
            if step is Step.HOLD:
                return
            if step is Step.FETCH:
                failed = ((obj.get("status") or {}).get("next") or {}).get("revision")
                # the backoff is the failed revision's: another one asked meanwhile starts at once
                if self.clock() >= state.retry_at or failed != ref.source.version:
                    self._start(obj, replace(ref, beside=True), state)
                return
        if self.removal.foreign_copy_stays(obj, ref, state):
            return
        if self.layout.is_complete(ref.namespace, ref.cache):
            self._ready(obj, ref, state)
            return
        requested = _requested(self.layout, ref)
        if (state.evicted or st.phase_of(obj) == names.PHASE_EVICTED) and not requested:
            return
        if self.clock() < state.retry_at:
            return
        self._start(obj, ref, state)

    def _parse(self, obj: Obj) -> CacheRef | None:
        """The copy's ref, its required signature carrying the trust held now (the platform's trust is
        re-read when the kubelet updated its volume; a namespace Secret or ConfigMap is followed by
        its watch, `self.trust`), so every pass re-derives Ready from it."""
        try:
            ref = ref_of(obj)
            required = required_signature(ref, self.jobs.credentials.cluster_trust, self.trust.material)
            return replace(ref, signature=required)
        except (InvalidSpec, ValueError, QuantityError, TypeError, KeyError) as err:
            self.status.set(
                obj, names.PHASE_FAILED, st.REASON_INVALID_SPEC, f"{err}; fix the ModelCache spec"
            )
            return None

    @staticmethod
    def _trust_object(obj: Obj) -> TrustObject | None:
        """The Secret or ConfigMap a ModelCacheNode names as trust material (its watch stays open)."""
        spec = obj.get("spec") or {}
        found = trust_object(
            str(obj["metadata"].get("namespace") or ""), verification_from_node_spec(spec.get("verification"))
        )
        return None if found is None else found[0]

    def _ready(self, obj: Obj, ref: CacheRef, state: CacheState) -> None:
        manifest = store.read_json(self.layout.manifest_path(ref.namespace, ref.cache)) or {}
        size = eviction.cache_size(self.layout, ref.namespace, ref.cache)
        expired = ref.ttl is not None and eviction.ttl_expired(
            self.layout, ref.namespace, ref.cache, ref.ttl, self.clock()
        )
        if expired and self.room.evict(ref.namespace, ref.cache, "ttl"):
            return
        store.clear_hydration_request(self.layout, ref.namespace, ref.cache)
        store.clear_progress(self.layout, ref.namespace, ref.cache)
        if st.phase_of(obj) != names.PHASE_READY and not state.downloaded:
            self.metrics.cache_hits.inc()
        state.attempts, state.retry_at, state.downloaded, state.evicted = 0, 0.0, False, False
        fields: dict[str, Any] = {
            "resolvedRevision": manifest.get("resolvedRevision"),
            "revision": version_of(manifest),  # the spec revision (object stores: prefix) it answers
            "sizeBytes": size,
            "progress": {"bytesDone": size, "bytesTotal": size},
            "lastUsedTime": self._last_used(obj, ref),
            "next": None,  # nothing beside: the served copy is the revision asked for
        }
        if state.peer_bytes is not None:
            fields["bytesFromPeers"], state.peer_bytes = state.peer_bytes, None
        if state.xet_report is not None:
            fields["xet"], state.xet_report = state.xet_report or None, None
        self.status.set(
            obj,
            names.PHASE_READY,
            st.REASON_CACHED,
            f"{format_bytes(size)} cached at revision {str(manifest.get('resolvedRevision', ''))[:12]}",
            fields,
            extra=[
                st.size_condition(
                    (obj.get("status") or {}).get("conditions"), ref.size_bytes, size, self.clock()
                )
            ],
        )

    def _last_used(self, obj: Obj, ref: CacheRef) -> str | None:
        now = self.clock()
        current = (obj.get("status") or {}).get("lastUsedTime")
        if store.mounts_for(self.layout, ref.namespace, ref.cache):
            if current and st.parse_time(current) > now - self.tuning.last_used_refresh:
                return str(current)
            return st.rfc3339(now)
        used = store.last_used(self.layout, ref.namespace, ref.cache)
        return st.rfc3339(used) if used else None

    # ---- downloads ---------------------------------------------------------

    def _start(self, obj: Obj, ref: CacheRef, state: CacheState) -> None:
        job = self.jobs.start(ref)
        with self.lock:
            state.job, state.evicted = job, False
            busy = self.copies.busy()
        if ref.beside:  # the served copy stays Ready; status.next says how the new revision goes
            self.status.set_next(ref.key, {"revision": ref.source.version, "phase": names.NEXT_DOWNLOADING})
            return
        if busy > self.settings.max_parallel_caches:
            self.status.set(
                obj, names.PHASE_PENDING, st.REASON_PENDING, "waiting for a download slot on this node"
            )
        elif (
            state.scrub_findings is None
            and state.attempts == 0
            and st.phase_of(obj) not in (names.PHASE_DOWNLOADING, names.PHASE_FAILED)
        ):
            # a retry keeps showing the last failure or wait (WaitingForSecret) until bytes flow again:
            # no Failed/Pending or WaitingForSecret/Pending flapping on every attempt
            self.status.set(
                obj, names.PHASE_PENDING, st.REASON_PENDING, "resolving the source revision and files"
            )

    def done(self, outcome: Outcome) -> None:
        """A job ended (from its pool thread): handled on the loop's thread."""
        self.events.put(("done", outcome))

    def wake(self) -> None:
        self.events.put(("wake", None))

    def _finish(self, outcome: Outcome) -> CopyKey:
        ref = outcome.ref
        with self.lock:
            state = self.copies.state(ref.key)
            state.job = None
            obj = self.copies.objects.get(ref.key)
        repaired = state.scrub_findings  # kept until a download repairs the copy
        if outcome.result is not None:
            state.scrub_findings = None
            if repaired and obj is not None:
                self._scrub_repaired(obj, ref, repaired)
            state.downloaded = True
            state.peer_bytes = outcome.result.bytes_from_peers
            result = outcome.result
            state.xet_report = st.xet_report(result.xet_files, result.bytes_from_xet, result.xet_fallbacks)
            self.metrics.record_download(outcome.result)
            record_copy(self.layout, ref.namespace, ref.cache, outcome.result)
        elif outcome.cancelled or obj is None:
            pass
        elif outcome.waiting is not None:
            delay = self._schedule_retry(state, 0.4)
            self.status.set(
                obj,
                names.PHASE_PENDING,
                outcome.waiting_reason,
                f"{outcome.waiting}; retrying in {delay:.0f}s",
            )
        elif outcome.error is not None and ref.beside:
            err = outcome.error
            self.metrics.failures.labels(err.reason).inc()
            delay = self._schedule_retry(state, err.backoff_factor)
            message = f"{err.message}; retrying in {delay:.0f}s (attempt {state.attempts})"
            failed = {"revision": ref.source.version, "phase": names.PHASE_FAILED, "reason": err.reason}
            self.status.set_next(ref.key, {**failed, "message": message})  # the served copy serves on
        elif outcome.error is not None:
            err = outcome.error
            self.metrics.failures.labels(err.reason).inc()
            delay = self._schedule_retry(state, err.backoff_factor)
            reason, message = (
                err.reason,
                f"{err.message}; retrying in {delay:.0f}s (attempt {state.attempts})",
            )
            if repaired:  # a file the scrub found bad could not be fetched again: name it
                reason = names.REASON_SCRUB_REPAIR_FAILED
                message = f"scrub found {'; '.join(repaired[: names.SCRUB_MISMATCHED_MAX])}; fetching again failed: {message}"
            self.status.write_progress(
                ref.namespace, ref.cache, progress_record(names.PHASE_FAILED, 0, 0, message, self.clock())
            )
            self.status.set(obj, names.PHASE_FAILED, reason, message)
        return ref.key

    def _scrub_repaired(self, obj: Obj, ref: CacheRef, repaired: list[str]) -> None:
        """The repairing download ended well: the record says Repaired, a Normal Event says what."""
        old = scrub_schedule.read(self.layout, ref.namespace, ref.cache) or scrub_schedule.ScrubRecord()
        record = scrub_schedule.ScrubRecord(self.clock(), names.SCRUB_REPAIRED, old.files_checked,
                                            old.bytes_checked, old.mismatched)  # fmt: skip
        scrub_schedule.write(self.layout, ref.namespace, ref.cache, record)
        try:
            self.status.merge(ref.key, {"scrub": record.status()})
        except Exception as err:  # the record on disk holds it; the next clean scrub reports again
            self.log.warning("could not record the repair", extra={"error": short_error(err)})
        message = f"fetched again and verified: {'; '.join(repaired[: names.SCRUB_MISMATCHED_MAX])}"
        self.kube.emit_event(obj, "Normal", names.REASON_SCRUB_REPAIRED, message)

    def _schedule_retry(self, state: CacheState, factor: float) -> float:
        delay = min(self.tuning.retry_max, self.tuning.retry_initial * factor * 2.0**state.attempts)
        state.attempts += 1
        state.retry_at = self.clock() + delay
        return delay

    def _base_missing_message(self) -> str:
        return (
            f"base path {self.settings.base_path} does not exist on node {self.settings.node_name}; "
            "create it on the node (the agent never creates it, so a typo cannot fill the root disk) "
            "or set the chart's localCache.basePath"
        )


def _requested(layout: StoreLayout, ref: CacheRef) -> bool:
    return (ref.namespace, ref.cache) in store.pending_hydration_requests(layout)
