"""Release node copies whose Node is gone, so deleting a ModelCache always finishes.

A ModelCacheNode carries the node agent's finalizer until that agent has removed
the copy from its disk. When the Node itself is deleted (the autoscaler removed
it), no agent is left to do that, and the ModelCache's finalize hook would wait
for ever: Metacontroller has no timeout. So praesto-hooks, the one process that
runs anyway, releases them: a ModelCacheNode being deleted whose `spec.nodeName`
names no Node loses the agent finalizer.

Why this is safe: only a Node that no longer exists is released, the patch is
conditional on the object's resourceVersion (two replicas never fight), and a
node that comes back under the same name cleans copies no ModelCacheNode owns
when its agent starts. `orphaned` is the pure decision; `OrphanReleaser` is the edge.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from praesto.listwatch import ListWatch
from praesto.reflector import Reflector, identity_only

log = logging.getLogger(__name__)
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

    def __init__(self, api: client.ApiClient, resync: int = RESYNC_SECONDS) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.resync = resync
        self.stopped = threading.Event()
        # Copies released, each once: both watches may release the same copy at once, and the API
        # server lets every racing removal of the last finalizer succeed (the later ones find the
        # object gone and answer 200 all the same), so a copy is counted by its uid.
        self.released = 0
        self._counted: dict[str, None] = {}  # uids of the last RELEASED_REMEMBERED copies released
        self._count_lock = threading.Lock()
        copies = ListWatch(
            self.custom.list_cluster_custom_object, names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL
        )
        nodes = ListWatch(self.core.list_node)
        self.watches: list[Reflector] = []
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
        except ApiException as err:
            if err.status == 404:
                return False
            raise
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
            except ApiException as err:
                if err.status in (404, 409):  # gone already, or changed: the next event decides again
                    continue
                raise
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
        for reflector in self.watches:
            reflector.start()
        return self


def main() -> None:
    """`python -m praesto.hooks.orphans`: what `praesto-hooks --release-orphaned-copies` runs beside gunicorn."""
    import signal

    from praesto.listwatch import api_client_from_environment

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    releaser = OrphanReleaser(api_client_from_environment()).start()
    signal.signal(signal.SIGTERM, lambda *_: releaser.stopped.set())
    releaser.stopped.wait()


if __name__ == "__main__":
    main()
