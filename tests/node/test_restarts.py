"""What a running Pod keeps when the node's parts come and go: hooks down, kubelet and CSI plugin restarted."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kubernetes.client.rest import ApiException
from praesto.csi.proto import csi_pb2, csi_pb2_grpc

from praesto import names
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import Metacontroller
from testkit.real_node import RealNode
from tests.cluster.installed import Installed
from tests.cluster.tenants import opted_in_namespace
from tests.node.node_daemons import NodeDaemons
from tests.node.pods import busybox_pod, core, delete_pod, mount_points_of, pod_log, wait_phase
from tests.node.test_pods import FILES, NS, WEIGHTS, create_cache, wait_cache

DIGEST = hashlib.sha256(WEIGHTS).hexdigest()
LOOP = "while true; do sha256sum /models/model.safetensors; sleep 0.5; done"


def test_plain_pods_start_while_the_hooks_are_stopped(installed: Installed, node: RealNode) -> None:
    """The Pod webhook fails open for Pods without Praesto annotations (they never needed it)."""
    admin = installed.admin
    opted_in_namespace(admin, NS)
    hooks = process_tree(installed.hooks.process.pid)  # gunicorn's master, workers, orphan releaser
    signal_all(hooks, signal.SIGSTOP)  # hung, the worse case: every call times out
    try:
        admin.create(busybox_pod("plain", NS, "echo started"))
        assert wait_phase(admin, "plain", NS, ("Succeeded", "Failed")) == "Succeeded"
        assert "started" in pod_log(admin, "plain", NS)
    finally:
        signal_all(hooks, signal.SIGCONT)
    delete_pod(admin, "plain", NS)


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc (parent first)."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree = [pid]
    for member in tree:
        tree.extend(child for child, parent in parents.items() if parent == member)
    return tree


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


@pytest.fixture(scope="module")
def running_reader(
    installed: Installed, hub: LocalHub, node: RealNode, daemons: NodeDaemons, controllers: Metacontroller
) -> Iterator[str]:
    """A long-running Pod reading the model every half second."""
    admin = installed.admin
    opted_in_namespace(admin, NS)
    hub.add_repo("org/steady", FILES)
    create_cache(installed, node, NS, "steady", "org/steady")
    wait_cache(installed, NS, "steady", names.PHASE_READY)
    created = admin.create(busybox_pod("steady-reader", NS, LOOP, cache="steady"))
    assert wait_phase(admin, "steady-reader", NS, ("Running",)) == "Running"
    yield created["metadata"]["uid"]
    delete_pod(admin, "steady-reader", NS)


def ephemeral_volume_handle(pod_uid: str, volume_name: str) -> str:
    """The volume id the kubelet gives an inline CSI volume (makeVolumeHandle,
    kubernetes v1.37.2 pkg/volume/csi/csi_mounter.go)."""
    return "csi-" + hashlib.sha256(f"{pod_uid}{volume_name}".encode()).hexdigest()


def log_lines(installed: Installed) -> int:
    """How many lines the reader has logged, once the kubelet serves its log again."""
    count: list[int] = []

    def served() -> bool:
        try:
            count[:] = [len(pod_log(installed.admin, "steady-reader", NS).splitlines())]
        except ApiException:
            return False
        return True

    wait_for("the kubelet serving the Pod's log", served, 60)
    return count[0]


def reads_since(installed: Installed, lines_before: int) -> bool:
    """New log lines since `lines_before`, each the model's digest (False while the kubelet's
    log endpoint is not serving yet, as just after a restart)."""
    try:
        lines = pod_log(installed.admin, "steady-reader", NS).splitlines()
    except ApiException:
        return False
    return len(lines) > lines_before and all(DIGEST in line for line in lines[lines_before:])


def test_kubelet_restart_keeps_the_running_pods_mount(
    installed: Installed, node: RealNode, running_reader: str
) -> None:
    mounts = mount_points_of(running_reader)
    assert len(mounts) == 1
    node.kubelet.restart()
    node.wait_ready()
    assert mount_points_of(running_reader) == mounts
    assert core(installed.admin).read_namespaced_pod("steady-reader", NS).status.phase == "Running"
    before = log_lines(installed)
    wait_for("the Pod still reading the model", lambda: reads_since(installed, before), 30)


def test_csi_restart_keeps_the_mount_and_republish_is_idempotent(
    installed: Installed, node: RealNode, daemons: NodeDaemons, running_reader: str
) -> None:
    (target,) = mount_points_of(running_reader)
    daemons.restart_csi()
    wait_for("csi.praesto.io registered again", daemons.csi_registered, 60)
    assert mount_points_of(running_reader) == [target]
    # What the kubelet sends again for a volume it already published: same target, same answer.
    pod = core(installed.admin).read_namespaced_pod("steady-reader", NS)
    volume = next(v for v in pod.spec.volumes if v.csi)
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=ephemeral_volume_handle(running_reader, volume.name),
        target_path=target,
        readonly=True,
        volume_capability=csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
            ),
        ),
        volume_context={
            **volume.csi.volume_attributes,
            names.CSI_ATTR_POD_NAMESPACE: NS,
            names.CSI_ATTR_POD_NAME: "steady-reader",
            names.CSI_ATTR_POD_UID: running_reader,
            names.CSI_ATTR_EPHEMERAL: "true",
        },
    )
    with grpc.insecure_channel(f"unix://{daemons.csi_socket()}") as channel:
        csi_pb2_grpc.NodeStub(channel).NodePublishVolume(request, timeout=30)
    assert mount_points_of(running_reader) == [target]  # no second mount stacked on the first
    before = log_lines(installed)
    wait_for("the Pod still reading the model", lambda: reads_since(installed, before), 30)
