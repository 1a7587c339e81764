"""Fixtures every directory may use: the real API server behind the fault proxy (testkit/kube_real.py).

Imported when first used, so a session that needs no API server loads no `kubernetes` client for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from testkit.controlplane import ControlPlane
    from testkit.kube_real import RealKube


@pytest.fixture(scope="session")
def kube_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for this test process (one per xdist worker), the chart's CRDs installed."""
    from testkit.kube_real import session_plane

    yield from session_plane(tmp_path_factory)


@pytest.fixture
def kube(kube_plane: ControlPlane) -> Iterator[RealKube]:
    """The real API server, wiped, behind a fresh fault proxy; `kube.api_client()` goes through the proxy."""
    from testkit.kube_real import proxied

    with proxied(kube_plane) as real:
        yield real
