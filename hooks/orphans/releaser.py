"""Release node copies whose Node is gone, so deleting a ModelCache always finishes.

A ModelCacheNode carries the node agent's finalizer until that agent has removed
the copy from its disk. When the Node itself is deleted (the autoscaler removed
it), no agent is left to do that, and the ModelCache's finalize hook would wait
for ever: Metacontroller has no timeout. So praesto-orphans, a Deployment of its
own, releases them: a ModelCacheNode being deleted whose `spec.nodeName`
names no Node loses the agent finalizer.

Why this is safe: only a Node that no longer exists is released, the patch is
conditional on the object's resourceVersion (two replicas never fight), and a
node that comes back under the same name cleans copies no ModelCacheNode owns
when its agent starts. `orphaned` is the pure decision; `OrphanReleaser` is the edge, its
calls through the hooks' door (hooks/kube.py). praesto-orphans (cli.py) runs it as its own
process: the chart's `<fullname>-orphans` Deployment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from praesto.hooks.kube import ApiClient, Conflict, Door, NotFound

from praesto import names
from praesto.listwatch import ListWatch
from praesto.reflector import Reflector, identity_only

log = logging.getLogger("praesto.hooks.orphans")  # its name before it was a package
Obj = dict[str, Any]
RESYNC_SECONDS = 600  # every copy is looked at again (a full list) this often
RELEASED_REMEMBERED = 4096  # released copies' uids kept, to count each copy once


def orphaned(
    copies: Iterable[Mapping[str, Any]], node_exists: Callable[[str], bool]
) -> list[Mapping[str, Any]]:
    """The ModelCacheNodes being deleted, held by the agent's finalizer, whose Node is gone."""
    out = []
    for copy in copies:
        meta = copy.get("metadata") or {}
        if not meta.get("deletionTimestamp") or names.FINALIZER_NODE_AGENT not in (
            meta.get("finalizers") or []
        ):
            continue
        node = (copy.get("spec") or {}).get("nodeName")
        if isinstance(node, str) and node and not node_exists(node):
            out.append(copy)
    return out


def release_patch(copy: Mapping[str, Any]) -> Obj:
    """A merge patch dropping only the agent's finalizer, refused if the object changed since it was read."""
    meta = copy["metadata"]
    kept = [f for f in meta.get("finalizers") or [] if f != names.FINALIZER_NODE_AGENT]
    return {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}


class OrphanReleaser:
    """Two reflectors (praesto.reflector): ModelCacheNodes (a copy marked for deletion whose Node is
    gone is released at once) and Nodes (a deleted Node releases its copies already marked; one that
    vanished while the watch was down counts as deleted). Every `resync` seconds the copies are listed
    again and each looked at anew; a release that failed on an API error comes back with its event.
    """

    def __init__(self, api: ApiClient | None = None, resync: int = RESYNC_SECONDS) -> None:
        door = Door(api)
        self.custom = door.custom
        self.core = door.core
        self.resync = resync
        self.stopped = threading.Event()
        # Copies released, each once: both watches may release the same copy at once, and the API
        # server lets every racing removal of the last finalizer succeed (the later ones find the
        # object gone and answer 200 all the same), so a copy is counted by its uid.
        self.released = 0
        self._counted: dict[str, None] = {}  # uids of the last RELEASED_REMEMBERED copies released
        self._count_lock = threading.Lock()
        copies = ListWatch(
            door.list_call(door.custom, "list_cluster_custom_object"),
            names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL,
        )  # fmt: skip
        nodes = ListWatch(door.list_call(door.core, "list_node"))
        self.watches: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        for kind, edge, handle in (
            (names.MODELCACHENODE_KIND, copies, self.on_copy),
            ("Node", nodes, self.on_node),
        ):
            reflector = Reflector(
                kind, edge.list, edge.watch, on_event=handle, transform=identity_only, stop=self.stopped,
                hang_up=edge.hang_up, relist_every=resync, logger=log,
            )  # fmt: skip
            self.watches.append(reflector)

    def node_exists(self, name: str) -> bool:
        try:
            self.core.read_node(name)
        except NotFound:
            return False
        return True

    def release(self, copies: Iterable[Mapping[str, Any]], node_exists: Callable[[str], bool]) -> int:
        released = 0
        for copy in orphaned(copies, node_exists):
            meta = copy["metadata"]
            try:
                self.custom.patch_namespaced_custom_object(
                    names.GROUP, names.VERSION, meta["namespace"], names.MODELCACHENODE_PLURAL,
                    meta["name"], release_patch(copy),
                )  # fmt: skip
            except (NotFound, Conflict):  # gone already, or changed: the next event decides again
                continue
            if not self._first_release(str(meta.get("uid") or f"{meta['namespace']}/{meta['name']}")):
                continue  # the other watch released it a moment ago
            released += 1
            log.info(
                "released node copy %s/%s: node %s no longer exists",
                meta["namespace"], meta["name"], copy["spec"]["nodeName"],
            )  # fmt: skip
        return released

    def _first_release(self, uid: str) -> bool:
        with self._count_lock:
            if uid in self._counted:
                return False
            self._counted[uid] = None
            if len(self._counted) > RELEASED_REMEMBERED:
                del self._counted[next(iter(self._counted))]
            self.released += 1
            return True

    def on_copy(self, event_type: str, copy: Obj) -> None:
        if event_type != "DELETED":
            self.release([copy], self.node_exists)

    def on_node(self, event_type: str, node: Obj) -> None:
        if event_type != "DELETED":
            return
        name = str(node["metadata"]["name"])
        listed = self.custom.list_cluster_custom_object(
            names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL,
            label_selector=f"{names.LABEL_NODE}={names.node_label_value(name)}",
        )  # fmt: skip
        self.release(
            listed.get("items") or [], lambda node_name: node_name != name and self.node_exists(node_name)
        )

    def start(self) -> OrphanReleaser:
        """Each reflector on a daemon thread of ours, so `running` can tell one that ended."""
        for reflector in self.watches:
            thread = threading.Thread(
                target=reflector.run, name=f"praesto-watch-{reflector.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return self

    def running(self) -> bool:
        """Started, not stopped, and every watch thread still alive (what the heartbeat vouches for)."""
        return bool(self._threads) and not self.stopped.is_set() and all(t.is_alive() for t in self._threads)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every watch now (each hangs up its open connection) and wait for its thread."""
        self.stopped.set()
        for reflector in self.watches:
            reflector.stop(0)
        for thread in self._threads:
            thread.join(timeout)
