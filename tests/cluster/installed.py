"""The chart as the control-plane tier installs it: rendered objects applied, praesto-hooks (from the
installed wheel) running as its ServiceAccount."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.chart_install import (
    METACONTROLLER_CRDS,
    WEBHOOK_KINDS,
    apply_rendered,
    container_env,
    ensure_namespace,
    install_crds,
    render_for_cluster,
)
from testkit.controlplane import ControlPlane
from testkit.helm_chart import CRD_DIR, NAMESPACE, RELEASE, one
from testkit.installed_wheel import installed_wheel
from testkit.kube_apply import Kube
from testkit.server import RunningServer, hooks_server

Obj = dict[str, Any]
QUOTA_NAMESPACE = "quota-team"  # a namespace the tier's chart values give a quota (test_quota.py)
ORDER_NAMESPACE = "quota-order"  # another, for the sync hook's check in creation order (test_sync_checks.py)
WARM_NAMESPACE = "warm-nodes"  # may hold new nodes (nodeAgent.startupTaint.namespaces; test_warm_nodes.py)
VALUES: Obj = {
    "webhooks": {"certManager": {"enabled": False}},
    "nodeAgent": {"startupTaint": {"namespaces": [WARM_NAMESPACE]}},
    "namespaceQuota": {"namespaces": {QUOTA_NAMESPACE: "3Gi", ORDER_NAMESPACE: "3Gi"}},
}
HOOKS_SA = f"{RELEASE}-hooks"
AGENT_SA = f"{RELEASE}-node-agent"
METACONTROLLER_SA = f"{RELEASE}-metacontroller"


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


def merged(base: Obj, extra: Obj) -> Obj:
    """Helm's way of layering values: maps merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


@contextmanager
def install_chart(
    control_plane: ControlPlane, workdir: Path, extra_values: Obj | None = None
) -> Iterator[Installed]:
    """CRDs, RBAC, controllers and webhooks from the chart; praesto-hooks running as its ServiceAccount."""
    admin = Kube(control_plane.admin())
    install_crds(admin, [*sorted(CRD_DIR.glob("*.yaml")), METACONTROLLER_CRDS])
    ensure_namespace(admin, NAMESPACE)
    ensure_namespace(admin, WARM_NAMESPACE)  # the chart puts the agent's warm Role there
    client_ca = control_plane.webhook_client_ca.cert_path
    client_auth = {"webhooks": {"clientAuth": {"caBundle": client_ca.read_text()}}}
    values = merged(merged(VALUES, extra_values or {}), client_auth)
    objects = render_for_cluster(workdir / "chart", values)
    apply_rendered(admin, objects, webhook_url="", webhook_ca=b"", skip_kinds=WEBHOOK_KINDS)
    deployment = one(objects, "Deployment", HOOKS_SA)
    env = {
        **container_env(deployment, "hooks"),
        "KUBECONFIG": str(control_plane.token_kubeconfig(NAMESPACE, HOOKS_SA)),
    }
    managed = ("--bind", "--workers", "--certfile", "--keyfile")  # hooks_server sets these itself
    args = [
        a.replace("/webhook-client-ca/ca.crt", str(client_ca))  # the chart's ConfigMap mount, here
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(managed)
    ]
    assert f"--client-ca-file={client_ca}" in args, args
    hooks = installed_wheel().script("praesto-hooks")  # the wheel's, as the image runs it
    with hooks_server(
        workdir / "hooks", tls=True, env=env, threads=4, extra_args=tuple(args), command=[hooks]
    ) as server:
        assert server.ca_path is not None
        webhooks = [o for o in objects if o["kind"] in WEBHOOK_KINDS]
        apply_rendered(admin, webhooks, webhook_url=server.base_url, webhook_ca=server.ca_path.read_bytes())
        yield Installed(control_plane, objects, server, admin, workdir)
