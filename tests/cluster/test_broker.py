"""The credentials broker against the real API server (issue 37 item 6a): real Pod-bound tokens whose
TokenReview names the node, the chart's RBAC (the per-cache grant binds praesto-hooks' account), the
real praesto-hooks from the wheel answering over HTTPS.

The copy and the grant are made as Metacontroller would from the sync hook's answer
(hooks/local.py), so the test decides the copy's phase itself.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.hooks.config import HooksConfig
from praesto.hooks.local import granted_objects, secret_grant

from praesto import names
from praesto.spec import parse_spec
from testkit.helm_chart import NAMESPACE
from testkit.objects import modelcachenode
from tests.cluster.agents import agent_pod, bound_to, remove_agent_pod
from tests.cluster.installed import AGENT_SA, HOOKS_SA, Installed
from tests.cluster.tenants import ready_node

NS = "broker-tenant"
CACHE = "private"
HERE, ELSEWHERE = "broker-node-a", "broker-node-b"
SOURCE = {"huggingface": {"repo": "org/private", "token": {"secretRef": {"name": "hf", "key": "HF_TOKEN"}}}}


def broker_token(installed: Installed, pod: dict[str, Any]) -> str:
    """What the agent on `pod`'s node mints (agent/peers/auth.py TokenMinter) for the broker."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [names.BROKER_TOKEN_AUDIENCE],
            "expirationSeconds": 600,
            "boundObjectRef": bound_to(pod),
        },
    }
    made = client.CoreV1Api(installed.admin.api).create_namespaced_service_account_token(
        AGENT_SA, NAMESPACE, body
    )
    return str(made.status.token)


def ask(installed: Installed, token: str, name: str = "hf") -> tuple[int, dict[str, Any]]:
    assert installed.hooks.ca_path is not None
    context = ssl.create_default_context(cafile=str(installed.hooks.ca_path))
    body = json.dumps({"namespace": NS, "cache": CACHE, "kind": "Secret", "name": name}).encode()
    request = urllib.request.Request(
        installed.hooks.url(names.BROKER_PATH),
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_only_the_agent_of_the_node_whose_copy_needs_the_secret_gets_it(installed: Installed) -> None:
    admin, core = installed.admin, client.CoreV1Api(installed.admin.api)
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for node in (HERE, ELSEWHERE):
        ready_node(admin, node)
    secret = base64.b64encode(b"hf_tenant_token").decode()
    for name in ("hf", "unrelated"):
        core.create_namespaced_secret(NS, {"metadata": {"name": name}, "data": {"HF_TOKEN": secret}})
    spec = parse_spec({"source": SOURCE, "storage": {"size": "1Gi"}})
    parent = {"apiVersion": names.API_VERSION, "kind": names.MODELCACHE_KIND,
              "metadata": {"name": CACHE, "namespace": NS, "uid": "00000000-0000-0000-0000-000000000001"}}  # fmt: skip
    config = HooksConfig(namespace=NAMESPACE, hooks_service_account=HOOKS_SA, agent_service_account=AGENT_SA)
    for obj in secret_grant(parent, granted_objects(spec), config):  # what the sync hook returns
        obj["metadata"].pop("ownerReferences", None)
        admin.apply(obj)
    node_source = {
        "uri": "hf://org/private",
        "revision": "main",
        "secretRef": {"name": "hf", "key": "HF_TOKEN"},
    }
    copy = admin.create(modelcachenode(CACHE, HERE, NS, source=node_source))
    here, elsewhere = agent_pod(installed, HERE), agent_pod(installed, ELSEWHERE)
    try:
        # The agents' own ServiceAccount reads no tenant Secret, grant or not.
        agent = client.CoreV1Api(installed.kube_as(AGENT_SA).api)
        with pytest.raises(ApiException) as refused:
            agent.read_namespaced_secret("hf", NS)
        assert refused.value.status == 403

        status, body = ask(installed, broker_token(installed, here))  # the copy is not reported yet
        assert status == 200 and base64.b64decode(body["data"]["HF_TOKEN"]) == b"hf_tenant_token"

        status, body = ask(installed, broker_token(installed, elsewhere))
        assert (status, body["reason"]) == (403, "NoCopyOnThisNode"), body
        status, body = ask(installed, broker_token(installed, here), name="unrelated")
        assert (status, body["reason"]) == (403, "NotNamedByTheCopy"), body

        status_api = client.CustomObjectsApi(installed.admin.api)
        status_api.patch_namespaced_custom_object_status(
            names.GROUP, names.VERSION, NS, names.MODELCACHENODE_PLURAL, copy["metadata"]["name"],
            {"status": {"phase": names.PHASE_READY}},
        )  # fmt: skip
        status, body = ask(installed, broker_token(installed, here))
        assert (status, body["reason"]) == (409, "CopySettled"), body
        assert "hf_tenant_token" not in json.dumps(body)
    finally:
        for pod in (here, elsewhere):
            remove_agent_pod(installed, pod)
