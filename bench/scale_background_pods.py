"""The cluster's other Pods: what Metacontroller caches although no cache uses them.

A ModelCache relates its consumer Pods (hooks/modelcache.py `customize`). Metacontroller 4.17.2
keeps one informer per related resource, listed and watched with no namespace and no label
selector (`pkg/dynamic/informer/informer.go` `newSharedResourceInformer`: `client.List(ctx,
opts)`; the rule's selector is applied later, to the informer's cache), so it holds every Pod
of the cluster in memory, whole. A fleet runs tens of Pods per node, none of them ours, so that
cost grows with the fleet, not with the caches: this writes such Pods, so the scale tier can
measure it.

Each Pod is shaped like a Deployment's replica as the API server returns it once running: created
by the ReplicaSet controller's field manager (labels, two containers with env, probes, resources,
the projected token volume and default tolerations the admission plugins add), bound to a Node,
and its status written by the kubelet (conditions, IPs, container statuses).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from bench.scale_nodes import node_name
from testkit.chart_install import ensure_namespace
from testkit.kube_apply import Kube

Obj = dict[str, Any]
NAMESPACES = 10  # background Pods spread over this many namespaces, like a fleet's teams
STARTED = "2026-12-07T00:00:00Z"


def namespace_of(index: int) -> str:
    return f"apps-{index % NAMESPACES:02d}"


def _container(name: str, image: str, port: int) -> Obj:
    return {
        "name": name,
        "image": image,
        "ports": [{"containerPort": port, "name": "http", "protocol": "TCP"}],
        "env": [{"name": f"SETTING_{i}", "value": f"value-{i}"} for i in range(8)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": port, "scheme": "HTTP"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port, "scheme": "HTTP"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }  # fmt: skip


def pod_body(index: int, nodes: int) -> Obj:
    """A running replica of one of a few apps, on node `index % nodes`."""
    app = f"app-{index % 50:02d}"
    name = f"{app}-7d9f8b6c4-{index:06d}"
    projected = {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ], "defaultMode": 420}  # fmt: skip
    containers = [_container("app", f"registry.example/{app}:1.4.2", 8080),
                  _container("sidecar", "registry.example/proxy:2.1.0", 15000)]  # fmt: skip
    tolerations = [
        {
            "key": f"node.kubernetes.io/{t}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        }
        for t in ("not-ready", "unreachable")
    ]
    labels = {"app": app, "pod-template-hash": "7d9f8b6c4", "team": namespace_of(index)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},  # no ownerReferences: the garbage collector would
        # delete a Pod whose ReplicaSet does not exist, and a real one would replace the Pods
        "spec": {
            "nodeName": node_name(index % nodes),
            "containers": containers,
            "volumes": [{"name": "kube-api-access", "projected": projected}],
            "tolerations": tolerations,
        },
    }


def pod_status(index: int) -> Obj:
    ip = f"10.{64 + index // 65536 % 64}.{index // 256 % 256}.{index % 256}"
    conditions = [{"type": t, "status": "True", "lastTransitionTime": STARTED}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]  # fmt: skip
    statuses = [
        {"name": n, "ready": True, "restartCount": 0, "started": True, "image": image,
         "imageID": f"registry.example/{image.split('/')[1].split(':')[0]}@sha256:{'ab' * 32}",
         "containerID": f"containerd://{index:064x}", "state": {"running": {"startedAt": STARTED}}}
        for n, image in (("app", "registry.example/app:1.4.2"), ("sidecar", "registry.example/proxy:2.1.0"))
    ]  # fmt: skip
    return {"phase": "Running", "conditions": conditions, "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": STARTED, "qosClass": "Burstable",
            "containerStatuses": statuses}  # fmt: skip


class PodWriter:
    """Writes `count` background Pods from a few threads, as the ReplicaSet controller and kubelet would."""

    def __init__(self, admin: Kube, configuration: client.Configuration, threads: int = 8) -> None:
        self.admin, self.configuration, self.threads = admin, configuration, threads
        self._local = threading.local()

    def _core(self) -> client.CoreV1Api:
        if not hasattr(self._local, "core"):
            self._local.core = client.CoreV1Api(client.ApiClient(configuration=self.configuration))
        return self._local.core

    def write(self, index: int, nodes: int) -> None:
        core, body = self._core(), pod_body(index, nodes)
        namespace = namespace_of(index)
        core.create_namespaced_pod(namespace, body, field_manager="kube-controller-manager")
        core.patch_namespaced_pod_status(
            body["metadata"]["name"], namespace, {"status": pod_status(index)}, field_manager="kubelet"
        )

    def write_all(self, count: int, nodes: int) -> None:
        for namespace in sorted({namespace_of(i) for i in range(min(count, NAMESPACES))}):
            ensure_namespace(self.admin, namespace)
        with ThreadPoolExecutor(self.threads) as pool:
            for done in pool.map(lambda i: self.write(i, nodes), range(count)):
                del done
