"""Admission through the real API server: it calls our webhook by URL + caBundle and applies our JSONPatch itself.

Scheduling is the real kube-scheduler over Node objects we create (no kubelet):
the affinity the webhook injects is what places the Pod.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.hooks.admission.lookup import WatchedLookups

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.helm_chart import NAMESPACE
from testkit.kube_apply import Kube
from testkit.server import post_json
from tests.cluster.installed import HOOKS_SA, Installed
from tests.cluster.tenants import (
    modelcache,
    opted_in_namespace,
    pod,
    ready_node,
    unschedulable_message,
    wait_scheduled,
)

POOL = "test.praesto.io/pool"


@pytest.fixture(scope="module")
def tenant(installed: Installed) -> str:
    namespace = opted_in_namespace(installed.admin, "admission-a")
    installed.admin.create(modelcache("tinyllama", namespace))
    return namespace


def test_pod_in_an_opted_in_namespace_comes_back_mutated(installed: Installed, tenant: str) -> None:
    created = installed.admin.create(pod("chat", tenant, "tinyllama"))
    volumes = created["spec"]["volumes"]
    csi = [v for v in volumes if (v.get("csi") or {}).get("driver") == names.CSI_DRIVER_NAME]
    assert len(csi) == 1
    assert csi[0]["csi"]["readOnly"] is True
    assert csi[0]["csi"]["volumeAttributes"]["modelCacheName"] == "tinyllama"
    mount = next(m for m in created["spec"]["containers"][0]["volumeMounts"] if m["name"] == csi[0]["name"])
    assert mount == {**mount, "mountPath": "/models", "readOnly": True}
    assert created["metadata"]["labels"][names.LABEL_USES_MODEL_CACHE] == "true"
    assert created["metadata"]["labels"][names.consumer_label_key("tinyllama")] == "true"


def test_pod_in_another_namespace_is_untouched(installed: Installed) -> None:
    ensure_namespace(installed.admin, "admission-off")
    installed.admin.create(modelcache("tinyllama", "admission-off"))
    created = installed.admin.create(pod("chat", "admission-off", "tinyllama"))
    assert not any("csi" in v for v in created["spec"].get("volumes") or [])
    assert names.LABEL_USES_MODEL_CACHE not in (created["metadata"].get("labels") or {})


def test_a_missing_cache_is_refused_with_cause_and_fix(installed: Installed, tenant: str) -> None:
    with pytest.raises(ApiException) as err:
        installed.admin.create(pod("orphan", tenant, "no-such-cache"))
    body = str(err.value.body)
    assert "no-such-cache" in body and "does not exist" in body


@pytest.fixture
def webhook_down(installed: Installed) -> Iterator[None]:
    """The Pod webhook pointed at a closed port, as if every hooks replica were gone."""
    kind = "MutatingWebhookConfiguration"
    live = installed.admin.list("admissionregistration.k8s.io/v1", kind)
    ours = next(o for o in live if o["metadata"]["name"] == installed.rendered(kind)["metadata"]["name"])
    down = copy.deepcopy(ours)
    for webhook in down["webhooks"]:
        webhook["clientConfig"]["url"] = "https://127.0.0.1:9/admission/mutate-pod"
    resource = installed.admin.resource("admissionregistration.k8s.io/v1", kind)
    resource.replace(body=down)
    try:
        yield
    finally:
        current = resource.get(name=ours["metadata"]["name"]).to_dict()
        ours["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        resource.replace(body=ours)


def test_webhook_outage_never_blocks_pods_that_do_not_use_praesto(
    installed: Installed, tenant: str, webhook_down: None
) -> None:
    plain = installed.admin.create(pod("plain", tenant))
    assert plain["metadata"]["name"] == "plain"
    with pytest.raises(ApiException) as err:
        installed.admin.create(pod("wants-model", tenant, "tinyllama"))
    assert "mutate-pod.praesto.io" in str(err.value.body)


def _pool_nodes(admin: Kube, pool: str, count: int) -> list[str]:
    return [ready_node(admin, f"{pool}-{i}", {POOL: pool})["metadata"]["name"] for i in range(count)]


def test_preferred_affinity_lands_the_pod_where_its_cache_is_ready(installed: Installed, tenant: str) -> None:
    nodes = _pool_nodes(installed.admin, "prefer", 3)
    ready_key = names.ready_label_key(tenant, "tinyllama")
    core = client.CoreV1Api(installed.admin.api)
    core.patch_node(nodes[1], {"metadata": {"labels": {ready_key: "true"}}})
    # The scheduler's cache lags writes: a Pod created at once could be scored before it sees the
    # label. A plain Pod that requires the label schedules only once it has seen it.
    probe = pod("prefer-probe", tenant)
    probe["spec"]["nodeSelector"] = {POOL: "prefer", ready_key: "true"}
    installed.admin.create(probe)
    assert wait_scheduled(installed.admin, tenant, "prefer-probe") == nodes[1]
    core.delete_namespaced_pod("prefer-probe", tenant, grace_period_seconds=0)
    for i in range(3):
        body = pod(f"prefer-{i}", tenant, "tinyllama", scheduling="Preferred")
        body["spec"]["nodeSelector"] = {POOL: "prefer"}
        installed.admin.create(body)
        assert wait_scheduled(installed.admin, tenant, f"prefer-{i}") == nodes[1]


def test_required_without_a_ready_node_stays_pending_with_the_schedulers_reason(
    installed: Installed, tenant: str
) -> None:
    _pool_nodes(installed.admin, "require", 2)
    body = pod("required", tenant, "tinyllama", scheduling="Required")
    body["spec"]["nodeSelector"] = {POOL: "require"}
    created = installed.admin.create(body)
    terms = created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == names.ready_label_key(
        tenant, "tinyllama"
    )
    message = unschedulable_message(installed.admin, tenant, "required")
    assert "didn't match Pod's node affinity/selector" in message


def test_a_cache_the_watch_has_not_delivered_yet_is_read_directly(installed: Installed) -> None:
    """`kubectl apply -f` of a ModelCache and its Pod: the Pod's admission may come before the
    watch delivers the cache. The lookup then reads the API server once instead of refusing."""
    namespace = opted_in_namespace(installed.admin, "admission-race")
    lookups = WatchedLookups(installed.plane.client_as(NAMESPACE, HOOKS_SA)).start()
    try:
        assert lookups.get_modelcache(namespace, "late") is None  # synced, and nothing there yet
        lookups.modelcaches.stop()  # the watch falls behind: nothing more is delivered
        installed.admin.create(modelcache("late", namespace))
        found = lookups.get_modelcache(namespace, "late")
        assert found is not None and found["metadata"]["name"] == "late"
        assert ("admission-race", "late") not in lookups.modelcaches.items  # it came from the direct read
    finally:
        lookups.stop()


def test_a_forged_admission_review_without_the_api_servers_certificate_learns_nothing(
    installed: Installed, tenant: str
) -> None:
    # Issue 12, finding 6: any Pod could post an AdmissionReview naming another team's
    # namespace and read from the answer whether a cache exists, its source and failure.
    forged = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged",
            "operation": "CREATE",
            "namespace": tenant,
            "object": pod("probe", tenant, "tinyllama"),
        },
    }
    for path in ("/admission/mutate-pod", "/admission/validate-modelcache"):
        status, body = post_json(installed.hooks, path, forged)
        assert status == 403, body
        assert "client certificate is required" in str(body)
        assert "tinyllama" not in str(body) and "org/tiny" not in str(body)
    # The hooks Metacontroller calls (no client certificate) still answer on the same port.
    status, _ = post_json(installed.hooks, "/hooks/modelcache/customize", {"parent": {}})
    assert status != 403
