"""Tenant-side builders for the control-plane tier: namespaces, ModelCaches, Pods, fake Nodes."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.kube_apply import Kube

Obj = dict[str, Any]


def opted_in_namespace(admin: Kube, name: str) -> str:
    ensure_namespace(admin, name, {names.LABEL_INJECTION: names.INJECTION_ENABLED})
    return name


def modelcache(name: str, namespace: str, *, node_selector: dict[str, str] | None = None, **spec: Any) -> Obj:
    body: Obj = {
        "source": {"huggingface": {"repo": "org/tiny"}},
        "storage": {"size": "1Gi"},
    }
    if node_selector is not None:
        body["nodeSelector"] = node_selector
    body.update(spec)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def grant(admin: Kube, namespace: str, service_account: str, role: str, rules: list[Obj]) -> None:
    """A tenant identity with limited RBAC: `service_account` (created if missing) bound to a Role
    named `role` in `namespace` holding `rules`."""
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace},
        }
    )
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": role, "namespace": namespace}
    admin.apply({"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": rules})
    admin.apply(
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        }
    )


def pod(
    name: str, namespace: str, cache: str | None = None, *, scheduling: str | None = None, **meta: Any
) -> Obj:
    annotations: dict[str, str] = {}
    if cache:
        annotations[names.ANNOTATION_MODEL_MOUNTS] = json.dumps(
            [{"modelCache": cache, "mountPath": "/models"}]
        )
    if scheduling:
        annotations[names.ANNOTATION_SCHEDULING] = scheduling
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations, **meta},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "server", "image": "registry.example/llm:1", "resources": {}}],
        },
    }


def ready_node(admin: Kube, name: str, labels: dict[str, str] | None = None) -> Obj:
    """A Node object that the scheduler sees as Ready with room for Pods (there is no kubelet)."""
    node = admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        }
    )
    status = {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"},
        ],
    }
    core = client.CoreV1Api(admin.api)
    core.patch_node_status(name, {"status": status})
    # The TaintNodesByCondition admission plugin registers every new Node with the
    # not-ready taint; the node lifecycle controller (off: no kubelets) would lift it.
    core.patch_node(name, {"spec": {"taints": None}})
    return node


def wait_scheduled(admin: Kube, namespace: str, name: str, deadline: float = 30) -> str:
    core = client.CoreV1Api(admin.api)
    bound: list[str] = []

    def scheduled() -> bool:
        node = core.read_namespaced_pod(name, namespace).spec.node_name
        if node:
            bound.append(node)
        return bool(node)

    wait_for(f"pod {namespace}/{name} to be scheduled", scheduled, deadline)
    return bound[0]


def unschedulable_message(admin: Kube, namespace: str, name: str, deadline: float = 30) -> str:
    """The scheduler's PodScheduled=False message, once it has written one."""
    core = client.CoreV1Api(admin.api)
    found: list[str] = []

    def reported() -> bool:
        for cond in core.read_namespaced_pod(name, namespace).status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                found.append(cond.message or "")
                return True
        return False

    wait_for(f"the scheduler to report pod {namespace}/{name} unschedulable", reported, deadline)
    return found[0]
