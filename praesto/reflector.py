"""One list-then-watch reflector for every process that follows Kubernetes objects.

The node agent (its ModelCacheNodes), the admission lookups (ModelCaches,
StorageClasses, Nodes) and the orphan releaser (ModelCacheNodes, Nodes) all
follow objects the same way, by these rules, each for a reason:

* List, then watch from the list's resourceVersion: the list is the state, the
  watch the changes after it; watching from "now" would miss what changed in
  between, and a list without a resourceVersion is refused (nothing to watch from).
* Bookmarks are asked for (`allowWatchBookmarks`, where the client has it): a
  quiet resource still moves our resourceVersion on, so a resume seldom lands
  on compacted history, and a bookmark proves the connection alive.
* A watch that ends or drops resumes from the last resourceVersion seen (an
  event's or a bookmark's), without a relist: a server timeout or a cut
  connection loses nothing, and a relist of a big cluster is costly.
* 410 Gone, or "too old resource version" (at connect or as an ERROR event):
  the history is compacted, so relist at once (no backoff: nothing failed).
  After every list, `on_event` sees SYNC for each listed object and DELETED
  (with the last stored object) for each one that vanished meanwhile, then
  `on_relisted()`: no deletion is lost for good.
* Errors (the server away, 5xx, 429, a failed callback) wait one capped
  exponential backoff with jitter (`Backoff`, one constant set), so a thousand
  agents do not reconnect in step; it resets after a list or an event. A watch
  that the server closes at once without an event counts as an error too (a
  proxy closing every watch would otherwise make a busy loop).
* An event counts as seen only once its callback returned: a callback that
  raises gets the event again on the resumed watch (at least once).
* Staleness: a watch that delivered nothing, not even a bookmark, for
  `IDLE_SECONDS` is presumed dead and restarted (the edge's read timeout; API
  servers send a bookmark about every minute). Independently, `unanswered_for()`
  says how long requests have gone unanswered (a hung server counts), so a
  store reader can refuse to decide on old data (`fresh(max_staleness)`).
* Optionally (`relist_every`), a relist every so often without any error, at
  the end of the watch then open: for a caller whose callbacks act on the world
  rather than on the store (the orphan releaser looks at every copy again).
* Stop: set the `stop` Event (or call `stop()`), and `hang_up` closes the open
  connection so the thread returns now, not at its read timeout.

The Kubernetes client stays at the edge: `list_fn()` returns (items,
resourceVersion) and `watch_fn(resourceVersion)` returns, once the server
answered, an iterator of raw watch events ({"type", "object"}); it raises
`Expired` for 410 and `Idle` for a quiet connection. `praesto.listwatch` builds
both over the real `kubernetes` client; tests drive them with local fakes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
ObjectKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
ListFn = Callable[[], tuple[list[Obj], str]]
WatchFn = Callable[[str], Iterable[Obj]]

WATCH_SECONDS = 300  # timeoutSeconds asked of the server for one watch; then it resumes
IDLE_SECONDS = 90  # a watch silent this long (no event, no bookmark) is restarted
CONNECT_SECONDS = 10  # TCP/TLS connect timeout of every list and watch request
BACKOFF_INITIAL = 1.0  # seconds before the first retry after an error
BACKOFF_CAP = 30.0  # the longest wait between retries
QUICK_END_SECONDS = 1.0  # a watch ended this soon without an event counts as an error

log = logging.getLogger("praesto.reflector")


class Expired(Exception):
    """The watch's resourceVersion is no longer served (410 Gone, too old resource version): relist."""


class Idle(Exception):
    """The watch delivered nothing, not even a bookmark, for IDLE_SECONDS: restart it from where it was."""


class WatchError(Exception):
    """The server answered with an error the reflector retries after its backoff."""


@dataclass
class Backoff:
    """Capped exponential delays with jitter: each delay lies in [d/2, d], d = initial * 2**n, <= cap."""

    initial: float = BACKOFF_INITIAL
    cap: float = BACKOFF_CAP
    attempts: int = field(default=0)

    def next(self) -> float:
        delay = min(self.cap, self.initial * 2.0 ** min(self.attempts, 32))
        self.attempts += 1
        return delay * random.uniform(0.5, 1.0)  # noqa: S311  (spreading retries, not a secret)

    def reset(self) -> None:
        self.attempts = 0


def key_of(obj: Obj) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def identity_only(obj: Obj) -> Obj:
    """A store transform keeping only what names the object: enough to report it DELETED if it vanishes."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("namespace", "name", "uid") if k in meta}}


def expired_status(status: Obj) -> bool:
    """Whether an ERROR event's Status (or an error body) means the watch position is compacted."""
    return status.get("code") == 410 or "too old resource version" in str(status.get("message") or "")


class Reflector:
    """List, then watch one resource; keep `items` (key -> transform(object)) and call `on_event`.

    `on_event(type, obj)` sees ADDED/MODIFIED/DELETED from the watch, and after each
    (re)list SYNC for every listed object and DELETED for every stored one that vanished.
    """

    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        watch_fn: WatchFn,
        *,
        on_event: Callable[[str, Obj], None] | None = None,
        on_relisted: Callable[[], None] | None = None,
        transform: Callable[[Obj], Any] | None = None,
        stop: threading.Event | None = None,
        hang_up: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
        relist_every: float | None = None,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.list_fn, self.watch_fn = name, list_fn, watch_fn
        self.on_event, self.on_relisted = on_event, on_relisted
        self.transform = transform or (lambda obj: obj)
        self.stopping = stop or threading.Event()
        self.hang_up = hang_up
        self.backoff = backoff or Backoff()
        self.relist_every = relist_every
        self.log = logger or log
        self.clock = clock
        self.items: dict[ObjectKey, Any] = {}  # replaced whole on a relist: readers may hold the old dict
        self.synced = threading.Event()  # set by the first successful list
        self.resource_version: str | None = None  # None: the next step is a list
        self.relists = 0  # lists made, the first included
        self.last_error = ""
        self._asking_since: float | None = None  # since when requests go unanswered
        self._listed_at = 0.0
        self._thread: threading.Thread | None = None

    # ---- readers ---------------------------------------------------------------

    def unanswered_for(self) -> float:
        """Seconds the reflector has been asking the API server without an answer (0 while answered)."""
        since = self._asking_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def fresh(self, max_staleness: float) -> bool:
        """Listed at least once, and no request unanswered for longer than `max_staleness` seconds."""
        return self.synced.is_set() and self.unanswered_for() <= max_staleness

    # ---- running ---------------------------------------------------------------

    def start(self) -> Reflector:
        """Run on a daemon thread of its own."""
        self._thread = threading.Thread(target=self.run, name=f"praesto-watch-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self.hang_up is not None:
            self.hang_up()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """Until `stop`: list when there is no position to resume from, else watch from it."""
        while not self.stopping.is_set():
            try:
                if self.resource_version is None or self._relist_due():
                    self._relist()
                self._watch(self.resource_version or "")
            except Expired as err:
                self.log.info("%s: watch expired; relisting (%s)", self.name, err, extra={"watch": self.name})
                self.resource_version = None
            except Exception as err:
                if self.stopping.is_set():
                    return  # stop() hung up on purpose
                self.last_error = f"{type(err).__name__}: {str(err)[:300]}"
                delay = self.backoff.next()
                self.log.warning(
                    "%s: watch failed; retrying in %.1fs: %s", self.name, delay, self.last_error,
                    extra={"watch": self.name, "error": self.last_error, "retryIn": delay},
                )  # fmt: skip
                self.stopping.wait(delay)

    def _ask(self, call: Callable[..., Any], *args: Any) -> Any:
        """One request; the time without an answer counts towards staleness."""
        if self._asking_since is None:
            self._asking_since = self.clock()
        result = call(*args)
        self._asking_since, self.last_error = None, ""
        return result

    def _relist_due(self) -> bool:
        return self.relist_every is not None and self.clock() - self._listed_at >= self.relist_every

    def _relist(self) -> None:
        items, version = self._ask(self.list_fn)
        self.relists, self._listed_at = self.relists + 1, self.clock()
        if not version:
            raise WatchError("the list carried no resourceVersion to watch from")
        listed = {key_of(obj): self.transform(obj) for obj in items}
        if self.on_event is not None:
            for key, last in self.items.items():
                if key not in listed:
                    self.on_event("DELETED", last)
            for obj in items:
                self.on_event("SYNC", obj)
        self.items, self.resource_version = listed, str(version)
        self.synced.set()
        self.backoff.reset()
        if self.on_relisted is not None:
            self.on_relisted()

    def _watch(self, version: str) -> None:
        started = self.clock()
        events = self._ask(self.watch_fn, version)
        delivered = False
        try:
            for event in _iterate(events, self.stopping):
                self._apply(event)
                delivered = True
                self.backoff.reset()
        except Idle:
            self.log.debug("%s: watch idle; resuming", self.name, extra={"watch": self.name})
            return
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        if not delivered and not self.stopping.is_set() and self.clock() - started < QUICK_END_SECONDS:
            raise WatchError("the server ended the watch at once, without an event")

    def _apply(self, event: Obj) -> None:
        kind, obj = str(event.get("type")), event.get("object") or {}
        if kind == "ERROR":
            if expired_status(obj):
                raise Expired(str(obj.get("message") or "410 Gone"))
            raise WatchError(f"HTTP {obj.get('code')} {obj.get('reason')}: {str(obj.get('message'))[:200]}")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED"):
            self.items[key_of(obj)] = self.transform(obj)
        elif kind == "DELETED":
            self.items.pop(key_of(obj), None)
        if kind != "BOOKMARK" and self.on_event is not None:
            self.on_event(kind, obj)
        if version:
            self.resource_version = version  # only now: a callback that raised gets the event again


def _iterate(events: Iterable[Obj], stop: threading.Event) -> Iterator[Obj]:
    """The events, ending as soon as `stop` is set (checked before each read and after it)."""
    iterator = iter(events)
    while not stop.is_set():
        try:
            event = next(iterator)
        except StopIteration:
            return
        if stop.is_set():
            return
        yield event
