"""Peers, per-node identity both ways (issue 12, and issue 21 item 12), on the real API server.

Real peer servers (the production `PeerAuthorizer`: TokenReview with the server's own node
audience, then a ModelCacheNode lookup) run with the agent ServiceAccount's own
client, bound to the agent Pod the chart's DaemonSet would run on their node. The
asking agent mints its tokens itself through the real TokenRequest API
(`auth.TokenMinter`), under the chart's Role and ValidatingAdmissionPolicy.

Before item 12 every agent held one shared HMAC secret and a token any node accepted:
a request captured on its way to one node was good at any other for 60 s (nonces
were per server), and an agent could put another node's token on its own requests.
Until issue 37 item 6b a captured request replayed to the node it was meant for got
200 while its token lived: now each token names a key of the asking agent's, that key
signs each request, and the node answers each nonce once (agent/peers/protocol.py).
"""

from __future__ import annotations

import copy
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.agent.kube import Door
from praesto.agent.peers import auth, protocol
from praesto.agent.peers.identity import Identities, PeerAuthorizer
from praesto.agent.peers.protocol import file_path
from praesto.agent.peers.server import PeerServer

from praesto import names
from praesto.store import StoreLayout
from testkit.helm_chart import NAMESPACE
from testkit.objects import modelcachenode
from tests.cluster.agents import agent_pod, bound_to, remove_agent_pod
from tests.cluster.installed import AGENT_SA, HOOKS_SA, Installed
from tests.cluster.tenants import ready_node
from tests.peers.test_peer_server import REV, make_cache

Obj = dict[str, Any]
TENANT = "peer-tenant"
NODE_A, NODE_B, NODE_C = "peer-a", "peer-b", "peer-c"  # A asks; B and C serve


def peer_token(installed: Installed, service_account: str, audience: str, bound: Obj | None = None) -> str:
    """A TokenRequest token made by the admin (not through the agent's grant)."""
    spec: Obj = {"audiences": [audience], "expirationSeconds": 600}
    if bound is not None:
        spec["boundObjectRef"] = bound
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    core = client.CoreV1Api(installed.plane.admin())
    return str(core.create_namespaced_service_account_token(service_account, NAMESPACE, body).status.token)


@dataclass
class World:
    installed: Installed
    servers: dict[str, PeerServer]
    pods: dict[str, Obj]
    apis: dict[str, client.ApiClient]  # each node's agent client, bound to its Pod

    def credentials(self, node: str = NODE_A) -> auth.Credentials:
        meta = self.pods[node]["metadata"]
        pod = auth.Pod(NAMESPACE, meta["name"], meta["uid"], AGENT_SA)
        return auth.Credentials(node, auth.TokenMinter(Door(self.apis[node]), pod))


@pytest.fixture(scope="module")
def world(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Nodes B and C serve two caches of the tenant; node A holds a copy of `placed` only."""
    admin = installed.admin
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    made = [
        admin.apply(modelcachenode("placed", NODE_A, TENANT)),
        admin.apply(modelcachenode("elsewhere", NODE_B, TENANT)),
    ]
    pods, apis, servers = {}, {}, {}
    for node in (NODE_A, NODE_B, NODE_C):
        ready_node(admin, node)
        pods[node] = agent_pod(installed, node)
        apis[node] = installed.plane.client_as(
            NAMESPACE, AGENT_SA, suffix=node, bound_object=bound_to(pods[node])
        )
    for node in (NODE_B, NODE_C):
        layout = StoreLayout(Path(tmp_path_factory.mktemp(node)))
        make_cache(layout, TENANT, "placed")
        make_cache(layout, TENANT, "elsewhere")
        authorizer = PeerAuthorizer(Identities(Door(apis[node]), f"{NAMESPACE}/{AGENT_SA}", node))
        servers[node] = PeerServer(layout, authorizer, ("127.0.0.1", 0)).start()
    try:
        yield World(installed, servers, pods, apis)
    finally:
        for server in servers.values():
            server.stop()
        for pod in pods.values():
            remove_agent_pod(installed, pod)
        for obj in made:
            admin.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], TENANT)


def path_of(cache: str) -> str:
    return file_path(TENANT, cache, REV, "model.bin")


def signed(credentials: auth.Credentials, node: str, cache: str) -> dict[str, str]:
    """What the agent of `credentials` sends to `node` for the model of `cache`."""
    return credentials.sign(node, "GET", path_of(cache), {})


def ask(server: PeerServer, cache: str, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=20)
    try:
        conn.request("GET", path_of(cache), headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, "" if resp.status == 200 else json.loads(body)["error"]
    finally:
        conn.close()


def test_an_agent_mints_its_own_token_and_reads_only_what_is_placed_on_its_node(world: World) -> None:
    credentials = world.credentials(NODE_A)
    assert ask(world.servers[NODE_B], "placed", signed(credentials, NODE_B, "placed")) == (200, "")
    status, error = ask(world.servers[NODE_B], "elsewhere", signed(credentials, NODE_B, "elsewhere"))
    assert status == 403 and f"node {NODE_A} holds no copy of {TENANT}/elsewhere" in error  # none on A
    assert credentials.minter.minted == 1  # the token (and its key) reused


def test_a_captured_request_does_not_replay_to_another_node(world: World) -> None:
    """Item 12: minted for node B's audience, the token is refused by node C (and by the API server)."""
    credentials = world.credentials(NODE_A)
    captured = signed(credentials, NODE_B, "placed")
    assert ask(world.servers[NODE_B], "placed", captured)[0] == 200
    status, error = ask(world.servers[NODE_C], "placed", captured)
    assert status == 401 and f"request to node {NODE_C}" in error  # signed for node B
    minted = credentials.minter.token_for(NODE_B)  # even signed for C with the agent's own key
    resigned = protocol.sign(
        minted.key, minted.token, node=NODE_C, method="GET", target=path_of("placed"), headers={}
    )
    status, error = ask(world.servers[NODE_C], "placed", resigned)
    assert status == 401 and names.peer_audience(NODE_C) + "/" in error
    assert world.servers[NODE_C].bytes_served == 0
    header = captured[protocol.AUTHORIZATION_HEADER]
    # and node B, which received it, cannot use it against the API server either
    stolen = copy.copy(world.installed.plane.admin().configuration)
    stolen.cert_file = stolen.key_file = None  # nothing but the token
    stolen.api_key = {"authorization": header}
    stolen.api_key_prefix = {}
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(client.ApiClient(stolen)).list_namespaced_pod(NAMESPACE)
    assert refused.value.status == 401


def _mint(world: World, as_node: str, spec: Obj) -> ApiException:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(world.apis[as_node]).create_namespaced_service_account_token(
            AGENT_SA, NAMESPACE, body
        )
    return refused.value


def test_an_agent_cannot_mint_a_token_that_speaks_for_another_node(world: World) -> None:
    """The API server binds a token to any Pod of the ServiceAccount; the chart's policy confines
    the agent to its own Pod, peer audiences and a bounded lifetime."""
    pod_b = bound_to(world.pods[NODE_B])
    refused = _mint(world, NODE_A, {"audiences": [names.peer_audience(NODE_C)], "boundObjectRef": pod_b})
    assert refused.status == 403 and "only to its own Pod" in str(refused.body)
    own = bound_to(world.pods[NODE_A])
    refused = _mint(world, NODE_A, {"audiences": ["https://kubernetes.default.svc"], "boundObjectRef": own})
    assert refused.status == 403 and "may mint tokens only for one audience" in str(refused.body)
    refused = _mint(world, NODE_A, {"audiences": [names.peer_audience(NODE_B)]})  # bound to nothing
    assert refused.status == 403
    refused = _mint(
        world,
        NODE_A,
        {"audiences": [names.peer_audience(NODE_B)], "boundObjectRef": own, "expirationSeconds": 86400},
    )
    assert refused.status == 403 and "3600" in str(refused.body)
    other_sa = {"audiences": [names.peer_audience(NODE_B)], "boundObjectRef": own}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": other_sa}
    with pytest.raises(ApiException) as denied:  # RBAC: tokens of its own ServiceAccount only
        client.CoreV1Api(world.apis[NODE_A]).create_namespaced_service_account_token(
            HOOKS_SA, NAMESPACE, body
        )
    assert denied.value.status == 403


def test_a_captured_request_replayed_to_the_same_node_is_refused(world: World) -> None:
    """Issue 37 item 6b: the same request again, its token with a key of the thief's own, its
    signature with a fresh nonce: each refused by node B, whose TokenReviews the API server answers."""
    credentials = world.credentials(NODE_A)
    server = world.servers[NODE_B]
    captured = signed(credentials, NODE_B, "placed")
    assert ask(server, "placed", captured) == (200, "")
    replayed = server.authorizer.nonces.replayed
    status, error = ask(server, "placed", captured)
    assert status == 401 and "nonce seen" in error
    assert server.authorizer.nonces.replayed == replayed + 1
    token = captured[protocol.AUTHORIZATION_HEADER].removeprefix("Bearer ")
    thief = protocol.sign(
        Ed25519PrivateKey.generate(), token, node=NODE_B, method="GET", target=path_of("placed"), headers={}
    )
    status, error = ask(server, "placed", thief)
    assert status == 401 and "not accepted by the API server for audience" in error
    fresh = signed(credentials, NODE_B, "placed")  # the agent's next request, for its nonce
    status, error = ask(server, "placed", {**captured, protocol.NONCE_HEADER: fresh[protocol.NONCE_HEADER]})
    assert status == 401 and protocol.SIGNATURE_HEADER in error
    assert ask(server, "placed", fresh) == (200, "")  # the agent itself goes on


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("unbound", "not bound to a Pod on a node"),
        ("hooks", "not the node agent"),
        ("old-shared-audience", "not accepted by the API server for audience"),
        ("node-audience-naming-no-key", "not accepted by the API server for audience"),
    ],
)
def test_tokens_not_bound_to_an_agent_pod_or_not_for_this_node_are_refused(
    world: World, kind: str, expected: str
) -> None:
    """Each request signed properly with the key its token names (where it names one)."""
    key = Ed25519PrivateKey.generate()
    audience = protocol.audience(NODE_B, protocol.public_bytes(key))
    own = bound_to(world.pods[NODE_A])
    token = {
        "unbound": lambda: peer_token(world.installed, AGENT_SA, audience),
        "hooks": lambda: peer_token(world.installed, HOOKS_SA, audience),
        "old-shared-audience": lambda: peer_token(world.installed, AGENT_SA, names.PEER_TOKEN_AUDIENCE, own),
        "node-audience-naming-no-key": lambda: peer_token(
            world.installed, AGENT_SA, names.peer_audience(NODE_B), own
        ),
    }[kind]()
    headers = protocol.sign(key, token, node=NODE_B, method="GET", target=path_of("placed"), headers={})
    status, error = ask(world.servers[NODE_B], "placed", headers)
    assert status == 401 and expected in error
    assert token not in error
