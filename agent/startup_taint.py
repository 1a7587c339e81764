"""Warm before schedulable: lift the node's startup taint once its warm-required caches are on disk.

A node that joins with the startup taint (`nodeAgent.startupTaint.key`, set by
the admin through the node pool or the kubelet's `--register-with-taints`)
takes no Pods that do not tolerate it. The agent on that node lifts the taint
once every local-mode ModelCache with `spec.warmNewNodes: true` whose
nodeSelector selects the node is complete in this node's store, or at the
deadline (counted from the Node's creation) with Events naming the caches that
were not ready.

Holding every new node is a cluster-wide power, so only caches in the namespaces
the platform admin lists (`nodeAgent.startupTaint.namespaces`, none by default)
hold nodes, and never one that cannot complete: a cache whose spec is invalid,
that the sync hook refused (`REFUSED`), or that is Failed (#21 item 8). The Node's
Events name the caches it waits for: they are the admin's own choice. Which caches are required is read from the ModelCaches
themselves (list, read-only), not from the ModelCacheNodes: those are created
by Metacontroller some time after the node joins, and lifting the taint before
they exist would defeat the point.

The decision is pure (`decide`); `StartupTaint` is the thin edge that reads the
Node and the ModelCaches, patches the Node, and writes Events. The chart's
ValidatingAdmissionPolicy lets the agent change nothing on a Node but remove
this one taint from its own Node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from praesto.agent.kube import Door, KubeApi, short_error

from praesto import names
from praesto.spec import InvalidSpec, parse_spec

Obj = dict[str, Any]
CacheKey = tuple[str, str]  # (namespace, name)
log = logging.getLogger("praesto.agent.startup_taint")

REASON_WARM = "ModelsWarm"
REASON_DEADLINE = names.REASON_WARM_DEADLINE
REASON_WAITING = "WaitingForWarmCaches"
# Ready-condition reasons of a cache that gets no copies at all (hooks/modelcache.py: invalid, refused)
REFUSED = ("InvalidSpec", "QuotaExceeded")


@dataclass(frozen=True)
class Decision:
    lift: bool
    reason: str = ""  # REASON_WARM or REASON_DEADLINE when lifting
    waiting_for: tuple[CacheKey, ...] = ()  # required caches not complete here


def has_taint(node: Mapping[str, Any], key: str) -> bool:
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or ())


def without_taint(node: Mapping[str, Any], key: str) -> list[Obj]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != key]


def can_complete(cache: Mapping[str, Any]) -> bool:
    """Not Failed, and not refused by the sync hook: a cache that will never have a copy must not hold."""
    status = cache.get("status") or {}
    if status.get("phase") == names.PHASE_FAILED:
        return False
    return not any(
        c.get("type") == "Ready" and c.get("status") == "False" and c.get("reason") in REFUSED
        for c in status.get("conditions") or ()
    )


def warm_required(
    caches: Iterable[Mapping[str, Any]], node_labels: Mapping[str, str], namespaces: Collection[str]
) -> list[CacheKey]:
    """Local-mode caches with warmNewNodes, in a namespace the admin allows to hold new nodes, that
    can complete and whose nodeSelector selects a node with these labels.

    A cache whose spec does not parse is skipped: the sync hook reports it as Failed, and
    no copy of it will ever be made here, so waiting for it would only hold the node.
    """
    out: list[CacheKey] = []
    for cache in caches:
        meta = cache.get("metadata") or {}
        if (
            meta.get("deletionTimestamp")
            or meta.get("namespace") not in namespaces
            or not can_complete(cache)
        ):
            continue
        try:
            spec = parse_spec(cache.get("spec"))
        except InvalidSpec:
            continue
        if not spec.warm_new_nodes or spec.mode != names.MODE_NODE:
            continue
        if all(node_labels.get(k) == v for k, v in spec.node_selector.items()):
            out.append((str(meta.get("namespace")), str(meta.get("name"))))
    return sorted(out)


def named(keys: Iterable[CacheKey]) -> str:
    return ", ".join(f"{ns}/{name}" for ns, name in keys)


def decide(
    required: Iterable[CacheKey],
    complete: Callable[[str, str], bool],
    age_seconds: float,
    deadline_seconds: float,
) -> Decision:
    waiting = tuple(key for key in required if not complete(*key))
    if not waiting:
        return Decision(True, REASON_WARM)
    if age_seconds >= deadline_seconds:
        return Decision(True, REASON_DEADLINE, waiting)
    return Decision(False, waiting_for=waiting)


def node_age_seconds(node: Mapping[str, Any], now: float) -> float:
    created = (node.get("metadata") or {}).get("creationTimestamp")
    if isinstance(created, datetime):
        return now - created.timestamp()
    if isinstance(created, str) and created:
        return now - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    return 0.0


class StartupTaint:
    """Polls until this node's startup taint is gone (lifted by us or by anyone), then stops."""

    def __init__(
        self,
        api: Door,
        kube: KubeApi,
        node_name: str,
        key: str,
        deadline_seconds: float,
        complete: Callable[[str, str], bool],
        namespaces: Collection[str] = (),
        interval: float = 2.0,
    ) -> None:
        self.api = api
        self.core = api.core  # calls raise praesto.kubeerrors' errors
        self.custom = api.custom
        self.kube = kube
        self.node_name = node_name
        self.key = key
        self.deadline_seconds = deadline_seconds
        self.complete = complete
        self.namespaces = tuple(sorted(set(namespaces)))  # chart nodeAgent.startupTaint.namespaces
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-taint", daemon=True)
        self.lifted: Decision | None = None
        self._announced: tuple[CacheKey, ...] | None = None
        self._last_problem = ""

    def start(self) -> StartupTaint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.step():
                    return
            except Exception as err:  # the API server may be away; the taint waits, the agent works on
                problem = short_error(err)
                if problem != self._last_problem:  # said once per distinct problem, not every tick
                    self._last_problem = problem
                    log.warning("startup taint: %s; retrying every %gs", problem, self.interval)
            self._stop.wait(self.interval)

    def step(self) -> bool:
        """One look; True when there is nothing left to do (no taint on the node)."""
        node: Obj = self.api.sanitize(self.core.read_node(self.node_name))
        if not has_taint(node, self.key):
            return True
        labels = (node.get("metadata") or {}).get("labels") or {}
        caches: list[Obj] = []
        for namespace in self.namespaces:  # only the namespaces that may hold new nodes are read
            listed = self.custom.list_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.MODELCACHE_PLURAL
            )
            caches.extend(listed.get("items") or [])
        required = warm_required(caches, labels, self.namespaces)
        decision = decide(required, self.complete, node_age_seconds(node, time.time()), self.deadline_seconds)
        if not decision.lift:
            if decision.waiting_for != self._announced:
                self._announced = decision.waiting_for
                message = (
                    f"keeping the startup taint {self.key} until these warm-required caches are on disk: "
                    f"{named(decision.waiting_for)} (at most {self.deadline_seconds:g}s after the Node joined)"
                )
                log.info(message)
                self._node_event(node, "Normal", message, REASON_WAITING)
            return False
        self._lift(node, decision)
        return True

    def _lift(self, node: Obj, decision: Decision) -> None:
        body = {
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": without_taint(node, self.key) or None},
        }
        self.core.patch_node(self.node_name, body)  # 409 on a concurrent change: the next step retries
        self.lifted = decision
        if decision.reason == REASON_WARM:
            message = f"every warm-required model cache is on disk; removed the startup taint {self.key}"
            self._node_event(node, "Normal", message, decision.reason)
            log.info(message)
            return
        message = (
            f"removed the startup taint {self.key} at the deadline of {self.deadline_seconds:g}s with "
            f"{len(decision.waiting_for)} warm-required cache(s) not ready: {named(decision.waiting_for)}; "
            "Pods may start before their model is on disk. Raise nodeAgent.startupTaint.deadlineSeconds "
            "or see each ModelCache's Events"
        )
        self._node_event(node, "Warning", message, decision.reason)
        log.warning(message)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for namespace, cache in decision.waiting_for:
            # the copy's record, which the sync hook turns into the WarmBeforeSchedulable condition
            copy = names.modelcachenode_name(cache, self.node_name)
            try:
                self.kube.patch_status(
                    namespace, copy, {"startupTaint": {"reason": decision.reason, "time": stamp}}
                )
            except Exception as err:  # the Events below still say it
                log.warning(
                    "startup taint: could not record it on %s/%s: %s", namespace, copy, short_error(err)
                )
            self.kube.event(
                namespace,
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.MODELCACHE_KIND,
                    "name": cache,
                    "namespace": namespace,
                },
                "Warning",
                decision.reason,
                f"node {self.node_name} stopped waiting for this cache after {self.deadline_seconds:g}s and "
                "now takes Pods; check this cache's status for why its copy there is not Ready",
            )

    def _node_event(self, node: Obj, type_: str, message: str, reason: str) -> None:
        involved = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": node["metadata"].get("uid"),
        }
        self.kube.event("default", involved, type_, reason, message)
