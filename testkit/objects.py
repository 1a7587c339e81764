"""A ModelCacheNode as the sync hook makes it (hooks/local.py), without the owner: for tests that play
one node against the real API server (an owner that does not exist would be
garbage-collected there)."""

from __future__ import annotations

from typing import Any

from praesto import names

Obj = dict[str, Any]


def modelcachenode(
    cache: str,
    node: str,
    namespace: str,
    *,
    source: Obj | None = None,
    size: str = "1Gi",
    unused_ttl: str | None = None,
) -> Obj:
    spec: Obj = {
        "modelCacheName": cache,
        "nodeName": node,
        "source": source or {"uri": f"hf://org/{cache}", "revision": "main"},
        "size": size,
    }
    if unused_ttl:
        spec["unusedTTL"] = unused_ttl
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHENODE_KIND,
        "metadata": {
            "name": names.modelcachenode_name(cache, node),
            "namespace": namespace,
            "labels": {names.LABEL_NODE: names.node_label_value(node), names.LABEL_MODEL_CACHE: cache},
        },
        "spec": spec,
    }
