"""Local CSI mode: one ModelCacheNode per node that should hold a copy.

Nodes come from two places: those matching `spec.nodeSelector` (all Nodes
when it is empty) and those where a consuming Pod is already scheduled, so an
autoscaled node that was never labelled still gets its copy on demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from praesto.hooks import hook_protocol, rolling
from praesto.hooks.common import Obj, child_metadata, consumer_pods, meta, previous_status, section
from praesto.hooks.config import HooksConfig
from praesto.hooks.local_status import aggregate

from praesto import names
from praesto.rbac import AGENT_CONFIGMAP_GRANT, AGENT_SECRET_GRANT, Permission
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


def copies_need_secret(node_names: Iterable[str], observed: Iterable[Mapping[str, Any]]) -> bool:
    """Whether some node copy may read the cache's Secret now: one not yet created or reported, or
    pending, downloading or failed (and retrying). The per-cache grant exists only then (issue 21
    item 4), not for as long as the cache exists; RBAC still cannot say which node's agent reads."""
    phases = {
        str(section(obj, "spec").get("nodeName")): section(obj, "status").get("phase") for obj in observed
    }
    return any(phases.get(node) not in SETTLED_PHASES for node in node_names)


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
    """Role (get on those named Secrets and ConfigMaps only) + RoleBinding to the node agent's
    ServiceAccount."""
    role_name = names.secret_reader_role_name(str(meta(parent)["name"]))
    rbac = "rbac.authorization.k8s.io"
    role = {
        "apiVersion": f"{rbac}/v1",
        "kind": "Role",
        "metadata": child_metadata(parent, role_name),
        "rules": [
            {
                "apiGroups": [grant.group],
                "resources": [grant.resource],
                "resourceNames": list(object_names),
                "verbs": list(grant.verbs),
            }
            for grant, object_names in objects.items()
        ],
    }
    binding = {
        "apiVersion": f"{rbac}/v1",
        "kind": "RoleBinding",
        "metadata": child_metadata(parent, role_name),
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": role_name},
        "subjects": [
            {"kind": "ServiceAccount", "name": config.agent_service_account, "namespace": config.namespace}
        ],
    }
    return [role, binding]


def sync_local(
    request: Mapping[str, Any],
    parent: Mapping[str, Any],
    spec: ModelCacheSpec,
    config: HooksConfig,
    now: datetime,
) -> Obj:
    nodes = hook_protocol.objects(request, "related", hook_protocol.NODE)
    pods = consumer_pods(request, parent)
    wanted = set(selected_nodes(nodes, spec.node_selector))
    demand = demand_nodes(pods) - wanted
    node_names = sorted(wanted | demand)
    observed = hook_protocol.objects(request, "children", hook_protocol.MODELCACHENODE)
    status = aggregate(parent, spec, node_names, len(demand), observed, now)
    # The same pure plan the status was computed from: each node's revision (the commit once a node
    # resolved it, so every node holds the same bytes) and whether it may serve it yet.
    rollout = rolling.plan(spec, previous_status(parent), node_names, observed)
    sources: dict[str, dict[str, Any]] = {}
    children = []
    for node in node_names:
        told = rollout.nodes[node]
        if told.revision not in sources:
            sources[told.revision] = spec.source.with_version(told.revision).to_dict()
        children.append(modelcachenode(parent, spec, node, sources[told.revision], told.switch))
    granted = granted_objects(spec)
    if granted and copies_need_secret(node_names, observed):
        children.extend(secret_grant(parent, granted, config))
    return {"status": status, "children": children}
