"""Metacontroller for the control-plane tier: both controllers running for the whole session.

They start once the chart is installed and watch the real API server as the
chart's Metacontroller ServiceAccount until the session ends, so every test
only creates and changes objects and waits for outcomes; none makes a pass
happen. Every watch event reaches the controllers `WATCH_LAG` late, so the
hooks are always exercised against a cache that trails the API server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.kube_apply import Kube
from testkit.metacontroller import CompositeController, DecoratorController, Metacontroller
from tests.cluster.flows import hook_client
from tests.cluster.installed import Installed

WATCH_LAG = 0.2  # seconds between an API server's write and the controllers' cache seeing it


@pytest.fixture(scope="session")
def running_metacontroller(installed: Installed, metacontroller: Kube) -> Iterator[Metacontroller]:
    process = Metacontroller(
        metacontroller,
        hook_client(installed),
        installed.rendered("CompositeController"),
        installed.rendered("DecoratorController"),
        lag=WATCH_LAG,
    )
    with process:
        yield process


@pytest.fixture(scope="session")
def composite(running_metacontroller: Metacontroller) -> CompositeController:
    return running_metacontroller.composite


@pytest.fixture(scope="session")
def decorator(running_metacontroller: Metacontroller) -> DecoratorController:
    return running_metacontroller.decorator
