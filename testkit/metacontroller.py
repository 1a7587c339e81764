"""Metacontroller 4.17.2, as our hooks meet it: its controllers, event-driven on the real API server's watches.

Usage (the control-plane tier starts one for the session, `tests/cluster/conftest.py`):

    composite.wait_parent(ns, "tiny", phase_is("Ready"), deadline=90)  # create objects, then wait
    composite.wait_parent(ns, "tiny", gone, deadline=60)                # after deleting the cache
    composite.passes(f"{ns}/tiny")          # every pass: why it ran (reasons), hook, response, writes
    composite.wait_seen("update", node)     # how the handlers judged the event of `node` at its
                                            # resourceVersion: which parents it queued (none: filtered)
    decorator.passes(decorator_key("v1", "Node", "", "node-a"))

No test calls a sync: passes run only when Metacontroller would run them.
`Metacontroller(...).start()` runs both controllers on threads until `stop()`.

Metacontroller cannot be installed here, so this is its algorithm, written from
its source at tag v4.17.2 (metacontroller/README.md lists each behaviour and
the file it comes from). It authenticates as the chart's Metacontroller
ServiceAccount, so every read and write is authorized by the chart's RBAC and
every child admitted for real. What triggers a pass, as Metacontroller:

* parent add/delete, and updates unless `ignoreStatusChanges` filters them
  (same generation, labels and annotations, not deleting; a resync passes);
* events of owned children (and orphans the parent's selector would adopt),
  except updates that keep the resourceVersion;
* every add, delete and resourceVersion change of a related object that a
  parent's customize rule selects (`metacontroller_customize.py`);
* `resyncAfterSeconds`, failed syncs (retried with backoff), and the resync
  period (`resyncPeriodSeconds`, else `--cache-flush-interval`, 30 min).

Every read comes from informers (`informer.py`), which may lag the API
server (`lag`); only finalizer and status writes read the live object first.

Over 400 lines: the composite controller's pass (claim, sync, apply, status, finalize) is
Metacontroller's one algorithm, kept in one file to be read beside its Go source; the
decorator, informers, queue and base live apart.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from testkit.client_rate_limit import MetacontrollerFlags, ThrottledApiClient, TokenBucket
from testkit.kube_apply import Kube
from testkit.metacontroller_apply import LAST_APPLIED
from testkit.metacontroller_base import (
    CACHE_FLUSH_INTERVAL,
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
from testkit.metacontroller_children import CONTROLLER_UID, ChildWriter
from testkit.metacontroller_customize import CustomizeManager
from testkit.metacontroller_decorator import DecoratorController, decorator_key

__all__ = [
    "CONTROLLER_UID",
    "LAST_APPLIED",
    "CompositeController",
    "DecoratorController",
    "HookClient",
    "Metacontroller",
    "Pass",
    "decorator_key",
    "gone",
]
COMPOSITE_RESPONSE_KEYS = frozenset({"status", "children", "resyncAfterSeconds", "finalized"})
GC_FINALIZERS = ("foregroundDeletion", "orphan")


def gone(parent: Obj | None) -> bool:
    return parent is None


class CompositeController(Controller):
    """`pkg/controller/composite/controller.go`."""

    name = "composite"

    def __init__(self, kube: Kube, hooks: HookClient, controller: Obj, workers: int = 2) -> None:
        super().__init__(kube, hooks, controller, workers)
        self.finalizer = f"metacontroller.io/compositecontroller-{controller['metadata']['name']}"
        self.has_finalize = "finalize" in self.spec["hooks"]
        rule = self.spec["parentResource"]
        self.parent_api = (rule["apiVersion"], rule["resource"])
        self.ignore_status_changes = bool(rule.get("ignoreStatusChanges"))
        self.parent_selector: Obj | None = rule.get("labelSelector")
        self.parent_resource = kube.resource_by_plural(*self.parent_api)
        self.child_types = [(c["apiVersion"], c["resource"]) for c in self.spec.get("childResources") or []]
        strategies = {
            (c["apiVersion"].rpartition("/")[0], c["resource"]): (c.get("updateStrategy") or {}).get(
                "method", "OnDelete"
            )
            for c in self.spec.get("childResources") or []
        }
        self.writer = ChildWriter(kube, strategies)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self, factory: InformerFactory) -> None:
        self.factory = factory
        self.parents = factory.informer(*self.parent_api)
        self.children = {t: factory.informer(*t) for t in self.child_types}
        self.customize = CustomizeManager(
            factory,
            self.hooks,
            self.controller,
            self.parents.view,  # read only: scanned on every related event
            self.enqueue_parent,
            self.saw,
        )
        resync = factory.handler_resync(self.spec.get("resyncPeriodSeconds"))
        self.parents.add_handler(_ParentEvents(self), resync)
        for informer in self.children.values():
            informer.add_handler(_ChildEvents(self))
        factory.wait_synced()
        self.start_workers()

    def stop(self) -> None:
        self.stop_workers()

    # ---- what tests use ----------------------------------------------------------------

    def wait_parent(
        self, namespace: str, name: str, done: Callable[[Obj | None], bool], deadline: float = 60
    ) -> Obj | None:
        """Read the parent from the API server until `done(parent)` (None: gone); TimeoutError after `deadline`."""
        end = time.monotonic() + deadline
        while True:
            parent = self.kube.get(self.parent_api[0], self.parent_resource.kind, name, namespace)
            if done(parent):
                return parent
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{namespace}/{name}: not done after {deadline}s; status {parent and parent.get('status')}; "
                    f"{self.summary(f'{namespace}/{name}')}"
                )
            time.sleep(0.1)  # poll interval, bounded by the deadline

    # ---- handlers' decisions -----------------------------------------------------------

    def ours(self, parent: Obj) -> bool:
        """A parent we care about: matches the selector, or still carries our finalizer."""
        return self.finalizer in (meta(parent).get("finalizers") or []) or selector_matches(
            self.parent_selector, meta(parent).get("labels")
        )

    def enqueue_parent(self, parent: Obj, reason: str) -> str | None:
        if not self.ours(parent):
            return None
        key = object_key(parent)
        self.enqueue(key, reason)
        return key

    def resolve(self, namespace: str, ref: Obj) -> Obj | None:
        """`resolveControllerRef`: the parent a child's controller ref names, from the cache, same uid."""
        if ref.get("kind") != self.parent_resource.kind:
            return None
        if ref.get("apiVersion", "").rpartition("/")[0] != self.parent_resource.group:
            return None
        parent = self.parents.get(namespace, ref["name"])
        if parent is None or meta(parent).get("uid") != ref.get("uid") or not self.ours(parent):
            return None
        return parent

    def selector(self, parent: Obj) -> Obj:
        """`makeSelector` with `generateSelector: true`: children carry `controller-uid`."""
        if not self.spec.get("generateSelector"):
            selector: Obj = ((parent.get("spec") or {}).get("selector")) or {}
            return selector
        return {"matchLabels": {CONTROLLER_UID: meta(parent)["uid"]}}

    # ---- syncParentObject --------------------------------------------------------------

    def sync(self, key: str, record: Pass) -> None:
        namespace, _, name = key.partition("/")
        parent = self.parents.get(namespace, name)
        if parent is None or not self.ours(parent):
            return
        record.parent_version = str(meta(parent).get("resourceVersion"))
        missing = self.has_finalize and self.finalizer not in (meta(parent).get("finalizers") or [])
        if missing and not meta(parent).get("deletionTimestamp"):  # finalizer.SyncObject
            added = atomic_update(self.parent_resource, parent, self._add_finalizer)
            if added is None:
                return
            record.writes.append(f"update {parent['kind']} {key} (finalizer)")
            parent = added
        observed = self._claim_children(parent, record)
        record.children_versions = {
            key: str(meta(child).get("resourceVersion"))
            for group in observed.values()
            for key, child in group.items()
        }
        related = self.customize.related(parent)
        deleting = bool(meta(parent).get("deletionTimestamp"))
        finalizing = self.has_finalize and (
            deleting or not selector_matches(self.parent_selector, meta(parent).get("labels"))
        )
        record.hook = "finalize" if finalizing else "sync"
        body = {
            "controller": self.controller,
            "parent": parent,
            "children": observed,
            "related": related,
            "finalizing": finalizing,
        }
        response = self.hooks.call(self.spec["hooks"][record.hook]["webhook"], body, COMPOSITE_RESPONSE_KEYS)
        record.response = response
        resync = response.get("resyncAfterSeconds") or 0
        if resync > 0:
            self.queue.add_after(key, float(resync), f"resyncAfterSeconds {resync}")
        if response.get("finalized"):
            removed = atomic_update(self.parent_resource, parent, self._remove_finalizer)
            if removed is None:
                return
            if self.finalizer in (meta(parent).get("finalizers") or []):
                record.writes.append(f"update {parent['kind']} {key} (finalizer removed)")
            parent = removed
        desired = [self._desired(parent, child) for child in response.get("children") or []]
        errors: list[str] = []
        if not meta(parent).get("deletionTimestamp") or self._should_finalize(parent):
            errors = self.writer.manage(parent, observed, desired, record)
        self._update_status(parent, response.get("status"), record)
        if errors:
            raise RuntimeError(f"can't reconcile children of {key}: {errors}")

    def _add_finalizer(self, obj: Obj) -> bool:
        finalizers = meta(obj).setdefault("finalizers", []) or []
        if self.finalizer in finalizers:
            return False
        meta(obj)["finalizers"] = [*finalizers, self.finalizer]
        return True

    def _remove_finalizer(self, obj: Obj) -> bool:
        finalizers = meta(obj).get("finalizers") or []
        if self.finalizer not in finalizers:
            return False
        meta(obj)["finalizers"] = [f for f in finalizers if f != self.finalizer]
        return True

    def _should_finalize(self, parent: Obj) -> bool:
        """`finalizer.Manager.ShouldFinalize`: never while the garbage collector owns the children."""
        finalizers = meta(parent).get("finalizers") or []
        if any(f in finalizers for f in GC_FINALIZERS):
            return False
        return self.has_finalize and self.finalizer in finalizers

    def _update_status(self, parent: Obj, status: Obj | None, record: Pass) -> None:
        """`updateParentStatus`: the hook's status replaces .status, with the parent's observedGeneration."""
        wanted = dict(status or {})
        wanted["observedGeneration"] = meta(parent).get("generation")

        changed: list[bool] = []

        def change(live: Obj) -> bool:
            record.parent_live_version = str(meta(live).get("resourceVersion"))
            before = live.get("status") or {}
            if before == wanted:
                return False
            record.status_changes = sorted(k for k in {*before, *wanted} if before.get(k) != wanted.get(k))
            live["status"] = wanted
            changed.append(True)
            return True

        try:
            if atomic_update(self.parent_resource, parent, change, "status") is not None and changed:
                record.writes.append(f"update-status {parent['kind']} {object_key(parent)}")
        except ConflictError:
            return  # changed since: its event syncs again

    # ---- children ----------------------------------------------------------------------

    def _claim_children(self, parent: Obj, record: Pass) -> dict[str, dict[str, Obj]]:
        """`claimChildren`: owned children and adoptable orphans in the parent's namespace, from the cache."""
        uid, namespace = meta(parent)["uid"], meta(parent)["namespace"]
        selector = self.selector(parent)
        deleting = bool(meta(parent).get("deletionTimestamp"))
        claimed: dict[str, dict[str, Obj]] = {}
        for (api_version, _), informer in self.children.items():
            group = claimed.setdefault(f"{informer.kind}.{api_version}", {})
            for child in informer.objects(namespace):
                ref = controller_ref(child)
                matches = selector_matches(selector, meta(child).get("labels"))
                if ref is not None:
                    if ref.get("uid") != uid:
                        continue
                    if matches:
                        group[object_key(child)] = child
                    elif not deleting:
                        self.writer.set_owner(child, parent, own=False, record=record)
                    continue
                if deleting or not matches or meta(child).get("deletionTimestamp"):
                    continue
                if self._can_adopt(parent) and self.writer.set_owner(child, parent, own=True, record=record):
                    group[object_key(child)] = child
        return claimed

    def _can_adopt(self, parent: Obj) -> bool:
        """`canAdoptFunc`: an uncached read; the same uid, not being deleted."""
        try:
            fresh = self.parent_resource.get(name=meta(parent)["name"], namespace=meta(parent)["namespace"])
        except NotFoundError:
            return False
        fresh_meta = fresh.to_dict()["metadata"]
        return bool(fresh_meta.get("uid") == meta(parent)["uid"] and not fresh_meta.get("deletionTimestamp"))

    def _desired(self, parent: Obj, child: Obj) -> Obj:
        out = copy.deepcopy(child)
        child_meta = out.setdefault("metadata", {})
        if not child_meta.get("namespace"):
            child_meta["namespace"] = meta(parent)["namespace"]  # applyNamespaceDefaults
        if self.spec.get("generateSelector"):
            child_meta.setdefault("labels", {}).setdefault(CONTROLLER_UID, meta(parent)["uid"])
        if not selector_matches(self.selector(parent), child_meta.get("labels")):
            raise RuntimeError(f"labels on desired child {object_key(out)} don't match parent selector")
        return out


class _ParentEvents:
    """`enqueueParentObject` / `updateParentObject`."""

    def __init__(self, controller: CompositeController) -> None:
        self.controller = controller

    def _queue(self, reason: str, obj: Obj) -> None:
        key = self.controller.enqueue_parent(obj, reason)
        self.controller.saw(reason, [key] if key else [])

    def on_add(self, obj: Obj) -> None:
        self._queue(describe("add", obj), obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if old is new:
            self._queue(describe("resync", new), new)
            return
        if self.controller.ignore_status_changes and status_only(old, new):
            self.controller.saw(describe("update", new), [])
            return
        self._queue(describe("update", new), new)

    def on_delete(self, obj: Obj) -> None:
        self._queue(describe("delete", obj), obj)


class _ChildEvents:
    """`onChildAdd` / `onChildUpdate` / `onChildDelete`."""

    def __init__(self, controller: CompositeController) -> None:
        self.controller = controller

    def on_add(self, child: Obj, what: str = "add") -> None:
        if meta(child).get("deletionTimestamp"):
            self.on_delete(child, what)
            return
        c = self.controller
        reason = f"child {describe(what, child)}"
        ref = controller_ref(child)
        if ref is not None:
            parents = [p for p in [c.resolve(meta(child)["namespace"], ref)] if p is not None]
        else:  # an orphan: every parent in its namespace whose selector matches it may adopt it
            parents = c.parents.objects(
                meta(child)["namespace"], lambda p: selector_matches(c.selector(p), meta(child).get("labels"))
            )
        queued = [k for k in (c.enqueue_parent(p, reason) for p in parents) if k]
        c.saw(reason, queued)

    def on_update(self, old: Obj, new: Obj) -> None:
        if meta(old).get("resourceVersion") == meta(new).get("resourceVersion"):
            return  # a resync or relist: the parent's resync covers it
        self.on_add(new, "update")

    def on_delete(self, child: Obj, what: str = "delete") -> None:
        c = self.controller
        reason = f"child {describe(what, child)}"
        ref = controller_ref(child)
        parent = c.resolve(meta(child).get("namespace") or "", ref) if ref is not None else None
        key = c.enqueue_parent(parent, reason) if parent is not None else None
        c.saw(reason, [key] if key else [])


class Metacontroller:
    """Both controllers in one process sharing informers, as the chart runs Metacontroller.

    `stop()` then `start()` is a restart: new informers (a fresh list), new queues;
    the controllers' pass logs are kept. `resync_period` is `--cache-flush-interval`
    and `lag` delays every watch event by that many seconds. `flags` (the chart's
    Metacontroller args) set the resync, one client rate limiter for every read,
    list and write (`client_rate_limit.py`; without flags, no limit) and, if they
    name `--workers`, each controller's workers; `workers` sets them outright
    (Metacontroller's default is 5; the stand-in's own 2 and 1 keep the tier's
    one-pass-per-event assertions exact, test_metacontroller_events.py).
    """

    def __init__(
        self,
        kube: Kube,
        hooks: HookClient,
        composite: Obj,
        decorator: Obj,
        *,
        resync_period: float | None = None,
        lag: float = 0.0,
        flags: MetacontrollerFlags | None = None,
        workers: int | None = None,
    ) -> None:
        default_resync = flags.cache_flush_interval if flags else CACHE_FLUSH_INTERVAL
        self.resync_period = default_resync if resync_period is None else resync_period
        self.bucket = flags.bucket() if flags else None
        self.kube, self.lag = _own_client(kube, self.bucket), lag
        count = workers or (flags.workers if flags and flags.workers_set else None)
        each = {"workers": count} if count else {}
        self.composite = CompositeController(_own_client(self.kube), hooks, composite, **each)
        self.decorator = DecoratorController(_own_client(self.kube), hooks, decorator, **each)
        self.factory: InformerFactory | None = None

    def start(self, *, resync_period: float | None = None, lag: float | None = None) -> Metacontroller:
        if resync_period is not None:
            self.resync_period = resync_period
        if lag is not None:
            self.lag = lag
        self.factory = InformerFactory(_own_client(self.kube), resync_period=self.resync_period, lag=self.lag)
        self.composite.start(self.factory)
        self.decorator.start(self.factory)
        return self

    def stop(self) -> None:
        self.composite.stop()
        self.decorator.stop()
        if self.factory is not None:
            self.factory.stop()
            self.factory = None

    def __enter__(self) -> Metacontroller:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _own_client(kube: Kube, bucket: TokenBucket | None = None) -> Kube:
    """The same identity (and limiter) on its own connection pool (the dynamic client is not shared across
    threads); with `bucket`, throttled by it."""
    if bucket is None and isinstance(kube.api, ThrottledApiClient):
        bucket = kube.api.bucket
    config = kube.api.configuration
    api = ThrottledApiClient(config, bucket) if bucket else client.ApiClient(configuration=config)
    return Kube(api, field_manager=kube.field_manager)
