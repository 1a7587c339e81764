"""The origin budget's door to the Kubernetes API: Leases in the release namespace, as dicts.

Exactly the calls `praesto.rbac.AGENT_ORIGIN_BUDGET` grants: list and watch (by the
budget's label), get, create and update Leases in one namespace. A write carrying the
resourceVersion it read answers 409 when another node wrote first: `write`
returns None then, and the caller reads again. No call here retries by itself.

`list()` answers from a watch of the budget's Leases (praesto/watched.py), started by the
first `list()` and stopped by `stop_watch()` when the node neither holds nor waits for a
slot: a node waiting for its turn, or renewing what it holds, reads from memory and is
woken by the next change (`wait`), instead of listing every `pollSeconds`. After a
conflict, the next `list()` first waits (at most `CONFLICT_SECONDS`) for the change that
beat it, so the caller does not write again from the same stale copy. After its own
write, `list()` answers only once the watch delivered that write (`caught_up`): a watch
sends events in resourceVersion order, so the answer holds every write made before it,
as a direct list would (slots.py's bound on pullers relies on exactly that).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from praesto.agent.budget.slots import Lease

from praesto import names
from praesto.kubeerrors import Conflict, Groups, NotFound
from praesto.listwatch import ListWatch
from praesto.watched import SYNC_SECONDS, WatchedSet, resource_version

_TYPE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
CONFLICT_SECONDS = 1.0  # after a 409, how long `list()` waits for the watch to bring the newer Lease


class LeaseApi:
    def __init__(self, api: Groups, namespace: str) -> None:
        self.leases = api.coordination  # calls raise praesto.kubeerrors' errors
        self.namespace = namespace
        self.watched = WatchedSet(
            f"origin budget Leases in {namespace}",
            ListWatch(
                self.leases.unmapped.list_namespaced_lease,
                namespace,
                label_selector=names.LABEL_ORIGIN_BUDGET,
            ),
            key=(namespace, ""),
        )
        self._conflicted: int | None = None  # the watch's version when a write last lost a race
        self._written = 0  # resourceVersion of this node's last write: `list` answers only after it

    @property
    def version(self) -> int:
        """Changes with every Lease change the watch brings (compare, then `wait`)."""
        return self.watched.version

    def wait(self, seen: int, timeout: float, cancel: threading.Event) -> bool:
        """Until a budget Lease changes after `version` `seen`, `timeout` passes, or `cancel` (True)."""
        return self.watched.wait(seen, timeout, cancel)

    def stop_watch(self) -> None:
        """Nothing on this node holds or waits for a slot: close the watch (the next `list` opens it)."""
        self.watched.stop()
        self._written = 0

    def list(self) -> dict[str, Lease]:
        """Every budget Lease (slots and hosts) by name: from the watch; one direct list while
        the watch cannot be trusted (not listed yet after `SYNC_SECONDS`, or unanswered)."""
        self.watched.start()
        conflicted, self._conflicted = self._conflicted, None
        if conflicted is not None:
            self.watched.wait_change(conflicted, CONFLICT_SECONDS)
        if self.watched.fresh(SYNC_SECONDS) and self.watched.caught_up(self._written, CONFLICT_SECONDS):
            return {str(o["metadata"]["name"]): o for o in self.watched.items()}
        return self.list_now()

    def cached(self, name: str) -> Lease | None:
        """One Lease: from the watch when it runs and can be trusted, else by a direct get."""
        if self.watched.running and self.watched.fresh():
            return self.watched.get((self.namespace, name))
        return self.get(name)

    def list_now(self) -> dict[str, Lease]:
        """Every budget Lease by name, by one direct list request."""
        resp = self.leases.list_namespaced_lease(
            self.namespace, label_selector=names.LABEL_ORIGIN_BUDGET, _preload_content=False
        )
        items: list[Lease] = json.loads(resp.data).get("items") or []
        return {str(o["metadata"]["name"]): o for o in items}

    def get(self, name: str) -> Lease | None:
        try:
            resp = self.leases.read_namespaced_lease(name, self.namespace, _preload_content=False)
        except NotFound:
            return None
        lease: Lease = json.loads(resp.data)
        return lease

    def write(self, body: Lease) -> Lease | None:
        """Create (no resourceVersion) or update (with it) `body`; None when another writer came first."""
        meta: dict[str, Any] = body["metadata"]
        full = {**_TYPE, **body, "metadata": {**meta, "namespace": self.namespace}}
        try:
            if meta.get("resourceVersion"):
                resp = self.leases.replace_namespaced_lease(
                    meta["name"], self.namespace, full, _preload_content=False
                )
            else:
                resp = self.leases.create_namespaced_lease(self.namespace, full, _preload_content=False)
        except Conflict:  # a stale resourceVersion, or AlreadyExists (created meanwhile)
            self._conflicted = self.watched.version
            return None
        written: Lease = json.loads(resp.data)
        self._written = max(self._written, resource_version(written))
        self.watched.keep(written)
        return written
