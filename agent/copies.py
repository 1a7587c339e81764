"""The node agent's words for one copy of a cache on this node, shared by its collaborators.

A copy is one ModelCacheNode: `CacheRef` is what a download needs of it, `CacheState`
what the agent remembers about it between reconciles (memory only), `Outcome` how
one download of it ended. `Copies` owns the two maps the collaborators share (the
objects as last seen, the states) and the one lock over them and every store
mutation. Nothing here talks to the API server or the disk; the reconciler, the
disk room, the removal, the status writer and the job runner all speak these
types, so none of them imports another to learn them (peers and the origin budget
need none of them).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from praesto.agent.download import api as dlapi
from praesto.agent.reservations import StoreKey

from praesto import names, store
from praesto.quantity import parse_duration, parse_quantity
from praesto.spec import Source, source_from_node_spec
from praesto.verification import Verification, verification_from_node_spec

Obj = dict[str, Any]
CopyKey = tuple[str, str]  # (namespace, ModelCacheNode name): one copy


@dataclass(frozen=True)
class CacheRef:
    """The parts of a ModelCacheNode a download needs."""

    namespace: str
    name: str  # the ModelCacheNode
    cache: str  # spec.modelCacheName: the store directory
    source: Source
    size_bytes: int | None  # spec.size
    ttl: float | None  # spec.unusedTTL in seconds
    cache_uid: str = ""  # the owning ModelCache's UID (the controller ownerReference); "" when none
    verification: Verification | None = None  # spec.verification: the signature the model must carry
    switch: bool = True  # spec.switch: serve this revision once held (False: hold it beside, keep serving)
    beside: bool = False  # this download fills the `next` copy beside a served one (a rolling update)
    # what a copy's manifest must record for spec.verification: method and path from the spec; the
    # reconcile adds the fingerprint of the trust held now (credentials.required_signature)
    signature: store.RequiredSignature | None = None

    @property
    def key(self) -> CopyKey:
        return self.namespace, self.name


class Running(Protocol):
    """A download in flight, as the agent holds it: it can be told to stop."""

    @property
    def cancel(self) -> threading.Event: ...


@dataclass
class CacheState:
    """What the agent remembers about one cache between reconciles (memory only)."""

    job: Running | None = None
    attempts: int = 0
    retry_at: float = 0.0
    downloaded: bool = False  # Ready through a download (not a cache hit)
    evicted: bool = False  # set before the directory goes, so no reconcile re-downloads it meanwhile
    peer_bytes: int | None = None  # bytes the last download got from peers, until Ready shows them
    # the last download's status.xet (status.xet_report; {}: none, the field goes), until Ready shows it
    xet_report: dict[str, Any] | None = None
    # (inode, mtime, size, cache UID, trust) of the manifest last found to be this cache's: not read
    # again until one of them changes
    matching_manifest: tuple[int, int, int, str, str] | None = None
    # the served manifest's identity, the revision and the trust it was found to hold (agent/rolling.py)
    served_revision: tuple[int, int, int, str, str, str] | None = None
    # what the last scrub found bad (agent/scrub/scrubber.py), until the repairing download ends
    scrub_findings: list[str] | None = None


@dataclass
class Outcome:
    ref: CacheRef
    result: dlapi.Result | None = None
    error: dlapi.DownloadError | None = None
    waiting: str | None = None  # why the download waits (a Secret, a credential)
    waiting_reason: str = "WaitingForSecret"  # or WaitingForCredentials
    cancelled: bool = False
    evicted: list[StoreKey] = field(default_factory=list)  # (namespace, cache) made room


def progress_record(
    phase: str, done: int, total: int, message: str, now: float, eta: int | None = None
) -> store.Progress:
    """The progress file the CSI driver reads for a copy (`store.write_progress`)."""
    return store.Progress(
        phase=phase, bytes_done=done, bytes_total=total, message=message, updated_at=now, eta_seconds=eta
    )


def ref_of(obj: Obj) -> CacheRef:
    """What a download needs of a ModelCacheNode; raises (InvalidSpec, ValueError, QuantityError,
    TypeError, KeyError) naming the field when its spec cannot be used."""
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    cache = spec.get("modelCacheName") or ""
    if not (names.is_dns_label(cache) and names.is_dns_label(ns)):
        raise ValueError(f"spec.modelCacheName: {cache!r} is not a DNS label; the sync hook writes it")
    source = source_from_node_spec(spec.get("source") or {})
    size = parse_quantity(spec["size"]) if spec.get("size") else None
    ttl = parse_duration(spec["unusedTTL"]) if spec.get("unusedTTL") else None
    verification = verification_from_node_spec(spec.get("verification"))
    switch = spec.get("switch", True)
    if not isinstance(switch, bool):
        raise ValueError(f"spec.switch: {switch!r} is not a boolean; the sync hook writes it")
    signature = store.RequiredSignature(verification.method, verification.path) if verification else None
    return CacheRef(
        ns, name, cache, source, size, ttl, owner_uid(obj), verification, switch, signature=signature
    )


def owner_uid(obj: Obj) -> str:
    """The UID of the ModelCache that owns this ModelCacheNode (Metacontroller's controller reference)."""
    for owner in obj["metadata"].get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == names.MODELCACHE_KIND:
            return str(owner.get("uid") or "")
    return ""


def cache_of(obj: Obj) -> str:
    """spec.modelCacheName: the store directory of a copy ("" when missing)."""
    return str((obj.get("spec") or {}).get("modelCacheName", ""))


def deleting(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def resource_version(obj: Obj) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class Copies:
    """This node's ModelCacheNodes as last seen (the watch and the agent's own writes) and what
    the agent remembers of each; `lock` guards both maps and every store mutation."""

    def __init__(self) -> None:
        self.objects: dict[CopyKey, Obj] = {}
        self.states: dict[CopyKey, CacheState] = {}
        self.lock = threading.RLock()

    def get(self, key: CopyKey) -> Obj | None:
        with self.lock:
            return self.objects.get(key)

    def state(self, key: CopyKey) -> CacheState:
        with self.lock:
            return self.states.setdefault(key, CacheState())

    def keep(self, obj: Obj | None) -> None:
        """A newer version of a known object (an API answer); never brings back a forgotten one."""
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self.lock:
            old = self.objects.get(key)
            if old is not None and resource_version(obj) >= resource_version(old):
                self.objects[key] = obj

    def seen(self, key: CopyKey, obj: Obj) -> None:
        """The watch brought `obj`: kept unless an answer to the agent's own write is newer."""
        with self.lock:
            old = self.objects.get(key)
            if old is None or resource_version(obj) >= resource_version(old):
                self.objects[key] = obj

    def keys_of(self, namespace: str, cache: str) -> list[CopyKey]:
        """The copies (one per ModelCacheNode) whose store directory is `namespace`/`cache`."""
        with self.lock:
            return [k for k, o in self.objects.items() if k[0] == namespace and cache_of(o) == cache]

    def running(self, key: CopyKey) -> Running | None:
        with self.lock:
            state = self.states.get(key)
            return None if state is None else state.job

    def busy(self) -> int:
        """Downloads running on this node."""
        with self.lock:
            return sum(1 for s in self.states.values() if s.job is not None)
