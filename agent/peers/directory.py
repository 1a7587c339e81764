"""Every node's ModelCacheNodes of one cache, watched while this node downloads that cache.

Peering (peering.py) reads them to find the leader and, while a download runs, new
holders every `Tuning.discover_seconds`; the peer server (identity.py) reads them to
check that an asking node holds a copy. One watch per cache being downloaded here
(label `praesto.io/model-cache`, the cache's namespace: what the agent's Role already
lets it list and watch), opened by the first download of it and closed by the last
(`acquire`/`release`), so an idle agent holds none: its only watch is its own
ModelCacheNodes (node_agent.py).
"""

from __future__ import annotations

import logging
import threading

from praesto import names
from praesto.kubeerrors import Groups
from praesto.listwatch import ListWatch
from praesto.reflector import WATCH_SECONDS, Backoff
from praesto.watched import WatchedSet

CacheKey = tuple[str, str]  # (namespace, cache)


class PeerDirectory:
    def __init__(
        self, api: Groups, node_name: str, *, watch_seconds: int = WATCH_SECONDS,
        backoff: Backoff | None = None,
    ) -> None:  # fmt: skip
        self.custom = api.custom  # calls raise praesto.kubeerrors' errors
        self.node_name, self.watch_seconds, self.backoff = node_name, watch_seconds, backoff
        self._lock = threading.Lock()
        self._watched: dict[CacheKey, tuple[WatchedSet, int]] = {}  # -> (its copies, downloads using it)

    def acquire(self, namespace: str, cache: str) -> WatchedSet:
        """The cache's copies, watched from now until the matching `release`."""
        key = (namespace, cache)
        with self._lock:
            copies, users = self._watched.get(key) or (self._new(namespace, cache), 0)
            self._watched[key] = (copies, users + 1)
        return copies.start()

    def release(self, namespace: str, cache: str) -> None:
        key = (namespace, cache)
        with self._lock:
            copies, users = self._watched.get(key) or (None, 0)
            if copies is None:
                return
            if users > 1:
                self._watched[key] = (copies, users - 1)
                return
            del self._watched[key]
        copies.stop()

    def watched(self, namespace: str, cache: str) -> WatchedSet | None:
        """The cache's copies if a download here watches them now (the peer server's shortcut)."""
        with self._lock:
            found = self._watched.get((namespace, cache))
        return found[0] if found is not None else None

    def stop(self) -> None:
        with self._lock:
            watched, self._watched = self._watched, {}
        for copies, _ in watched.values():
            copies.stop()

    def list_now(self, namespace: str, cache: str) -> list[dict[str, object]]:
        """One direct list of the cache's copies: only when the watch cannot be trusted (`fresh`)."""
        listed = self.custom.list_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.MODELCACHENODE_PLURAL,
            label_selector=_selector(cache),
        )  # fmt: skip
        return list(listed.get("items") or [])

    def _new(self, namespace: str, cache: str) -> WatchedSet:
        listwatch = ListWatch(
            self.custom.unmapped.list_namespaced_custom_object, names.GROUP, names.VERSION, namespace,
            names.MODELCACHENODE_PLURAL, label_selector=_selector(cache), watch_seconds=self.watch_seconds,
        )  # fmt: skip
        logger = logging.getLogger("praesto.peers")  # peering.py's
        name = f"copies of {namespace}/{cache}"
        return WatchedSet(name, listwatch, key=(namespace, cache), backoff=self.backoff, logger=logger)


def _selector(cache: str) -> str:
    return f"{names.LABEL_MODEL_CACHE}={cache}"
