"""Metacontroller 4.17.2, as our hooks meet it: a test driver that does what it does, step for step.

Metacontroller cannot be installed here, so the control-plane tier runs its
algorithm, written from its source at tag v4.17.2 (metacontroller/README.md
lists each behaviour with the file it comes from). The driver authenticates as
the chart's Metacontroller ServiceAccount, so every read and write it makes is
authorized by the chart's RBAC on the real API server, and every child is
admitted (OwnerReferencesPermissionEnforcement, webhooks, schema) for real.

CompositeController (`pkg/controller/composite/controller.go` syncParentObject):
 1. add the finalizer `metacontroller.io/compositecontroller-<name>` when a
    finalize hook exists (not on a parent already being deleted);
 2. claim children: every child resource in the parent's namespace owned by the
    parent, or an orphan matching `controller-uid=<parent uid>` (adopted);
 3. related objects from the customize hook's rules (`customize/manager.go`);
 4. call finalize (deleting parent, finalizer present) or sync, with
    {controller, parent, children, related, finalizing}; decode the response
    strictly (unknown keys fail the sync, `pkg/hooks/webhook.go`);
 5. `finalized: true` removes the finalizer;
 6. label every desired child `controller-uid`, then manage children
    (`common/manage_children.go`): delete observed children not desired
    (background propagation, UID precondition); create missing ones with the
    last-applied annotation and a controller ownerReference with
    blockOwnerDeletion; update existing ones by a 3-way merge (`dynamic/apply`)
    per the child's update strategy (InPlace, OnDelete, Recreate);
 7. write status (+ observedGeneration) through the status subresource when it changed.

DecoratorController (`pkg/controller/decorator/controller.go`): customize →
related, sync with {controller, object, attachments, related, finalizing}, and
labels/annotations merged into the object (null deletes) with one Update.

Metacontroller reacts to watch events; the tests call `sync` (or
`sync_until`) instead, which runs the same pass on demand.
"""

from __future__ import annotations

import copy
import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from tests.support.kube_apply import Kube

Obj = dict[str, Any]
LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
CONTROLLER_UID = "controller-uid"
COMPOSITE_RESPONSE_KEYS = frozenset({"status", "children", "resyncAfterSeconds", "finalized"})
DECORATOR_RESPONSE_KEYS = frozenset(
    {"labels", "annotations", "status", "attachments", "resyncAfterSeconds", "finalized"}
)
CUSTOMIZE_RESPONSE_KEYS = frozenset({"relatedResources"})
RULE_KEYS = frozenset({"apiVersion", "resource", "labelSelector", "namespaceSelector", "namespace", "names"})
KNOWN_MERGE_KEYS = ("containerPort", "port", "mountPath", "name", "uid", "ip", "path")
SYSTEM_FIELDS = (
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
)


class HookError(RuntimeError):
    """The hook answered something Metacontroller 4.17.2 would refuse; the sync fails."""


# ---- the 3-way merge of pkg/dynamic/apply/apply.go --------------------------------


def merge(destination: Any, last_applied: Any, desired: Any) -> Any:
    if isinstance(destination, dict):
        return _merge_object(destination, last_applied or {}, desired or {})
    if isinstance(destination, list):
        key = _list_map_key(destination, last_applied or [], desired or [])
        if key:
            return _merge_list_map(key, destination, last_applied or [], desired or [])
        return desired
    return desired


def _merge_object(destination: Obj, last_applied: Obj, desired: Obj) -> Obj:
    for key in last_applied:
        if key not in desired:
            destination.pop(key, None)
    for key, value in desired.items():
        destination[key] = merge(destination.get(key), last_applied.get(key), value)
    return destination


def _string_key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _list_map_key(*lists: list[Any]) -> str:
    common: set[str] | None = None
    for items in lists:
        for item in items:
            if not isinstance(item, dict):
                return ""
            common = set(item) if common is None else common & set(item)
    return next((k for k in KNOWN_MERGE_KEYS if common and k in common), "")


def _merge_list_map(
    key: str, destination: list[Any], last_applied: list[Any], desired: list[Any]
) -> list[Any]:
    dest = {_string_key(i[key]): i for i in destination}
    last = {_string_key(i[key]): i for i in last_applied}
    want = {_string_key(i[key]): i for i in desired}
    _merge_object(dest, last, want)
    out, added = [], set()
    for item in [*destination, *desired]:
        k = _string_key(item[key])
        if k in dest and k not in added:
            out.append(dest[k])
            added.add(k)
    return out


def encode(obj: Obj) -> str:
    """The last-applied annotation's text: Go's json.Marshal sorts keys and adds no spaces."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def apply_update(observed: Obj, desired: Obj) -> Obj:
    """`ApplyUpdate`: the 3-way merge of observed, last applied and desired; system fields and status kept."""
    annotations = (observed.get("metadata") or {}).get("annotations") or {}
    last = json.loads(annotations[LAST_APPLIED]) if annotations.get(LAST_APPLIED) else {}
    update = copy.deepcopy(desired)
    (update.get("metadata", {}).get("annotations") or {}).pop(LAST_APPLIED, None)
    merged = merge(copy.deepcopy(observed), last, update)
    for name in SYSTEM_FIELDS:
        if name in observed["metadata"]:
            merged["metadata"][name] = observed["metadata"][name]
        else:
            merged["metadata"].pop(name, None)
    if "status" in observed:
        merged["status"] = observed["status"]
    else:
        merged.pop("status", None)
    merged["metadata"].setdefault("annotations", {})[LAST_APPLIED] = encode(update)
    return dict(merged)


# ---- hooks over HTTPS ------------------------------------------------------------


@dataclass
class HookClient:
    """Calls the hook URLs a controller names, at `base_url` (the test's praesto-hooks), trusting `ca_path`."""

    base_url: str
    ca_path: Path
    timeout: float = 10.0

    def call(self, webhook: Obj, body: Obj, allowed: frozenset[str]) -> Obj:
        path = urlsplit(webhook["url"]).path
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        context = ssl.create_default_context(cafile=str(self.ca_path))
        with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
            answer = json.loads(response.read())
        if not isinstance(answer, dict):
            raise HookError(f"{path}: response is not an object")
        unknown = sorted(set(answer) - allowed)
        if unknown:
            raise HookError(f"{path}: strict decoding failed: unknown fields {unknown}")
        return answer


def _selector_text(selector: Obj | None) -> str:
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, values = expr["operator"], ",".join(expr.get("values") or [])
        parts.append(
            {"In": f"{expr['key']} in ({values})", "NotIn": f"{expr['key']} notin ({values})"}.get(
                op, expr["key"] if op == "Exists" else f"!{expr['key']}"
            )
        )
    return ",".join(parts)


def group_key(obj: Obj) -> str:
    return f"{obj['kind']}.{obj['apiVersion']}"


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])


class RelatedObjects:
    """`customize.Manager.GetRelatedObjects` for v2 hooks (`determineSelectionType`)."""

    def __init__(self, kube: Kube, hooks: HookClient, controller: Obj) -> None:
        self.kube, self.hooks, self.controller = kube, hooks, controller

    def rules(self, parent: Obj) -> list[Obj]:
        hook = self.controller["spec"]["hooks"].get("customize")
        if not hook:
            return []
        body = {"controller": self.controller, "parent": parent}
        answer = self.hooks.call(hook["webhook"], body, CUSTOMIZE_RESPONSE_KEYS)
        rules = answer.get("relatedResources") or []
        for rule in rules:
            unknown = sorted(set(rule) - RULE_KEYS)
            if unknown:
                raise HookError(f"customize: strict decoding failed: unknown rule fields {unknown}")
        return list(rules)

    def collect(self, parent: Obj) -> dict[str, dict[str, Obj]]:
        related: dict[str, dict[str, Obj]] = {}
        for rule in self.rules(parent):
            resource = self.kube.resource_by_plural(rule["apiVersion"], rule["resource"])
            group = related.setdefault(f"{resource.kind}.{rule['apiVersion']}", {})
            for obj in self._select(rule, resource.namespaced):
                group[object_key(obj)] = obj
        return related

    def _select(self, rule: Obj, namespaced: bool) -> list[Obj]:
        labels, names, namespace = (
            rule.get("labelSelector"),
            rule.get("names") or [],
            rule.get("namespace") or "",
        )
        if names and (labels is not None or rule.get("namespaceSelector") is not None):
            raise HookError("related rule cannot have both names and labelSelector/namespaceSelector")
        if namespace and rule.get("namespaceSelector") is not None:
            raise HookError("related rule cannot have both namespace and namespaceSelector")
        if rule.get("namespaceSelector") is not None:
            chosen = self.kube.list(
                "v1", "Namespace", label_selector=_selector_text(rule["namespaceSelector"])
            )
            found = []
            for ns in chosen:
                found += self._list(rule, ns["metadata"]["name"], _selector_text(labels))
            return found
        scope = namespace if (namespaced and namespace) else None
        found = self._list(rule, scope, _selector_text(labels))
        if names:
            found = [o for o in found if o["metadata"]["name"] in names]
        return found

    def _list(self, rule: Obj, namespace: str | None, selector: str) -> list[Obj]:
        resource = self.kube.resource_by_plural(rule["apiVersion"], rule["resource"])
        listed = resource.get(namespace=namespace, label_selector=selector)
        return [
            {**item.to_dict(), "apiVersion": rule["apiVersion"], "kind": resource.kind}
            for item in listed.items
        ]


@dataclass
class SyncResult:
    parent: Obj | None
    response: Obj
    hook: str
    writes: list[str] = field(default_factory=list)  # "<verb> <Kind> <namespace/name>" this pass made


class CompositeDriver:
    def __init__(self, kube: Kube, controller: Obj, hooks: HookClient) -> None:
        self.kube, self.controller, self.hooks = kube, controller, hooks
        self.writes: list[str] = []
        self.spec = controller["spec"]
        self.finalizer = f"metacontroller.io/compositecontroller-{controller['metadata']['name']}"
        parent_rule = self.spec["parentResource"]
        self.parent_resource = kube.resource_by_plural(parent_rule["apiVersion"], parent_rule["resource"])
        self.related = RelatedObjects(kube, hooks, controller)
        self.strategies = {
            (c["apiVersion"].rpartition("/")[0], c["resource"]): (c.get("updateStrategy") or {}).get(
                "method", "OnDelete"
            )
            for c in self.spec.get("childResources", [])
        }

    def _get_parent(self, namespace: str, name: str) -> Obj | None:
        try:
            out: Obj = self.parent_resource.get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None
        return out

    def sync(self, namespace: str, name: str) -> SyncResult | None:
        """One pass of syncParentObject; None when the parent is gone."""
        parent = self._get_parent(namespace, name)
        if parent is None:
            return None
        self.writes = []
        meta = parent["metadata"]
        finalizers = meta.get("finalizers") or []
        has_finalize = "finalize" in self.spec["hooks"]
        if has_finalize and self.finalizer not in finalizers and not meta.get("deletionTimestamp"):
            meta["finalizers"] = [*finalizers, self.finalizer]
            self._wrote("update", parent)
            parent = self.parent_resource.replace(body=parent, namespace=namespace).to_dict()
            meta = parent["metadata"]
        children = self._claim_children(parent)
        related = self.related.collect(parent)
        finalizing = (
            bool(meta.get("deletionTimestamp"))
            and has_finalize
            and self.finalizer in (meta.get("finalizers") or [])
        )
        if meta.get("deletionTimestamp") and not finalizing:
            return SyncResult(parent, {}, "none")
        hook = "finalize" if finalizing else "sync"
        body = {
            "controller": self.controller,
            "parent": parent,
            "children": children,
            "related": related,
            "finalizing": finalizing,
        }
        response = self.hooks.call(self.spec["hooks"][hook]["webhook"], body, COMPOSITE_RESPONSE_KEYS)
        if response.get("finalized") and finalizing:
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != self.finalizer]
            self._wrote("update", parent)
            try:
                parent = self.parent_resource.replace(body=parent, namespace=namespace).to_dict()
            except NotFoundError:
                return SyncResult(None, response, hook, self.writes)
        desired = [self._with_selector_label(parent, child) for child in response.get("children") or []]
        # Children are managed while the parent lives, or while our finalizer still holds it:
        # once `finalized` removed it, that last response's children are neither applied nor pruned.
        if not parent["metadata"].get("deletionTimestamp") or self.finalizer in (
            parent["metadata"].get("finalizers") or []
        ):
            self._manage_children(parent, children, desired)
        status = dict(response.get("status") or {})
        status["observedGeneration"] = parent["metadata"].get("generation")
        if status != parent.get("status"):
            self._wrote("update-status", parent)
            try:
                updated = self._update_status(parent, status)
            except (NotFoundError, ConflictError):
                updated = None
            parent = updated or parent
        return SyncResult(parent, response, hook, self.writes)

    def _wrote(self, verb: str, obj: Obj) -> None:
        self.writes.append(f"{verb} {obj.get('kind')} {object_key(obj)}")

    def sync_until(
        self, namespace: str, name: str, done: Callable[[SyncResult | None], bool], deadline: float = 60
    ) -> SyncResult | None:
        """Sync passes (as watch events would trigger them) until `done(result)`, polling with a deadline."""
        end = time.monotonic() + deadline
        last: SyncResult | None = None
        while True:
            last = self.sync(namespace, name)
            if done(last):
                return last
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{namespace}/{name}: not done after {deadline}s; last status {last and last.parent and last.parent.get('status')}"
                )
            time.sleep(0.2)  # poll interval, bounded by the deadline

    # ---- children ----------------------------------------------------------------

    def _child_resources(self) -> list[Obj]:
        return list(self.spec.get("childResources") or [])

    def _claim_children(self, parent: Obj) -> dict[str, dict[str, Obj]]:
        uid = parent["metadata"]["uid"]
        namespace = parent["metadata"]["namespace"]
        claimed: dict[str, dict[str, Obj]] = {}
        for child in self._child_resources():
            resource = self.kube.resource_by_plural(child["apiVersion"], child["resource"])
            group = claimed.setdefault(f"{resource.kind}.{child['apiVersion']}", {})
            for item in resource.get(namespace=namespace).items:
                obj = {**item.to_dict(), "apiVersion": child["apiVersion"], "kind": resource.kind}
                refs = obj["metadata"].get("ownerReferences") or []
                controller = next((r for r in refs if r.get("controller")), None)
                labels = obj["metadata"].get("labels") or {}
                if controller is not None and controller["uid"] == uid:
                    group[object_key(obj)] = obj
                elif (
                    controller is None
                    and labels.get(CONTROLLER_UID) == uid
                    and not parent["metadata"].get("deletionTimestamp")
                ):
                    obj["metadata"]["ownerReferences"] = [*refs, self._controller_ref(parent)]
                    self._wrote("adopt", obj)
                    group[object_key(obj)] = resource.replace(body=obj, namespace=namespace).to_dict()
        return claimed

    @staticmethod
    def _controller_ref(parent: Obj) -> Obj:
        return {
            "apiVersion": parent["apiVersion"],
            "kind": parent["kind"],
            "name": parent["metadata"]["name"],
            "uid": parent["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _with_selector_label(self, parent: Obj, child: Obj) -> Obj:
        out = copy.deepcopy(child)
        meta = out.setdefault("metadata", {})
        meta.setdefault("namespace", parent["metadata"]["namespace"])
        if self.spec.get("generateSelector"):
            meta.setdefault("labels", {}).setdefault(CONTROLLER_UID, parent["metadata"]["uid"])
        return out

    def _manage_children(self, parent: Obj, observed: dict[str, dict[str, Obj]], desired: list[Obj]) -> None:
        wanted: dict[str, dict[str, Obj]] = {}
        for child in desired:
            wanted.setdefault(group_key(child), {})[object_key(child)] = child
        for key, objects in observed.items():
            for name, obj in objects.items():
                if obj["metadata"].get("deletionTimestamp") or name in wanted.get(key, {}):
                    continue
                self._delete(obj)
        for key, objects in wanted.items():
            for name, child in objects.items():
                current = observed.get(key, {}).get(name)
                if current is None:
                    self._create(parent, child)
                else:
                    self._update(current, child)

    def _delete(self, obj: Obj) -> None:
        resource = self.kube.resource(obj["apiVersion"], obj["kind"])
        self._wrote("delete", obj)
        body = {"propagationPolicy": "Background", "preconditions": {"uid": obj["metadata"]["uid"]}}
        try:
            resource.delete(name=obj["metadata"]["name"], namespace=obj["metadata"]["namespace"], body=body)
        except NotFoundError:
            return

    def _create(self, parent: Obj, child: Obj) -> None:
        body = copy.deepcopy(child)
        last_applied = encode(child)
        body["metadata"].setdefault("annotations", {})[LAST_APPLIED] = last_applied
        refs = body["metadata"].get("ownerReferences") or []
        if not any(r.get("uid") == parent["metadata"]["uid"] for r in refs):
            body["metadata"]["ownerReferences"] = [*refs, self._controller_ref(parent)]
        self._wrote("create", body)
        self.kube.create(body)

    def _update(self, observed: Obj, desired: Obj) -> None:
        merged = apply_update(observed, desired)
        if merged == observed or observed["metadata"].get("deletionTimestamp"):
            return
        group = observed["apiVersion"].rpartition("/")[0]
        plural = self.kube.resource(observed["apiVersion"], observed["kind"]).name
        method = self.strategies.get((group, plural), "OnDelete")
        if method in ("OnDelete", ""):
            return
        if method in ("Recreate", "RollingRecreate"):
            self._delete(observed)
            return
        resource = self.kube.resource(observed["apiVersion"], observed["kind"])
        self._wrote("update", observed)
        try:
            resource.replace(body=merged, namespace=observed["metadata"]["namespace"])
        except (NotFoundError, ConflictError):
            return

    def _update_status(self, parent: Obj, status: Obj) -> Obj:
        body = copy.deepcopy(parent)
        body["status"] = status
        status_resource = self.parent_resource.subresources["status"]
        out: Obj = status_resource.replace(body=body, namespace=parent["metadata"]["namespace"]).to_dict()
        return out


class DecoratorDriver:
    """The DecoratorController over one resource: labels and annotations from the sync hook."""

    def __init__(self, kube: Kube, controller: Obj, hooks: HookClient) -> None:
        self.kube, self.controller, self.hooks = kube, controller, hooks
        self.related = RelatedObjects(kube, hooks, controller)

    def sync(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        resource = self.kube.resource(api_version, kind)
        obj: Obj = resource.get(name=name, namespace=namespace).to_dict()
        body = {
            "controller": self.controller,
            "object": obj,
            "attachments": {},
            "related": self.related.collect(obj),
            "finalizing": False,
        }
        answer = self.hooks.call(
            self.controller["spec"]["hooks"]["sync"]["webhook"], body, DECORATOR_RESPONSE_KEYS
        )
        meta = obj["metadata"]
        changed = False
        for section in ("labels", "annotations"):
            current = meta.setdefault(section, {}) or {}
            meta[section] = current
            for key, value in (answer.get(section) or {}).items():
                if value is None:
                    changed |= current.pop(key, None) is not None
                elif current.get(key) != value:
                    current[key] = value
                    changed = True
        if changed:
            obj = resource.replace(body=obj, namespace=namespace).to_dict()
        return obj
