"""What both of Metacontroller's controllers share: hook calls, shared informers, label selectors, the worker loop.

Sources at tag v4.17.2: `pkg/hooks/webhook.go` (strict decoding),
`pkg/dynamic/informer/factory.go` (one informer per resource, shared by every
controller in the process), `pkg/controller/composite/controller.go`
`processNextWorkItem` (errors retried with the queue's backoff).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from testkit.informer import Informer
from testkit.kube_apply import Kube
from testkit.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)
Obj = dict[str, Any]
CACHE_FLUSH_INTERVAL = 1800.0  # `--cache-flush-interval` default (pkg/cmd/metacontroller/main.go)
CONFLICT_RETRIES = (0.01, 0.05, 0.25)  # retry.DefaultBackoff: 4 steps from 10 ms, factor 5


class HookError(RuntimeError):
    """The hook answered something Metacontroller 4.17.2 would refuse; the sync fails and is retried."""


class NotSynced(RuntimeError):
    """`customize.ErrRelatedInformerNotSynced`: a related informer has not listed yet; retried."""


@dataclass
class HookClient:
    """Calls the hook URLs a controller names, at `base_url` (the test's praesto-hooks), trusting `ca_path`."""

    base_url: str
    ca_path: Path
    timeout: float = 10.0
    observer: Callable[[str, int, float], None] | None = None  # (path, request bytes, seconds) per call

    def call(self, webhook: Obj, body: Obj, allowed: frozenset[str]) -> Obj:
        path = urlsplit(webhook["url"]).path
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        context = ssl.create_default_context(cafile=str(self.ca_path))
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
            answer = json.loads(response.read())
        if self.observer is not None:
            self.observer(path, len(data), time.monotonic() - started)
        if not isinstance(answer, dict):
            raise HookError(f"{path}: response is not an object")
        unknown = sorted(set(answer) - allowed)
        if unknown:
            raise HookError(f"{path}: strict decoding failed: unknown fields {unknown}")
        return answer


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """`metav1.LabelSelectorAsSelector(...).Matches`: nil and {} select everything."""
    labels = labels or {}
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(op)
        if not ok:
            return False
    return True


def meta(obj: Mapping[str, Any]) -> Obj:
    out: Obj = obj.get("metadata") or {}
    return out


def controller_ref(obj: Mapping[str, Any]) -> Obj | None:
    """`metav1.GetControllerOf`."""
    return next((r for r in meta(obj).get("ownerReferences") or [] if r.get("controller")), None)


def object_key(obj: Mapping[str, Any]) -> str:
    m = meta(obj)
    return f"{m['namespace']}/{m['name']}" if m.get("namespace") else str(m["name"])


def group_key(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}.{obj['apiVersion']}"


def describe(what: str, obj: Mapping[str, Any]) -> str:
    """How a trigger reads in a pass's reasons: `update Node local-a@1234`."""
    return f"{what} {obj.get('kind')} {object_key(obj)}@{meta(obj).get('resourceVersion')}"


def atomic_update(
    resource: Any, obj: Obj, change: Callable[[Obj], bool], subresource: str = ""
) -> Obj | None:
    """`ResourceClient.AtomicUpdate`/`AtomicStatusUpdate`: GET live, change, PUT; retried on conflict.

    None when the object is gone or was replaced (another uid)."""
    namespace, name = meta(obj).get("namespace"), meta(obj)["name"]
    for pause in (*CONFLICT_RETRIES, None):
        try:
            current: Obj = resource.get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None
        if meta(current).get("uid") != meta(obj).get("uid"):
            return None
        if not change(current):
            return current
        target = resource.subresources[subresource] if subresource else resource
        try:
            out: Obj = target.replace(body=current, namespace=namespace).to_dict()
            return out
        except ConflictError:
            if pause is None:
                raise
            time.sleep(pause)  # retry.RetryOnConflict's backoff
        except NotFoundError:
            return None
    raise AssertionError("unreachable")


def status_only(old: Obj, new: Obj) -> bool:
    """What `ignoreStatusChanges` filters: same generation, labels and annotations, and not deleting."""
    o, n = meta(old), meta(new)
    return (
        o.get("generation") == n.get("generation")
        and (o.get("labels") or {}) == (n.get("labels") or {})
        and (o.get("annotations") or {}) == (n.get("annotations") or {})
        and not n.get("deletionTimestamp")
    )


class InformerFactory:
    """`SharedInformerFactory`: one informer per (apiVersion, resource) for the whole process."""

    def __init__(self, kube: Kube, *, resync_period: float = CACHE_FLUSH_INTERVAL, lag: float = 0.0) -> None:
        self.kube, self.resync_period, self.lag = kube, resync_period, lag
        self._informers: dict[tuple[str, str], Informer] = {}
        self._kinds: dict[tuple[str, str], tuple[str, bool]] = {}
        self._lock = threading.Lock()

    def describe(self, api_version: str, plural: str) -> tuple[str, bool]:
        """(kind, namespaced) from discovery, as `dynamicdiscovery.ResourceMap` knows them."""
        with self._lock:
            if (api_version, plural) not in self._kinds:
                resource = self.kube.resource_by_plural(api_version, plural)
                self._kinds[(api_version, plural)] = (str(resource.kind), bool(resource.namespaced))
            return self._kinds[(api_version, plural)]

    def handler_resync(self, resync_period_seconds: float | None) -> float:
        """A parent handler's resync: its own period (at least 1 s) when shorter than the shared
        informer's, which resyncs every handler anyway (`informer.go` `addHandler`)."""
        if resync_period_seconds:
            return min(max(1.0, float(resync_period_seconds)), self.resync_period)
        return self.resync_period

    def informer(self, api_version: str, plural: str) -> Informer:
        kind, _ = self.describe(api_version, plural)
        with self._lock:
            found = self._informers.get((api_version, plural))
            if found is None:
                found = Informer(self.kube.api, api_version, plural, kind, lag=self.lag).start()
                self._informers[(api_version, plural)] = found
            return found

    def informers(self) -> list[Informer]:
        with self._lock:
            return list(self._informers.values())

    def wait_synced(self, deadline: float = 30.0) -> None:
        with self._lock:
            informers = list(self._informers.values())
        for informer in informers:
            if not informer.synced.wait(deadline):
                raise TimeoutError(f"the {informer.kind} informer did not list within {deadline}s")

    def stop(self) -> None:
        with self._lock:
            informers = list(self._informers.values())
            self._informers.clear()
        for informer in informers:
            informer.stop()


@dataclass
class Pass:
    """One sync of one key: why it ran (the queue's reasons), what the hook said, what was written."""

    key: str
    reasons: list[str]
    started: float
    hook: str = ""
    response: Obj = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)
    error: str = ""
    finished: float = 0.0
    parent_version: str = ""  # the resourceVersion of the parent this pass read from the cache
    children_versions: dict[str, str] = field(default_factory=dict)  # key -> resourceVersion it read
    parent_live_version: str = ""  # the parent's resourceVersion on the server when its status was compared
    status_changes: list[str] = field(default_factory=list)  # the .status keys a status write changed

    def triggered_by(self, what: str, obj: Mapping[str, Any]) -> bool:
        return any(r.endswith(describe(what, obj)) for r in self.reasons)


@dataclass
class Seen:
    """One informer event as a controller judged it: which keys it queued (none: filtered out)."""

    reason: str
    queued: list[str]


class Controller:
    """A queue and its workers (`processNextWorkItem`), with a log of passes and events for tests."""

    name = "controller"

    def __init__(self, kube: Kube, hooks: HookClient, controller: Obj, workers: int) -> None:
        self.kube, self.hooks, self.controller, self.workers = kube, hooks, controller, workers
        self.spec: Obj = controller["spec"]
        self.queue = WorkQueue()
        self._log_lock = threading.Lock()
        self._passes: list[Pass] = []
        self._seen: list[Seen] = []
        self._threads: list[threading.Thread] = []

    # ---- the worker loop ---------------------------------------------------------------

    def sync(self, key: str, record: Pass) -> None:
        raise NotImplementedError

    def start_workers(self) -> None:
        self._threads = [
            threading.Thread(target=self._work, name=f"{self.name}-worker-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop_workers(self) -> None:
        self.queue.shut_down()
        for thread in self._threads:
            thread.join(30)
        self.queue = WorkQueue()
        self._threads = []

    def _work(self) -> None:
        while True:
            try:
                key, reasons = self.queue.get()
            except ShutDown:
                return
            record = Pass(key, reasons, time.monotonic())
            try:
                self.sync(key, record)
                self.queue.forget(key)
            except NotSynced as error:
                record.error = str(error)
                self.queue.add_rate_limited(key, "retry: related informer not synced")
            except Exception as error:  # a failed sync is retried with backoff, as Metacontroller does
                record.error = f"{type(error).__name__}: {error}"
                log.warning("%s: sync of %s failed: %s", self.name, key, record.error)
                self.queue.add_rate_limited(key, f"retry: {record.error[:200]}")
            finally:
                record.finished = time.monotonic()
                with self._log_lock:
                    self._passes.append(record)
                self.queue.done(key)

    # ---- what handlers record ----------------------------------------------------------

    def enqueue(self, key: str, reason: str) -> None:
        self.queue.add(key, reason)

    def saw(self, reason: str, queued: list[str]) -> None:
        with self._log_lock:
            self._seen.append(Seen(reason, queued))

    # ---- what tests read ---------------------------------------------------------------

    def drain(self) -> list[Pass]:
        """Take the passes logged so far and forget them and the events seen (a long run's memory)."""
        with self._log_lock:
            taken, self._passes, self._seen = self._passes, [], []
            return taken

    def passes(self, key: str | None = None) -> list[Pass]:
        with self._log_lock:
            return [p for p in self._passes if key is None or p.key == key]

    def wait_pass(self, key: str, match: Callable[[Pass], bool], deadline: float, what: str = "") -> Pass:
        """The first finished pass of `key` that `match`es, waiting for it with a deadline."""
        end = time.monotonic() + deadline
        while True:
            found = next((p for p in self.passes(key) if match(p)), None)
            if found is not None:
                return found
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{self.name}: no pass of {key} {what} after {deadline}s; {self.summary(key)}"
                )
            time.sleep(0.05)  # poll interval, bounded by the deadline

    def wait_seen(self, what: str, obj: Mapping[str, Any], deadline: float = 30) -> Seen:
        """The handlers' verdict on the event of `obj` at its resourceVersion (`describe(what, obj)`)."""
        wanted = describe(what, obj)
        end = time.monotonic() + deadline
        while True:
            with self._log_lock:
                found = next((s for s in self._seen if s.reason.endswith(wanted)), None)
            if found is not None:
                return found
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name}: never saw {wanted} within {deadline}s")
            time.sleep(0.05)  # poll interval, bounded by the deadline

    def summary(self, key: str) -> str:
        passes = self.passes(key)
        errors = [p.error for p in passes if p.error][-3:]
        last = passes[-1] if passes else None
        described = last and f"reasons {last.reasons}, hook {last.hook!r}, writes {last.writes}"
        return f"{len(passes)} passes, last: {described}; last errors {errors}"
