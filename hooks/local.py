"""Local CSI mode: one ModelCacheNode per node that should hold a copy.

Nodes come from two places: those matching `spec.nodeSelector` (all Nodes
when it is empty), seen as their NodeSummaries (hooks/node_summary.py) or, until
a Node has one, whole; and those where a consuming Pod is already scheduled, so
an autoscaled node that was never labelled still gets its copy on demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from praesto.hooks import rolling
from praesto.hooks.common import Obj, child_metadata, consumer_pods, meta, role_and_binding, section
from praesto.hooks.config import HooksConfig
from praesto.hooks.local_status import aggregate
from praesto.hooks.node_summary import genuine
from praesto.hooks.views import Copy, Related, SyncRequest

from praesto import names
from praesto.rbac import (
    AGENT_CONFIGMAP_GRANT,
    AGENT_SECRET_GRANT,
    AGENT_TRUST_CONFIGMAP_GRANT,
    AGENT_TRUST_SECRET_GRANT,
    Permission,
)
from praesto.spec import ModelCacheSpec


def selected_nodes(nodes: Iterable[Mapping[str, Any]], selector: Mapping[str, str]) -> list[str]:
    """Names of Nodes whose labels contain every selector pair (all when empty)."""
    out = []
    items = selector.items()
    for node in nodes:
        node_meta = meta(node)
        name = node_meta.get("name")
        if not isinstance(name, str) or not name or node_meta.get("deletionTimestamp"):
            continue
        labels = node_meta.get("labels")
        if not items or (isinstance(labels, dict) and all(labels.get(k) == v for k, v in items)):
            out.append(name)
    return out


def demand_nodes(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes where one of these consuming Pods (see `consumer_pods`) is scheduled."""
    out = set()
    for pod in pods:
        node = section(pod, "spec").get("nodeName")
        if isinstance(node, str) and node:
            out.add(node)
    return out


def modelcachenode(
    parent: Mapping[str, Any], spec: ModelCacheSpec, node: str, source: dict[str, Any], switch: bool = True
) -> Obj:
    cache = str(meta(parent)["name"])
    node_spec: Obj = {
        "modelCacheName": cache,
        "nodeName": node,
        "source": source,  # shared, never mutated: serialised as is
        "size": spec.size,
    }
    if not switch:  # hold the revision beside the served copy (spec.updateStrategy AllNodes)
        node_spec["switch"] = False
    if spec.unused_ttl:
        node_spec["unusedTTL"] = spec.unused_ttl
    if spec.prewarm:
        node_spec["prewarm"] = True
    if spec.verification is not None:
        node_spec["verification"] = spec.verification.to_node_dict()
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHENODE_KIND,
        "metadata": child_metadata(
            parent, names.modelcachenode_name(cache, node), {names.LABEL_NODE: names.node_label_value(node)}
        ),
        "spec": node_spec,
    }


# A copy in these phases reads no Secret: it is on disk, or gone until a Pod asks again (the agent
# then reports Pending, WaitingForSecret, and the grant comes back on the next sync).
SETTLED_PHASES = frozenset({names.PHASE_READY, names.PHASE_EVICTED})


def copy_needs_secret(status: Mapping[str, Any]) -> bool:
    """Whether a copy with this ModelCacheNode status may read its cache's Secret now: pending,
    downloading or failed (and retrying), or serving while another revision is fetched beside it
    (status.next, a rolling update, until that one is on disk). The one rule of the per-cache grant
    and of the credentials broker (hooks/broker.py), which hands the Secret only to that copy's node."""
    if status.get("phase") not in SETTLED_PHASES:
        return True
    beside = status.get("next")
    return isinstance(beside, Mapping) and beside.get("phase") != names.NEXT_READY


def copies_need_secret(node_names: Iterable[str], copies: Iterable[Copy]) -> bool:
    """Whether some node copy may read the cache's Secret now (`copy_needs_secret`), or one is not yet
    created or reported. The per-cache grant exists only then (issue 21 item 4), not for as long as
    the cache exists; which node's agent gets the Secret is the broker's check (hooks/broker.py)."""
    statuses = {str(copy.node): copy.status for copy in copies}
    return any(node not in statuses or copy_needs_secret(statuses[node]) for node in node_names)


def granted_objects(spec: ModelCacheSpec) -> dict[Permission, list[str]]:
    """What the cache's node copies read in its namespace, by kind: the source's token or credentials
    Secret, and the Secret or ConfigMap holding spec.verification's trust material."""
    verification = spec.verification
    wanted = {
        AGENT_SECRET_GRANT: [spec.source.secret_ref, verification.secret_ref if verification else None],
        AGENT_CONFIGMAP_GRANT: [verification.config_map_ref if verification else None],
    }
    out = {grant: sorted({r.name for r in refs if r is not None}) for grant, refs in wanted.items()}
    return {grant: objects for grant, objects in out.items() if objects}


def secret_grant(
    parent: Mapping[str, Any], objects: dict[Permission, list[str]], config: HooksConfig
) -> list[Obj]:
    """Role (get on those named Secrets and ConfigMaps only) + RoleBinding to praesto-hooks' own
    ServiceAccount: its credentials broker (hooks/broker.py) hands each object only to the agent of
    a node holding a copy that needs it, so no agent ServiceAccount can read a tenant's Secret."""
    rules = [
        {
            "apiGroups": [grant.group],
            "resources": [grant.resource],
            "resourceNames": list(object_names),
            "verbs": list(grant.verbs),
        }
        for grant, object_names in objects.items()
    ]
    role_name = names.secret_reader_role_name(str(meta(parent)["name"]))
    return role_and_binding(parent, role_name, rules, config.hooks_service_account, config.namespace)


def trust_watch_grant(parent: Mapping[str, Any], spec: ModelCacheSpec, config: HooksConfig) -> list[Obj]:
    """Role on the one Secret or ConfigMap holding spec.verification's trust material (get, list,
    watch on a ConfigMap; get only on a Secret) + RoleBinding to the node agent's ServiceAccount,
    while any copy exists: each agent follows that object, a ConfigMap by a watch of it alone, a
    Secret by a GET every few minutes (agent/trust_material.py), so a copy verified under material
    replaced since leaves Ready (issue 37 item 4). The material is public (a public key or CA
    certificates); the tenant's credentials stay behind the broker (`secret_grant`)."""
    verification = spec.verification
    if verification is None or (verification.secret_ref is None and verification.config_map_ref is None):
        return []
    grant, ref = (
        (AGENT_TRUST_SECRET_GRANT, verification.secret_ref)
        if verification.secret_ref is not None
        else (AGENT_TRUST_CONFIGMAP_GRANT, verification.config_map_ref)
    )
    assert ref is not None
    role_name = names.trust_reader_role_name(str(meta(parent)["name"]))
    rule = {"apiGroups": [grant.group], "resources": [grant.resource], "resourceNames": [ref.name]}
    rules = [{**rule, "verbs": list(grant.verbs)}]
    return role_and_binding(parent, role_name, rules, config.agent_service_account, config.namespace)


def selectable(related: Related) -> list[Mapping[str, Any]]:
    """What a cache selects from: related Nodes (not yet summarized, or all of them under an older rule)
    and the genuine NodeSummaries (hooks/node_summary.py); a Node may appear in both while its label
    catches up."""
    return [*related.nodes, *(s for s in related.summaries if genuine(s))]


def sync_local(request: SyncRequest, spec: ModelCacheSpec, config: HooksConfig, now: datetime) -> Obj:
    """The local-mode pass: which nodes hold a copy, what each is told, the cache's summed status."""
    parent = request.parent
    pods = consumer_pods(request.related.pods, parent.obj)
    wanted = set(selected_nodes(selectable(request.related), spec.node_selector))
    demand = demand_nodes(pods) - wanted
    node_names = sorted(wanted | demand)
    copies = request.children.copies
    # One plan per pass, reported by the status and carried out by the children: each node's revision
    # (the commit once a node resolved it, so every node holds the same bytes) and whether it may serve it.
    rollout = rolling.plan(spec, parent.before, node_names, copies)
    status = aggregate(parent, spec, node_names, len(demand), copies, rollout, now)
    sources: dict[str, dict[str, Any]] = {}
    children = []
    for node in node_names:
        told = rollout.nodes[node]
        if told.revision not in sources:
            sources[told.revision] = spec.source.with_version(told.revision).to_dict()
        children.append(modelcachenode(parent.obj, spec, node, sources[told.revision], told.switch))
    granted = granted_objects(spec)
    if granted and copies_need_secret(node_names, copies):
        children.extend(secret_grant(parent.obj, granted, config))
    if node_names:
        children.extend(trust_watch_grant(parent.obj, spec, config))
    return {"status": status, "children": children}
