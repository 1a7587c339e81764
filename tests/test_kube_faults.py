"""The fault proxy in front of the real API server: what goes through is the server's, faults are on demand.

These were the deleted API emulator's own checks (selectors, status subresource, preconditions, finalizers,
watch resume and expiry); they now hold against the real kube-apiserver through the proxy, which
proves the proxy forwards faithfully, streams watches and injects its faults where asked.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode

G, V, P = names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL
MCN = f"{P}.{G}"


def mcn(name: str, node: str, namespace: str = "default") -> dict[str, Any]:
    """A valid ModelCacheNode (the CRD's schema holds) named `name`, labelled for `node`."""
    obj = modelcachenode(name, node, namespace)
    obj["metadata"]["name"] = name
    return obj


def resource_version(kube: RealKube) -> str:
    return str(kube.call("GET", kube.path(MCN))["metadata"]["resourceVersion"])


def test_list_filters_by_label_and_carries_resource_versions(kube: RealKube) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.ensure_namespace("ns1")
    a = api.create_namespaced_custom_object(G, V, "ns1", P, mcn("a", "n1", "ns1"))
    kube.create(mcn("b", "n2", "ns2"))
    listed = api.list_cluster_custom_object(G, V, P, label_selector=f"{names.LABEL_NODE}=n1")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert int(listed["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"]) > 0


def test_status_subresource_and_preconditions(kube: RealKube) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.ensure_namespace("ns")
    obj = api.create_namespaced_custom_object(G, V, "ns", P, mcn("a", "n1", "ns"))
    spec, stale = obj["spec"], obj["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object_status(
        G, V, "ns", P, "a", {"status": {"phase": "Ready"}, "spec": {"nodeName": "other"}}
    )
    stored = kube.get(MCN, "a", "ns")
    assert stored is not None
    assert stored["status"] == {"phase": "Ready"}
    assert stored["spec"] == spec  # /status never changes spec
    api.patch_namespaced_custom_object(G, V, "ns", P, "a", {"status": None, "spec": {"size": "2Gi"}})
    stored = kube.get(MCN, "a", "ns")
    assert stored is not None
    assert stored["status"] == {"phase": "Ready"}  # the main resource never changes status
    assert stored["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object(
            G, V, "ns", P, "a", {"metadata": {"resourceVersion": stale, "finalizers": ["x"]}}
        )
    assert err.value.status == 409


def test_finalizers_hold_deletion(kube: RealKube) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.create(mcn("a", "n1"))
    api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": ["f"]}})
    api.delete_namespaced_custom_object(G, V, "default", P, "a")
    held = kube.get(MCN, "a", "default")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": None}})
    assert kube.get(MCN, "a", "default") is None


def _collect(api: client.CustomObjectsApi, out: list[Any], **kwargs: Any) -> None:
    try:
        for event in watch.Watch().stream(api.list_cluster_custom_object, G, V, P, **kwargs):
            out.append((event["type"], event["object"]["metadata"]["name"]))
    except ApiException as err:
        out.append(("ERROR", err.status))


def test_watch_resumes_filters_and_times_out(kube: RealKube) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.create(mcn("before", "n1"))
    since = resource_version(kube)
    kube.create(mcn("missed", "n1"))
    got: list[Any] = []
    thread = threading.Thread(
        target=_collect,
        args=(api, got),
        kwargs={"label_selector": f"{names.LABEL_NODE}=n1", "resource_version": since, "timeout_seconds": 2},
    )
    thread.start()
    kube.wait_for_watches(1)
    kube.create(mcn("other-node", "n2"))
    kube.create(mcn("live", "n1"))
    kube.patch(MCN, "live", {"metadata": {"labels": {names.LABEL_NODE: "n2"}}}, "default")
    thread.join(timeout=10)
    assert not thread.is_alive()  # timeoutSeconds honoured
    assert got == [("ADDED", "missed"), ("ADDED", "live"), ("DELETED", "live")]


def test_compaction_and_expiry_give_410(kube: RealKube) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.create(mcn("a", "n1"))
    kube.create(mcn("b", "n1"))
    kube.compact()
    got: list[Any] = []
    _collect(api, got, resource_version="1", timeout_seconds=5)
    assert got == [("ERROR", 410)]
    kube.wait_for_watches_closed()  # else the next wait could count this finished watch
    got.clear()
    thread = threading.Thread(
        target=_collect,
        args=(api, got),
        kwargs={"resource_version": resource_version(kube), "timeout_seconds": 30},
    )
    thread.start()
    kube.wait_for_watches(1)
    kube.expire_watches()
    thread.join(timeout=10)
    assert got == [("ERROR", 410)]


def test_request_log_and_fault_injection(kube: RealKube) -> None:
    core = client.CoreV1Api(kube.api_client())
    kube.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"}, "data": {}}
    )
    kube.fail_next(1, 503, lambda r: r.resource == "secrets")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("s", "ns")
    assert err.value.status == 503
    assert core.read_namespaced_secret("s", "ns").metadata.name == "s"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="node-1")))
    assert [(r.verb, r.resource, r.namespace, r.name) for r in kube.requests] == [
        ("get", "secrets", "ns", "s"),
        ("get", "secrets", "ns", "s"),
        ("create", "nodes", None, None),
    ]
