"""Several full node agents on one machine, sharing the real API server (through the fault proxy,
testkit/kube_real.py) and one local hub.

Each node has its own base path, its own `kubernetes` client and its own peer
server on its own loopback address (127.0.0.2, .3, ...), so agents find each
other through ModelCacheNode status exactly as in a cluster. Timings are shrunk.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient
from praesto.agent import logs
from praesto.agent.budget.leases import LeaseApi
from praesto.agent.budget.origin_budget import BudgetConfig, OriginBudget
from praesto.agent.kube import Door, KubeApi
from praesto.agent.metrics import AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.agent.peers import protocol
from praesto.agent.peers.auth import Pod
from praesto.agent.peers.peering import PeerConfig, Peering
from praesto.agent.peers.server import Limits
from praesto.agent.peers.source import Tuning
from praesto.agent.reconcile import LoopTuning
from praesto.agent.settings import AgentSettings, ScrubSettings

from praesto import names, rbac
from praesto.reflector import Backoff
from praesto.store import StoreLayout
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode

MCN = f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}"
NAMESPACE = "team-a"
AGENT_SERVICE_ACCOUNT = "praesto-system/praesto-node-agent"
# What the chart grants the agent anywhere, here cluster-wide: the per-namespace Roles (Secrets by
# name, warm caches, origin-budget Leases, its own tokens) stand in as cluster grants; the tests'
# request-log checks (testkit/agent_harness.py `rbac_violations`) hold the code to the narrower list.
AGENT_GRANTS = (
    *rbac.AGENT,
    *rbac.AGENT_PEERS,
    *rbac.AGENT_WARM,
    *rbac.AGENT_ORIGIN_BUDGET,
    rbac.AGENT_SECRET_GRANT,
    rbac.AGENT_CONFIGMAP_GRANT,
    rbac.AGENT_TRUST_SECRET_GRANT,
    rbac.AGENT_TRUST_CONFIGMAP_GRANT,
)
Obj = dict[str, Any]


@dataclass
class Node:
    name: str
    base: Path
    host: str
    agent: Agent | None = None

    @property
    def layout(self) -> StoreLayout:
        return StoreLayout(self.base)

    @property
    def peering(self) -> Peering:
        assert self.agent is not None and self.agent.peering is not None
        return self.agent.peering


@dataclass
class Cluster:
    kube: RealKube
    hub: LocalHub
    tmp: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    log: io.StringIO = field(default_factory=io.StringIO)

    def start(
        self,
        name: str,
        *,
        limits: Limits | None = None,
        tuning: Tuning | None = None,
        pod_node: str | None = None,
        stall_seconds: float = 10.0,
        peers: bool = True,
        concurrency: int = 4,
        poll_seconds: float = 0.1,
        budget: BudgetConfig | None = None,
    ) -> Node:
        """`budget`: the origin budget this agent takes part in (None: ungated)."""
        node = self.nodes.get(name) or Node(name, self.tmp / name, f"127.0.0.{len(self.nodes) + 2}")
        node.base.mkdir(exist_ok=True)
        self.nodes[name] = node
        api = agent_client(self.kube)
        peer = PeerConfig(
            address="",
            pod=agent_pod(self.kube, name, pod_node or name),
            service_account=AGENT_SERVICE_ACCOUNT,
            bind=(node.host, 0),
            limits=limits or Limits(),
            tuning=tuning or Tuning(min_seconds=20.0),
            poll_seconds=poll_seconds,
            stall_seconds=stall_seconds,
        )
        settings = AgentSettings(
            node_name=name, base_path=node.base, hf_endpoint=self.hub.endpoint, concurrency=concurrency, reserve="0",
            scrub=ScrubSettings(0.0), egress=LOOPBACK,
        )  # fmt: skip
        loop = LoopTuning(
            tick_seconds=0.1,
            progress_seconds=0.2,
            retry_initial=0.2,
            retry_max=1.0,
            watch_backoff=Backoff(0.05, 0.5),
        )
        node.agent = Agent(
            settings,
            KubeApi(api, name, watch_timeout=5),
            AgentMetrics.create(),
            peering=Peering(peer, Door(api), name, node.layout) if peers else None,
            budget=OriginBudget(budget, LeaseApi(Door(api), budget.namespace), name) if budget else None,
            tuning=loop,
        ).start()
        return node

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.agent is not None:
                node.agent.stop()
                node.agent = None

    def select(self, cache: str, node: str, repo: str | None = None) -> Obj:
        """The ModelCacheNode the sync hook would create for `cache` on `node`."""
        source = {"uri": f"hf://{repo or 'org/' + cache}", "revision": "main"}
        return self.kube.create(modelcachenode(cache, node, NAMESPACE, source=source))

    def status(self, cache: str, node: str) -> Obj:
        obj = self.kube.get(MCN, names.modelcachenode_name(cache, node), NAMESPACE) or {}
        return dict(obj.get("status") or {})

    def wait_ready(self, cache: str, nodes: list[str], timeout: float = 60.0) -> None:
        try:
            self.kube.wait_until(
                lambda: all(self.status(cache, n).get("phase") == names.PHASE_READY for n in nodes),
                timeout,
                f"{cache} Ready on {nodes}",
            )
        except TimeoutError as err:
            states = {
                n: (self.status(cache, n).get("phase"), self.status(cache, n).get("message")) for n in nodes
            }
            raise TimeoutError(f"{err}: {states}; log tail:\n{self.log.getvalue()[-3000:]}") from None

    def files(self, cache: str, node: str) -> dict[str, bytes]:
        root = self.nodes[node].layout.cache_dir(NAMESPACE, cache)
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".praesto")
        }


def agent_client(kube: RealKube) -> ApiClient:
    """A client as the agent's ServiceAccount, granted `AGENT_GRANTS`: the real RBAC decides its calls."""
    namespace, _, account = AGENT_SERVICE_ACCOUNT.partition("/")
    return kube.api_client(kube.identity(namespace, account, AGENT_GRANTS))


def agent_pod(kube: RealKube, node: str, runs_on: str) -> Pod:
    """The agent Pod of `node` (so TokenRequests bind to it), scheduled on `runs_on`: another
    node than `node` plays an agent that claims a node it is not on."""
    namespace, _, account = AGENT_SERVICE_ACCOUNT.partition("/")
    return _pod(kube, namespace, account, f"praesto-node-agent-{node}", runs_on)


def _pod(kube: RealKube, namespace: str, account: str, name: str, runs_on: str) -> Pod:
    """A Pod of ServiceAccount `namespace/account` on Node `runs_on` (all three made if missing)."""
    if kube.get("nodes", runs_on) is None:
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": runs_on}})
    if kube.get("serviceaccounts", account, namespace) is None:
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": namespace},
            }
        )
    pod = kube.get("pods", name, namespace)
    if pod is None:
        pod = kube.create({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "serviceAccountName": account, "nodeName": runs_on,
                "containers": [{"name": "agent", "image": "praesto:test"}],
            },
        })  # fmt: skip
    return Pod(namespace, name, str(pod["metadata"]["uid"]), account)


def peer_token(
    kube: RealKube,
    node: str,
    *,
    user: str | None = None,
    bound: bool = True,
    target: str = "",
    audience: str = "",
    key: bytes = b"",
) -> str:
    """A real token (TokenRequest) for the audience of node `target` and public key `key`
    (`protocol.audience`; or `audience`): of the agent ServiceAccount bound to its Pod on `node`,
    or of ServiceAccount `user` (system:serviceaccount:<ns>:<name>) bound to a Pod of its own
    there, or bound to no Pod."""
    if user is None:
        pod = agent_pod(kube, node, node)
    else:
        namespace, _, account = user.removeprefix("system:serviceaccount:").partition(":")
        pod = _pod(kube, namespace, account, f"{account}-{node}", node)
    namespace, account = pod.namespace, pod.service_account
    spec: Obj = {"audiences": [audience or protocol.audience(target, key)], "expirationSeconds": 3600}
    if bound:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = kube.path("serviceaccounts", namespace, account, "token")
    return str(kube.call("POST", path, body)["status"]["token"])


@contextmanager
def cluster(kube: RealKube, tmp: Path) -> Iterator[Cluster]:
    with LocalHub(tmp / "hub") as hub:
        c = Cluster(kube, hub, tmp)
        logs.configure("DEBUG", c.log)
        try:
            yield c
        finally:
            c.stop()
