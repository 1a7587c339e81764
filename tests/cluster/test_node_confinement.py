"""Issue 12, finding 5: a compromised node agent reaches only its own node's copies.

The agent's ClusterRole lets it patch every ModelCacheNode; the chart's
ValidatingAdmissionPolicy narrows that to the copies whose `spec.nodeName` is
the node in its Pod-bound token, and to their status and its own finalizer. The
real kube-apiserver evaluates the policy; tokens come from the TokenRequest API
bound to the Pod the chart's DaemonSet would run on each node, as the kubelet
projects them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import wait_for
from testkit.helm_chart import NAMESPACE
from testkit.objects import modelcachenode
from tests.cluster.agents import agent_pod, bound_to, remove_agent_pod
from tests.cluster.installed import AGENT_SA, Installed
from tests.cluster.tenants import ready_node

Obj = dict[str, Any]
TENANT = "confined"
NODE_A, NODE_B = "confine-a", "confine-b"


@pytest.fixture(scope="module")
def copies(installed: Installed) -> Iterator[dict[str, Obj]]:
    admin = installed.admin
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    made = {}
    for node in (NODE_A, NODE_B):
        ready_node(admin, node)
        made[node] = admin.apply(modelcachenode("shared-model", node, TENANT))
    policy_in_force(installed)
    yield made
    for obj in made.values():
        admin.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], TENANT)


def policy_in_force(installed: Installed) -> None:
    """The API server loads a new policy through an informer: wait until it refuses a probe."""
    loose = client.CustomObjectsApi(installed.plane.client_as(NAMESPACE, AGENT_SA, suffix="probe"))

    def refuses() -> bool:
        try:
            patch_status(loose, NODE_A, {})
        except ApiException as err:
            return err.status in (403, 422)
        return False

    wait_for("the node-agent ValidatingAdmissionPolicy to take effect", refuses, 30)


@pytest.fixture(scope="module")
def agent_a(installed: Installed, copies: dict[str, Obj]) -> Iterator[client.CustomObjectsApi]:
    """The API as node A's agent sees it: its token is bound to its DaemonSet Pod on node A."""
    pod = agent_pod(installed, NODE_A)
    api = installed.plane.client_as(NAMESPACE, AGENT_SA, suffix=NODE_A, bound_object=bound_to(pod))
    yield client.CustomObjectsApi(api)
    remove_agent_pod(installed, pod)


def patch_status(api: client.CustomObjectsApi, node: str, status: Obj) -> Obj:
    name = names.modelcachenode_name("shared-model", node)
    result: Obj = api.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, TENANT, names.MODELCACHENODE_PLURAL, name, {"status": status}
    )
    return result


def patch_object(api: client.CustomObjectsApi, node: str, body: Obj) -> Obj:
    name = names.modelcachenode_name("shared-model", node)
    result: Obj = api.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, TENANT, names.MODELCACHENODE_PLURAL, name, body
    )
    return result


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ApiException) as info:
        call(*args)
    assert info.value.status in (403, 422), info.value.body
    return str(info.value.body)


def test_an_agent_writes_its_own_node_copy_status_and_finalizer(agent_a: client.CustomObjectsApi) -> None:
    out = patch_status(agent_a, NODE_A, {"phase": "Downloading", "peer": {"address": "10.0.0.1:9103"}})
    assert out["status"]["phase"] == "Downloading"
    added = patch_object(agent_a, NODE_A, {"metadata": {"finalizers": [names.FINALIZER_NODE_AGENT]}})
    assert added["metadata"]["finalizers"] == [names.FINALIZER_NODE_AGENT]
    removed = patch_object(agent_a, NODE_A, {"metadata": {"finalizers": None}})
    assert not removed["metadata"].get("finalizers")


def test_an_agent_cannot_touch_another_nodes_copy(
    agent_a: client.CustomObjectsApi, installed: Installed
) -> None:
    # The attack: advertise itself as node B's peer, or pin a revision through B's status.
    body = refused(
        patch_status, agent_a, NODE_B, {"peer": {"address": "10.6.6.6:9103"}, "resolvedRevision": "f" * 40}
    )
    assert f"agent on node {NODE_A} may change only its own node copies" in body
    assert f"belongs to node {NODE_B}" in body
    refused(patch_object, agent_a, NODE_B, {"metadata": {"finalizers": [names.FINALIZER_NODE_AGENT]}})
    status = installed.admin.get(
        names.API_VERSION,
        names.MODELCACHENODE_KIND,
        names.modelcachenode_name("shared-model", NODE_B),
        TENANT,
    )
    assert status is not None and "peer" not in (status.get("status") or {})


def test_an_agent_cannot_rewrite_spec_labels_or_other_finalizers(agent_a: client.CustomObjectsApi) -> None:
    evil = {"uri": "hf://attacker/model", "revision": "main"}
    assert "may not change a ModelCacheNode's spec" in refused(
        patch_object, agent_a, NODE_A, {"spec": {"source": evil}}
    )
    labels = {"metadata": {"labels": {names.LABEL_NODE: names.node_label_value(NODE_B)}}}
    assert "only its own finalizer" in refused(patch_object, agent_a, NODE_A, labels)
    other = {"metadata": {"finalizers": ["example.com/keep-forever"]}}
    assert "only its own finalizer" in refused(patch_object, agent_a, NODE_A, other)


def test_a_token_not_bound_to_a_node_is_refused(installed: Installed, copies: dict[str, Obj]) -> None:
    # A token minted without a Pod binding (stolen from a Secret, or requested by hand).
    loose = client.CustomObjectsApi(installed.plane.client_as(NAMESPACE, AGENT_SA, suffix="unbound"))
    body = refused(patch_status, loose, NODE_A, {"phase": "Ready"})
    assert "not bound to a Pod on a node" in body


def test_the_policy_is_rendered_from_the_shared_names(installed: Installed) -> None:
    policy = installed.rendered("ValidatingAdmissionPolicy", f"{AGENT_SA}-own-node")
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}" in condition
    assert names.FINALIZER_NODE_AGENT in policy["spec"]["validations"][-1]["expression"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["apiGroups"] == [names.GROUP]


def test_an_agent_may_only_lift_the_startup_taint_from_its_own_node(
    agent_a: client.CustomObjectsApi, installed: Installed
) -> None:
    # Issue 15: the agent lifts the startup taint (agent/startup_taint.py); RBAC grants nodes patch cluster-wide.
    startup = {"key": names.DEFAULT_STARTUP_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    other = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}
    admin = client.CoreV1Api(installed.admin.api)
    for node in (NODE_A, NODE_B):
        admin.patch_node(node, {"spec": {"taints": [startup, other]}})
    as_agent = client.CoreV1Api(agent_a.api_client)

    body = refused(as_agent.patch_node, NODE_B, {"spec": {"taints": [other]}})
    assert f"only the Node its token is bound to ({NODE_A}), not {NODE_B}" in body
    assert "only remove the startup taint" in refused(
        as_agent.patch_node, NODE_A, {"spec": {"taints": [startup]}}
    )
    added = [startup, other, {"key": "x", "effect": "NoSchedule"}]
    assert "only remove the startup taint" in refused(
        as_agent.patch_node, NODE_A, {"spec": {"taints": added}}
    )
    label = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
    assert "may not change a Node's metadata.labels" in refused(as_agent.patch_node, NODE_A, label)
    assert "may not change a Node's spec.unschedulable" in refused(
        as_agent.patch_node, NODE_A, {"spec": {"unschedulable": True}}
    )

    lifted = as_agent.patch_node(NODE_A, {"spec": {"taints": [other]}})
    assert [t.key for t in lifted.spec.taints] == ["example.com/dedicated"]
    assert [t.key for t in admin.read_node(NODE_B).spec.taints] == [
        names.DEFAULT_STARTUP_TAINT_KEY,
        "example.com/dedicated",
    ]


# Every field a client may set on a Node's UPDATE, with a value the agent might try (#21 item 5). The
# ObjectMeta fields the API server manages itself (or that are immutable) are listed apart; the test
# fails when the API server's schema has a field in neither list.
NODE_ATTEMPTS: dict[str, Obj] = {
    "metadata.labels": {"metadata": {"labels": {"example.com/evil": "1"}}},
    "metadata.annotations": {"metadata": {"annotations": {"example.com/evil": "1"}}},
    # an owner that does not exist: the garbage collector would delete the Node
    "metadata.ownerReferences": {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "gone",
                    "uid": "6b0c4f59-0000-4000-8000-000000000001",
                }
            ]
        }
    },
    "metadata.finalizers": {"metadata": {"finalizers": ["example.com/hold-forever"]}},
    "metadata.generateName": {"metadata": {"generateName": "evil-"}},
    "spec.podCIDR": {"spec": {"podCIDR": "10.250.0.0/24"}},
    "spec.podCIDRs": {"spec": {"podCIDRs": ["10.250.0.0/24"]}},
    "spec.providerID": {"spec": {"providerID": "evil:///node"}},
    "spec.unschedulable": {"spec": {"unschedulable": True}},
    "spec.configSource": {
        "spec": {
            "configSource": {
                "configMap": {"name": "evil", "namespace": "kube-system", "kubeletConfigKey": "kubelet"}
            }
        }
    },
    "spec.externalID": {"spec": {"externalID": "evil"}},
    "spec.podPreemptionPolicy": {"spec": {"podPreemptionPolicy": {"disableResizePreemption": ["evil"]}}},
}
SERVER_MANAGED_METADATA = {
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields",
}  # fmt: skip


def _schema_fields(installed: Installed) -> set[str]:
    """NodeSpec and ObjectMeta properties, as this API server serves them (OpenAPI v3)."""
    response = installed.admin.api.call_api(
        "/openapi/v3/api/v1", "GET", auth_settings=["BearerToken"], _preload_content=False
    )
    data = json.loads(response[0].data if isinstance(response, tuple) else response.data)
    schemas = data["components"]["schemas"]
    spec = set(schemas["io.k8s.api.core.v1.NodeSpec"]["properties"])
    meta = set(schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"])
    return {f"spec.{f}" for f in spec - {"taints"}} | {
        f"metadata.{f}" for f in meta - SERVER_MANAGED_METADATA
    }


def _comparable(node: Obj) -> Obj:
    meta = {k: v for k, v in node["metadata"].items() if k not in ("managedFields", "resourceVersion")}
    return {"metadata": meta, "spec": node.get("spec") or {}}


def test_nothing_on_its_node_but_the_startup_taint_changes(
    agent_a: client.CustomObjectsApi, installed: Installed
) -> None:
    """#21 item 5, as a class: the agent's attempt at every settable Node field is refused."""
    as_agent = client.CoreV1Api(agent_a.api_client)
    admin = client.CoreV1Api(installed.admin.api)
    serialize = installed.admin.api.sanitize_for_serialization
    before = _comparable(serialize(admin.read_node(NODE_A)))
    changed, answers = [], {}
    for field, patch in NODE_ATTEMPTS.items():
        try:
            as_agent.patch_node(NODE_A, patch)
        except ApiException as err:
            answers[field] = (err.status, str(err.body))
            continue
        # admitted: a field the API server itself drops (spec.configSource, no longer served; an
        # alpha field behind a feature gate that is off), so nothing changed
        if _comparable(serialize(admin.read_node(NODE_A))) != before:
            changed.append(field)
    assert changed == [], f"the agent changed its Node's {changed}"
    for field, (status, body) in answers.items():
        # Some are refused before the policy is asked: immutable fields by the API server's own
        # validation (422), owner changes by OwnerReferencesPermissionEnforcement (the agent may not
        # delete Nodes); clusters that lack either rely on the policy's expression, checked below.
        named = field.removesuffix("s") if field == "spec.podCIDRs" else field  # defaulting sets podCIDR too
        by_policy = "ValidatingAdmissionPolicy" in body
        assert status in (403, 422) and (not by_policy or f"may not change a Node's {named}" in body), body
    assert _comparable(serialize(admin.read_node(NODE_A))) == before
    assert set(NODE_ATTEMPTS) == _schema_fields(installed), "a Node field the policy does not cover"
    policy = installed.rendered("ValidatingAdmissionPolicy", f"{AGENT_SA}-own-node-taint")
    guarded = {m.group(1) for v in policy["spec"]["validations"]
               for m in re.finditer(r"has\(object\.((?:metadata|spec)\.\w+)\)", v["expression"])}  # fmt: skip
    assert guarded == set(NODE_ATTEMPTS)
