"""Typed views of the hook requests Metacontroller v4.17.2 sends: each field read once, at the hook's entry.

The shapes (hook version v2, as our controllers ask for; tag v4.17.2):

* sync and finalize get `CompositeHookRequest` {controller, parent, children, related, finalizing}
  (`pkg/controller/composite/api/v2/hooks.go`); customize gets `CustomizeHookRequest` {controller,
  parent} (`pkg/controller/common/customize/api/v2/hooks.go`).
* the node decorator's (hooks/nodes.py) sync gets `DecoratorHookRequest` {controller, object,
  attachments, related, finalizing} (`pkg/controller/decorator/api/v2/hooks.go`); its customize gets the
  Node as `parent`.
* `children`, `attachments` and `related` are `UniformObjectMap`s (`pkg/controller/common/api/v2/
  common.go`): keyed by `GroupVersionKind.MarshalText` (`<Kind>.<group>/<version>`, core group
  `<Kind>.<version>`, `pkg/controller/common/api/api.go`), then by `<namespace>/<name>` (cluster-scoped:
  `<name>`).

`SyncRequest.parse` (`Parent.parse` for customize) and, for the decorator, `DecoratorRequest.parse`
(`DecoratedNode.parse` for customize) are the one place a request dict is unpacked, raising
hook_protocol.BadRequest (answered with 400); the passes read these frozen views, never the dict. Objects
inside stay the dicts Metacontroller sent: responses are built from them and must stay byte-identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from praesto.hooks import hook_protocol
from praesto.hooks.common import Obj, generation, section

from praesto import names

Objects = tuple[Obj, ...]


@dataclass(frozen=True)
class Parent:
    """The ModelCache being synced, as sent (`obj`), with the fields every pass reads."""

    obj: Mapping[str, Any]
    name: str
    namespace: str
    generation: int
    before: Mapping[str, Any]  # the status the previous pass wrote

    @classmethod
    def parse(cls, request: Any) -> Parent:
        """The request's parent, or hook_protocol.BadRequest when the body is not a hook request."""
        obj = _parent_of(request)
        namespace = obj["metadata"].get("namespace")
        return cls(
            obj,
            obj["metadata"]["name"],
            namespace if isinstance(namespace, str) else "",
            generation(obj),
            section(obj, "status"),
        )


@dataclass(frozen=True)
class Copy:
    """One observed ModelCacheNode: the node it is for, the source it was told, what its agent reports."""

    obj: Obj
    node: str | None  # spec.nodeName, None when missing or not a string
    source: Mapping[str, Any]  # spec.source
    status: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Obj) -> Copy:
        spec = section(obj, "spec")
        node = spec.get("nodeName")
        return cls(
            obj, node if isinstance(node, str) else None, section(spec, "source"), section(obj, "status")
        )


@dataclass(frozen=True)
class Children:
    """The observed children by kind, each in the request's order."""

    copies: tuple[Copy, ...]  # ModelCacheNodes (local mode)
    jobs: Objects  # the download Job (PVC mode)
    pvcs: Objects
    roles: Objects
    role_bindings: Objects
    every: Objects  # every child of every kind with metadata: kept as it is when the spec is invalid


@dataclass(frozen=True)
class Related:
    """The related objects customize asked for, by kind, each in the request's order."""

    pods: Objects  # consumers, and in PVC mode the download Job's Pods
    nodes: Objects  # selected Nodes not summarized yet (hooks/node_summary.py)
    summaries: Objects  # NodeSummaries, genuine or not
    modelcaches: Objects  # the namespace's caches, when it has a quota
    service_accounts: Objects  # the downloader's, with workload identity


@dataclass(frozen=True)
class SyncRequest:
    """A sync or finalize request (`CompositeHookRequest`)."""

    parent: Parent
    children: Children
    related: Related
    finalizing: bool

    @classmethod
    def parse(cls, request: Any) -> SyncRequest:
        """The view of `request`, or hook_protocol.BadRequest saying which part is not a hook request."""
        parent = Parent.parse(request)  # checks `children` and `related` too
        children = request.get("children") or {}
        return cls(
            parent,
            Children(
                copies=tuple(Copy.of(o) for o in _group(request, "children", hook_protocol.MODELCACHENODE)),
                jobs=_group(request, "children", hook_protocol.JOB),
                pvcs=_group(request, "children", hook_protocol.PVC),
                roles=_group(request, "children", hook_protocol.ROLE),
                role_bindings=_group(request, "children", hook_protocol.ROLEBINDING),
                every=tuple(
                    obj
                    for group in children.values()
                    if isinstance(group, dict)
                    for obj in group.values()
                    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict)
                ),
            ),
            Related(
                pods=_group(request, "related", hook_protocol.POD),
                nodes=_group(request, "related", hook_protocol.NODE),
                summaries=_group(request, "related", hook_protocol.NODESUMMARY),
                modelcaches=_group(request, "related", hook_protocol.MODELCACHE),
                service_accounts=_group(request, "related", hook_protocol.SERVICE_ACCOUNT),
            ),
            request.get("finalizing") is True,
        )


@dataclass(frozen=True)
class DecoratedNode:
    """The Node a decorator hook is for: `parent` in customize, `object` in sync."""

    obj: Mapping[str, Any]
    name: str
    labels: Mapping[str, Any]  # metadata.labels, {} when missing

    @classmethod
    def parse(cls, request: Any, key: str) -> DecoratedNode:
        """The Node in `request[key]`, or hook_protocol.BadRequest when it has no name."""
        node = request.get(key) if isinstance(request, dict) else None
        metadata = node.get("metadata") if isinstance(node, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not isinstance(node, dict) or not isinstance(name, str) or not name:
            raise hook_protocol.BadRequest(f"request.{key} must be a Node with metadata.name")
        return cls(node, name, section(metadata, "labels"))


@dataclass(frozen=True)
class DecoratorRequest:
    """The node decorator's sync request (`DecoratorHookRequest`)."""

    node: DecoratedNode  # `object`
    summary: Obj | None  # its NodeSummary among `attachments`, once Metacontroller has seen it
    cache_nodes: Objects  # related ModelCacheNodes of any served version, in the request's order
    finalizing: bool  # never true today: the chart's decorator has no finalize hook

    @classmethod
    def parse(cls, request: Any) -> DecoratorRequest:
        """The view of `request`, or hook_protocol.BadRequest when `object` is no named Node."""
        node = DecoratedNode.parse(request, "object")
        summaries = section(request, "attachments").get(hook_protocol.NODESUMMARY)
        summary = summaries.get(node.name) if isinstance(summaries, dict) else None
        cache_nodes = tuple(
            obj
            for key, group in section(request, "related").items()
            if str(key).startswith(f"{names.MODELCACHENODE_KIND}.") and isinstance(group, dict)
            for obj in group.values()
            if isinstance(obj, dict)
        )
        return cls(
            node,
            summary if isinstance(summary, dict) else None,
            cache_nodes,
            request.get("finalizing") is True,
        )


def _parent_of(request: Any) -> Obj:
    """The parent object, or BadRequest when the body is not a hook request."""
    if not isinstance(request, dict):
        raise hook_protocol.BadRequest("request body must be a JSON object with a 'parent' field")
    parent = request.get("parent")
    if not isinstance(parent, dict):
        raise hook_protocol.BadRequest("request.parent: Required value: must be the ModelCache object")
    metadata = parent.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise hook_protocol.BadRequest("request.parent.metadata.name: Required value: the parent has no name")
    for part in ("children", "related"):
        value = request.get(part)
        if value is not None and not isinstance(value, dict):
            raise hook_protocol.BadRequest(f"request.{part}: must be an object keyed by <Kind>.<apiVersion>")
    return parent


def _group(request: Mapping[str, Any], part: str, key: str) -> Objects:
    """Observed objects of one type (values of `request[part][key]`), skipping junk."""
    group = (request.get(part) or {}).get(key)
    if not isinstance(group, dict):
        return ()
    return tuple(obj for obj in group.values() if isinstance(obj, dict))
