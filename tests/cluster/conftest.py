"""The real control-plane tier: one upstream control plane per session, the chart installed into it.

`make test-cluster` runs this directory alone (no xdist: one control plane).
In CI the tier must run: a missing Go toolchain fails the session instead of
skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart_install import (
    METACONTROLLER_CRDS,
    WEBHOOK_KINDS,
    apply_rendered,
    container_env,
    ensure_namespace,
    install_crds,
    render_for_cluster,
)
from tests.support.controlplane import ControlPlane, ControlPlaneUnavailable, start_control_plane
from tests.support.helm_chart import CRD_DIR, NAMESPACE, RELEASE, one
from tests.support.kube_apply import Kube
from tests.support.server import RunningServer, hooks_server

Obj = dict[str, Any]
VALUES: Obj = {"webhooks": {"certManager": {"enabled": False}}}
HOOKS_SA = f"{RELEASE}-hooks"
AGENT_SA = f"{RELEASE}-node-agent"
METACONTROLLER_SA = f"{RELEASE}-metacontroller"
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


@dataclass
class Installed:
    """The chart as installed: rendered objects, the hooks server, clients per identity."""

    plane: ControlPlane
    objects: list[Obj]
    hooks: RunningServer
    admin: Kube
    workdir: Path

    def kube_as(self, service_account: str, namespace: str = NAMESPACE, **token_args: Any) -> Kube:
        return Kube(
            self.plane.client_as(namespace, service_account, **token_args), field_manager=service_account
        )

    def rendered(self, kind: str, name: str | None = None) -> Obj:
        return one(self.objects, kind, name)


@pytest.fixture(scope="session")
def installed(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """CRDs, RBAC, controllers and webhooks from the chart; praesto-hooks running as its ServiceAccount."""
    workdir = tmp_path_factory.mktemp("installed")
    admin = Kube(control_plane.admin())
    install_crds(admin, [*sorted(CRD_DIR.glob("*.yaml")), METACONTROLLER_CRDS])
    ensure_namespace(admin, NAMESPACE)
    objects = render_for_cluster(workdir / "chart", VALUES)
    apply_rendered(admin, objects, webhook_url="", webhook_ca=b"", skip_kinds=WEBHOOK_KINDS)
    deployment = one(objects, "Deployment", HOOKS_SA)
    env = {
        **container_env(deployment, "hooks"),
        "KUBECONFIG": str(control_plane.token_kubeconfig(NAMESPACE, HOOKS_SA)),
    }
    managed = ("--bind", "--workers", "--certfile", "--keyfile")  # hooks_server sets these itself
    args = [
        a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(managed)
    ]
    with ExitStack() as stack:
        server = stack.enter_context(
            hooks_server(workdir / "hooks", tls=True, env=env, threads=4, extra_args=tuple(args))
        )
        assert server.ca_path is not None
        webhooks = [o for o in objects if o["kind"] in WEBHOOK_KINDS]
        apply_rendered(admin, webhooks, webhook_url=server.base_url, webhook_ca=server.ca_path.read_bytes())
        yield Installed(control_plane, objects, server, admin, workdir)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _VERSION:
        terminalreporter.write_line(f"control-plane tier ran against kube-apiserver {_VERSION[0]}")
