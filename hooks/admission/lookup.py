"""What admission reads from the cluster, served from watch-fed memory.

Admission must answer in milliseconds and must not hammer the API server, so
nothing is read per request: one background thread per resource lists, then
watches, and keeps a dict current (`praesto.reflector`: resume after errors,
relist on 410 Gone; a lookup refuses while the API goes unanswered). The
pure webhook logic sees only the `Lookups` protocol; tests may pass
`StaticLookups`, the server always uses `WatchedLookups` with the real
`kubernetes` client, through the hooks' door (hooks/kube.py).

Settings (`HooksConfig`, hooks/config.py, built from the environment at the
process edge): `admission_lookups` (`PRAESTO_ADMISSION_LOOKUPS=off`: no API
access, every lookup reports itself unavailable), `lookup_watch_timeout`,
`lookup_max_staleness` and `lookup_cold_wait`.
The client is configured in-cluster, else from `KUBECONFIG` / `~/.kube/config`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from praesto.hooks.config import ENV_ADMISSION_LOOKUPS, HooksConfig
from praesto.hooks.kube import APIError, Door, NotFound, unanswered

from praesto import names
from praesto.listwatch import ListWatch
from praesto.reflector import Reflector

log = logging.getLogger(__name__)

ENV_LOOKUPS = ENV_ADMISSION_LOOKUPS  # the name tests and messages use
_DEFAULTS = HooksConfig()
DIRECT_READ_TIMEOUT = (1.0, 2.0)  # seconds (connect, read) for the one direct read on a miss


class LookupUnavailable(Exception):
    """The cluster state is unknown (cache still cold, or the API unreachable)."""


class Lookups(Protocol):
    def get_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ModelCache object, None when it does not exist; raises LookupUnavailable."""

    def modelcaches_in(self, namespace: str) -> list[dict[str, Any]]:
        """Every ModelCache of `namespace` (for its quota); raises LookupUnavailable."""

    def storageclass_exists(self, name: str) -> bool:
        """Raises LookupUnavailable."""

    def count_nodes_matching(self, selector: Mapping[str, str]) -> int:
        """Nodes whose labels include every selector pair; raises LookupUnavailable."""


@dataclass
class StaticLookups:
    """In-memory lookups for pure-logic tests and `praesto` offline tools."""

    modelcaches: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    storageclasses: set[str] = field(default_factory=set)
    node_labels: list[dict[str, str]] = field(default_factory=list)
    unavailable: str | None = None

    def _check(self) -> None:
        if self.unavailable:
            raise LookupUnavailable(self.unavailable)

    def get_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return self.modelcaches.get((namespace, name))

    def modelcaches_in(self, namespace: str) -> list[dict[str, Any]]:
        self._check()
        return [obj for (ns, _), obj in self.modelcaches.items() if ns == namespace]

    def storageclass_exists(self, name: str) -> bool:
        self._check()
        return name in self.storageclasses

    def count_nodes_matching(self, selector: Mapping[str, str]) -> int:
        self._check()
        return sum(1 for labels in self.node_labels if _matches(labels, selector))


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _check(reflector: Reflector, cold_wait: float, max_staleness: float) -> None:
    """Raise LookupUnavailable unless the data is known and fresh enough to decide on."""
    if not reflector.synced.wait(cold_wait):
        cause = f": {reflector.last_error}" if reflector.last_error else " (initial list not finished)"
        raise LookupUnavailable(f"the {reflector.name} cache is not loaded yet{cause}")
    age = reflector.unanswered_for()
    if age > max_staleness:
        why = reflector.last_error or f"no answer from the API server for {reflector.name} list/watch"
        raise LookupUnavailable(f"the API server has been unreachable for {age:.0f}s: {why}")


def _reflector(name: str, list_call: Any, args: tuple[Any, ...], transform: Any, timeout: int) -> Reflector:
    """`transform` keeps only what lookups need (e.g. a Node's labels), so a big cluster costs little memory."""
    edge = ListWatch(list_call, *args, watch_seconds=timeout)
    return Reflector(name, edge.list, edge.watch, transform=transform, hang_up=edge.hang_up, logger=log)


def _slim_modelcache(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "generation") if k in meta},
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


def _node_labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


class WatchedLookups:
    """`Lookups` fed by list+watch through the real `kubernetes` client."""

    def __init__(
        self,
        api_client: Any = None,
        watch_timeout: int | None = None,
        max_staleness: float | None = None,
        cold_wait: float | None = None,
    ) -> None:
        door = Door(api_client)
        timeout = watch_timeout or _DEFAULTS.lookup_watch_timeout
        staleness = max_staleness if max_staleness is not None else _DEFAULTS.lookup_max_staleness
        self.cold_wait = cold_wait if cold_wait is not None else _DEFAULTS.lookup_cold_wait
        self.max_staleness = staleness
        self.custom = door.custom
        self.modelcaches = _reflector(
            "ModelCache",
            door.list_call(door.custom, "list_cluster_custom_object"),
            (names.GROUP, names.VERSION, names.MODELCACHE_PLURAL),
            _slim_modelcache,
            timeout,
        )
        self.storageclasses = _reflector(
            "StorageClass", door.list_call(door.storage, "list_storage_class"), (), lambda _: True, timeout
        )
        self.nodes = _reflector("Node", door.list_call(door.core, "list_node"), (), _node_labels, timeout)
        self._all = (self.modelcaches, self.storageclasses, self.nodes)

    def start(self) -> WatchedLookups:
        for reflector in self._all:
            reflector.start()
        return self

    def stop(self) -> None:
        for reflector in self._all:
            reflector.stop()

    def get_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        _check(self.modelcaches, self.cold_wait, self.max_staleness)
        found = self.modelcaches.items.get((namespace, name))
        if found is not None:
            return dict(found)
        return self._read_modelcache(namespace, name)

    def _read_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A miss may only mean the watch has not delivered a ModelCache created a moment ago
        (`kubectl apply -f` of a cache and its Pod): ask the API server once, briefly, before
        the webhook refuses the Pod."""
        try:
            obj = self.custom.get_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.MODELCACHE_PLURAL,
                name,
                _request_timeout=DIRECT_READ_TIMEOUT,
            )
        except NotFound:
            return None
        except APIError as error:
            failure = type(error).__name__ if unanswered(error) else f"HTTP {error.status}"
            raise LookupUnavailable(f"reading ModelCache {namespace}/{name} failed: {failure}") from None
        except Exception as error:
            raise LookupUnavailable(
                f"reading ModelCache {namespace}/{name} failed: {type(error).__name__}"
            ) from None
        return _slim_modelcache(obj)

    def modelcaches_in(self, namespace: str) -> list[dict[str, Any]]:
        """From the watch only: a quota decision must not cost an API request per create."""
        _check(self.modelcaches, self.cold_wait, self.max_staleness)
        return [dict(obj) for (ns, _), obj in list(self.modelcaches.items.items()) if ns == namespace]

    def storageclass_exists(self, name: str) -> bool:
        _check(self.storageclasses, self.cold_wait, self.max_staleness)
        return ("", name) in self.storageclasses.items

    def count_nodes_matching(self, selector: Mapping[str, str]) -> int:
        _check(self.nodes, self.cold_wait, self.max_staleness)
        return sum(1 for labels in list(self.nodes.items.values()) if _matches(labels, selector))


class DisabledLookups:
    """Lookups when `PRAESTO_ADMISSION_LOOKUPS=off`: every read reports why it cannot answer."""

    def __init__(self, reason: str = f"API lookups are disabled by {ENV_LOOKUPS}=off") -> None:
        self.reason = reason

    def get_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise LookupUnavailable(self.reason)

    def modelcaches_in(self, namespace: str) -> list[dict[str, Any]]:
        raise LookupUnavailable(self.reason)

    def storageclass_exists(self, name: str) -> bool:
        raise LookupUnavailable(self.reason)

    def count_nodes_matching(self, selector: Mapping[str, str]) -> int:
        raise LookupUnavailable(self.reason)


_shared: tuple[int, Lookups] | None = None
_shared_lock = threading.Lock()


def shared_lookups(settings: HooksConfig | None = None) -> Lookups:
    """One started lookup component per process (re-created after a fork: threads do not survive it).

    `settings`: the process's HooksConfig (the app passes its own); without one, it is built from
    the environment here, as the process edge would."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            settings = settings if settings is not None else HooksConfig.from_env()
            lookups: Lookups
            if not settings.admission_lookups:
                lookups = DisabledLookups()
            else:
                try:
                    lookups = WatchedLookups(
                        watch_timeout=settings.lookup_watch_timeout,
                        max_staleness=settings.lookup_max_staleness,
                        cold_wait=settings.lookup_cold_wait,
                    ).start()
                except Exception as error:  # no in-cluster config and no kubeconfig
                    log.error("praesto lookups: no Kubernetes client configuration: %s", error)
                    lookups = DisabledLookups(f"no Kubernetes client configuration ({error})")
            _shared = (os.getpid(), lookups)
        return _shared[1]
