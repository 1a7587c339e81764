"""NodeSummary: the part of a Node that ModelCache selectors read, so no cache's sync carries whole Nodes.

Why (issue 38), from Metacontroller v4.17.2's source:

* A related object's every add, delete and resourceVersion change queues each parent one of whose
  rules matches it, with no filter on what changed (`pkg/controller/common/customize/manager.go`
  `onRelatedUpdate` -> `findRelatedParents`), and `GetRelatedObjects` sends it whole, managedFields
  included. Relating Nodes made every kubelet status write a full pass of every cache selecting the
  Node, its request growing ~26.5 KB per GPU Node.
* The node decorator (a DecoratorController over Nodes) has `ignoreStatusChanges: true`: an update
  keeping generation, labels and annotations, not deleting, is dropped (`pkg/controller/decorator/
  controller.go` `updateParentObject`), so heartbeats and image-list changes never wake it.

So the decorator keeps one NodeSummary per Node as its attachment (cluster-scoped, named as the Node,
owned by it, so the garbage collector removes it with the Node): the Node's labels, less those of
`excluded_key`, as its own labels. Metacontroller updates it only when the 3-way merge changes it
(`pkg/controller/common/manage_children.go` `DynamicApply.Apply`, `updateStrategy: InPlace`). A
cache relates summaries by its nodeSelector, so only a selecting label's change costs it a pass.

The move from Nodes to summaries deletes no copy: the decorator labels the Node
`LABEL_NODE_SUMMARIZED` only once the summary is in its request (`attachments`), that is in the shared
informer (`pkg/dynamic/informer`) the cache's related summaries are listed from, and a cache relates
the selected Nodes without that label too. Every selected Node is in a cache's request at every moment:
whole before its summary exists, as a summary after.

Not covered: a summary deleted by hand (only Metacontroller and cluster admins may). Until the decorator's
next pass unmarks the Node, a cache's request holds neither, exactly as when the Node stops matching the
selector, so the copy there is deleted and made again (issue 38 notes the options).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from praesto.hooks.common import Obj, meta

from praesto import names

NODE_REF = ("v1", "Node")


def excluded_key(key: str) -> bool:
    """A Node label a summary does not copy: node-feature-discovery's (its domain or a subdomain), those
    that change by themselves (GFD's timestamp), and ours."""
    prefix = key.partition("/")[0] if "/" in key else ""
    return (
        prefix == names.NFD_LABEL_DOMAIN
        or prefix.endswith("." + names.NFD_LABEL_DOMAIN)
        or key in names.VOLATILE_NODE_LABELS
        or key.startswith(names.READY_LABEL_PREFIX)
        or key == names.LABEL_NODE_SUMMARIZED
    )


def summary_labels(labels: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if isinstance(v, str) and not excluded_key(k)}


def summary_for(node: Mapping[str, Any]) -> Obj:
    """The attachment the decorator wants for this Node (Metacontroller adds the owner reference)."""
    node_meta = meta(node)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.NODESUMMARY_KIND,
        "metadata": {"name": node_meta["name"], "labels": summary_labels(node_meta.get("labels") or {})},
    }


def related_rules(selector: Mapping[str, str]) -> list[Obj]:
    """A cache's related rules for `spec.nodeSelector`: the summaries it selects, and the selected Nodes not
    yet summarized. A selector naming a label summaries do not copy relates the Nodes themselves."""
    if any(excluded_key(k) for k in selector):
        return [{"apiVersion": "v1", "resource": "nodes", "labelSelector": {"matchLabels": dict(selector)}}]
    unsummarized = {"key": names.LABEL_NODE_SUMMARIZED, "operator": "DoesNotExist"}
    return [
        {
            "apiVersion": names.API_VERSION,
            "resource": names.NODESUMMARY_PLURAL,
            "labelSelector": {"matchLabels": dict(selector)},
        },
        {
            "apiVersion": "v1",
            "resource": "nodes",
            "labelSelector": {"matchLabels": dict(selector), "matchExpressions": [unsummarized]},
        },
    ]


def genuine(summary: Mapping[str, Any]) -> bool:
    """Written by Metacontroller for the Node of its name: its controller reference names that Node."""
    name = meta(summary).get("name")
    refs = meta(summary).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(r, dict)
        and r.get("controller") is True
        and (r.get("apiVersion"), r.get("kind")) == NODE_REF
        and r.get("name") == name
        for r in refs
    )
