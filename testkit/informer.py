"""A list-then-watch cache of one resource with event handlers: client-go's reflector, store and shared informer, small.

What a controller built on client-go sees, and nothing more: objects come from
this cache (which trails the API server by the watch's delivery time, plus
`lag` when a test wants a slower cache), handlers get add/update/delete in
watch order, an update whose resourceVersion did not change is a resync (the
same object passed as old and new, as client-go's `Sync` delta does), and a
relist after `410 Gone` or a broken watch replays the difference as events.

Self-contained on purpose (only `kubernetes.client.ApiClient`), so it can move
to production code as the one reflector of issue 23 item 2.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)
Obj = dict[str, Any]
BACKOFF_START, BACKOFF_MAX = 0.2, 5.0


class Handler(Protocol):
    def on_add(self, obj: Obj) -> None: ...
    def on_update(self, old: Obj, new: Obj) -> None: ...
    def on_delete(self, obj: Obj) -> None: ...


def object_key(obj: Obj) -> str:
    """client-go's MetaNamespaceKeyFunc: `namespace/name`, or `name` for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta.get("name"))


def resource_path(api_version: str, plural: str) -> str:
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{prefix}/{plural}"


_Note = tuple[str, Obj, Obj]  # ("add" | "update" | "delete", old, new); old is new for a resync


@dataclass
class _Subscriber:
    handler: Handler
    resync_period: float | None
    next_resync: float = field(default=0.0)


class Informer:
    """One resource, every namespace; `start()` lists and watches on a thread, handlers run on another."""

    def __init__(
        self,
        api: client.ApiClient,
        api_version: str,
        plural: str,
        kind: str,
        *,
        lag: float = 0.0,
        watch_timeout: int = 60,
    ) -> None:
        fork = getattr(api, "own_pool", None)  # a client that keeps its rate limiter on a new pool
        self.api = fork() if fork else client.ApiClient(configuration=api.configuration)  # its own pool
        self.api_version, self.kind, self.path = api_version, kind, resource_path(api_version, plural)
        self.lag, self.watch_timeout = lag, watch_timeout
        self.synced = threading.Event()
        self._store: dict[str, Obj] = {}
        self._lock = threading.RLock()
        self._events: deque[tuple[float, str, Any]] = deque()
        self._wake = threading.Condition(self._lock)
        self._subscribers: list[_Subscriber] = []
        self._stop = threading.Event()
        self._response: Any = None
        self._threads = [
            threading.Thread(target=self._reflect, name=f"informer-{kind}", daemon=True),
            threading.Thread(target=self._dispatch, name=f"informer-{kind}-handlers", daemon=True),
        ]

    # ---- what controllers use ---------------------------------------------------------

    def add_handler(self, handler: Handler, resync_period: float | None = None) -> None:
        """Like client-go, a new handler first gets every cached object (as a resync)."""
        with self._lock:
            subscriber = _Subscriber(handler, resync_period)
            if resync_period:
                subscriber.next_resync = time.monotonic() + resync_period
            self._subscribers.append(subscriber)
            for obj in list(self._store.values()):
                handler.on_update(obj, obj)

    def get(self, namespace: str | None, name: str) -> Obj | None:
        with self._lock:
            found = self._store.get(f"{namespace}/{name}" if namespace else name)
            return copy.deepcopy(found) if found is not None else None

    def objects(self, namespace: str | None = None, match: Callable[[Obj], bool] | None = None) -> list[Obj]:
        with self._lock:
            items = [
                o
                for o in self._store.values()
                if (namespace is None or (o.get("metadata") or {}).get("namespace") == namespace)
                and (match is None or match(o))
            ]
            return copy.deepcopy(items)

    def view(self) -> list[Obj]:
        """The cached objects themselves, not copies, for a reader that changes nothing: a scan of every
        object on every event (a copy of each would cost O(store) per event)."""
        with self._lock:
            return list(self._store.values())

    def backlog(self) -> tuple[int, float]:
        """Watch events received but not yet in the store: how many, and the oldest one's age in
        seconds (beyond `lag`). A controller reading a cache this far behind creates what exists."""
        with self._lock:
            if not self._events:
                return 0, 0.0
            return len(self._events), max(0.0, time.monotonic() - self._events[0][0])

    def start(self) -> Informer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._hang_up()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(10)

    # ---- list and watch ---------------------------------------------------------------

    def _request(self, query: list[tuple[str, Any]], read_timeout: float) -> Any:
        return self.api.call_api(
            self.path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=(5, read_timeout),
        )

    def _hang_up(self) -> None:
        """Shut the open watch's socket, so the reader returns now rather than at its read timeout."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _reflect(self) -> None:
        backoff = BACKOFF_START
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = BACKOFF_START
                self._watch(version)
            except ApiException as error:
                if error.status == 410:  # the watch position was compacted: relist now
                    continue
                log.warning("informer %s: %s; relisting in %.1fs", self.kind, error.reason, backoff)
            except Exception as error:  # a broken connection, an API server restart: relist
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s; relisting in %.1fs", self.kind, error, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _list(self) -> str:
        response = self._request([], 30)
        body = json.loads(response.data)
        items = [{**o, "apiVersion": self.api_version, "kind": self.kind} for o in body.get("items") or []]
        log.debug("informer %s: listed %d", self.kind, len(items))
        self._push("LIST", items)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            query = [
                ("watch", "true"),
                ("resourceVersion", version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", self.watch_timeout),
            ]
            self._response = self._request(query, self.watch_timeout + 10)
            if self._stop.is_set():
                return
            for event in self._lines(self._response):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code") or 500, reason=obj.get("message"))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._push(str(kind), obj)

    @staticmethod
    def _lines(response: Any) -> Iterator[Obj]:
        for line in iter_resp_lines(response):
            yield json.loads(line)

    def _push(self, kind: str, payload: Any) -> None:
        with self._wake:
            self._events.append((time.monotonic() + self.lag, kind, payload))
            self._wake.notify_all()

    # ---- the store and the handlers ---------------------------------------------------

    def _dispatch(self) -> None:
        """Apply due events to the store (under the lock), then tell the handlers (outside it)."""
        while not self._stop.is_set():
            with self._wake:
                now = time.monotonic()
                due = self._events[0][0] if self._events else now + 1.0
                resyncs = [s.next_resync for s in self._subscribers if s.resync_period]
                wake_at = min([due, *resyncs])
                if wake_at > now:
                    self._wake.wait(wake_at - now)
                    continue
                notes: list[_Note] = []
                if self._events and self._events[0][0] <= now:
                    _, kind, payload = self._events.popleft()
                    notes = self._apply(kind, payload)
                resyncs_due = self._resyncs_due(now)
                subscribers = list(self._subscribers)
            for note in notes:
                for subscriber in subscribers:
                    self._notify(subscriber.handler, note)
            for subscriber, objects in resyncs_due:
                for obj in objects:
                    self._notify(subscriber.handler, ("update", obj, obj))

    def _apply(self, kind: str, payload: Any) -> list[_Note]:
        if kind == "LIST":
            notes: list[_Note] = []
            listed = {object_key(o): o for o in payload}
            for key in [k for k in self._store if k not in listed]:
                gone = self._store.pop(key)
                notes.append(("delete", gone, gone))
            for key, obj in listed.items():
                old = self._store.get(key)
                self._store[key] = obj
                notes.append(("update", old, obj) if old is not None else ("add", obj, obj))
            self.synced.set()
            log.debug("informer %s: synced", self.kind)
            return notes
        obj = {**payload, "apiVersion": self.api_version, "kind": self.kind}
        key = object_key(obj)
        if kind == "DELETED":
            self._store.pop(key, None)
            return [("delete", obj, obj)]
        old = self._store.get(key)
        self._store[key] = obj
        return [("add", obj, obj) if old is None else ("update", old, obj)]

    def _notify(self, handler: Handler, note: _Note) -> None:
        what, old, new = note
        try:
            if what == "add":
                handler.on_add(new)
            elif what == "update":
                handler.on_update(old, new)
            else:
                handler.on_delete(new)
        except Exception:  # a handler's bug must not stop the cache
            log.exception("informer %s: handler failed", self.kind)

    def _resyncs_due(self, now: float) -> list[tuple[_Subscriber, list[Obj]]]:
        due = []
        for subscriber in self._subscribers:
            if subscriber.resync_period and subscriber.next_resync <= now:
                subscriber.next_resync = now + subscriber.resync_period
                due.append((subscriber, list(self._store.values())))
        return due
