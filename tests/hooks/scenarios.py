"""Named hook scenarios: the requests behind the golden files (tests/hooks/golden/)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from praesto import names
from testkit.hook_objects import (
    COMMIT,
    SEED_LOCAL_SPEC,
    SEED_PVC_SPEC,
    Obj,
    cache_node,
    consumer,
    customize_request,
    job,
    mcn,
    modelcache,
    node,
    node_status,
    pvc,
    sync_request,
)

CACHE = "tinyllama"
RWX = "tinyllama-rwx"
NODES = [cache_node("node-a"), cache_node("node-b"), node("node-c")]
SIZE = 2_200_000_000


def _pvc_parent(status: Obj | None = None, ttl: str | None = None) -> Obj:
    spec = copy.deepcopy(SEED_PVC_SPEC)
    if ttl:
        spec["eviction"] = {"unusedTTL": ttl}
    return modelcache(RWX, spec, status)


def _with_token() -> Obj:
    spec = copy.deepcopy(SEED_LOCAL_SPEC)
    spec["source"]["huggingface"]["token"] = {"secretRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    return modelcache(CACHE, spec)


def _pvc_with_token() -> Obj:
    spec = copy.deepcopy(SEED_PVC_SPEC)
    spec["source"]["huggingface"]["token"] = {"secretRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    spec["downloader"] = {"image": "registry.example/praesto:custom", "resources": {"limits": {"cpu": "2"}}}
    return modelcache(RWX, spec)


_ready_before: Obj = {"phase": "Ready", "readyNodes": 2, "totalNodes": 2, "resolvedRevision": COMMIT}
_evicted_status: Obj = {"phase": names.PHASE_EVICTED, "lastUsedTime": "2026-11-30T10:00:00Z"}


def _disk_full() -> Obj:
    return node_status(
        "Failed",
        message="only 1.0 GiB free in /var/praesto, 2.0 GiB needed",
        conditions=[{"type": "Ready", "status": "False", "reason": "InsufficientDiskSpace"}],
    )


SCENARIOS: dict[str, tuple[str, Callable[[], Obj]]] = {
    # customize
    "customize-local-seed": ("customize", lambda: customize_request(modelcache(CACHE))),
    "customize-pvc-seed": ("customize", lambda: customize_request(_pvc_parent())),
    # local mode: node set
    "local-seed-first-sync": ("sync", lambda: sync_request(modelcache(CACHE), nodes=NODES)),
    "local-node-added": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=[*NODES, cache_node("node-d")],
            children=[mcn(CACHE, "node-a", node_status("Ready", SIZE, SIZE, sizeBytes=SIZE))],
        ),
    ),
    "local-node-removed": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=[cache_node("node-a"), node("node-b")],
            children=[
                mcn(CACHE, "node-a", node_status("Ready", SIZE, SIZE, sizeBytes=SIZE)),
                mcn(CACHE, "node-b", node_status("Ready", SIZE, SIZE, sizeBytes=SIZE)),
            ],
        ),
    ),
    "local-demand-node": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=NODES,
            pods=[
                consumer(CACHE, "app-1", "node-c"),
                consumer(
                    CACHE, "app-2", "ip-10-0-0-1.eu-west-1.compute.internal-autoscaled-node-with-a-long-name"
                ),
                consumer(CACHE, "unscheduled"),
                consumer(CACHE, "finished", "node-z", phase="Succeeded"),
            ],
        ),
    ),
    "local-no-nodes-match": ("sync", lambda: sync_request(modelcache(CACHE), nodes=[node("node-c")])),
    "local-all-nodes-no-selector": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE, {**SEED_LOCAL_SPEC, "nodeSelector": {}}),
            nodes=[node("node-c"), {**node("gone"), "metadata": {"name": "gone", "deletionTimestamp": "x"}}],
        ),
    ),
    # local mode: phases
    "local-pending": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE), nodes=NODES, children=[mcn(CACHE, "node-a"), mcn(CACHE, "node-b")]
        ),
    ),
    "local-downloading": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=NODES,
            children=[
                mcn(CACHE, "node-a", node_status("Downloading", 900_000_000, SIZE, resolvedRevision=COMMIT)),
                mcn(CACHE, "node-b", node_status("Pending")),
            ],
        ),
    ),
    "local-ready-pins-revision": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE, status=_ready_before),
            nodes=NODES,
            children=[
                mcn(
                    CACHE,
                    "node-a",
                    node_status(
                        "Ready",
                        SIZE,
                        SIZE,
                        sizeBytes=SIZE,
                        resolvedRevision=COMMIT,
                        lastUsedTime="2026-12-01T11:00:00Z",
                    ),
                ),
                mcn(
                    CACHE,
                    "node-b",
                    node_status(
                        "Ready",
                        SIZE,
                        SIZE,
                        sizeBytes=SIZE,
                        resolvedRevision=COMMIT,
                        lastUsedTime="2026-12-01T11:30:00Z",
                    ),
                ),
            ],
        ),
    ),
    "local-one-node-failed": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=NODES,
            children=[
                mcn(CACHE, "node-a", node_status("Ready", SIZE, SIZE, sizeBytes=SIZE)),
                mcn(
                    CACHE,
                    "node-b",
                    node_status(
                        "Failed",
                        message="only 1.0 GiB free in /var/praesto, 2.0 GiB needed",
                        conditions=[{"type": "Ready", "status": "False", "reason": "InsufficientDiskSpace"}],
                    ),
                ),
            ],
        ),
    ),
    "local-all-nodes-failed": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE),
            nodes=NODES,
            children=[mcn(CACHE, n, _disk_full()) for n in ("node-a", "node-b")],
        ),
    ),
    "local-all-evicted": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE, status=_ready_before),
            nodes=NODES,
            children=[mcn(CACHE, n, node_status("Evicted", sizeBytes=SIZE)) for n in ("node-a", "node-b")],
        ),
    ),
    "local-waiting-for-secret": (
        "sync",
        lambda: sync_request(
            _with_token(),
            nodes=NODES,
            children=[
                mcn(
                    CACHE,
                    n,
                    node_status(
                        "Pending",
                        message="Secret default/hf-token not found; create it with key HF_TOKEN",
                        conditions=[{"type": "Ready", "status": "False", "reason": "WaitingForSecret"}],
                    ),
                )
                for n in ("node-a", "node-b")
            ],
        ),
    ),
    "local-evicted-counts-pending": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE, status=_ready_before),
            nodes=NODES,
            children=[
                mcn(CACHE, "node-a", node_status("Ready", SIZE, SIZE, sizeBytes=SIZE)),
                mcn(CACHE, "node-b", node_status("Evicted", sizeBytes=SIZE)),
            ],
        ),
    ),
    "local-token-secret": ("sync", lambda: sync_request(_with_token(), nodes=NODES)),
    # shared PVC mode
    "pvc-seed-first-sync": ("sync", lambda: sync_request(_pvc_parent())),
    "pvc-token-and-overrides": ("sync", lambda: sync_request(_pvc_with_token())),
    "pvc-downloading": (
        "sync",
        lambda: sync_request(_pvc_parent(), children=[pvc(RWX, "Pending"), job(RWX)]),
    ),
    "pvc-ready": (
        "sync",
        lambda: sync_request(
            _pvc_parent(),
            children=[
                pvc(RWX),
                job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1),
            ],
        ),
    ),
    "pvc-failed": (
        "sync",
        lambda: sync_request(
            _pvc_parent(),
            children=[
                pvc(RWX),
                job(
                    RWX,
                    [
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                        }
                    ],
                    active=0,
                ),
            ],
        ),
    ),
    "pvc-volume-lost": ("sync", lambda: sync_request(_pvc_parent(), children=[pvc(RWX, "Lost"), job(RWX)])),
    "pvc-unused-before-expiry": (
        "sync",
        lambda: sync_request(
            _pvc_parent({"phase": "Ready", "lastUsedTime": "2026-12-01T11:00:00Z"}, ttl="2h"),
            children=[pvc(RWX), job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1)],
        ),
    ),
    "pvc-evicted": (
        "sync",
        lambda: sync_request(
            _pvc_parent({"phase": "Ready", "lastUsedTime": "2026-12-01T09:00:00Z"}, ttl="2h"),
            children=[pvc(RWX), job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1)],
        ),
    ),
    "pvc-evicted-stays-evicted": (
        "sync",
        lambda: sync_request(_pvc_parent(_evicted_status, ttl="2h")),
    ),
    "pvc-rehydrate-on-new-consumer": (
        "sync",
        lambda: sync_request(_pvc_parent(_evicted_status, ttl="2h"), pods=[consumer(RWX, "app-1")]),
    ),
    "pvc-in-use-advances-last-used": (
        "sync",
        lambda: sync_request(
            _pvc_parent({"phase": "Ready", "lastUsedTime": "2026-12-01T11:00:00Z"}, ttl="2h"),
            pods=[consumer(RWX, "app-1", "node-a")],
            children=[pvc(RWX), job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1)],
        ),
    ),
    "pvc-in-use-last-used-quantized": (
        "sync",
        lambda: sync_request(
            _pvc_parent({"phase": "Ready", "lastUsedTime": "2026-12-01T11:59:30Z"}, ttl="2h"),
            pods=[consumer(RWX, "app-1", "node-a")],
            children=[pvc(RWX), job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1)],
        ),
    ),
    # finalize
    "finalize-waiting-for-node-agents": (
        "finalize",
        lambda: sync_request(
            modelcache(CACHE, status=_ready_before),
            nodes=NODES,
            children=[mcn(CACHE, "node-a", node_status("Ready"))],
            finalizing=True,
        ),
    ),
    "finalize-done": (
        "finalize",
        lambda: sync_request(modelcache(CACHE, status=_ready_before), nodes=NODES, finalizing=True),
    ),
    # specs the hook cannot use
    "invalid-spec-keeps-children": (
        "sync",
        lambda: sync_request(
            modelcache(CACHE, {"source": {"huggingface": {"repo": "not a repo"}}, "storage": {"size": "0"}}),
            nodes=NODES,
            children=[mcn(CACHE, "node-a", node_status("Ready"))],
        ),
    ),
    "invalid-spec-not-an-object": ("sync", lambda: sync_request(modelcache(CACHE, spec=[]))),  # type: ignore[arg-type]
}
