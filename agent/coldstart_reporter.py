"""The agent's half of per-Pod cold-start accounting, and the prewarm trigger (issue #15).

The CSI driver records, per (Pod, cache), the first NodePublish attempt, whether
the cache was complete then (hit) and when the mount succeeded
(`praesto.coldstart_record`). This reporter polls those records (a listdir twice a
second) and, for each finished one:

1. starts a prewarm when the cache's ModelCacheNode has `spec.prewarm` (first:
   the model server is about to start);
2. adds it to the copy's `status.podStarts` (hits, misses, the last waits),
   which the sync hook sums into the ModelCache's status;
3. records an Event on the Pod (involvedObject by uid) saying hit or miss, the
   wait, and for a miss where the bytes of the copy it waited for came from;
4. observes the `praesto_pod_model_*` metrics, then removes the record.

A record whose status write fails stays for the next poll; the Event and the
metrics come after that write, so a retry never reports a Pod twice. The status
goes through the agent's one status writer (status_writer.py); the copies are
read from the agent's shared view (`Copies`).
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable
from typing import Any

from praesto.agent import logs
from praesto.agent.copies import Copies, Obj, cache_of
from praesto.agent.download.api import Result
from praesto.agent.kube import KubeApi, key_of, short_error
from praesto.agent.metrics import ORIGIN_DEDUP, ORIGIN_PEER, ORIGIN_SOURCE
from praesto.agent.prewarm import Prewarmer, PrewarmResult
from praesto.agent.status_writer import StatusWriter
from praesto.csi import storefs
from prometheus_client import CollectorRegistry, Counter, Histogram

from praesto import coldstart_record, store
from praesto.quantity import format_bytes

REASON_HIT = "ModelCacheHit"
REASON_MISS = "ModelCacheMiss"
RECENT = 32  # waits kept per copy in status.podStarts.recentWaitSeconds
UNMATCHED_SECONDS = 300.0  # a record whose ModelCacheNode is still unknown is reported without status then
ABANDONED_SECONDS = 86400.0  # a Pod that never got its mount (deleted while waiting): forget it
WAIT_BUCKETS = (0.05, 0.25, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600, 7200)


class PodStartMetrics:
    """`praesto_pod_model_*`: per cache (namespace, model_cache), on the agent's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "model_cache"]
        self.wait_seconds = Histogram(
            "praesto_pod_model_wait_seconds",
            "Seconds from a Pod's first mount attempt of a model cache to the successful mount",
            labels,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.starts = Counter(
            "praesto_pod_model_starts",
            "Pods that mounted a model cache, by result: hit (Ready at the first attempt) or miss",
            [*labels, "result"],
            registry=registry,
        )
        self.bytes = Counter(
            "praesto_pod_model_bytes",
            "Bytes of the copies Pods waited for (misses), by origin: source, peer or dedup",
            [*labels, "origin"],
            registry=registry,
        )
        self.prewarmed = Counter(
            "praesto_pod_model_prewarmed_bytes",
            "Bytes of model files read into the page cache ahead of a Pod's model load (spec.prewarm)",
            labels,
            registry=registry,
        )


def record_copy(layout: store.StoreLayout, namespace: str, cache: str, result: Result) -> None:
    """Where the bytes of the copy just published came from, tied to its manifest's completedAt.

    Best effort: without it a Pod's Event says the origin of the bytes is unknown.
    """
    manifest = store.read_json(layout.manifest_path(namespace, cache)) or {}
    record = {
        "completedAt": manifest.get("completedAt"),
        "resolvedRevision": result.plan.revision,
        ORIGIN_SOURCE: result.bytes_from_origin,
        ORIGIN_PEER: result.bytes_from_peers,
        ORIGIN_DEDUP: result.bytes_deduplicated,
        "seconds": round(result.seconds, 3),
    }
    with contextlib.suppress(OSError):
        store.write_json_atomic(layout.copy_record(namespace, cache), record)


def copy_bytes(layout: store.StoreLayout, namespace: str, cache: str) -> dict[str, int] | None:
    """Bytes by origin of the copy on disk now; None when unknown (pre-baked, or an older copy's record)."""
    record = store.read_json(layout.copy_record(namespace, cache))
    manifest = store.read_json(layout.manifest_path(namespace, cache))
    if not record or not manifest or record.get("completedAt") != manifest.get("completedAt"):
        return None
    out = {}
    for origin in (ORIGIN_SOURCE, ORIGIN_PEER, ORIGIN_DEDUP):
        value = record.get(origin)
        out[origin] = value if isinstance(value, int) and value >= 0 else 0
    return out


def event_for(
    start: coldstart_record.PodStart, node: str, by_origin: dict[str, int] | None
) -> tuple[str, str]:
    """(reason, message) of the Event on the Pod."""
    cache = f"model cache {start.namespace}/{start.name}"
    if start.hit:
        return REASON_HIT, (
            f"{cache} was Ready on node {node} at the Pod's first mount attempt: mounted in "
            f"{start.wait_seconds:.2f}s"
        )
    if by_origin is None:
        source = "where its bytes came from is unknown (the copy was not downloaded by this node agent)"
    else:
        source = (
            f"the copy took {format_bytes(by_origin[ORIGIN_SOURCE])} from the origin, "
            f"{format_bytes(by_origin[ORIGIN_PEER])} from peer nodes and "
            f"{format_bytes(by_origin[ORIGIN_DEDUP])} from identical files already on the node (dedup)"
        )
    return REASON_MISS, (
        f"{cache} was not on node {node} at the Pod's first mount attempt: the Pod waited "
        f"{start.wait_seconds:.1f}s for it; {source}"
    )


def updated_summary(current: Any, start: coldstart_record.PodStart) -> dict[str, Any]:
    """`status.podStarts` of a copy with one more Pod start (pure: the hook reads the same shape)."""
    now = current if isinstance(current, dict) else {}
    hits = _count(now.get("hits")) + (1 if start.hit else 0)
    misses = _count(now.get("misses")) + (0 if start.hit else 1)
    recent = [w for w in now.get("recentWaitSeconds") or [] if isinstance(w, int | float) and w >= 0]
    recent = [*recent, round(start.wait_seconds, 3)][-RECENT:]
    when = start.mounted_at or start.first_attempt_at
    return {
        "hits": hits,
        "misses": misses,
        "recentWaitSeconds": recent,
        "lastPodStartTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class PodStartReporter:
    def __init__(
        self,
        copies: Copies,
        status: StatusWriter,
        kube: KubeApi,
        node: str,
        registry: CollectorRegistry,
        poll_seconds: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.copies, self.status, self.kube, self.node = copies, status, kube, node
        self.layout = status.layout
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.metrics = PodStartMetrics(registry)
        self.prewarmer = Prewarmer()
        self.log = logs.logger("praesto.agent.coldstart_reporter", node=node)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._summaries: dict[
            tuple[str, str, str], dict[str, Any]
        ] = {}  # per ModelCacheNode uid, ahead of the watch
        self._prewarmed: set[str] = set()  # record files whose prewarm already started

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="praesto-podstarts", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.prewarmer.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except Exception as err:  # this thread must outlive any one record
                self.log.warning("pod start reporting failed", extra={"error": short_error(err)})

    # ---- one pass -----------------------------------------------------------

    def poll(self) -> int:
        """Report every finished record; returns how many were reported.

        The driver's pods/ is read through storefs' walk, never through a symlink planted there."""
        try:
            with storefs.store_dir(self.layout.base, (store.INTERNAL_DIR, store.PODS)) as folder:
                return 0 if folder is None else self._poll_in(folder)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            return 0  # not a plain directory: the driver refuses to write there and says so

    def _poll_in(self, folder: int) -> int:
        reported = 0
        for record in storefs.record_names(folder):
            start = coldstart_record.from_json(storefs.read_json_at(folder, record))
            if start is None or start.mounted_at is None:
                if start is None or self.clock() - start.first_attempt_at > ABANDONED_SECONDS:
                    storefs.unlink_at(folder, record)
                continue
            if self._report(folder, record, start):
                reported += 1
        return reported

    def _copy_of(self, namespace: str, cache: str) -> Obj | None:
        with self.copies.lock:
            for (ns, _name), obj in self.copies.objects.items():
                if ns == namespace and cache_of(obj) == cache:
                    return obj
        return None

    def _report(self, folder: int, record: str, start: coldstart_record.PodStart) -> bool:
        obj = self._copy_of(start.namespace, start.name)
        if obj is None and self.clock() - start.first_attempt_at < UNMATCHED_SECONDS:
            return False  # the watch may not have brought it yet
        if obj is not None and (obj.get("spec") or {}).get("prewarm") is True:
            self._prewarm(record, start)
        if obj is not None and not self._write_summary(obj, start):
            return False
        node = self.node
        by_origin = None if start.hit else copy_bytes(self.layout, start.namespace, start.name)
        reason, message = event_for(start, node, by_origin)
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": start.pod_name,
            "namespace": start.namespace,
            "uid": start.pod_uid,
        }
        self.kube.event(start.namespace, involved, "Normal", reason, message)
        labels = {"namespace": start.namespace, "model_cache": start.name}
        self.metrics.wait_seconds.labels(**labels).observe(start.wait_seconds)
        self.metrics.starts.labels(**labels, result="hit" if start.hit else "miss").inc()
        for origin, count in (by_origin or {}).items():
            self.metrics.bytes.labels(**labels, origin=origin).inc(count)
        logs.cache_logger(start.namespace, start.name).info(
            "pod start",
            extra={"pod": start.pod_name, "hit": start.hit, "waitSeconds": round(start.wait_seconds, 3)},
        )
        storefs.unlink_at(folder, record)
        self._prewarmed.discard(record)
        return True

    def _write_summary(self, obj: Obj, start: coldstart_record.PodStart) -> bool:
        key = key_of(obj)
        ident = (*key, str(obj["metadata"].get("uid")))
        current = self._summaries.get(ident) or (obj.get("status") or {}).get("podStarts")
        summary = updated_summary(current, start)
        try:
            self.status.merge(key, {"podStarts": summary})
        except Exception as err:
            self.log.warning(
                "could not write status.podStarts; retrying",
                extra={"namespace": key[0], "modelCacheNode": key[1], "error": short_error(err)},
            )
            return False
        self._summaries[ident] = summary
        return True

    def _prewarm(self, record: str, start: coldstart_record.PodStart) -> None:
        if record in self._prewarmed or not self.layout.is_complete(start.namespace, start.name):
            return
        self._prewarmed.add(record)
        labels = {"namespace": start.namespace, "model_cache": start.name}

        def done(result: PrewarmResult) -> None:
            self.metrics.prewarmed.labels(**labels).inc(result.bytes_read)
            logs.cache_logger(start.namespace, start.name).info(
                "prewarmed",
                extra={
                    "bytes": result.bytes_read,
                    "of": result.bytes_total,
                    "seconds": round(result.seconds, 3),
                    "stopped": result.stopped or None,
                },
            )

        cache_dir = self.layout.cache_dir(start.namespace, start.name)
        self.prewarmer.start((start.namespace, start.name), cache_dir, done)
