"""One real node: containerd + the upstream kubelet joined to the tier's control plane.

    with real_node(plane, workdir, "node-tier-1") as node:
        ...  # node.kubelet.plugins_registry, node.containerd, node.admin (a cluster-admin client)

Start: the node's address, the `kubernetes` Service for its Pods (testkit/kubernetes_service.py),
containerd, the locally built images imported, the kubelet;
ready when the Node is Ready and the node lifecycle controller has lifted
`node.kubernetes.io/not-ready`. Stop: every Pod on the node deleted through the API (so
the kubelet unpublishes volumes and tears sandboxes down as it would), the kubelet and
containerd stopped, whatever is still left killed, unmounted and removed, and then the
machine compared with its state before the node started: a leftover fails the tier.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from testkit import node_host
from testkit.controlplane import ControlPlane, build_binaries, wait_for
from testkit.kubelet import Kubelet
from testkit.kubernetes_service import KubernetesService
from testkit.node_images import PAUSE_IMAGE, build_images
from testkit.node_runtime import BRIDGE, Containerd

NODE_MODULE = "tests/node"
READY_DEADLINE = 120.0
DRAIN_DEADLINE = 120.0
LEFTOVER_DEADLINE = 10.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def node_binaries() -> Path:
    return build_binaries(NODE_MODULE)


def kubernetes_module_dir() -> Path:
    """The k8s.io/kubernetes sources the node module builds from (Go's module cache)."""
    root = Path(__file__).resolve().parents[1] / NODE_MODULE
    out = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@dataclass
class RealNode:
    plane: ControlPlane
    containerd: Containerd
    kubelet: Kubelet

    @property
    def name(self) -> str:
        return self.kubelet.node_name

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.plane.admin())

    def node(self) -> Any:
        return self.core().read_node(self.name)

    def ready(self) -> bool:
        try:
            node = self.node()
        except ApiException:
            return False
        conditions = {c.type: c.status for c in (node.status.conditions or [])}
        taints = {t.key for t in (node.spec.taints or [])}
        return conditions.get("Ready") == "True" and NOT_READY_TAINT not in taints

    def wait_ready(self) -> None:
        def check() -> bool:
            self.kubelet.component.check_running()
            self.containerd.component.check_running()
            return self.ready()

        try:
            wait_for(f"Node {self.name} Ready", check, READY_DEADLINE, interval=0.5)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.kubelet.component.log_tail()}") from None

    def versions(self) -> str:
        info = self.node().status.node_info
        return f"kubelet {info.kubelet_version}, {info.container_runtime_version}"

    def pods(self) -> list[Any]:
        listed = self.core().list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}")
        return list(listed.items)

    def kubelet_running(self) -> bool:
        process = self.kubelet.component.process
        return process is not None and process.poll() is None

    def drain(self) -> None:
        """Delete every Pod on the node gracefully and wait until the kubelet has finished them."""
        core = self.core()
        for pod in self.pods():
            try:
                core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1)
            except ApiException as err:
                if err.status != 404:
                    raise
        wait_for(f"every Pod on {self.name} gone", lambda: not self.pods(), DRAIN_DEADLINE, interval=0.5)


def _clean_up(node: RealNode, workdir: Path, before: node_host.Footprint) -> None:
    """Whatever the graceful path left: processes, mounts, links, cgroups, chains, paths."""
    node_host.kill_processes(("containerd-shim-runc-v2",), node.containerd.address)
    now = node_host.Footprint.now(workdir)
    added = now.added_since(before)
    cgroups = set(added.get("cgroups", []))
    node_host.kill_cgroup_processes(cgroups)  # before unmounting: nothing may still use a mount
    node_host.unmount_under((str(workdir), *(str(p) for p in node_host.FIXED_PATHS)))
    node_host.remove_cgroups(cgroups)
    for link in (node_host.NODE_LINK, BRIDGE):
        node_host.remove_link(link)
    for link in added.get("links", []):
        if link.startswith("veth"):
            node_host.remove_link(link)
    node_host.remove_chains(set(added.get("chains", [])))
    for path in added.get("paths", []):
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)
    node_host.restore_sysctls(set(before.settings))


def _settled_leftovers(workdir: Path, before: node_host.Footprint) -> dict[str, list[str]]:
    """What the node left, looked at again until nothing is or LEFTOVER_DEADLINE passes.

    A shim whose sandbox the drain removed ends by itself (containerd's Shutdown call); it was
    reparented to PID 1, and while it exits and until PID 1 reaps it /proc still lists it under
    its name, with an empty command line (so `kill_processes` does not match it). One look right
    after the teardown raced that exit; what is still there at the deadline is a real leftover.
    """
    end = time.monotonic() + LEFTOVER_DEADLINE
    while True:
        leftovers = node_host.Footprint.now(workdir).added_since(before)
        if not leftovers or time.monotonic() > end:
            return leftovers
        time.sleep(0.2)  # poll interval, bounded by the deadline above


@contextmanager
def real_node(
    plane: ControlPlane,
    workdir: Path,
    name: str,
    *,
    register_with_taints: list[dict[str, str]] | None = None,
) -> Iterator[RealNode]:
    binaries = node_binaries()
    before = node_host.Footprint.now(workdir)
    images = build_images(kubernetes_module_dir(), workdir / "images")
    containerd = Containerd(binaries, workdir / "containerd", PAUSE_IMAGE)
    kubelet = Kubelet(
        plane,
        binaries,
        workdir / "kubelet",
        name,
        node_host.NODE_IP,
        containerd.address,
        register_with_taints=register_with_taints or [],
    )
    node = RealNode(plane, containerd, kubelet)
    api_service = KubernetesService(plane)
    try:
        node_host.add_node_address()
        api_service.start()  # before any Pod: in-cluster clients reach the API server
        containerd.start()
        for archive in images.values():
            containerd.import_image(archive)
        kubelet.start()
        node.wait_ready()
        yield node
    finally:
        try:
            if node.kubelet_running():
                node.drain()
        finally:
            kubelet.stop()
            containerd.stop()
            api_service.stop()
            _clean_up(node, workdir, before)
    leftovers = _settled_leftovers(workdir, before)
    if leftovers:
        raise AssertionError(f"the node left state behind on the machine: {leftovers}")
