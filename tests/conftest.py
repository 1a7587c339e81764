"""Fixtures every directory may use: the real API server behind the fault proxy (tests/support/kube_real.py)."""

from tests.support.kube_real import kube, kube_plane

__all__ = ["kube", "kube_plane"]
