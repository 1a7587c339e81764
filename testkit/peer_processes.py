"""Node agents as users run them: one `praesto-agent run` process per node, from the installed wheel.

`Cluster` (testkit/peer_cluster.py) runs its agents in the test's own process, which
lets tests look inside them; a benchmark of several nodes on one machine must not,
since its agents would share one interpreter (one GIL) where real nodes share
nothing. `ProcessCluster` keeps `Cluster`'s API (select, status, wait_ready,
files) and starts each node as its own process with the production defaults and
the DaemonSet's flags: a kubeconfig holding a TokenRequest token of the agent
ServiceAccount bound to the node's agent Pod (the real RBAC decides every call),
its peer server on its own port of 127.0.0.1, the Pod's name and UID as the
downward API would give them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from praesto.agent.peers.server import Limits

from testkit.controlplane import Component, ControlPlane
from testkit.egress import LOOPBACK_FLAG
from testkit.installed_wheel import installed_wheel
from testkit.peer_cluster import AGENT_SERVICE_ACCOUNT, Cluster, Node, agent_client, agent_pod
from testkit.ports import free_port

STARTED = '"msg": "agent started"'  # agent/node_agent.py logs it once its watch and loop run
START_DEADLINE = 120.0  # seconds: eight interpreters importing at once on two busy CPUs


def _wait_started(component: Component) -> None:
    """Until the agent runs (as a DaemonSet's agent long has when a cache is created), so a
    benchmark times the download, not the interpreter's start."""
    deadline = time.monotonic() + START_DEADLINE
    while STARTED not in component.log_tail(1 << 20):
        component.check_running()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{component.name} did not start in {START_DEADLINE:g}s:\n{component.log_tail()}"
            )
        time.sleep(0.05)  # poll interval, bounded by the deadline


@dataclass
class ProcessCluster(Cluster):
    plane: ControlPlane | None = None
    processes: dict[str, Component] = field(default_factory=dict)

    def start_process(self, name: str, *, limits: Limits, concurrency: int) -> Node:
        """Node `name`'s agent as its own process; `limits` become the --peer-* flags."""
        assert self.plane is not None, "ProcessCluster needs the plane its agents' kubeconfigs name"
        node = self.nodes.get(name) or Node(name, self.tmp / name, "127.0.0.1")
        node.base.mkdir(exist_ok=True)
        self.nodes[name] = node
        agent_client(self.kube)  # the agent ServiceAccount and its grants (AGENT_GRANTS)
        pod = agent_pod(self.kube, name, name)
        namespace, _, account = AGENT_SERVICE_ACCOUNT.partition("/")
        bound = {"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.uid}
        kubeconfig = self.plane.token_kubeconfig(namespace, account, suffix=name, bound_object=bound)
        argv = [
            installed_wheel().script("praesto-agent"),
            "run",
            f"--node-name={name}",
            f"--base-path={node.base}",
            f"--hf-endpoint={self.hub.endpoint}",
            LOOPBACK_FLAG,  # the hub listens on loopback
            f"--kubeconfig={kubeconfig}",
            "--reserve=0",
            "--metrics-port=0",
            "--scrub-interval=0",
            "--startup-taint-key=",
            f"--concurrency={concurrency}",
            f"--peer-port={free_port()}",
            "--peer-address=127.0.0.1",
            f"--pod-name={pod.name}",
            f"--pod-uid={pod.uid}",
            f"--peer-service-account={AGENT_SERVICE_ACCOUNT}",
            f"--peer-upload-rate={limits.rate}",
            f"--peer-max-connections={limits.max_connections}",
            f"--peer-max-connections-per-client={limits.max_connections_per_client}",
        ]
        component = Component(f"praesto-agent/{name}", argv, self.tmp / f"{name}.log")
        component.start()
        self.processes[name] = component
        _wait_started(component)
        return node

    def stop(self) -> None:
        for component in self.processes.values():
            component.stop()
        self.processes.clear()
        super().stop()

    def wait_ready(self, cache: str, nodes: list[str], timeout: float = 60.0) -> None:
        for component in self.processes.values():
            component.check_running()
        try:
            super().wait_ready(cache, nodes, timeout)
        except TimeoutError as err:
            tails = "\n".join(f"{c.name}:\n{c.log_tail(1500)}" for c in self.processes.values())
            raise TimeoutError(f"{err}\n{tails}") from None
