"""Trust material a cache names in its own namespace (spec.verification's secretRef or configMapRef),
as it is now (issue 37 item 4).

A copy verified under a key stands for its cache only while the object spec.verification names
still holds that key: the tenant replacing a withdrawn key in the same Secret or ConfigMap (same
name, new content) changes no spec, so nothing else tells the agent. How it learns, shared by every
copy of this node that names the object, begun when a copy first names it and ended when none does:

* A ConfigMap: one list and watch of that one object (fieldSelector metadata.name, which the
  per-cache Role's resourceNames allows: hooks/local.py trust_watch_grant). That is the kubelet's own
  way of following what its Pods mount (the default configMapAndSecretChangeDetectionStrategy Watch,
  pkg/kubelet/util/manager/watch_based_manager.go): an idle watch costs the API server nothing, and a
  replaced key is noticed at once.
* A Secret: a GET of it when a copy first names it, then every TRUST_SECRET_RECHECK_SECONDS
  (`SecretRecheck`). Listing or watching a Secret, even by fieldSelector, needs list and watch on
  secrets, and RBAC's escalation check would make Metacontroller (which creates the per-cache Role)
  hold them on every Secret of the cluster: no identity may list Secrets (docs/security.md), so the
  Role grants `get` on that one Secret only and a replaced key is noticed within one period (sooner
  while the Secret is missing or unreadable: the watch backoff).

Each change wakes the reconciler, which compares every copy with the fingerprint of the material now
(store.signature_mismatch) on its next pass; at start the first list or GET gives it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from praesto.agent.kube import KubeApi

from praesto.reflector import Backoff, Reflector
from praesto.verification import Verification

# How often a trust Secret is read again (`SecretRecheck`): a key replaced in a Secret is noticed
# within this long (in a ConfigMap at once, by its watch), a bounded delay. The cost is one GET per
# node and trust Secret its copies name, per period: nodes x signed caches / 300 GETs a second, e.g.
# 1,000 nodes x 10 caches = 33/s; a shorter period costs the API server proportionally more.
TRUST_SECRET_RECHECK_SECONDS = 300.0


@dataclass(frozen=True)
class TrustObject:
    kind: str  # "Secret" or "ConfigMap"
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Unreadable:
    """The named material is gone or cannot be read: no copy verified under it stands."""

    why: str  # e.g. "deleted", "has no key key.pub"


# What `NamespaceTrust.material` answers: the PEM now, Unreadable, or None: not known yet (the first
# list has not answered, or the server is away), so only method and path are compared meanwhile.
Material = bytes | Unreadable | None


def trust_object(namespace: str, wanted: Verification | None) -> tuple[TrustObject, str] | None:
    """The object (and key) holding `wanted`'s material in the cache's namespace; None when the
    material is not there (the platform's trust, sigstore, no verification)."""
    if wanted is None or wanted.cluster_trust:
        return None
    if wanted.secret_ref is not None:
        return TrustObject("Secret", namespace, wanted.secret_ref.name), str(wanted.secret_ref.key)
    if wanted.config_map_ref is not None:
        return TrustObject("ConfigMap", namespace, wanted.config_map_ref.name), str(wanted.config_map_ref.key)
    return None


def material_value(kind: str, data: dict[str, str], key: str) -> bytes | None:
    """One key's bytes as the download reads them (agent/kube.py read_secret_value,
    read_config_map_value), so both give the same fingerprint."""
    if key not in data:
        return None
    if kind == "ConfigMap":
        return str(data[key]).encode()
    try:
        return base64.b64decode(data[key])
    except (binascii.Error, ValueError):
        return None


class Follower(Protocol):
    """What `NamespaceTrust.material` reads of a Reflector (a ConfigMap) or a `SecretRecheck`."""

    synced: threading.Event  # set once the object was read (or found gone)
    items: dict[tuple[str, str], Any]  # (namespace, name) -> the object, while it exists
    last_error: str  # the last read's error ("(403)" in it: the grant is gone), "" after a success

    def stop(self, timeout: float = 5.0) -> None: ...


class SecretRecheck:
    """One trust Secret read by GET now and every `period` seconds, waking `wake` only when what
    `material` derives from it changes (content, gone, forbidden). While it is missing or a read
    fails it is read again sooner, on `backoff` (capped at `period`): a copy waiting for its key
    (WaitingForSecret), or for the grant the sync hook is about to make, goes on once it is there,
    not a period later; the download, which reads the key itself, would otherwise publish a copy
    this still holds for "deleted", to be taken out again."""

    def __init__(
        self,
        obj: TrustObject,
        read: Callable[[], dict[str, str] | None],
        wake: Callable[[], None],
        period: float,
        backoff: Backoff,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.obj, self.read, self.wake, self.period = obj, read, wake, period
        self.backoff, self.log = backoff, logger
        self.synced = threading.Event()
        self.items: dict[tuple[str, str], Any] = {}  # replaced whole on each read: readers may hold the old
        self.last_error = ""
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SecretRecheck:
        self._thread = threading.Thread(target=self.run, name=f"praesto-trust-{self.obj.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        while not self.stopping.is_set():
            self.stopping.wait(self.step())

    def step(self) -> float:
        """One GET, waking the reconciler if what it holds changed; returns the seconds until the next."""
        before = self._view()
        delay = self._check()
        if self._view() != before:
            self.wake()
        return delay

    def _check(self) -> float:
        try:
            data = self.read()
        except Exception as err:
            self.last_error = f"{type(err).__name__}: {str(err)[:300]}"  # as the Reflector words it
            delay = min(self.period, self.backoff.next())
            self.log.warning(
                "trust %s: read failed; retrying in %.1fs: %s", self.obj, delay, self.last_error,
                extra={"object": str(self.obj), "error": self.last_error, "retryIn": delay},
            )  # fmt: skip
            return delay
        key = (self.obj.namespace, self.obj.name)
        self.items = {} if data is None else {key: {"data": data}}
        self.last_error = ""
        self.synced.set()
        if data is None:
            return min(self.period, self.backoff.next())
        self.backoff.reset()
        return self.period

    def _view(self) -> tuple[bool, bool, dict[tuple[str, str], Any]]:
        return "(403)" in self.last_error, self.synced.is_set(), self.items


class NamespaceTrust:
    """One follower per named trust object of this node's copies; `material` reads what it holds."""

    def __init__(
        self,
        kube: KubeApi,
        wake: Callable[[], None],
        backoff: Backoff,
        logger: logging.LoggerAdapter[logging.Logger],
        secret_recheck_seconds: float = TRUST_SECRET_RECHECK_SECONDS,
    ) -> None:
        self.kube, self.wake, self.backoff, self.log = kube, wake, backoff, logger
        self.secret_recheck_seconds = secret_recheck_seconds
        self._watches: dict[TrustObject, Follower] = {}

    def material(self, namespace: str, wanted: Verification | None) -> Material:
        """The PEM `wanted` names in `namespace` as its follower holds it now (called on the reconcile thread)."""
        found = trust_object(namespace, wanted)
        if found is None:
            return None
        obj, key = found
        follower = self._watch(obj)
        if "(403)" in follower.last_error:  # the grant is gone (or never came): nothing verifies
            return Unreadable("which the node agent may not read (HTTP 403)")
        if not follower.synced.is_set():
            return None
        current = follower.items.get((obj.namespace, obj.name))
        if current is None:
            return Unreadable("deleted")
        value = material_value(obj.kind, dict(current.get("data") or {}), key)
        return Unreadable(f"which has no key {key}") if value is None else value

    def _watch(self, obj: TrustObject) -> Follower:
        follower = self._watches.get(obj)
        if follower is not None:
            return follower
        backoff = Backoff(self.backoff.initial, self.backoff.cap)
        if obj.kind == "Secret":
            read = functools.partial(self.kube.trust_secret_data, obj.namespace, obj.name)
            follower = SecretRecheck(
                obj, read, self.wake, self.secret_recheck_seconds, backoff, self.log
            ).start()
        else:
            edge = self.kube.trust_config_map_watch(obj.namespace, obj.name)
            follower = Reflector(
                f"trust {obj}", edge.list, edge.watch, hang_up=edge.hang_up,
                on_event=lambda _type, _obj: self.wake(), on_relisted=self.wake,
                backoff=backoff, logger=self.log,
            ).start()  # fmt: skip
        self._watches[obj] = follower
        self.log.info("following trust material", extra={"object": str(obj)})
        return follower

    def retain(self, named: Iterable[TrustObject]) -> None:
        """End the following of objects no copy of this node names any more."""
        keep = set(named)
        for obj in [o for o in self._watches if o not in keep]:
            self._watches.pop(obj).stop(timeout=0)

    def stop(self) -> None:
        self.retain(())

    @property
    def watched(self) -> list[TrustObject]:
        return sorted(self._watches, key=str)
