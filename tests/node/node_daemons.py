"""The chart's node agent and CSI plugin as host processes beside the node tier's kubelet.

Both come from the installed wheel with the args and env the chart renders for their
containers (tests/node/daemonset.py translates paths). The agent authenticates with a
token bound to the DaemonSet's Pod on this node, as the kubelet would project it; the
in-cluster configuration a container would use becomes a kubeconfig holding that token.
The CSI plugin registers itself with the kubelet through `plugins_registry`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import grpc
from kubernetes import client
from praesto.csi.proto import csi_pb2, csi_pb2_grpc

from praesto import names
from testkit.controlplane import Component, ControlPlane, wait_for
from testkit.dockerfile import image_env
from testkit.helm_chart import NAMESPACE, RELEASE
from testkit.hub import LocalHub
from testkit.installed_wheel import installed_wheel
from testkit.kube_apply import Kube
from testkit.node_host import NODE_IP
from testkit.praesto_image import PRAESTO_IMAGE
from testkit.real_node import RealNode
from tests.cluster.agents import bound_to, remove_agent_pod
from tests.cluster.installed import AGENT_SA
from tests.node.daemonset import HostPaths, host_argv, placeholder_pod, rendered_env

Obj = dict[str, Any]
REGISTRATION_DEADLINE = 60.0


class ChartOnCluster(Protocol):
    """What the node's processes read of an installed chart: tests/cluster/installed.py's Installed
    (objects applied by the tier), or a release the real helm installed (tests/node/helm_release.py)."""

    plane: ControlPlane
    admin: Kube
    trust_dir: Path

    def rendered(self, kind: str, name: str | None = None) -> Obj: ...


def chart_values(hub: LocalHub) -> Obj:
    """What the node tier (and `make run`) sets on top of the chart's defaults.

    One node: no peers to share with. The origin is the local hub. Praesto's image is the one
    built here (testkit/praesto_image.py), imported into the node's containerd: the
    shared-PVC download Job runs it."""
    return {
        "nodeAgent": {"peers": {"enabled": False}},
        "downloader": {"hfEndpoint": hub.endpoint},
        # the hub's CDN origin is on the node's own address, a reserved one (agent/download/egress.py)
        "downloads": {"egress": {"allowedCIDRs": [f"{NODE_IP}/32"]}},
        "image": dict(zip(("repository", "tag"), PRAESTO_IMAGE.rsplit(":", 1), strict=True)),
    }


class NodeDaemons:
    def __init__(self, installed: ChartOnCluster, node: RealNode, workdir: Path) -> None:
        self.installed = installed
        self.node = node
        self.workdir = workdir
        self.base = workdir / "store"
        self.downward = {"spec.nodeName": node.name, "metadata.namespace": NAMESPACE}
        self._read_template()
        self.pod: Obj | None = None
        self.agent: Component | None = None
        self.csi: Component | None = None

    def _read_template(self) -> None:
        """The DaemonSet as the chart (or the release's current revision) has it, and its host paths."""
        self.daemonset = self.installed.rendered("DaemonSet")
        kubelet_dir, base_path = self._chart_paths()
        trust = {f"{RELEASE}-trust": self.installed.trust_dir}  # the chart's verification.trust ConfigMap
        self.paths = HostPaths(kubelet_dir, self.node.kubelet.root_dir, base_path, self.base, trust)

    def _chart_paths(self) -> tuple[str, str]:
        """The kubelet dir and store path the chart rendered (from the DaemonSet's hostPath volumes)."""
        volumes = {v["name"]: v for v in self.daemonset["spec"]["template"]["spec"]["volumes"]}
        return volumes["kubelet-dir"]["hostPath"]["path"], volumes["store"]["hostPath"]["path"]

    # ---- agent -----------------------------------------------------------------------
    def _agent_component(self) -> Component:
        assert self.pod is not None
        kubeconfig = self.installed.plane.token_kubeconfig(
            NAMESPACE, AGENT_SA, suffix=f"node-{self.node.name}", bound_object=bound_to(self.pod)
        )
        script = installed_wheel().script("praesto-agent")
        argv = [
            *host_argv(self.daemonset, "agent", script, self.downward, self.paths),
            f"--kubeconfig={kubeconfig}",
        ]
        return Component("praesto-agent", argv, self.workdir / "agent.log")

    def _csi_component(self) -> Component:
        script = installed_wheel().script("praesto-csi")
        argv = host_argv(self.daemonset, "csi", script, self.downward, self.paths)
        return Component("praesto-csi", argv, self.workdir / "csi.log")

    def _env(self, container: str) -> dict[str, str]:
        spec = next(
            c for c in self.daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == container
        )
        return {**image_env(), **rendered_env(spec, self.downward)}  # as the image runs it

    def start_agent(self) -> None:
        self.agent = self._agent_component()
        self.agent.env = self._env("agent")
        self.agent.start()

    def start_csi(self) -> None:
        self.csi = self._csi_component()
        self.csi.env = self._env("csi")
        self.csi.start()

    def restart_csi(self) -> None:
        """Stop and start the plugin; returns once the new process answers Probe on its socket
        (the CSINode may still list the driver from before: it says nothing of the new process)."""
        assert self.csi is not None
        self.csi.stop()
        self.start_csi()
        wait_for("the CSI plugin serving its socket", self.csi_serving, REGISTRATION_DEADLINE)

    def csi_serving(self) -> bool:
        assert self.csi is not None
        self.csi.check_running()
        with grpc.insecure_channel(f"unix://{self.csi_socket()}") as channel:
            try:
                answer = csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=5)
            except grpc.RpcError:
                return False
        return not answer.HasField("ready") or answer.ready.value

    def restart_agent(self) -> None:
        assert self.agent is not None
        self.agent.stop()
        self.start_agent()

    # ---- a rolling update of the DaemonSet, on this node ---------------------------------
    def remove_pod(self) -> None:
        """The DaemonSet controller deletes this node's Pod (RollingUpdate, maxSurge 0): the kubelet
        stops its containers (SIGTERM, SIGKILL after the grace period), then the Pod is gone."""
        for component in (self.agent, self.csi):
            if component is not None:
                component.stop()
        if self.pod is not None:
            remove_agent_pod(self.installed, self.pod)
            self.pod = None

    def create_pod(self) -> None:
        """The controller's new Pod on this node, from the DaemonSet's template as it is now (an
        upgrade may have changed it): the processes start from that template's args and env."""
        self._read_template()
        self.pod = self.installed.admin.apply(placeholder_pod(self.daemonset, self.node.name))
        self.start_csi()
        self.start_agent()
        wait_for("the new CSI plugin serving its socket", self.csi_serving, REGISTRATION_DEADLINE)
        wait_for("csi.praesto.io registered", self.csi_registered, REGISTRATION_DEADLINE)

    def leave(self) -> None:
        """The node leaves the cluster: drained, agent and kubelet stopped, its Node object deleted."""
        self.node.drain()
        if self.agent is not None:
            self.agent.stop()
        self.node.kubelet.stop()
        client.CoreV1Api(self.installed.admin.api).delete_node(self.node.name)
        wait_for("the Node deleted", lambda: not self._node_exists(), 60)

    def rejoin(self, register_with_taints: list[dict[str, str]]) -> None:
        """The kubelet registers the node again (with these taints); the agent starts on it anew."""
        self.node.kubelet.register_with_taints = register_with_taints
        self.node.kubelet.restart()
        wait_for("the Node registered again", self._node_exists, 60)
        self.pod = self.installed.admin.apply(placeholder_pod(self.daemonset, self.node.name))
        self.start_agent()
        wait_for("csi.praesto.io registered again", self.csi_registered, REGISTRATION_DEADLINE)

    def _node_exists(self) -> bool:
        try:
            client.CoreV1Api(self.installed.admin.api).read_node(self.node.name)
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def metrics_port(self) -> int:
        """The agent's metrics port, as the chart renders it."""
        assert self.agent is not None
        (flag,) = [a for a in self.agent.argv if a.startswith("--metrics-port=")]
        return int(flag.partition("=")[2])

    def csi_socket(self) -> str:
        """The CSI plugin's socket on the host (the chart's /csi/csi.sock through its hostPath)."""
        assert self.csi is not None
        (flag,) = [a for a in self.csi.argv if a.startswith("--endpoint=")]
        return flag.partition("=")[2].removeprefix("unix://")

    def csi_registered(self) -> bool:
        """The kubelet lists our driver on its CSINode (it did so after GetInfo and validation)."""
        storage = client.StorageV1Api(self.installed.admin.api)
        try:
            # kubernetes 36.0.3 raises on a CSINode whose `drivers` is null: read it raw
            csinode = storage.read_csi_node(self.node.name, _preload_content=False)
        except client.ApiException:
            return False
        drivers = (json.loads(csinode.data).get("spec") or {}).get("drivers") or []
        return any(d.get("name") == names.CSI_DRIVER_NAME for d in drivers)

    def __enter__(self) -> NodeDaemons:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o775)
        self.pod = self.installed.admin.apply(placeholder_pod(self.daemonset, self.node.name))
        self.start_csi()
        self.start_agent()
        assert self.csi is not None
        csi = self.csi

        def registered() -> bool:
            csi.check_running()
            return self.csi_registered()

        wait_for("the kubelet to register csi.praesto.io", registered, REGISTRATION_DEADLINE, interval=0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        """Pods leave first, while the CSI plugin still answers the kubelet's unpublish (a node's
        DaemonSet Pods are the last a drain takes); then the agent and the plugin stop."""
        try:
            if self.node.kubelet_running():
                self.node.drain()
        finally:
            for component in (self.agent, self.csi):
                if component is not None:
                    component.stop()
            if self.pod is not None:
                remove_agent_pod(self.installed, self.pod)

    def logs(self) -> str:
        return "\n".join(f"--- {c.name}\n{c.log_tail(8000)}" for c in (self.agent, self.csi) if c is not None)
