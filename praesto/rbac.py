"""The Kubernetes API calls each component makes: one list, two uses.

The chart's RBAC templates are tested to grant exactly these, and each
component's tests check (through the test fault proxy's request log) that its code
makes no call outside its list. Change a component's API use here first.
"""

from __future__ import annotations

from dataclasses import dataclass

from praesto import names


@dataclass(frozen=True, order=True)
class Permission:
    group: str  # "" for the core group
    resource: str  # may include a subresource: "modelcachenodes/status"
    verbs: tuple[str, ...]
    namespaced: bool = True


READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete")

# Node agent (DaemonSet): its own ModelCacheNodes, their status and finalizer, and events.
# It reads no tenant Secret: the credentials broker in praesto-hooks (hooks/broker.py) hands a copy's
# Secret to the agent of that copy's node only, with a token it mints like peer tokens (AGENT_PEERS).
AGENT: tuple[Permission, ...] = (
    Permission(names.GROUP, names.MODELCACHENODE_PLURAL, ("get", "list", "watch", "patch", "update")),
    Permission(names.GROUP, f"{names.MODELCACHENODE_PLURAL}/status", ("get", "patch", "update")),
    Permission("", "events", ("create", "patch")),
    # Peers: the serving agent checks the asking agent's Pod-bound token (agent/peers/identity.py).
    Permission("authentication.k8s.io", "tokenreviews", ("create",), namespaced=False),
    # Warm before schedulable (agent/startup_taint.py): lifting the startup taint from its own Node (the
    # chart's ValidatingAdmissionPolicy allows no more).
    Permission("", "nodes", ("get", "patch"), namespaced=False),
)

# Warm before schedulable: which warmNewNodes caches select this node, read only in the namespaces the
# admin lets hold new nodes (chart nodeAgent.startupTaint.namespaces): a Role in each of them, so no
# agent lists every tenant's ModelCaches (#21 item 4).
AGENT_WARM: tuple[Permission, ...] = (Permission(names.GROUP, names.MODELCACHE_PLURAL, ("list",)),)

# Per-cache grant returned by the sync hook (Role in the cache's namespace, resourceNames = the Secret).
AGENT_SECRET_GRANT = Permission("", "secrets", ("get",))
# ... and, when spec.verification's trust material is in a ConfigMap, get on that one ConfigMap.
AGENT_CONFIGMAP_GRANT = Permission("", "configmaps", ("get",))
# spec.verification's trust material (a public key or CA certificates) in a Secret or ConfigMap: a Role
# bound to the agent while any copy exists (hooks/local.py trust_watch_grant), so a copy verified under
# material replaced since leaves Ready (agent/trust_material.py). A ConfigMap is followed by list and
# watch with fieldSelector metadata.name, which resourceNames allows; a Secret by `get` every few
# minutes only, because granting list or watch on it would need Metacontroller to hold them on every
# Secret (RBAC's escalation check), and no identity may list Secrets.
TRUST_SECRET_VERBS = ("get",)
TRUST_CONFIGMAP_VERBS = ("get", "list", "watch")
AGENT_TRUST_SECRET_GRANT = Permission("", "secrets", TRUST_SECRET_VERBS)
AGENT_TRUST_CONFIGMAP_GRANT = Permission("", "configmaps", TRUST_CONFIGMAP_VERBS)

# PVC mode's live progress: the download Pod's own ServiceAccount may patch its one Job (Role in the
# cache's namespace, resourceNames = the Job, only while it runs; hooks/pvc_progress.py). The chart's
# ValidatingAdmissionPolicy (download-progress-policy.yaml) lets that patch change one annotation only.
# Metacontroller holds patch on Jobs (METACONTROLLER), which RBAC's escalation check requires.
DOWNLOADER_PROGRESS_GRANT = Permission("batch", "jobs", ("patch",))

# Peers and the credentials broker (agent/peers/auth.py TokenMinter): a Role in the release namespace
# lets the agent ServiceAccount request tokens for itself only (resourceNames); the chart's
# ValidatingAdmissionPolicy binds each to the asking agent's own Pod and a peer or broker audience.
AGENT_PEERS: tuple[Permission, ...] = (Permission("", "serviceaccounts/token", ("create",)),)

# Origin budget (agent/budget, chart originBudget.enabled): a Role in the release namespace only.
# Slot names are not known ahead (per-host slots hash the host), so neither create nor update can
# name them (resourceNames); the chart's ValidatingAdmissionPolicy confines the agent's writes to
# Leases named praesto-origin-* and held, if at all, by the node its token is bound to.
AGENT_ORIGIN_BUDGET: tuple[Permission, ...] = (
    Permission("coordination.k8s.io", "leases", ("get", "list", "watch", "create", "update")),
)

# Hooks Deployment: the admission webhook's watch-fed lookups and the credentials broker.
HOOKS: tuple[Permission, ...] = (
    Permission(names.GROUP, names.MODELCACHE_PLURAL, READ),
    # The credentials broker (hooks/broker_http.py): the asking node's copy, by name.
    Permission(names.GROUP, names.MODELCACHENODE_PLURAL, ("get",)),
    Permission("storage.k8s.io", "storageclasses", READ, namespaced=False),
    # Node labels only, for the validating webhook's "nodeSelector matches no nodes" warning.
    Permission("", "nodes", ("list", "watch"), namespaced=False),
    # The credentials broker (hooks/broker.py): which node's agent asks, from its Pod-bound token.
    Permission("authentication.k8s.io", "tokenreviews", ("create",), namespaced=False),
)

# The orphan releaser (praesto-orphans, hooks/orphans/, its own Deployment and ServiceAccount): watches
# every node copy and Node, reads a Node by name, and drops the agent's finalizer from a copy whose Node
# is gone (the *-modelcachenode-writers policy lets it change nothing else on a ModelCacheNode).
ORPHANS: tuple[Permission, ...] = (
    Permission(names.GROUP, names.MODELCACHENODE_PLURAL, ("list", "watch", "patch")),
    Permission("", "nodes", READ, namespaced=False),
)

# Metacontroller, restricted to what our CompositeController and DecoratorController manage.
METACONTROLLER: tuple[Permission, ...] = (
    Permission(names.GROUP, names.MODELCACHE_PLURAL, ("get", "list", "watch", "update", "patch")),
    Permission(names.GROUP, f"{names.MODELCACHE_PLURAL}/status", ("get", "update", "patch")),
    # Children carry ownerReferences with blockOwnerDeletion: true (Metacontroller always
    # sets it); the OwnerReferencesPermissionEnforcement admission plugin then requires
    # update on the owner's finalizers subresource for every child create.
    Permission(names.GROUP, f"{names.MODELCACHE_PLURAL}/finalizers", ("update",)),
    Permission(names.GROUP, names.MODELCACHENODE_PLURAL, READ + WRITE),
    Permission("", "nodes", ("get", "list", "watch", "update", "patch"), namespaced=False),
    # The node decorator's attachment, one per Node (hooks/node_summary.py), owned by its Node with
    # blockOwnerDeletion: creating it needs update on nodes/finalizers (as for modelcaches above).
    Permission(names.GROUP, names.NODESUMMARY_PLURAL, READ + WRITE, namespaced=False),
    Permission("", "nodes/finalizers", ("update",), namespaced=False),
    Permission("", "pods", READ),
    # PVC mode with workload identity relates the downloader's ServiceAccount (hooks/pvc_pod.py).
    Permission("", "serviceaccounts", READ),
    # Every customize manager (4.15+) runs a namespaces informer, for namespaceSelector rules.
    Permission("", "namespaces", ("list", "watch"), namespaced=False),
    Permission("", "persistentvolumeclaims", READ + WRITE),
    Permission("batch", "jobs", READ + WRITE),
    # A downloader Job without the identity: egress to the metadata address denied (hooks/pvc_job.py).
    Permission("networking.k8s.io", "networkpolicies", READ + WRITE),
    Permission("rbac.authorization.k8s.io", "roles", READ + WRITE),
    Permission("rbac.authorization.k8s.io", "rolebindings", READ + WRITE),
    # Granting a verb on a Secret or ConfigMap through a Role requires holding it (RBAC escalation
    # check): `get` for the per-cache grants, list and watch too for a trust ConfigMap's watch. Never
    # list or watch on Secrets: that would read every tenant's (a trust Secret is re-read by `get`).
    Permission("", "secrets", TRUST_SECRET_VERBS),
    Permission("", "configmaps", TRUST_CONFIGMAP_VERBS),
    Permission("", "events", ("create", "patch")),
    Permission("apiextensions.k8s.io", "customresourcedefinitions", READ, namespaced=False),
    Permission("metacontroller.k8s.io", "compositecontrollers", READ, namespaced=False),
    Permission("metacontroller.k8s.io", "decoratorcontrollers", READ, namespaced=False),
    Permission("metacontroller.k8s.io", "controllerrevisions", READ + WRITE),
    Permission("coordination.k8s.io", "leases", ("get", "create", "update")),
)

# CSI plugin: no API access at all (trusts only kubelet-set pod info).
CSI: tuple[Permission, ...] = ()
