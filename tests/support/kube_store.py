"""The in-memory object store behind the test Kubernetes API emulator.

Kubernetes semantics the product code relies on, without HTTP (see
`tests.support.kube` for the server and why it is not `kmock`): resourceVersions,
label/field selectors, merge and JSON patches with resourceVersion
preconditions, the status subresource, finalizers and a compactable watch
history.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.support.kube_select import ApiError, field_matches, merge_patch, selector_matches

Obj = dict[str, Any]

__all__ = ["DEFAULT_RESOURCES", "ApiError", "ResourceInfo", "Store", "merge_patch", "selector_matches"]


@dataclass(frozen=True)
class ResourceInfo:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False  # has a /status subresource

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_RESOURCES: tuple[ResourceInfo, ...] = (
    ResourceInfo("", "v1", "pods", "Pod", status=True),
    ResourceInfo("", "v1", "secrets", "Secret"),
    ResourceInfo("", "v1", "configmaps", "ConfigMap"),
    ResourceInfo("", "v1", "events", "Event"),
    ResourceInfo("", "v1", "serviceaccounts", "ServiceAccount"),
    ResourceInfo("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status=True),
    ResourceInfo("", "v1", "nodes", "Node", namespaced=False, status=True),
    ResourceInfo("", "v1", "namespaces", "Namespace", namespaced=False, status=True),
    ResourceInfo("events.k8s.io", "v1", "events", "Event"),
    ResourceInfo("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False),
    ResourceInfo("batch", "v1", "jobs", "Job", status=True),
    ResourceInfo("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceInfo("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceInfo("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceInfo("praesto.praesto.io", "v1alpha1", "modelcaches", "ModelCache", status=True),
    ResourceInfo("praesto.praesto.io", "v1alpha1", "modelcachenodes", "ModelCacheNode", status=True),
)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the store -------------------------------------------------------------

Key = tuple[str, str, str, str]  # group, plural, namespace ("" when cluster-scoped), name


@dataclass
class _Event:
    rv: int
    type: str
    info: ResourceInfo
    old: Obj | None
    new: Obj


class Store:
    """Objects, history and the sync API tests use; every write wakes watchers."""

    def __init__(self, resources: tuple[ResourceInfo, ...] = DEFAULT_RESOURCES):
        self._resources: dict[tuple[str, str], ResourceInfo] = {}
        for info in resources:
            self.register(info)
        self._objects: dict[Key, Obj] = {}
        self._history: list[_Event] = []
        self._rv = 0
        self._compacted = 0
        self._cond = threading.Condition(threading.RLock())
        self._stopping = False

    def register(self, info: ResourceInfo) -> None:
        self._resources[(info.group, info.plural)] = info

    def compact(self) -> int:
        """Forget history: a watch from an older resourceVersion gets 410 Gone."""
        with self._cond:
            self._compacted = self._rv
            self._history.clear()
            return self._rv

    def info(self, resource: str) -> ResourceInfo:
        """`plural` (core) or `plural.group`, as kubectl spells it."""
        plural, _, group = resource.partition(".")
        found = self._resources.get((group, plural))
        if found is None:
            raise KeyError(f"unknown resource {resource!r}; register(ResourceInfo(...)) it")
        return found

    def _info_for_kind(self, api_version: str, kind: str) -> ResourceInfo:
        group = api_version.rpartition("/")[0]
        for info in self._resources.values():
            if info.group == group and info.kind == kind:
                return info
        raise KeyError(f"unknown kind {api_version} {kind}")

    @staticmethod
    def _key(info: ResourceInfo, namespace: str | None, name: str) -> Key:
        return (info.group, info.plural, (namespace or "") if info.namespaced else "", name)

    def _bump(self, obj: Obj) -> int:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return self._rv

    def _emit(self, type_: str, info: ResourceInfo, old: Obj | None, new: Obj) -> None:
        self._history.append(_Event(self._rv, type_, info, copy.deepcopy(old), copy.deepcopy(new)))
        self._cond.notify_all()

    def _create(self, info: ResourceInfo, namespace: str | None, body: Obj, keep_status: bool = False) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if info.namespaced:
            if namespace and meta.get("namespace") not in (None, namespace):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the URL")
            namespace = namespace or meta.get("namespace") or "default"
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        key = self._key(info, namespace, meta["name"])
        with self._cond:
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{info.plural} "{meta["name"]}" already exists')
            obj.setdefault("apiVersion", info.api_version)
            obj.setdefault("kind", info.kind)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            meta.pop("deletionTimestamp", None)
            if info.status and not keep_status:
                obj.pop("status", None)  # status is written through /status only
            self._bump(obj)
            self._objects[key] = obj
            self._emit("ADDED", info, None, obj)
            return copy.deepcopy(obj)

    def _get(self, info: ResourceInfo, namespace: str | None, name: str) -> Obj:
        with self._cond:
            obj = self._objects.get(self._key(info, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{info.plural} "{name}" not found')
            return copy.deepcopy(obj)

    def _list(self, info: ResourceInfo, namespace: str | None, labels: str, fields: str) -> Obj:
        with self._cond:
            items = [
                copy.deepcopy(o) for o in self._of(info) if self._matches(info, namespace, labels, fields, o)
            ]
            return {
                "apiVersion": info.api_version,
                "kind": info.kind + "List",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def _of(self, info: ResourceInfo) -> list[Obj]:
        return [o for k, o in self._objects.items() if k[:2] == (info.group, info.plural)]

    @staticmethod
    def _matches(info: ResourceInfo, namespace: str | None, labels: str, fields: str, obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        if namespace and info.namespaced and meta.get("namespace") != namespace:
            return False
        if labels and not selector_matches(labels, meta.get("labels") or {}):
            return False
        return not fields or field_matches(fields, obj)

    def _write(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        subresource: str = "",
    ) -> Obj:
        """Apply `change` to a copy; keep what the addressed (sub)resource may change."""
        key = self._key(info, namespace, name)
        with self._cond:
            old = self._objects.get(key)
            if old is None:
                raise ApiError(404, "NotFound", f'{info.plural} "{name}" not found')
            new = change(copy.deepcopy(old))
            want_rv = (new.get("metadata") or {}).get("resourceVersion")
            if want_rv not in (None, "", old["metadata"]["resourceVersion"]):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {info.plural} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            if subresource == "status":
                result = copy.deepcopy(old)
                if "status" in new:
                    result["status"] = new["status"]
                else:
                    result.pop("status", None)
            else:
                result = new
                if info.status:
                    if "status" in old:
                        result["status"] = old["status"]
                    else:
                        result.pop("status", None)
                # identity and server-owned fields stay
                meta = result.setdefault("metadata", {})
                for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "generation"):
                    if k in old["metadata"]:
                        meta[k] = old["metadata"][k]
                    else:
                        meta.pop(k, None)
                result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
                if _spec_part(result) != _spec_part(old):
                    meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if result == old:
                return copy.deepcopy(old)  # no-op writes keep the resourceVersion, as the API does
            self._bump(result)
            meta = result["metadata"]
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                del self._objects[key]
                self._emit("DELETED", info, old, result)
            else:
                self._objects[key] = result
                self._emit("MODIFIED", info, old, result)
            return copy.deepcopy(result)

    def _delete(self, info: ResourceInfo, namespace: str | None, name: str) -> Obj:
        key = self._key(info, namespace, name)
        with self._cond:
            old = self._objects.get(key)
            if old is None:
                raise ApiError(404, "NotFound", f'{info.plural} "{name}" not found')
            if old["metadata"].get("finalizers"):
                if old["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = _now()
                self._bump(new)
                self._objects[key] = new
                self._emit("MODIFIED", info, old, new)
                return copy.deepcopy(new)
            new = copy.deepcopy(old)
            self._bump(new)
            del self._objects[key]
            self._emit("DELETED", info, old, new)
            return new

    def create(self, obj: Obj, *, with_status: bool = False) -> Obj:
        """Store an object (status kept only with `with_status=True`, as a controller would write it)."""
        info = self._info_for_kind(obj["apiVersion"], obj["kind"])
        return self._create(info, obj.get("metadata", {}).get("namespace"), obj, with_status)

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self._get(self.info(resource), namespace, name)
        except ApiError:
            return None

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "") -> list[Obj]:
        return list(self._list(self.info(resource), namespace, label_selector, "")["items"])

    def patch(
        self, resource: str, name: str, patch: Obj, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        """JSON merge patch; `subresource="status"` writes status only."""
        return self._write(self.info(resource), namespace, name, lambda o: merge_patch(o, patch), subresource)

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        return self._delete(self.info(resource), namespace, name)

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
        """Poll `predicate` until true, woken by every write; raise with `what` on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what or predicate}")
                self._cond.wait(min(left, 0.2))

    def _watch_events(
        self, info: ResourceInfo, namespace: str | None, labels: str, fields: str, since: str
    ) -> Iterator[Obj | None]:
        """Yield watch events; None is a heartbeat letting the caller check its deadline."""
        with self._cond:
            if since in ("", "0"):
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in self._of(info)
                    if self._matches(info, namespace, labels, fields, o)
                ]
            else:
                cursor = int(since)
                initial = (
                    [{"type": "ERROR", "object": gone(cursor, self._compacted)}]
                    if cursor < self._compacted
                    else []
                )
        yield from initial
        if initial and initial[0]["type"] == "ERROR":
            return
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._woken, cursor), timeout=0.2)
                if self._stopping:
                    return
                event = self._history_after(cursor)
                if event is None:
                    if cursor < self._compacted:
                        yield {"type": "ERROR", "object": gone(cursor, self._compacted)}
                        return
                    out = None
                else:
                    cursor = event.rv
                    out = _translate(event, info, namespace, labels, fields, self._matches)
            if out is not None or event is None:
                yield out

    def _woken(self, cursor: int) -> bool:
        return self._stopping or self._history_after(cursor) is not None

    def _history_after(self, cursor: int) -> _Event | None:
        for event in self._history:  # short in tests; a bisect would do for long runs
            if event.rv > cursor:
                return event
        return None


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def gone(cursor: int, compacted: int) -> Obj:
    return ApiError(410, "Expired", f"too old resource version: {cursor} ({compacted})").status()


def _translate(
    event: _Event,
    info: ResourceInfo,
    namespace: str | None,
    labels: str,
    fields: str,
    matches: Callable[[ResourceInfo, str | None, str, str, Obj], bool],
) -> Obj | None:
    """What a watcher with these selectors sees: objects entering/leaving the selection."""
    if event.info != info:
        return None
    was = event.old is not None and matches(info, namespace, labels, fields, event.old)
    now = matches(info, namespace, labels, fields, event.new)
    if event.type == "DELETED":
        return {"type": "DELETED", "object": event.new} if was else None
    if was and now:
        return {"type": event.type, "object": event.new}
    if now:
        return {"type": "ADDED", "object": event.new}
    if was:
        return {"type": "DELETED", "object": event.new}
    return None
