"""A fake node agent per node for the scale bench: the agent's own status writer, no download.

Each node's copies are reported through `agent.status_writer.StatusWriter` with the
agent's `KubeApi` (the same patches, the same Events on a phase change), driven the way
agent/reconcile.py drives it, minus the bytes: add the node agent's finalizer first (the
watch brings the object back), then report Ready at the revision the copy is told
(`spec.source.revision`), or, while `spec.switch` is false during a roll, hold it beside
(`status.next`, agent/rolling.py); on delete, drop the finalizer (agent/removal.py). The
copies are watched with one informer for all nodes; `workers` threads write.

Not modelled: each agent's own watch (one per node, filtered by its label) and its
Pod-bound token (the node-confinement policy is not evaluated: all write as one identity).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from praesto.agent import status as st
from praesto.agent.copies import Copies
from praesto.agent.kube import KubeApi
from praesto.agent.status_writer import StatusWriter

from praesto import names
from praesto.store import StoreLayout
from testkit.informer import Informer

Obj = dict[str, Any]
SIZE = 1 << 30


class FakeAgents:
    def __init__(self, api: client.ApiClient, workers: int = 8) -> None:
        self.api, self.workers = api, workers
        self.informer = Informer(
            api, names.API_VERSION, names.MODELCACHENODE_PLURAL, names.MODELCACHENODE_KIND
        )
        self._writers: dict[str, StatusWriter] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._pending: set[str] = set()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        self.errors: list[str] = []

    def __enter__(self) -> FakeAgents:
        self.informer.add_handler(self)
        self.informer.start()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        for _thread in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(30)
        self.informer.stop()

    # ---- informer handler ---------------------------------------------------------

    def on_add(self, obj: Obj) -> None:
        self._enqueue(obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        self._enqueue(new)

    def on_delete(self, obj: Obj) -> None:
        return

    def _enqueue(self, obj: Obj) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
        self._queue.put(key)

    # ---- the agent's decisions ------------------------------------------------------

    def _writer(self, node: str) -> StatusWriter:
        with self._lock:
            found = self._writers.get(node)
            if found is None:
                layout = StoreLayout(Path(f"/var/lib/praesto-scale-bench/{node}"))  # never touched: no bytes
                found = StatusWriter(KubeApi(self.api, node), Copies(), layout, time.time, 5.0, node=node)
                self._writers[node] = found
            return found

    def forget(self, node: str) -> None:
        """The node's agent restarted: its next write starts from an empty memory."""
        with self._lock:
            self._writers.pop(node, None)

    def _work(self) -> None:
        while (key := self._queue.get()) is not None:
            with self._lock:
                self._pending.discard(key)
            namespace, _, name = key.partition("/")
            obj = self.informer.get(namespace, name)
            if obj is None:
                continue
            try:
                self.reconcile(obj)
            except Exception as error:  # a conflict or a deleted copy: its next event brings it back
                self.errors.append(f"{key}: {type(error).__name__}: {str(error)[:200]}")

    def reconcile(self, obj: Obj) -> None:
        spec, meta = obj.get("spec") or {}, obj["metadata"]
        writer = self._writer(str(spec.get("nodeName")))
        writer.copies.keep(obj)
        obj = writer.copies.get((meta["namespace"], meta["name"])) or obj
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if obj["metadata"].get("deletionTimestamp"):
            if names.FINALIZER_NODE_AGENT in finalizers:
                rest = [f for f in finalizers if f != names.FINALIZER_NODE_AGENT]
                writer.kube.set_finalizers(obj, rest)
            return
        if names.FINALIZER_NODE_AGENT not in finalizers:
            writer.copies.keep(writer.kube.set_finalizers(obj, [*finalizers, names.FINALIZER_NODE_AGENT]))
            return
        told = str((spec.get("source") or {}).get("revision") or "")
        status = obj.get("status") or {}
        served = status.get("resolvedRevision") if st.phase_of(obj) == names.PHASE_READY else None
        key = (meta["namespace"], meta["name"])
        if served and served != told and spec.get("switch") is False:
            writer.set_next(key, {"revision": told, "resolvedRevision": told, "phase": names.NEXT_READY})
            return
        fields = {
            "resolvedRevision": told,
            "revision": told,
            "sizeBytes": SIZE,
            "progress": {"bytesDone": SIZE, "bytesTotal": SIZE},
            "next": None,
        }
        size = st.size_condition(status.get("conditions"), SIZE, SIZE, time.time())
        message = f"1.0 GiB cached at revision {told[:12]}"
        writer.set(obj, names.PHASE_READY, st.REASON_CACHED, message, fields, extra=[size])
