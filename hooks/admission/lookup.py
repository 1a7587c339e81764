"""What admission reads from the cluster, served from watch-fed memory.

Admission must answer in milliseconds and must not hammer the API server, so
nothing is read per request: one background thread per resource lists, then
watches, and keeps a dict current (relisting on 410 Gone or any error). The
pure webhook logic sees only the `Lookups` protocol; tests may pass
`StaticLookups`, the server always uses `WatchedLookups` with the real
`kubernetes` client.

Env:
* `PRAESTO_ADMISSION_LOOKUPS=off`: no API access (local development; every
  lookup then reports itself unavailable);
* `PRAESTO_LOOKUP_WATCH_TIMEOUT`: seconds a watch stays open (default 300);
* `PRAESTO_LOOKUP_MAX_STALENESS`: seconds the API may go unanswered before
  lookups refuse (default 60);
* `PRAESTO_LOOKUP_COLD_WAIT`: seconds a request waits for a freshly started
  worker's first list (default 2).
The client is configured in-cluster, else from `KUBECONFIG` / `~/.kube/config`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from praesto import names

log = logging.getLogger(__name__)

ENV_LOOKUPS = "PRAESTO_ADMISSION_LOOKUPS"
ENV_WATCH_TIMEOUT = "PRAESTO_LOOKUP_WATCH_TIMEOUT"
ENV_MAX_STALENESS = "PRAESTO_LOOKUP_MAX_STALENESS"
ENV_COLD_WAIT = "PRAESTO_LOOKUP_COLD_WAIT"
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


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class _Reflector:
    """List, then watch one resource into `self.items`; relist on 410 Gone or errors.

    `transform` keeps only what lookups need (e.g. a Node's labels), so a big
    cluster costs little memory.
    """

    def __init__(
        self,
        kind: str,
        list_func: Callable[..., Any],
        args: tuple[Any, ...],
        transform: Callable[[dict[str, Any]], Any],
        watch_timeout: int,
        max_staleness: float,
    ) -> None:
        self.kind = kind
        self.list_func = list_func
        self.args = args
        self.transform = transform
        self.watch_timeout = watch_timeout
        self.max_staleness = max_staleness
        self.items: dict[tuple[str, str], Any] = {}
        self.synced = threading.Event()
        self.failing_since: float | None = None
        self.last_error = ""
        self._stop = threading.Event()
        self._watch: Any = None
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"praesto-lookup-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._hang_up()
        self._thread.join(timeout)

    def _hang_up(self) -> None:
        """Shut the open watch socket down so the reader returns now, not at its read timeout."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def check(self, cold_wait: float) -> None:
        """Raise LookupUnavailable unless the data is known and fresh enough to decide on."""
        if not self.synced.wait(cold_wait):
            cause = f": {self.last_error}" if self.last_error else " (initial list not finished)"
            raise LookupUnavailable(f"the {self.kind} cache is not loaded yet{cause}")
        since = self.failing_since
        if since is not None and time.monotonic() - since > self.max_staleness:
            raise LookupUnavailable(
                f"the API server has been unreachable for {time.monotonic() - since:.0f}s: {self.last_error}"
            )

    def _contact(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API request; the time without an answer counts towards staleness (a hung server too)."""
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            self.last_error = f"no answer from the API server for {self.kind} list/watch"
        result = func(*args, **kwargs)
        self.failing_since, self.last_error = None, ""
        return result

    def _fail(self, error: BaseException) -> None:
        self.last_error = f"{type(error).__name__}: {str(error)[:300]}"
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        log.warning("praesto lookup %s: %s; relisting", self.kind, self.last_error)

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.2
                self._watch_from(version)
            except ApiException as error:
                if self._stop.is_set():
                    return
                if error.status == 410:  # history compacted: an ordinary relist, no backoff
                    log.info("praesto lookup %s: watch expired (410 Gone); relisting", self.kind)
                    continue
                self._fail(error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as error:  # network, decoding, anything: relist after a capped backoff
                if self._stop.is_set():
                    return
                self._fail(error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _list(self) -> str:
        response = self._contact(self.list_func, *self.args, _preload_content=False, _request_timeout=(5, 30))
        body = json.loads(response.data)
        self.items = {_key(obj): self.transform(obj) for obj in body.get("items") or []}
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch_from(self, version: str) -> None:
        @functools.wraps(self.list_func)
        def connect(*args: Any, **kwargs: Any) -> Any:
            self._response = self._contact(self.list_func, *args, **kwargs)
            if self._stop.is_set():
                self._hang_up()
            return self._response

        while not self._stop.is_set():
            self._watch = watch.Watch()
            kwargs: dict[str, Any] = {
                "timeout_seconds": self.watch_timeout,
                "allow_watch_bookmarks": True,
                "deserialize": False,
                # A server may hold a watch past timeoutSeconds; the read timeout ends it.
                "_request_timeout": (5, self.watch_timeout + 10),
            }
            if version:
                kwargs["resource_version"] = version
            try:
                for event in self._watch.stream(connect, *self.args, **kwargs):
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind in ("ADDED", "MODIFIED"):
                        self.items[_key(obj)] = self.transform(obj)
                    elif kind == "DELETED":
                        self.items.pop(_key(obj), None)
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            except ReadTimeoutError:
                pass  # a quiet watch the server held open: resume from the last version
            if not version:
                return  # no resourceVersion to resume from: relist rather than miss events


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
        api = api_client or default_api_client()
        timeout = watch_timeout or int(os.environ.get(ENV_WATCH_TIMEOUT, "300"))
        staleness = (
            max_staleness if max_staleness is not None else float(os.environ.get(ENV_MAX_STALENESS, "60"))
        )
        self.cold_wait = cold_wait if cold_wait is not None else float(os.environ.get(ENV_COLD_WAIT, "2"))
        custom = client.CustomObjectsApi(api)
        self.custom = custom
        self.modelcaches = _Reflector(
            "ModelCache",
            custom.list_cluster_custom_object,
            (names.GROUP, names.VERSION, names.MODELCACHE_PLURAL),
            _slim_modelcache,
            timeout,
            staleness,
        )
        self.storageclasses = _Reflector(
            "StorageClass",
            client.StorageV1Api(api).list_storage_class,
            (),
            lambda _: True,
            timeout,
            staleness,
        )
        self.nodes = _Reflector("Node", client.CoreV1Api(api).list_node, (), _node_labels, timeout, staleness)
        self._all = (self.modelcaches, self.storageclasses, self.nodes)

    def start(self) -> WatchedLookups:
        for reflector in self._all:
            reflector.start()
        return self

    def stop(self) -> None:
        for reflector in self._all:
            reflector.stop()

    def get_modelcache(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.modelcaches.check(self.cold_wait)
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
        except ApiException as error:
            if error.status == 404:
                return None
            raise LookupUnavailable(
                f"reading ModelCache {namespace}/{name} failed: HTTP {error.status}"
            ) from None
        except Exception as error:
            raise LookupUnavailable(
                f"reading ModelCache {namespace}/{name} failed: {type(error).__name__}"
            ) from None
        return _slim_modelcache(obj)

    def modelcaches_in(self, namespace: str) -> list[dict[str, Any]]:
        """From the watch only: a quota decision must not cost an API request per create."""
        self.modelcaches.check(self.cold_wait)
        return [dict(obj) for (ns, _), obj in list(self.modelcaches.items.items()) if ns == namespace]

    def storageclass_exists(self, name: str) -> bool:
        self.storageclasses.check(self.cold_wait)
        return ("", name) in self.storageclasses.items

    def count_nodes_matching(self, selector: Mapping[str, str]) -> int:
        self.nodes.check(self.cold_wait)
        return sum(1 for labels in list(self.nodes.items.values()) if _matches(labels, selector))


def default_api_client() -> Any:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


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


def shared_lookups() -> Lookups:
    """One started lookup component per process (re-created after a fork: threads do not survive it)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            lookups: Lookups
            if os.environ.get(ENV_LOOKUPS, "").lower() in ("off", "false", "0", "disabled"):
                lookups = DisabledLookups()
            else:
                try:
                    lookups = WatchedLookups().start()
                except Exception as error:  # no in-cluster config and no kubeconfig
                    log.error("praesto lookups: no Kubernetes client configuration: %s", error)
                    lookups = DisabledLookups(f"no Kubernetes client configuration ({error})")
            _shared = (os.getpid(), lookups)
        return _shared[1]
