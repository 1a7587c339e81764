"""Pods for the node tier: what a user writes, run by the real kubelet, read back through the API."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import wait_for
from testkit.kube_apply import Kube
from testkit.node_images import BUSYBOX_IMAGE

Obj = dict[str, Any]
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def busybox_pod(
    name: str,
    namespace: str,
    script: str,
    *,
    cache: str | None = None,
    volumes: list[Obj] | None = None,
    mounts: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    """A Pod running `sh -c script` in the tier's busybox image (Pod Security "restricted")."""
    annotations = {}
    if cache:
        annotations[names.ANNOTATION_MODEL_MOUNTS] = json.dumps(
            [{"modelCache": cache, "mountPath": "/models"}]
        )
    container: Obj = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "securityContext": RESTRICTED,
    }
    if mounts:
        container["volumeMounts"] = mounts
    body: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
        **spec,
    }
    if volumes:
        body["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": body,
    }


def core(kube: Kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api)


def pod_phase(kube: Kube, name: str, namespace: str) -> str:
    try:
        return str(core(kube).read_namespaced_pod(name, namespace).status.phase)
    except ApiException as err:
        if err.status == 404:
            return "Gone"
        raise


def wait_phase(kube: Kube, name: str, namespace: str, phases: tuple[str, ...], deadline: float = 120) -> str:
    wait_for(
        f"Pod {namespace}/{name} {'/'.join(phases)}",
        lambda: pod_phase(kube, name, namespace) in phases,
        deadline,
    )
    return pod_phase(kube, name, namespace)


def pod_log(kube: Kube, name: str, namespace: str) -> str:
    """Through the API server from the kubelet (raw: kubernetes 36.0.3 mangles decoded logs)."""
    response = core(kube).read_namespaced_pod_log(name, namespace, _preload_content=False)
    return bytes(response.data).decode()


def pod_events(kube: Kube, namespace: str, name: str) -> list[Any]:
    selector = f"involvedObject.kind=Pod,involvedObject.name={name}"
    return list(core(kube).list_namespaced_event(namespace, field_selector=selector).items)


def event_messages(kube: Kube, namespace: str, name: str, reason: str) -> list[str]:
    return [str(e.message) for e in pod_events(kube, namespace, name) if e.reason == reason]


def delete_pod(kube: Kube, name: str, namespace: str, deadline: float = 60) -> None:
    try:
        core(kube).delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    except ApiException as err:
        if err.status != 404:
            raise
    wait_for(f"Pod {namespace}/{name} gone", lambda: pod_phase(kube, name, namespace) == "Gone", deadline)


def mount_points_of(pod_uid: str) -> list[str]:
    """The node's mounts inside this Pod's kubelet directory for CSI volumes."""
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    return [p for p in points if f"/pods/{pod_uid}/volumes/kubernetes.io~csi/" in p]
