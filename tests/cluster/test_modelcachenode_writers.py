"""Issue 37: only Praesto's controller writes ModelCacheNodes, even for a user who may write anything in a namespace.

A ModelCacheNode makes the node agents fetch its source with the Secrets granted in its namespace,
so the chart's `*-modelcachenode-writers` ValidatingAdmissionPolicy keeps its writes to identities
allowed to create ModelCacheNodes in every namespace (Metacontroller). The real kube-apiserver
evaluates the policy; the tenant holds a `*` Role in its own namespace, the widest grant a
namespace admin hands out. The node agent's own rights are test_node_confinement.py's, the hooks'
release of a vanished Node's copy test_node_gone.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import wait_for
from testkit.helm_chart import NAMESPACE, RELEASE
from testkit.kube_apply import Kube
from testkit.objects import modelcachenode
from tests.cluster.installed import AGENT_SA, Installed
from tests.cluster.tenants import grant

Obj = dict[str, Any]
TENANT = "mcn-writers"
EDITOR = "namespace-admin"
NODE = "writers-node"
EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
# What the attacker wants the agents to fetch: another path, with the namespace's granted Secret.
EVIL_SOURCE = {"uri": "s3://bank-data/hr-private", "secretRef": {"name": "team-s3"}}
CREATE_REFUSED = (
    "only Praesto's controller (Metacontroller, which may create ModelCacheNodes in every namespace)"
)
UPDATE_REFUSED = "are written by Praesto's controller (Metacontroller) and the node agent only"


@pytest.fixture(scope="module")
def editor(installed: Installed) -> client.CustomObjectsApi:
    """A user who may do anything in TENANT (a `*` Role there), and nothing cluster-wide."""
    installed.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    grant(installed.admin, TENANT, EDITOR, "everything", EVERYTHING)
    api = client.CustomObjectsApi(installed.plane.client_as(TENANT, EDITOR))
    probe = modelcachenode("probe", NODE, TENANT)

    def refuses() -> bool:  # the API server loads a new policy through an informer
        try:
            create(api, probe)
        except ApiException as err:
            return err.status == 403 and CREATE_REFUSED in str(err.body)
        installed.admin.delete(
            names.API_VERSION, names.MODELCACHENODE_KIND, probe["metadata"]["name"], TENANT
        )
        return False

    wait_for("the modelcachenode-writers policy to take effect", refuses, 30)
    return api


def create(api: client.CustomObjectsApi, obj: Obj) -> Obj:
    result: Obj = api.create_namespaced_custom_object(
        names.GROUP, names.VERSION, TENANT, names.MODELCACHENODE_PLURAL, obj
    )
    return result


def patch(api: client.CustomObjectsApi, name: str, body: Obj, *, status: bool = False) -> Obj:
    call = api.patch_namespaced_custom_object_status if status else api.patch_namespaced_custom_object
    result: Obj = call(names.GROUP, names.VERSION, TENANT, names.MODELCACHENODE_PLURAL, name, body)
    return result


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ApiException) as info:
        call(*args, **kwargs)
    assert info.value.status == 403, info.value.body
    return str(info.value.body)


def test_a_namespace_wide_writer_cannot_create_a_modelcachenode(
    installed: Installed, editor: client.CustomObjectsApi
) -> None:
    # The `*` Role is real: the same user creates anything else in its namespace.
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "anything"}}
    client.CoreV1Api(editor.api_client).create_namespaced_config_map(TENANT, config_map)
    evil = modelcachenode("evil", NODE, TENANT, source=EVIL_SOURCE)
    assert CREATE_REFUSED in refused(create, editor, evil)
    assert (
        installed.admin.get(names.API_VERSION, names.MODELCACHENODE_KIND, evil["metadata"]["name"], TENANT)
        is None
    )


def test_a_namespace_wide_writer_cannot_change_one_but_may_let_it_go(
    installed: Installed, editor: client.CustomObjectsApi, metacontroller: Kube
) -> None:
    made = metacontroller.create(modelcachenode("honest", NODE, TENANT))
    name = made["metadata"]["name"]
    attempts: dict[str, tuple[Obj, bool]] = {
        "spec": ({"spec": {"source": EVIL_SOURCE}}, False),
        "labels": ({"metadata": {"labels": {names.LABEL_NODE: names.node_label_value("other-node")}}}, False),
        "annotations": ({"metadata": {"annotations": {"example.com/x": "1"}}}, False),
        "a finalizer": ({"metadata": {"finalizers": ["example.com/keep-forever"]}}, False),
        "status": ({"status": {"phase": names.PHASE_READY, "peer": {"address": "10.6.6.6:9103"}}}, True),
    }
    for what, (body, status) in attempts.items():
        assert UPDATE_REFUSED in refused(patch, editor, name, body, status=status), what
    after = installed.admin.get(names.API_VERSION, names.MODELCACHENODE_KIND, name, TENANT)
    assert after is not None and after["spec"] == made["spec"] and "status" not in after
    # Letting go stays open (the garbage collector orphaning it, the hooks releasing a gone Node's copy).
    held = patch(
        client.CustomObjectsApi(metacontroller.api), name, {"metadata": {"finalizers": ["example.com/held"]}}
    )
    assert held["metadata"]["finalizers"] == ["example.com/held"]
    released = patch(editor, name, {"metadata": {"finalizers": None}})
    assert not released["metadata"].get("finalizers")
    installed.admin.delete(names.API_VERSION, names.MODELCACHENODE_KIND, name, TENANT)


def test_metacontroller_writes_them_in_any_namespace(installed: Installed, metacontroller: Kube) -> None:
    made = metacontroller.create(modelcachenode("from-controller", NODE, TENANT))
    name = made["metadata"]["name"]
    changed = patch(client.CustomObjectsApi(metacontroller.api), name, {"spec": {"size": "2Gi"}})
    assert changed["spec"]["size"] == "2Gi"
    installed.admin.delete(names.API_VERSION, names.MODELCACHENODE_KIND, name, TENANT)


def test_the_policy_leaves_only_the_node_agent_to_its_own_node_policy(installed: Installed) -> None:
    policy = installed.rendered("ValidatingAdmissionPolicy", f"{RELEASE}-modelcachenode-writers")
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"]
        == f'request.userInfo.username != "system:serviceaccount:{NAMESPACE}:{AGENT_SA}"'
    )
    installed.rendered("ValidatingAdmissionPolicy", f"{AGENT_SA}-own-node")  # which confines the agent
