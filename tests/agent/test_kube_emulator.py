"""The test Kubernetes API emulator behaves like the API server where the agent relies on it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from praesto import names
from tests.support.kube import KubeEmulator, selector_matches

G, V, P = names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL
MCN = f"{P}.{G}"


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


def mcn(name: str, node: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHENODE_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {names.LABEL_NODE: node}},
        "spec": {"nodeName": node},
    }


def test_selectors() -> None:
    labels = {"a": "1", "b": "2"}
    assert selector_matches("a=1,b==2", labels)
    assert not selector_matches("a!=1", labels)
    assert selector_matches("a in (1, 3),!c", labels)
    assert not selector_matches("b notin (2)", labels)
    assert not selector_matches("c", labels)


def test_list_filters_by_label_and_carries_resource_versions(kube: KubeEmulator) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    a = api.create_namespaced_custom_object(G, V, "ns1", P, mcn("a", "n1", "ns1"))
    kube.create(mcn("b", "n2", "ns2"))
    listed = api.list_cluster_custom_object(G, V, P, label_selector=f"{names.LABEL_NODE}=n1")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert int(listed["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"]) > 0


def test_status_subresource_and_preconditions(kube: KubeEmulator) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    obj = api.create_namespaced_custom_object(G, V, "ns", P, mcn("a", "n1", "ns"))
    stale = obj["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object_status(
        G, V, "ns", P, "a", {"status": {"phase": "Ready"}, "spec": {"nodeName": "other"}}
    )
    stored = kube.get(MCN, "a", "ns")
    assert stored is not None
    assert stored["status"] == {"phase": "Ready"}
    assert stored["spec"] == {"nodeName": "n1"}  # /status never changes spec
    api.patch_namespaced_custom_object(G, V, "ns", P, "a", {"status": None, "spec": {"size": "1Gi"}})
    stored = kube.get(MCN, "a", "ns")
    assert stored is not None
    assert stored["status"] == {"phase": "Ready"}  # the main resource never changes status
    assert stored["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object(
            G, V, "ns", P, "a", {"metadata": {"resourceVersion": stale, "finalizers": ["x"]}}
        )
    assert err.value.status == 409


def test_finalizers_hold_deletion(kube: KubeEmulator) -> None:
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


def test_watch_resumes_filters_and_times_out(kube: KubeEmulator) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    kube.create(mcn("before", "n1"))
    since = str(kube.resource_version)
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


def test_compaction_and_expiry_give_410(kube: KubeEmulator) -> None:
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
        kwargs={"resource_version": str(kube.resource_version), "timeout_seconds": 30},
    )
    thread.start()
    kube.wait_for_watches(1)
    kube.expire_watches()
    thread.join(timeout=10)
    assert got == [("ERROR", 410)]


def test_request_log_and_fault_injection(kube: KubeEmulator) -> None:
    core = client.CoreV1Api(kube.api_client())
    kube.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"}, "data": {}}
    )
    kube.fail_next(1, 503)
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
