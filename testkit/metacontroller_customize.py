"""Metacontroller 4.17.2's customize manager (`pkg/controller/common/customize/manager.go`), for v2 hooks.

* The customize answer is cached per parent (uid, generation) for 20 minutes
  (`newResponseCache`): a parent's rules change only with its generation.
* Related objects are read from informers, one per related resource, started
  the first time a rule names it; until it has listed, the sync fails with
  `ErrRelatedInformerNotSynced` and is retried.
* Every add, delete and resourceVersion change of a related object queues each
  parent whose rule matches the old or the new object (`onRelatedUpdate`,
  `findRelatedParents`); there is no status filter for related objects.
* A rule is one of four selections (`determineSelectionType`); `labelSelector`
  alone selects in every namespace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from testkit.informer import Informer
from testkit.metacontroller_base import (
    HookClient,
    HookError,
    InformerFactory,
    NotSynced,
    Obj,
    describe,
    meta,
    object_key,
    selector_matches,
)

CUSTOMIZE_RESPONSE_KEYS = frozenset({"relatedResources"})
RULE_KEYS = frozenset({"apiVersion", "resource", "labelSelector", "namespaceSelector", "namespace", "names"})
CACHE_SECONDS = 20 * 60


def selection_type(rule: Mapping[str, Any]) -> str:
    """`determineSelectionType`; HookError for the combinations it refuses."""
    labels, namespace_selector = (
        rule.get("labelSelector") is not None,
        rule.get("namespaceSelector") is not None,
    )
    namespace, names = bool(rule.get("namespace")), bool(rule.get("names"))
    if names and (labels or namespace_selector):
        raise HookError(f"related rule cannot have both names and labelSelector/namespaceSelector: {rule}")
    if namespace and namespace_selector:
        raise HookError(f"related rule cannot have both namespace and namespaceSelector: {rule}")
    if namespace_selector:
        return "NamespaceSelector"
    if labels and namespace:
        return "NamespaceAndLabels"
    if namespace or names:
        return "NamespacesAndNames"
    return "Labels"


class CustomizeManager:
    """Related objects of one controller's parents, and the events that queue them."""

    def __init__(
        self,
        factory: InformerFactory,
        hooks: HookClient,
        controller: Obj,
        parents: Callable[[], list[Obj]],  # the cached parents, read only (`Informer.view`)
        enqueue: Callable[[Obj, str], str | None],
        saw: Callable[[str, list[str]], None],
    ) -> None:
        self.factory, self.hooks, self.controller = factory, hooks, controller
        self.parents, self.enqueue, self.saw = parents, enqueue, saw
        self.hook: Obj | None = controller["spec"].get("hooks", {}).get("customize")
        self.calls: list[tuple[str, int]] = []  # (uid, generation) of every customize call made
        self._cache: dict[tuple[str, int], tuple[float, list[Obj]]] = {}
        self._lock = threading.Lock()
        self._watched: set[tuple[str, str]] = set()
        self.namespaces = factory.informer("v1", "namespaces")  # every manager starts one (4.15+)

    def rules(self, parent: Obj) -> list[Obj]:
        if self.hook is None:
            return []
        key = (str(meta(parent).get("uid")), int(meta(parent).get("generation") or 0))
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        body = {"controller": self.controller, "parent": parent}
        answer = self.hooks.call(self.hook["webhook"], body, CUSTOMIZE_RESPONSE_KEYS)
        rules = list(answer.get("relatedResources") or [])
        for rule in rules:
            unknown = sorted(set(rule) - RULE_KEYS)
            if unknown:
                raise HookError(f"customize: strict decoding failed: unknown rule fields {unknown}")
        with self._lock:
            self.calls.append(key)
            self._cache[key] = (time.monotonic() + CACHE_SECONDS, rules)
        return rules

    # ---- GetRelatedObjects -------------------------------------------------------------

    def related(self, parent: Obj) -> dict[str, dict[str, Obj]]:
        out: dict[str, dict[str, Obj]] = {}
        for rule in self.rules(parent):
            informer = self._informer(rule["apiVersion"], rule["resource"])
            if not informer.synced.is_set():
                raise NotSynced(f"related informer for {rule['resource']} not synced yet")
            _, namespaced = self.factory.describe(rule["apiVersion"], rule["resource"])
            group = out.setdefault(f"{informer.kind}.{rule['apiVersion']}", {})
            for obj in self._select(rule, informer, namespaced):
                group[object_key(obj)] = obj
        return out

    def _select(self, rule: Obj, informer: Informer, namespaced: bool) -> list[Obj]:
        how = selection_type(rule)
        labels = rule.get("labelSelector")
        scope = rule.get("namespace") if namespaced and rule.get("namespace") else None
        if how == "Labels":
            return informer.objects(None, lambda o: selector_matches(labels, meta(o).get("labels")))
        if how == "NamespaceAndLabels":
            return informer.objects(scope, lambda o: selector_matches(labels, meta(o).get("labels")))
        if how == "NamespaceSelector":
            if not self.namespaces.synced.is_set():
                raise NotSynced("namespace informer not synced yet")
            chosen = {
                meta(ns)["name"]
                for ns in self.namespaces.objects(
                    None, lambda n: selector_matches(rule["namespaceSelector"], meta(n).get("labels"))
                )
            }
            return informer.objects(
                None,
                lambda o: (
                    meta(o).get("namespace") in chosen and selector_matches(labels, meta(o).get("labels"))
                ),
            )
        names = rule.get("names") or []
        return informer.objects(scope, lambda o: not names or meta(o).get("name") in names)

    # ---- events of related objects -----------------------------------------------------

    def _informer(self, api_version: str, plural: str) -> Informer:
        informer = self.factory.informer(api_version, plural)
        with self._lock:
            first = (api_version, plural) not in self._watched
            self._watched.add((api_version, plural))
        if first:
            informer.add_handler(_RelatedEvents(self))
        return informer

    def matches(self, rule: Obj, obj: Obj) -> bool:
        """`matchesRelatedRule` for v2 hooks."""
        kind, namespaced = self.factory.describe(rule["apiVersion"], rule["resource"])
        if obj.get("apiVersion") != rule["apiVersion"] or obj.get("kind") != kind:
            return False
        how, m = selection_type(rule), meta(obj)
        if how in ("Labels", "NamespaceAndLabels", "NamespaceSelector") and not selector_matches(
            rule.get("labelSelector"), m.get("labels")
        ):
            return False
        if how == "NamespaceAndLabels":
            return not namespaced or m.get("namespace") == rule.get("namespace")
        if how == "NamespaceSelector":
            namespace = self.namespaces.get(None, str(m.get("namespace")))
            return namespace is not None and selector_matches(
                rule["namespaceSelector"], meta(namespace).get("labels")
            )
        if how == "NamespacesAndNames":
            if namespaced and rule.get("namespace") and m.get("namespace") != rule["namespace"]:
                return False
            return not rule.get("names") or m.get("name") in rule["names"]
        return True

    def notify(self, what: str, *objects: Obj) -> None:
        """`findRelatedParents`: queue every parent one of whose rules matches one of `objects`."""
        reason = f"related {describe(what, objects[-1])}"
        queued = []
        for parent in self.parents():
            try:
                rules = self.rules(parent)
            except Exception:  # Metacontroller skips the parent; its relist tries again
                continue
            if any(self.matches(rule, obj) for rule in rules for obj in objects):
                key = self.enqueue(parent, reason)
                if key:
                    queued.append(key)
        self.saw(reason, queued)


class _RelatedEvents:
    """`onRelatedAdd`/`onRelatedUpdate`/`onRelatedDelete`."""

    def __init__(self, manager: CustomizeManager) -> None:
        self.manager = manager

    def on_add(self, obj: Obj) -> None:
        self.manager.notify("delete" if meta(obj).get("deletionTimestamp") else "add", obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if meta(old).get("resourceVersion") == meta(new).get("resourceVersion"):
            return  # a resync or relist: no change
        self.manager.notify("update", old, new)

    def on_delete(self, obj: Obj) -> None:
        self.manager.notify("delete", obj)
