"""Metacontroller 4.17.2's DecoratorController (`pkg/controller/decorator/controller.go`).

Parents are the objects of `spec.resources` (Nodes for us), queued on add,
delete, and updates that `ignoreStatusChanges` lets through (the same filter as
the CompositeController's, with a resync passing), on related-object events,
events of their attachments (`onChildAdd/Update/Delete`: the controller ref
resolved to a parent of ours, same uid; an update keeping the resourceVersion
ignored), `resyncAfterSeconds` and `resyncPeriodSeconds`. A pass calls the sync
hook with {controller, object, attachments, related, finalizing}, where
attachments are those of `spec.attachments` whose controller ref is the parent
and which carry the `metacontroller.k8s.io/decorator-controller` annotation
naming this controller (`getChildren`); merges the answer's labels and
annotations into the cached object (null deletes a key) and writes it with one
Update at the cached resourceVersion: a conflict or NotFound ends the pass,
since the newer version's event queues the object again. Then, as
`common.ManageChildren`, the desired attachments (annotated) are created or
updated per their `updateStrategy` and the undesired deleted.
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
    controller_ref,
    describe,
    meta,
    object_key,
    selector_matches,
    status_only,
)
from testkit.metacontroller_children import ChildWriter
from testkit.metacontroller_customize import CustomizeManager

DECORATOR_RESPONSE_KEYS = frozenset(
    {"labels", "annotations", "status", "attachments", "resyncAfterSeconds", "finalized"}
)
DECORATOR_ANNOTATION = "metacontroller.k8s.io/decorator-controller"


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
        self.attachment_types = [(a["apiVersion"], a["resource"]) for a in self.spec.get("attachments") or []]
        self.writer = ChildWriter(
            kube,
            {
                (a["apiVersion"].rpartition("/")[0], a["resource"]): (a.get("updateStrategy") or {}).get(
                    "method", "OnDelete"
                )
                for a in self.spec.get("attachments") or []
            },
        )
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
        self.attachment_informers = {t: factory.informer(*t) for t in self.attachment_types}
        for attachments in self.attachment_informers.values():
            attachments.add_handler(_AttachmentEvents(self))
        factory.wait_synced()
        self.start_workers()

    def stop(self) -> None:
        self.stop_workers()

    def _all_parents(self) -> list[Obj]:
        return [o for informer, _ in self.informers.values() for o in informer.view()]  # read only

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
        observed = self._attachments(parent)
        body = {
            "controller": self.controller,
            "object": parent,
            "attachments": observed,
            "related": related,
            "finalizing": finalizing,
        }
        answer = self.hooks.call(self.spec["hooks"][record.hook]["webhook"], body, DECORATOR_RESPONSE_KEYS)
        record.response = answer
        resync = answer.get("resyncAfterSeconds") or 0
        if resync > 0:
            self.queue.add_after(key, float(resync), f"resyncAfterSeconds {resync}")
        if not self._write(resource, parent, answer, record):
            return
        desired = [copy.deepcopy(a) for a in answer.get("attachments") or []]
        for attachment in desired:
            annotations = attachment.setdefault("metadata", {}).get("annotations") or {}
            attachment["metadata"]["annotations"] = {**annotations, DECORATOR_ANNOTATION: self.name_of()}
        if not meta(parent).get("deletionTimestamp") or finalizing:
            errors = self.writer.manage(parent, observed, desired, record)
            if errors:
                raise RuntimeError(f"can't reconcile attachments: {'; '.join(errors)}")

    def name_of(self) -> str:
        return str(self.controller["metadata"]["name"])

    def _attachments(self, parent: Obj) -> dict[str, dict[str, Obj]]:
        """`getChildren`: every attachment type's group (even empty), ours by controller ref and annotation."""
        out: dict[str, dict[str, Obj]] = {}
        namespace = meta(parent).get("namespace") or None
        for (api_version, _), informer in self.attachment_informers.items():
            group = out.setdefault(f"{informer.kind}.{api_version}", {})
            for obj in informer.objects(namespace):
                ref = controller_ref(obj)
                if ref is None or ref.get("uid") != meta(parent).get("uid"):
                    continue
                if (meta(obj).get("annotations") or {}).get(DECORATOR_ANNOTATION) != self.name_of():
                    continue
                group[object_key(obj)] = obj
        return out

    def resolve(self, namespace: str, ref: Obj) -> Obj | None:
        """`resolveControllerRef`: the parent of that kind and name (in the child's namespace if the kind is
        namespaced) from the cache, same uid, ours."""
        for (api_version, kind), (informer, rule) in self.informers.items():
            if (
                kind != ref.get("kind")
                or api_version.rpartition("/")[0] != ref.get("apiVersion", "").rpartition("/")[0]
            ):
                continue
            _, namespaced = self.factory.describe(rule["apiVersion"], rule["resource"])
            parent = informer.get(namespace if namespaced else None, ref["name"])
            if parent is not None and meta(parent).get("uid") == ref.get("uid"):
                ours = self.matches(parent) or self.finalizer in (meta(parent).get("finalizers") or [])
                return parent if ours else None
        return None

    def _write(self, resource: Any, parent: Obj, answer: Obj, record: Pass) -> bool:
        """The parent's labels, annotations and status; False when the pass ends here (conflict, gone)."""
        updated = copy.deepcopy(parent)
        m = meta(updated)
        labels, annotations = dict(m.get("labels") or {}), dict(m.get("annotations") or {})
        status = answer["status"] if answer.get("status") is not None else parent.get("status")
        changed = merge_strings(labels, answer.get("labels") or {})
        changed |= merge_strings(annotations, answer.get("annotations") or {})
        status_changed = status != parent.get("status")
        finalized = bool(answer.get("finalized")) and self.finalizer in (m.get("finalizers") or [])
        if not (changed or status_changed or finalized):
            return True
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
            return False  # written from a stale cache, or gone: the newer version's event queues it again
        record.writes.append(f"update {parent['kind']} {m['name']}")
        return True


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


class _AttachmentEvents:
    """`onChildAdd`/`onChildUpdate`/`onChildDelete`: queue the parent the controller ref names."""

    def __init__(self, controller: DecoratorController) -> None:
        self.controller = controller

    def _queue(self, what: str, obj: Obj) -> None:
        reason = f"attachment {describe(what, obj)}"
        ref = controller_ref(obj)
        namespace = meta(obj).get("namespace") or ""
        parent = self.controller.resolve(namespace, ref) if ref is not None else None
        key = self.controller.enqueue_parent(parent, reason) if parent is not None else None
        self.controller.saw(reason, [key] if key else [])

    def on_add(self, obj: Obj) -> None:
        self._queue("delete" if meta(obj).get("deletionTimestamp") else "add", obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if meta(old).get("resourceVersion") != meta(new).get("resourceVersion"):
            self._queue("update", new)

    def on_delete(self, obj: Obj) -> None:
        self._queue("delete", obj)
