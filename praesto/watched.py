"""Objects a process reads again and again, kept by a watch: list once, then only changes.

Used by the node agent (its peers' copies of a cache, the origin budget's Leases). Why: a
waiting agent that lists every couple of seconds costs the API server one list per
agent per period (1,000 agents waiting on one leader: 500 lists a second). Here one
reflector (praesto.reflector: resumes each watch from the last resourceVersion, relists
only on 410 Gone, backs off with jitter) keeps the objects; readers take them from memory
(`items`, no API call) and wait on `wait_change`, which a watch event ends at once. The
only periodic request left is the watch's own renewal every `WATCH_SECONDS` (300 s), a
WATCH from where it was, not a list.

`keep(obj)` stores an object the caller just wrote (the API's answer), so a reader does not
act on the older copy the watch has not replaced yet; an event older than what is kept is
ignored (resourceVersions compared as etcd revisions, as `Copies` does).

`fresh()` says whether the memory can be trusted: listed, and no request left unanswered
for `STALE_SECONDS` (the server away, or the watch refused). When it cannot, callers fall
back to one direct read, as they did before the watch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from praesto.listwatch import ListWatch
from praesto.reflector import Backoff, ObjectKey, Reflector, key_of

Obj = dict[str, Any]
STALE_SECONDS = 15.0  # unanswered this long: the memory is not trusted, callers read directly
SYNC_SECONDS = 10.0  # how long a first reader waits for the first list


def resource_version(obj: Obj) -> int:
    """An object's resourceVersion as the etcd revision it is (0 when absent or not a number)."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else 0


class WatchedSet:
    """The objects `listwatch` lists, kept by a watch started on first use (`start`) until `stop`."""

    def __init__(
        self,
        name: str,
        listwatch: ListWatch,
        *,
        key: tuple[str, str] = ("", ""),
        backoff: Backoff | None = None,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        """`key`: what the set is of, for its owner (e.g. (namespace, cache))."""
        self.name, self.listwatch, self.backoff, self.logger = name, listwatch, backoff, logger
        self.key = key
        self._changed = threading.Condition()
        self._items: dict[ObjectKey, Obj] = {}
        self.version = 0  # bumped on every change: what a waiter compares against
        self.seen_version = 0  # the newest resourceVersion the list or the watch delivered
        self._reflector: Reflector | None = None

    # ---- lifecycle -----------------------------------------------------------------
    def start(self) -> WatchedSet:
        """List and watch on a thread of its own, unless already running."""
        with self._changed:
            if self._reflector is not None:
                return self
            self._reflector = Reflector(
                self.name, self.listwatch.list, self.listwatch.watch, on_event=self._seen,
                on_relisted=self._relisted, hang_up=self.listwatch.hang_up, backoff=self.backoff,
                logger=self.logger,
            )  # fmt: skip
        self._reflector.start()
        return self

    def stop(self) -> None:
        """Close the watch (its connection hung up now) and forget the objects."""
        with self._changed:
            reflector, self._reflector = self._reflector, None
            self._items, self.seen_version = {}, 0
            self.version += 1
            self._changed.notify_all()
        if reflector is not None:
            reflector.stop()

    @property
    def running(self) -> bool:
        return self._reflector is not None

    # ---- readers -------------------------------------------------------------------
    def fresh(self, wait: float = 0.0, cancel: threading.Event | None = None) -> bool:
        """Listed (waiting up to `wait` seconds for the first list) and answered lately."""
        reflector = self._reflector
        if reflector is None:
            return False
        waited = 0.0
        while waited < wait and not reflector.synced.wait(0.05):  # short steps: `cancel` is honoured
            if cancel is not None and cancel.is_set():
                return False
            waited += 0.05
        return reflector.fresh(STALE_SECONDS)

    def items(self) -> list[Obj]:
        with self._changed:
            return list(self._items.values())

    def get(self, key: ObjectKey) -> Obj | None:
        with self._changed:
            return self._items.get(key)

    def caught_up(self, resource_version: int, timeout: float) -> bool:
        """Whether the watch delivered `resource_version` (waiting up to `timeout`): a watch sends
        events in resourceVersion order, so every change before that write is in memory too."""
        with self._changed:
            return self._changed.wait_for(lambda: self.seen_version >= resource_version, timeout)

    def wait_change(self, seen: int, timeout: float) -> int:
        """Return the current version once it differs from `seen`, or after `timeout` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != seen, timeout)
            return self.version

    def wait(self, seen: int, timeout: float, cancel: threading.Event) -> bool:
        """Until the set changes after version `seen`, `timeout` seconds pass, or `cancel` is set
        (checked every quarter second: an Event of its own); True when cancelled."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and self.version == seen and not cancel.is_set():
            self.wait_change(seen, min(left, 0.25))
        return cancel.is_set()

    # ---- writers -------------------------------------------------------------------
    def keep(self, obj: Obj | None) -> None:
        """What the caller's own write answered: newer than what the watch has brought so far."""
        if obj is not None and self._reflector is not None:
            self._put(key_of(obj), obj)

    def _seen(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            with self._changed:
                self._items.pop(key_of(obj), None)
                self.version += 1
                self._changed.notify_all()
        else:  # SYNC (after a list), ADDED, MODIFIED
            self._put(key_of(obj), obj)
        if kind != "SYNC":
            with self._changed:
                self.seen_version = max(self.seen_version, resource_version(obj))
                self._changed.notify_all()

    def _relisted(self) -> None:
        reflector = self._reflector
        if reflector is None:
            return
        with self._changed:
            self._items = {k: v for k, v in self._items.items() if k in reflector.items}
            listed = str(reflector.resource_version or "")
            self.seen_version = max(self.seen_version, int(listed) if listed.isdigit() else 0)
            self.version += 1
            self._changed.notify_all()

    def _put(self, key: ObjectKey, obj: Obj) -> None:
        with self._changed:
            old = self._items.get(key)
            if old is None or resource_version(obj) >= resource_version(old):
                self._items[key] = obj
                self.version += 1
                self._changed.notify_all()
