"""Issue 12, peers: a node agent reads from a peer only what is placed on its own node.

A real peer server (the production `Gate`: signature, nonce, TokenReview, then a
ModelCacheNode lookup) runs with the agent ServiceAccount's own client against
the real kube-apiserver, so the chart's RBAC (tokenreviews create) and the API
server's Pod-bound token extras are the real ones. Tokens come from the
TokenRequest API with the peer audience, bound to the Pod the chart's DaemonSet
would run on each node, exactly as the kubelet projects them.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from praesto.agent.peers import auth
from praesto.agent.peers.identity import Gate, Identities
from praesto.agent.peers.server import PeerServer, file_path

from praesto import names
from praesto.store import StoreLayout
from tests.cluster.agents import agent_pod, bound_to, remove_agent_pod
from tests.cluster.installed import AGENT_SA, HOOKS_SA, Installed
from tests.cluster.tenants import ready_node
from tests.peers.test_peer_server import REV, make_cache
from tests.support.helm_chart import NAMESPACE
from tests.support.objects import modelcachenode

Obj = dict[str, Any]
TENANT = "peer-tenant"
NODE_A, NODE_B = "peer-a", "peer-b"
SECRET = b"chart-generated-peer-secret-0123456789"


def peer_token(installed: Installed, service_account: str, namespace: str, bound: Obj | None = None) -> str:
    """A TokenRequest token with the peer audience, as the chart's projected volume asks for it."""
    spec: Obj = {"audiences": [names.PEER_TOKEN_AUDIENCE], "expirationSeconds": 600}
    if bound is not None:
        spec["boundObjectRef"] = bound
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    core = client.CoreV1Api(installed.plane.admin())
    return str(core.create_namespaced_service_account_token(service_account, namespace, body).status.token)


@pytest.fixture(scope="module")
def world(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PeerServer, dict[str, str]]]:
    """Node B's peer server holding two caches of the tenant; node A holds a copy of `placed` only."""
    admin = installed.admin
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    made = [
        admin.apply(modelcachenode("placed", NODE_A, TENANT)),
        admin.apply(modelcachenode("elsewhere", NODE_B, TENANT)),
    ]
    pods = {}
    for node in (NODE_A, NODE_B):
        ready_node(admin, node)
        pods[node] = agent_pod(installed, node)
    tokens = {
        "a": peer_token(installed, AGENT_SA, NAMESPACE, bound_to(pods[NODE_A])),
        "unbound": peer_token(installed, AGENT_SA, NAMESPACE),
        "hooks": peer_token(installed, HOOKS_SA, NAMESPACE),
    }
    layout = StoreLayout(Path(tmp_path_factory.mktemp("peer-b")))
    make_cache(layout, TENANT, "placed")
    make_cache(layout, TENANT, "elsewhere")
    agent_api = installed.plane.client_as(
        NAMESPACE, AGENT_SA, suffix=NODE_B, bound_object=bound_to(pods[NODE_B])
    )
    gate = Gate(SECRET, Identities(agent_api, f"{NAMESPACE}/{AGENT_SA}"))
    server = PeerServer(layout, gate, ("127.0.0.1", 0)).start()
    try:
        yield server, tokens
    finally:
        server.stop()
        for pod in pods.values():
            remove_agent_pod(installed, pod)
        for obj in made:
            admin.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], TENANT)


def ask(server: PeerServer, cache: str, token: str, node: str = NODE_A) -> tuple[int, str]:
    path = file_path(TENANT, cache, REV, "model.bin")
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=20)
    try:
        conn.request("GET", path, headers={"Authorization": auth.sign(SECRET, token, node, "GET", path)})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, "" if resp.status == 200 else json.loads(body)["error"]
    finally:
        conn.close()


def test_a_pod_bound_agent_token_is_its_node_and_reads_only_what_is_placed_there(
    world: tuple[PeerServer, dict[str, str]],
) -> None:
    server, tokens = world
    assert ask(server, "placed", tokens["a"]) == (200, "")
    status, error = ask(server, "elsewhere", tokens["a"])  # no ModelCacheNode of it on node A
    assert status == 403 and f"node {NODE_A} holds no copy of {TENANT}/elsewhere" in error
    status, error = ask(server, "placed", tokens["a"], node=NODE_B)  # claims to be another node
    assert status == 401 and f"token is bound to {NODE_A}" in error


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("unbound", "not bound to a Pod on a node"), ("hooks", "not the node agent")],
)
def test_tokens_not_bound_to_an_agent_pod_are_refused(
    world: tuple[PeerServer, dict[str, str]], kind: str, expected: str
) -> None:
    server, tokens = world
    status, error = ask(server, "placed", tokens[kind])
    assert status == 401 and expected in error
    assert tokens[kind] not in error
