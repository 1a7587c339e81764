"""Fixtures for the CSI node plugin tests: a store, a driver, and mount cleanup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import store
from testkit.csi_driver import InProcessDriver, unmount_all_under


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """The node-local store; every mount made below tmp_path is detached afterwards, even on failure."""
    path = tmp_path / "store"
    path.mkdir()
    yield path
    unmount_all_under(tmp_path)


@pytest.fixture
def pods(tmp_path: Path) -> Path:
    """Stands in for /var/lib/kubelet/pods: where target paths live."""
    path = tmp_path / "pods"
    path.mkdir()
    return path


@pytest.fixture
def layout(base: Path) -> store.StoreLayout:
    return store.StoreLayout(base)


@pytest.fixture
def driver(base: Path) -> Iterator[InProcessDriver]:
    with InProcessDriver(base) as running:
        yield running
