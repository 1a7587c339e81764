"""DecoratorController over Nodes: label each Node with one key per cache Ready on it.

The Pod webhook adds a node affinity on these keys, so Pods land where their
model is already on disk. Keys come from `names.ready_label_key` (a hash of
`<namespace>/<name>`), valid for every legal name and not leaking tenant
names onto cluster-scoped Nodes. Hook version v2 (Metacontroller v4.17.2):
the customize request carries the Node as `parent`
(`pkg/controller/common/customize/api/v2/hooks.go`), the sync request as
`object`, with `attachments` and `related` (`pkg/controller/decorator/api/v2/hooks.go`),
each read once into hooks/views.py's `DecoratedNode` / `DecoratorRequest`;
`related` holds its ModelCacheNodes. Its one attachment is the Node's
NodeSummary (hooks/node_summary.py says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flask import Blueprint, Response, jsonify, request
from praesto.hooks import hook_protocol, node_summary
from praesto.hooks.common import section
from praesto.hooks.views import DecoratedNode, DecoratorRequest

from praesto import names

blueprint = Blueprint("praesto_nodes", __name__)

# Seconds until the pass that checks the summarized marker was written (see `sync`).
MARKER_RETRY_SECONDS = 10
SYNC_KEYS = frozenset({"labels", "annotations", "status", "attachments", "resyncAfterSeconds", "finalized"})


def customize(body: Any) -> dict[str, Any]:
    """Relate the ModelCacheNodes (all namespaces) labelled with this node."""
    node = DecoratedNode.parse(body, "parent")
    return {
        "relatedResources": [
            {
                "apiVersion": names.API_VERSION,
                "resource": names.MODELCACHENODE_PLURAL,
                "labelSelector": {"matchLabels": {names.LABEL_NODE: names.node_label_value(node.name)}},
            }
        ]
    }


def ready_caches(node_name: str, cache_nodes: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, cache) of every ModelCacheNode Ready on this node and not being deleted."""
    ready = set()
    for child in cache_nodes:
        meta = section(child, "metadata")
        spec = section(child, "spec")
        status = section(child, "status")
        labels = section(meta, "labels")
        cache = labels.get(names.LABEL_MODEL_CACHE)
        namespace = meta.get("namespace")
        # spec.nodeName guards against two long node names sharing a shortened label value.
        if spec.get("nodeName", node_name) != node_name or meta.get("deletionTimestamp"):
            continue
        if status.get("phase") == names.PHASE_READY and isinstance(cache, str) and isinstance(namespace, str):
            ready.add((namespace, cache))
    return ready


def sync(body: Any) -> dict[str, Any]:
    """Desired readiness labels: "true" per Ready cache, null (= delete) for stale ones of ours; the
    Node's summary, and the label saying caches may read it instead of the Node."""
    request = DecoratorRequest.parse(body)
    node = request.node
    current = node.labels
    wanted = {
        names.ready_label_key(ns, cache): "true" for ns, cache in ready_caches(node.name, request.cache_nodes)
    }
    labels: dict[str, str | None] = dict(wanted)
    labels.update(
        {
            k: None
            for k in current
            if isinstance(k, str) and k.startswith(names.READY_LABEL_PREFIX) and k not in wanted
        }
    )
    # The marker last: only a summary Metacontroller has already seen lets caches stop relating the Node.
    summarized = request.summary is not None
    labels[names.LABEL_NODE_SUMMARIZED] = "true" if summarized else None
    response: dict[str, Any] = {"labels": labels, "attachments": [node_summary.summary_for(node.obj)]}
    if (current.get(names.LABEL_NODE_SUMMARIZED) == "true") != summarized:
        # Metacontroller writes the Node at the version it read and ends the pass silently on a conflict
        # (`syncParentObject`, v4.17.2); the newer version, a status write, is dropped by
        # ignoreStatusChanges. So the marker asks for another pass rather than wait resyncPeriodSeconds.
        response["resyncAfterSeconds"] = MARKER_RETRY_SECONDS
    return response


def _serve(handler: Any) -> tuple[Response, int]:
    body = request.get_json(silent=True)
    if body is None:
        return jsonify({"error": "request body must be a JSON object from Metacontroller"}), 400
    try:
        return jsonify(handler(body)), 200
    except hook_protocol.BadRequest as error:
        return jsonify({"error": str(error)}), 400


@blueprint.post("/hooks/node/customize")
def customize_hook() -> tuple[Response, int]:
    return _serve(customize)


@blueprint.post("/hooks/node/sync")
def sync_hook() -> tuple[Response, int]:
    return _serve(sync)
