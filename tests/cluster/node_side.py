"""One tier node's agent with the CSI node plugin beside it (root: real bind mounts), and the
folders that stand in for the kubelet's pod volume directories. Shared by the tier tests that
mount copies: test_pod_starts, test_scrub, test_rolling."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from testkit.csi_driver import InProcessDriver, unmount_all_under
from testkit.ports import free_port
from tests.cluster.agents import AgentProcess
from tests.cluster.installed import Installed


def agent_with_csi(
    stack: ExitStack, installed: Installed, node: str, endpoint: str, work: Path, *extra_args: str
) -> tuple[AgentProcess, InProcessDriver, int]:
    """`node`'s agent (its metrics on the returned loopback port) and the CSI plugin over its store;
    every mount below `work` is detached when `stack` closes."""
    port = free_port()
    metrics = (f"--metrics-port={port}", "--metrics-address=127.0.0.1")
    agent = stack.enter_context(
        AgentProcess(installed, node, endpoint, work / node, extra_args=(*metrics, *extra_args))
    )
    stack.callback(unmount_all_under, work)
    driver = stack.enter_context(InProcessDriver(agent.base))
    return agent, driver, port


@pytest.fixture
def targets(tmp_path: Path) -> Iterator[Path]:
    """Stands in for the kubelet's pod volume directories; every mount below is detached afterwards."""
    yield tmp_path
    unmount_all_under(tmp_path)
