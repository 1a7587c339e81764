"""Metacontroller-shaped v2 requests for the ModelCache hooks, built from small parts."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from praesto.hooks import hook_protocol
from praesto.hooks import node_summary as nodesummary

from praesto import names

Obj = dict[str, Any]
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CREATED = "2026-12-01T10:00:00Z"
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
GIB = 2**30

SEED_LOCAL_SPEC: Obj = {
    "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}},
    "storage": {"size": "5Gi"},
    "nodeSelector": {"praesto.io/cache-node": "true"},
}
SEED_PVC_SPEC: Obj = {
    "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}},
    "storage": {"size": "5Gi", "storageClassName": "rwx-storage-class"},
}
CONTROLLER: Obj = {
    "apiVersion": "metacontroller.k8s.io/v1alpha1",
    "kind": "CompositeController",
    "metadata": {"name": "praesto-modelcaches"},
}


def modelcache(
    name: str = "tinyllama", spec: Obj | None = None, status: Obj | None = None, namespace: str = "default"
) -> Obj:
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": CREATED,
        },
        "spec": copy.deepcopy(SEED_LOCAL_SPEC if spec is None else spec),
    }
    if status is not None:
        obj["status"] = status
    return obj


def node(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def node_summary(name: str, labels: dict[str, str] | None = None) -> Obj:
    """A NodeSummary as Metacontroller writes it for the Node `name` (hooks/node_summary.py)."""
    summary = nodesummary.summary_for(node(name, labels))
    summary["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": f"uid-{name}", "controller": True}
    ]
    return summary


def cache_node(name: str) -> Obj:
    return node(name, {"praesto.io/cache-node": "true", "kubernetes.io/hostname": name})


def consumer(cache: str, pod: str, node_name: str | None = None, phase: str = "Running") -> Obj:
    obj: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod,
            "namespace": "default",
            "labels": {names.consumer_label_key(cache): "true"},
        },
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": phase},
    }
    if node_name:
        obj["spec"]["nodeName"] = node_name
    return obj


def mcn(cache: str, node_name: str, status: Obj | None = None) -> Obj:
    """An observed ModelCacheNode as the API server returns it (status from the agent)."""
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHENODE_KIND,
        "metadata": {
            "name": names.modelcachenode_name(cache, node_name),
            "namespace": "default",
            "uid": f"uid-{cache}-{node_name}",
            "resourceVersion": "100",
            "labels": {names.LABEL_MODEL_CACHE: cache, names.LABEL_NODE: names.node_label_value(node_name)},
        },
        "spec": {
            "modelCacheName": cache,
            "nodeName": node_name,
            "source": {"uri": "hf://TinyLlama/TinyLlama-1.1B-Chat-v1.0", "revision": "main"},
            "size": "5Gi",
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def node_status(phase: str, done: int = 0, total: int = 0, **extra: Any) -> Obj:
    status: Obj = {"phase": phase}
    if total:
        status["progress"] = {"bytesDone": done, "bytesTotal": total}
    status.update(extra)
    return status


def job(cache: str, conditions: list[Obj] | None = None, active: int = 1, succeeded: int = 0) -> Obj:
    status: Obj = {"active": active} if active else {}
    if succeeded:
        status["succeeded"] = succeeded
    if conditions:
        status["conditions"] = conditions
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.download_job_name(cache), "namespace": "default"},
        "spec": {"backoffLimit": 4},
        "status": status,
    }


def pvc(cache: str, phase: str = "Bound") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": names.pvc_name(cache), "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteMany"]},
        "status": {"phase": phase},
    }


def _keyed(objs: list[Obj], namespaced: bool = True) -> dict[str, Obj]:
    out = {}
    for obj in objs:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if namespaced and meta.get("namespace") else meta["name"]
        out[key] = obj
    return out


def sync_request(
    parent: Obj,
    *,
    nodes: list[Obj] | None = None,
    pods: list[Obj] | None = None,
    children: list[Obj] | None = None,
    finalizing: bool = False,
    summaries: list[Obj] | None = None,
) -> Obj:
    groups: dict[str, list[Obj]] = {
        k: []
        for k in (
            hook_protocol.MODELCACHENODE,
            hook_protocol.PVC,
            hook_protocol.JOB,
            hook_protocol.ROLE,
            hook_protocol.ROLEBINDING,
        )
    }
    for child in children or []:
        groups[hook_protocol.group_key(child["kind"], child["apiVersion"])].append(child)
    return {
        "controller": CONTROLLER,
        "parent": parent,
        "children": {key: _keyed(objs) for key, objs in groups.items()},
        "related": {
            hook_protocol.NODE: _keyed(nodes or [], False),
            hook_protocol.NODESUMMARY: _keyed(summaries or [], False),
            hook_protocol.POD: _keyed(pods or []),
        },
        "finalizing": finalizing,
    }


def customize_request(parent: Obj) -> Obj:
    return {"controller": CONTROLLER, "parent": parent}
