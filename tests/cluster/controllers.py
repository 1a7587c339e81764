"""Metacontroller for the control-plane tier: both controllers running for the whole session.

They start once the chart is installed and watch the real API server as the
chart's Metacontroller ServiceAccount until the session ends, so every test
only creates and changes objects and waits for outcomes; none makes a pass
happen. Every watch event reaches the controllers `WATCH_LAG` late, so the
hooks are always exercised against a cache that trails the API server. They run
at the settings the chart gives Metacontroller (client rate limit, workers,
resync: its rendered args).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.kube_apply import Kube
from testkit.metacontroller import CompositeController, DecoratorController, Metacontroller
from testkit.metacontroller_subchart import chart_metacontroller_flags
from tests.cluster.flows import hook_client
from tests.cluster.installed import VALUES, Installed

LIMITER: list[tuple[int, float, float, int]] = []  # (requests, seconds waited, qps, burst) per session
WATCH_LAG = 0.2  # seconds between an API server's write and the controllers' cache seeing it


@pytest.fixture(scope="session")
def running_metacontroller(
    installed: Installed, metacontroller: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Metacontroller]:
    process = Metacontroller(
        metacontroller,
        hook_client(installed),
        installed.rendered("CompositeController"),
        installed.rendered("DecoratorController"),
        lag=WATCH_LAG,
        flags=chart_metacontroller_flags(tmp_path_factory.mktemp("metacontroller-args"), VALUES),
    )
    with process:
        yield process
    if process.bucket is not None:  # what the chart's client rate limit cost the tier (conftest prints it)
        LIMITER.append(
            (process.bucket.requests, process.bucket.waited, process.bucket.qps, process.bucket.burst)
        )


@pytest.fixture(scope="session")
def composite(running_metacontroller: Metacontroller) -> CompositeController:
    return running_metacontroller.composite


@pytest.fixture(scope="session")
def decorator(running_metacontroller: Metacontroller) -> DecoratorController:
    return running_metacontroller.decorator
