"""`praesto uninstall-check`: the chart's pre-delete hook, so `helm uninstall` finishes or refuses.

Removing the release while ModelCaches exist would take the node agents away first; every
ModelCacheNode carries their finalizer, so each one and its ModelCache would then be stuck for
good, and the copies would stay on the nodes. The hook runs before Helm removes anything
(Helm v4.3.2 pkg/action/uninstall.go: `execHook(rel, release.HookPreDelete, ...)` comes before
`deleteRelease`; a failed hook returns there) and:

* no ModelCache: succeeds, and Helm removes the release;
* ModelCaches and `uninstall.deleteModelCaches` off: fails, naming them and how to proceed;
  Helm prints this command's output (`helm.sh/hook-output-log-policy: hook-failed`, copied
  from the Job's Pod by pkg/action/hooks.go `outputLogsByPolicy`);
* `uninstall.deleteModelCaches` on: deletes every ModelCache, waits until no ModelCache and
  no ModelCacheNode is left (the agents have removed every copy and their finalizers) and no
  Node carries a readiness label of a cache (the DecoratorController took them off: the hooks it
  calls go with the release), then succeeds; past `--wait-seconds` it fails naming what is left.

`decide` and the messages are pure (the list of ModelCaches in, the verdict out); `main` is the
thin Kubernetes edge.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from praesto.hooks.kube import ApiClient, APIError, Door, NoApiConfig, NotFound, configured_client, unanswered

from praesto import names
from praesto.cliargs import CommandParser, add_version, positive_int

Obj = dict[str, Any]
DELETE_VALUE = "uninstall.deleteModelCaches"  # the chart value that turns --delete-model-caches on
LISTED = 20  # caches named in a message; the rest are counted
POLL_SECONDS = 2.0
EXIT_OK, EXIT_REFUSED, EXIT_TEMPORARY = 0, 1, 75
PLURAL_CLI = f"{names.MODELCACHE_PLURAL}.{names.GROUP}"  # what kubectl is told (unambiguous)


@dataclass(frozen=True)
class Cache:
    """One ModelCache as the hook sees it."""

    namespace: str
    name: str
    phase: str
    deleting: bool

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class CacheNode:
    """One ModelCacheNode left while waiting: whose copy, where, and what its agent says."""

    namespace: str
    cache: str
    node: str
    message: str


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    revision: int  # the revision this hook was rendered at: rolling back to it changes nothing


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    message: str
    to_delete: tuple[Cache, ...] = ()

    @property
    def proceed(self) -> bool:
        return self.exit_code == EXIT_OK


def cache_of(obj: Obj) -> Cache:
    meta = obj.get("metadata") or {}
    phase = str((obj.get("status") or {}).get("phase") or "Pending")
    return Cache(str(meta.get("namespace", "")), str(meta.get("name", "")), phase,
                 bool(meta.get("deletionTimestamp")))  # fmt: skip


def cache_node_of(obj: Obj) -> CacheNode:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    return CacheNode(
        str(meta.get("namespace", "")),
        str(labels.get(names.LABEL_MODEL_CACHE, "")),
        str(spec.get("nodeName") or labels.get(names.LABEL_NODE, "")),
        str(status.get("message") or ""),
    )


def listing(refs: Sequence[str], limit: int = LISTED) -> str:
    """`refs` sorted, comma-separated; past `limit`, a count of the rest."""
    shown = ", ".join(sorted(refs)[:limit])
    return (
        shown if len(refs) <= limit else f"{shown} and {len(refs) - limit} more (kubectl get {PLURAL_CLI} -A)"
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def refusal(caches: Sequence[Cache], release: Release) -> str:
    """Why the uninstall is refused and the two ways on, with the commands to paste.

    One line: Helm v4.3.2 copies the hook's log through the standard logger, which its slog
    handler prints as one record per chunk read, `\\n` escaped (pkg/cmd/root.go hookOutputWriter)."""
    ns = f"--namespace {release.namespace}"
    n = len(caches)
    return (
        f"praesto uninstall-check: refusing to uninstall {release.name}, nothing was removed: "
        f"{_count(n, 'ModelCache')} still {'exists' if n == 1 else 'exist'} ({listing([c.ref for c in caches])}), "
        "and removing the node agents now would leave the ModelCaches, their ModelCacheNodes and the "
        "copies on the nodes stuck on the agents' finalizers. Either delete them, wait until they are "
        f"gone (kubectl delete {PLURAL_CLI} --all --all-namespaces --wait) and run helm uninstall again; "
        "or let the uninstall delete them all (it waits for Pods still reading them to end): "
        f"`helm rollback {release.name} {release.revision} {ns}` (Helm now lists the release as "
        f"'uninstalling', which helm upgrade refuses; revision {release.revision} is the one this check came "
        f"with, so nothing else changes), then `helm upgrade {release.name} CHART {ns} --reuse-values "
        f"--set {DELETE_VALUE}=true` (CHART: the chart you installed), then `helm uninstall {release.name} {ns}`."
    )


def decide(caches: Sequence[Cache], *, delete_all: bool, release: Release) -> Verdict:
    """What the hook does about the ModelCaches that exist now."""
    if not caches:
        return Verdict(EXIT_OK, f"praesto uninstall-check: no ModelCache exists; {release.name} can go.")
    if not delete_all:
        return Verdict(EXIT_REFUSED, refusal(caches, release))
    fresh = tuple(c for c in caches if not c.deleting)
    return Verdict(
        EXIT_OK,
        f"praesto uninstall-check: {DELETE_VALUE} is on: deleting {_count(len(caches), 'ModelCache')} "
        f"({listing([c.ref for c in caches])}) and waiting until the node agents have removed every copy.",
        fresh,
    )


def leftovers(caches: Sequence[Cache], nodes: Sequence[CacheNode]) -> str:
    """What is still there: each ModelCache, and each copy with its agent's own message."""
    parts = [f"{c.ref} ({c.phase}{', deleting' if c.deleting else ''})" for c in sorted(caches, key=str)]
    for n in sorted(nodes, key=lambda n: (n.namespace, n.cache, n.node)):
        parts.append(f"copy of {n.namespace}/{n.cache} on {n.node}: {n.message or 'no message yet'}")
    return "; ".join(parts[:LISTED]) + (f"; and {len(parts) - LISTED} more" if len(parts) > LISTED else "")


def timed_out(
    caches: Sequence[Cache],
    nodes: Sequence[CacheNode],
    labelled: Sequence[str],
    waited: float,
    release: Release,
) -> str:
    labels = f"; readiness labels still on Node {', '.join(sorted(labelled))}" if labelled else ""
    return (
        f"praesto uninstall-check: after {waited:.0f}s, {_count(len(caches), 'ModelCache')} and "
        f"{_count(len(nodes), 'node copy')} are still being removed, nothing of {release.name} was removed: "
        f"{leftovers(caches, nodes)}{labels}. A copy that a running Pod still mounts goes when that Pod "
        "ends: delete those Pods (or wait for them), then run helm uninstall again; the deletion goes on "
        "meanwhile. A copy on a node whose agent is not running stays until the agent is back "
        "(docs/user-guide.md, reason Deleting)."
    )


# ---- the Kubernetes edge ------------------------------------------------------------------


class Cluster:
    """ModelCaches and ModelCacheNodes through the API, with the hook's ServiceAccount."""

    def __init__(self, api: ApiClient) -> None:
        self.door = Door(api)
        self.custom = self.door.custom

    def caches(self) -> list[Cache]:
        listed = self.custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.MODELCACHE_PLURAL)
        return [cache_of(o) for o in listed.get("items") or []]

    def cache_nodes(self) -> list[CacheNode]:
        plural = names.MODELCACHENODE_PLURAL
        listed = self.custom.list_cluster_custom_object(names.GROUP, names.VERSION, plural)
        return [cache_node_of(o) for o in listed.get("items") or []]

    def labelled_nodes(self) -> list[str]:
        """Nodes still carrying a readiness label of a cache (names.READY_LABEL_PREFIX)."""
        listed = self.door.core.list_node().items
        return [n.metadata.name for n in listed if any(k.startswith(names.READY_LABEL_PREFIX)
                                                       for k in n.metadata.labels or {})]  # fmt: skip

    def delete(self, cache: Cache) -> None:
        with contextlib.suppress(NotFound):  # gone already
            self.custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, cache.namespace, names.MODELCACHE_PLURAL, cache.name
            )


def run(
    cluster: Cluster,
    *,
    delete_all: bool,
    release: Release,
    wait_seconds: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    verdict = decide(cluster.caches(), delete_all=delete_all, release=release)
    say(verdict.message)
    if not verdict.proceed or not delete_all:
        return verdict.exit_code
    for cache in verdict.to_delete:
        cluster.delete(cache)
    start = clock()
    while True:
        caches, nodes, labelled = cluster.caches(), cluster.cache_nodes(), cluster.labelled_nodes()
        if not caches and not nodes and not labelled:
            say(f"praesto uninstall-check: every ModelCache and copy is gone after {clock() - start:.0f}s.")
            return EXIT_OK
        if clock() - start >= wait_seconds:
            say(timed_out(caches, nodes, labelled, clock() - start, release))
            return EXIT_REFUSED
        sleep(POLL_SECONDS)


def parser() -> CommandParser:
    p = CommandParser(
        prog="praesto uninstall-check",
        description="The chart's pre-delete hook: refuse `helm uninstall` while ModelCaches exist, "
        f"or delete them all and wait until their copies are gone ({DELETE_VALUE}).",
    )
    add_version(p)
    p.add_argument("--release", required=True, help="the Helm release being uninstalled")
    p.add_argument("--namespace", required=True, help="the release's namespace")
    p.add_argument("--revision", type=positive_int, required=True,
                   help="the release revision the hook was rendered at (printed in the rollback line)")  # fmt: skip
    p.add_argument("--delete-model-caches", action="store_true",
                   help=f"delete every ModelCache and wait for them (chart: {DELETE_VALUE})")  # fmt: skip
    p.add_argument("--wait-seconds", type=positive_int, default=240,
                   help="how long to wait for the ModelCaches to be gone (chart: uninstall.waitSeconds)")  # fmt: skip
    return p


def kube_client() -> ApiClient:
    """In-cluster (the hook's Pod), else KUBECONFIG / ~/.kube/config (a developer's run)."""
    return configured_client()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    release = Release(args.release, args.namespace, args.revision)

    def say(text: str) -> None:
        print(text, flush=True)

    try:
        cluster = Cluster(kube_client())
        return run(cluster, delete_all=args.delete_model_caches, release=release,
                   wait_seconds=args.wait_seconds, say=say)  # fmt: skip
    except NoApiConfig as err:
        say(f"praesto uninstall-check: no Kubernetes client configuration ({err}); run it in the cluster")
        return EXIT_REFUSED
    except APIError as err:
        if unanswered(err):
            say(f"praesto uninstall-check: cannot reach the API server ({err}); try helm uninstall again")
            return EXIT_TEMPORARY
        transient = err.status is None or err.status >= 500 or err.status == 429
        say(f"praesto uninstall-check: the API server answered {err.status} {err.reason}; "
            + ("try helm uninstall again" if transient else "check the hook's RBAC (templates/uninstall-hook.yaml)"))  # fmt: skip
        return EXIT_TEMPORARY if transient else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
