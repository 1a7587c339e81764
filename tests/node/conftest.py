"""The node tier: the upstream control plane, the chart, and one real node (kubelet + containerd).

`make test-node` runs this directory alone (one node per machine: the kubelet and
containerd use fixed host paths). What it adds to the control-plane tier: a real kubelet
calls our CSI plugin (registered through the kubelet's plugin-registration API) for real
Pods that containerd runs with runc, and the agent and the CSI plugin run from the
installed wheel with the chart's flags and identities. It needs root and Linux; in CI it
must run (a missing toolchain or root fails the session instead of skipping it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.controlplane import ControlPlane, ControlPlaneUnavailable, start_control_plane
from testkit.hub import LocalHub
from testkit.kube_apply import Kube
from testkit.metacontroller import Metacontroller
from testkit.node_host import NODE_IP
from testkit.real_node import RealNode, real_node
from tests.cluster.controllers import running_metacontroller
from tests.cluster.installed import METACONTROLLER_SA, Installed, install_chart
from tests.node.node_daemons import NodeDaemons, chart_values

__all__ = ["running_metacontroller"]  # a fixture (tests/cluster/controllers.py)
NODE = "node-tier-1"
# modules that `helm install` the chart themselves
HELM_INSTALLS = ("test_helm_lifecycle.py", "test_helm_upgrade_resume.py")
NODES_OF_THEIR_OWN = ("test_local_cluster_run.py",)  # modules that start a node themselves (make run)
_VERSIONS: list[str] = []


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the node tier must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if os.geteuid() != 0:
        _unavailable("the node tier runs a kubelet and containerd, which need root")
    try:
        plane = start_control_plane(tmp_path_factory.mktemp("control-plane"), with_kubelets=True)
    except ControlPlaneUnavailable as err:
        _unavailable(str(err))
        raise
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def hub(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    """The Hugging Face Hub on the node's own address: the origin the node's agent downloads
    from, and the shared-PVC download Job's Pod too (through the Pod network's gateway)."""
    with LocalHub(tmp_path_factory.mktemp("hub"), host=NODE_IP) as running:
        yield running


@pytest.fixture(scope="session")
def installed(
    control_plane: ControlPlane, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    values = chart_values(hub)
    with install_chart(control_plane, tmp_path_factory.mktemp("installed"), extra_values=values) as chart:
        yield chart


@pytest.fixture(scope="session")
def node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    with real_node(control_plane, tmp_path_factory.mktemp("node"), NODE) as running:
        _VERSIONS.append(running.versions())
        yield running


@pytest.fixture(scope="session")
def daemons(
    installed: Installed, node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeDaemons]:
    """The chart's agent and CSI plugin on the node, from the installed wheel."""
    with NodeDaemons(installed, node, tmp_path_factory.mktemp("daemons")) as running:
        yield running


@pytest.fixture(scope="session")
def metacontroller(installed: Installed) -> Kube:
    """The Metacontroller identity: the chart's ServiceAccount and ClusterRole."""
    return installed.kube_as(METACONTROLLER_SA)


@pytest.fixture(scope="session")
def controllers(running_metacontroller: Metacontroller) -> Metacontroller:
    """Metacontroller's CompositeController and DecoratorController, event-driven, for the session.

    Metacontroller cannot be installed from a registry here; this stand-in does what its
    v4.17.2 source does, triggered as it is (testkit/metacontroller.py). On a real
    cluster the chart brings the real one.
    """
    return running_metacontroller


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that install the chart with the real helm run first, on a cluster nothing installed
    it on yet: the session's `installed` applies the chart without helm, and both cannot hold the
    cluster-scoped CSIDriver. Everything else keeps its order."""
    # Before them, modules that bring up a node of their own: one node per machine, so they go
    # before the session's node starts.
    items.sort(
        key=lambda item: (item.path.name not in NODES_OF_THEIR_OWN, item.path.name not in HELM_INSTALLS)
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _VERSIONS:
        terminalreporter.write_line(f"node tier ran on a real node: {_VERSIONS[0]}")
