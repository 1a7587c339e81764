"""The real control-plane tier: one upstream control plane per session, the chart installed into it.

`make test-cluster` runs this directory alone (no xdist: one control plane).
In CI the tier must run: a missing Go toolchain fails the session instead of
skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.controlplane import ControlPlane, ControlPlaneUnavailable, start_control_plane
from testkit.hub import LocalHub
from testkit.installed_wheel import installed_wheel
from testkit.kube_apply import Kube
from tests.cluster.controllers import LIMITER, composite, decorator, running_metacontroller
from tests.cluster.installed import METACONTROLLER_SA, Installed, install_chart
from tests.cluster.node_side import targets

# fixtures defined elsewhere (tests/cluster/controllers.py, node_side.py)
__all__ = ["composite", "decorator", "running_metacontroller", "targets"]
_VERSION: list[str] = []


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        plane = start_control_plane(tmp_path_factory.mktemp("control-plane"))
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the control-plane tier must run in CI: {err}")
        pytest.skip(str(err))
    try:
        _VERSION.append(plane.version())
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def installed(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    with install_chart(control_plane, tmp_path_factory.mktemp("installed")) as chart:
        yield chart


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    """The Hugging Face Hub on loopback (the cluster's origin)."""
    with LocalHub(tmp_path_factory.mktemp("hub")) as running:
        yield running


@pytest.fixture(scope="session")
def metacontroller(installed: Installed) -> Kube:
    """The Metacontroller identity: the chart's ServiceAccount and ClusterRole."""
    return installed.kube_as(METACONTROLLER_SA)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _VERSION:
        terminalreporter.write_line(f"control-plane tier ran against kube-apiserver {_VERSION[0]}")
    for requests, waited, qps, burst in LIMITER:
        terminalreporter.write_line(
            f"Metacontroller stand-in: {requests} API requests at the chart's {qps:g}/s burst {burst}, "
            f"{waited:.1f} s waited on that limit in all"
        )
    if installed_wheel.cache_info().currsize:
        wheel = installed_wheel()
        terminalreporter.write_line(
            f"praesto processes ran from {wheel.wheel.name} installed in {wheel.venv}"
        )
