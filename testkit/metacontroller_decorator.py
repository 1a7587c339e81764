"""Metacontroller 4.17.2's DecoratorController (`pkg/controller/decorator/controller.go`), without attachments.

Parents are the objects of `spec.resources` (Nodes for us), queued on add,
delete, and updates that `ignoreStatusChanges` lets through (the same filter as
the CompositeController's, with a resync passing), on related-object events,
`resyncAfterSeconds` and `resyncPeriodSeconds`. A pass calls the sync hook with
{controller, object, attachments, related, finalizing}, merges the answer's
labels and annotations into the cached object (null deletes a key) and writes
it with one Update at the cached resourceVersion: a conflict is dropped, since
the newer version's event queues the object again.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from testkit.kube_apply import Kube
from testkit.metacontroller_base import (
    Controller,
    HookClient,
    InformerFactory,
    Obj,
    Pass,
    atomic_update,
    describe,
    meta,
    selector_matches,
    status_only,
)
from testkit.metacontroller_customize import CustomizeManager

DECORATOR_RESPONSE_KEYS = frozenset(
    {"labels", "annotations", "status", "attachments", "resyncAfterSeconds", "finalized"}
)


def decorator_key(api_version: str, kind: str, namespace: str, name: str) -> str:
    """`parentQueueKey`: `apiVersion:kind:namespace:name`."""
    return f"{api_version}:{kind}:{namespace}:{name}"


def merge_strings(current: dict[str, str], updates: dict[str, Any]) -> bool:
    """`updateStringMap`: set each key, delete those given null; True when something changed."""
    changed = False
    for key, value in updates.items():
        if value is None:
            changed |= current.pop(key, None) is not None
        elif current.get(key) != value:
            current[key] = value
            changed = True
    return changed


class DecoratorController(Controller):
    name = "decorator"

    def __init__(self, kube: Kube, hooks: HookClient, controller: Obj, workers: int = 1) -> None:
        super().__init__(kube, hooks, controller, workers)
        if self.spec.get("attachments"):
            raise NotImplementedError("the test driver decorates without attachments, as the chart does")
        self.finalizer = f"metacontroller.io/decoratorcontroller-{controller['metadata']['name']}"
        self.has_finalize = "finalize" in self.spec["hooks"]
        for rule in self.spec["resources"]:
            if rule.get("annotationSelector"):
                raise NotImplementedError("annotationSelector is not modelled by the test driver")

    def start(self, factory: InformerFactory) -> None:
        self.factory = factory
        self.informers = {}
        for rule in self.spec["resources"]:
            informer = factory.informer(rule["apiVersion"], rule["resource"])
            self.informers[(rule["apiVersion"], informer.kind)] = (informer, rule)
        self.customize = CustomizeManager(
            factory, self.hooks, self.controller, self._all_parents, self.enqueue_parent, self.saw
        )
        resync = factory.handler_resync(self.spec.get("resyncPeriodSeconds"))
        for informer, rule in self.informers.values():
            informer.add_handler(_Events(self, rule), resync)
        factory.wait_synced()
        self.start_workers()

    def stop(self) -> None:
        self.stop_workers()

    def _all_parents(self) -> list[Obj]:
        return [o for informer, _ in self.informers.values() for o in informer.objects()]

    def _rule(self, obj: Obj) -> Obj | None:
        found = self.informers.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        return found[1] if found else None

    def matches(self, obj: Obj) -> bool:
        rule = self._rule(obj)
        return rule is not None and selector_matches(rule.get("labelSelector"), meta(obj).get("labels"))

    def enqueue_parent(self, obj: Obj, reason: str) -> str | None:
        if not self.matches(obj) and self.finalizer not in (meta(obj).get("finalizers") or []):
            return None
        key = decorator_key(
            obj["apiVersion"], obj["kind"], meta(obj).get("namespace") or "", meta(obj)["name"]
        )
        self.enqueue(key, reason)
        return key

    def sync(self, key: str, record: Pass) -> None:
        api_version, kind, namespace, name = key.split(":", 3)
        informer, _ = self.informers[(api_version, kind)]
        parent = informer.get(namespace or None, name)
        if parent is None or not (
            self.matches(parent) or self.finalizer in (meta(parent).get("finalizers") or [])
        ):
            return
        resource = self.kube.resource(api_version, kind)
        if not self.has_finalize and self.finalizer in (meta(parent).get("finalizers") or []):

            def drop(live: Obj) -> bool:
                meta(live)["finalizers"] = [
                    f for f in meta(live).get("finalizers") or [] if f != self.finalizer
                ]
                return True

            parent = atomic_update(resource, parent, drop) or parent
        related = self.customize.related(parent)
        finalizing = self.has_finalize and (
            bool(meta(parent).get("deletionTimestamp")) or not self.matches(parent)
        )
        record.hook = "finalize" if finalizing else "sync"
        body = {
            "controller": self.controller,
            "object": parent,
            "attachments": {},
            "related": related,
            "finalizing": finalizing,
        }
        answer = self.hooks.call(self.spec["hooks"][record.hook]["webhook"], body, DECORATOR_RESPONSE_KEYS)
        record.response = answer
        resync = answer.get("resyncAfterSeconds") or 0
        if resync > 0:
            self.queue.add_after(key, float(resync), f"resyncAfterSeconds {resync}")
        self._write(resource, parent, answer, record)

    def _write(self, resource: Any, parent: Obj, answer: Obj, record: Pass) -> None:
        updated = copy.deepcopy(parent)
        m = meta(updated)
        labels, annotations = dict(m.get("labels") or {}), dict(m.get("annotations") or {})
        status = answer["status"] if answer.get("status") is not None else parent.get("status")
        changed = merge_strings(labels, answer.get("labels") or {})
        changed |= merge_strings(annotations, answer.get("annotations") or {})
        status_changed = status != parent.get("status")
        finalized = bool(answer.get("finalized")) and self.finalizer in (m.get("finalizers") or [])
        if not (changed or status_changed or finalized):
            return
        m["labels"], m["annotations"], updated["status"] = labels, annotations, status
        namespace = m.get("namespace") or None
        try:
            if status_changed and "status" in resource.subresources:
                written = resource.subresources["status"].replace(body=updated, namespace=namespace).to_dict()
                m["resourceVersion"] = meta(written)["resourceVersion"]
                record.writes.append(f"update-status {parent['kind']} {m['name']}")
            if finalized:
                m["finalizers"] = [f for f in m.get("finalizers") or [] if f != self.finalizer]
            resource.replace(body=updated, namespace=namespace)
        except (ConflictError, NotFoundError):
            return  # written from a stale cache, or gone: the newer version's event queues it again
        record.writes.append(f"update {parent['kind']} {m['name']}")


class _Events:
    """`enqueueParentObject` / `updateParentObject` for one of `spec.resources`."""

    def __init__(self, controller: DecoratorController, rule: Obj) -> None:
        self.controller, self.rule = controller, rule

    def _queue(self, reason: str, obj: Obj) -> None:
        key = self.controller.enqueue_parent(obj, reason)
        self.controller.saw(reason, [key] if key else [])

    def on_add(self, obj: Obj) -> None:
        self._queue(describe("add", obj), obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if old is new:
            self._queue(describe("resync", new), new)
        elif self.rule.get("ignoreStatusChanges") and status_only(old, new):
            self.controller.saw(describe("update", new), [])
        else:
            self._queue(describe("update", new), new)

    def on_delete(self, obj: Obj) -> None:
        self._queue(describe("delete", obj), obj)
