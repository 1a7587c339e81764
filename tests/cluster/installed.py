"""The chart as the control-plane tier installs it: rendered objects applied, praesto-hooks (the hooks
Deployment's container) and praesto-orphans (the orphans Deployment's), both from the installed wheel,
each running as its own ServiceAccount."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from praesto import names
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
from testkit.dockerfile import image_env
from testkit.egress import LOOPBACK_CIDRS
from testkit.helm_chart import CRD_DIR, NAMESPACE, RELEASE, one
from testkit.installed_wheel import installed_wheel
from testkit.kube_apply import Kube
from testkit.pki import KeyPair, signing_key
from testkit.server import RunningServer, hooks_server

Obj = dict[str, Any]
QUOTA_NAMESPACE = "quota-team"  # a namespace the tier's chart values give a quota (test_quota.py)
ORDER_NAMESPACE = "quota-order"  # another, for the sync hook's check in creation order (test_sync_checks.py)
WARM_NAMESPACE = "warm-nodes"  # may hold new nodes (nodeAgent.startupTaint.namespaces; test_warm_nodes.py)
SIGNED_ONLY_NAMESPACE = (
    "signed-only"  # accepts only signed models (verification.requiredIn; test_signed_models.py)
)
PLATFORM_TRUST = "platform-models"  # the tier's verification.trust entry: a key the tests sign with
TRUST_MOUNT = "/etc/praesto/cluster-trust"  # where the chart mounts verification.trust's ConfigMap
VALUES: Obj = {
    "webhooks": {"certManager": {"enabled": False}},
    "verification": {"requiredIn": [SIGNED_ONLY_NAMESPACE]},
    "nodeAgent": {"startupTaint": {"namespaces": [WARM_NAMESPACE]}},
    "namespaceQuota": {"namespaces": {QUOTA_NAMESPACE: "3Gi", ORDER_NAMESPACE: "3Gi"}},
    # the tier's hub, registries and stores listen on loopback: the PVC-mode Jobs reach them
    "downloads": {"egress": {"allowedCIDRs": LOOPBACK_CIDRS.split(",")}},
}
HOOKS_SA = f"{RELEASE}-hooks"
ORPHANS_SA = f"{RELEASE}-orphans"
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
    platform_key: KeyPair  # signs models for the chart's verification.trust entry PLATFORM_TRUST
    trust_dir: Path  # that ConfigMap as the kubelet would mount it (agents: --trust-dir)

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
    """CRDs, RBAC, controllers and webhooks from the chart; praesto-hooks and praesto-orphans running,
    each as its ServiceAccount."""
    admin = Kube(control_plane.admin())
    install_crds(admin, [*sorted(CRD_DIR.glob("*.yaml")), METACONTROLLER_CRDS])
    ensure_namespace(admin, NAMESPACE)
    ensure_namespace(admin, WARM_NAMESPACE)  # the chart puts the agent's warm Role there
    client_ca = control_plane.webhook_client_ca.cert_path
    client_auth = {"webhooks": {"clientAuth": {"caBundle": client_ca.read_text()}}}
    (workdir / "platform").mkdir(parents=True, exist_ok=True)
    platform_key = signing_key(workdir / "platform" / "platform.key")
    trust = {"verification": {"trust": {PLATFORM_TRUST: {"publicKey": platform_key.cert_path.read_text()}}}}
    values = merged(merged(merged(VALUES, trust), extra_values or {}), client_auth)
    objects = render_for_cluster(workdir / "chart", values)
    trust_dir = mount_config_map(one(objects, "ConfigMap", f"{RELEASE}-trust"), workdir / "cluster-trust")
    apply_rendered(admin, objects, webhook_url="", webhook_ca=b"", skip_kinds=WEBHOOK_KINDS)
    deployment = one(objects, "Deployment", HOOKS_SA)
    env = {
        **image_env(),  # as the image runs it (MALLOC_ARENA_MAX: its peak memory is what scale measures)
        **container_env(deployment, "hooks"),
        "KUBECONFIG": str(control_plane.token_kubeconfig(NAMESPACE, HOOKS_SA)),
    }
    assert env[names.ENV_TRUST_DIR] == TRUST_MOUNT, env
    env[names.ENV_TRUST_DIR] = str(trust_dir)  # the chart's ConfigMap mount, here
    managed = ("--bind", "--workers", "--certfile", "--keyfile")  # hooks_server sets these itself
    args = [
        a.replace("/webhook-client-ca/ca.crt", str(client_ca))  # the chart's ConfigMap mount, here
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(managed)
    ]
    assert f"--client-ca-file={client_ca}" in args, args
    hooks = installed_wheel().script("praesto-hooks")  # the wheel's, as the image runs it
    with (
        orphans_container(
            one(objects, "Deployment", ORPHANS_SA),
            str(control_plane.token_kubeconfig(NAMESPACE, ORPHANS_SA)),
            workdir / "orphans",
        ),
        hooks_server(
            workdir / "hooks", tls=True, env=env, threads=4, extra_args=tuple(args), command=[hooks]
        ) as server,
    ):
        assert server.ca_path is not None
        webhooks = [o for o in objects if o["kind"] in WEBHOOK_KINDS]
        apply_rendered(admin, webhooks, webhook_url=server.base_url, webhook_ca=server.ca_path.read_bytes())
        yield Installed(control_plane, objects, server, admin, workdir, platform_key, trust_dir)


ORPHANS_START_DEADLINE = 30.0  # seconds for praesto-orphans' first heartbeat on a busy machine


@contextmanager
def orphans_container(deployment: Obj, kubeconfig: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The orphans Deployment's container: praesto-orphans from the installed wheel with the chart's
    flags, as its own ServiceAccount; up once its liveness probe (run as the kubelet would) passes."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    workdir.mkdir(parents=True, exist_ok=True)
    heartbeat = str(workdir / "heartbeat")  # the chart's emptyDir, here

    def here(argv: list[str]) -> list[str]:
        return [f"--heartbeat-file={heartbeat}" if a.startswith("--heartbeat-file=") else a for a in argv]

    script = installed_wheel().script("praesto-orphans")
    env = {**os.environ, **image_env(), "KUBECONFIG": kubeconfig}
    log_path = workdir / "praesto-orphans.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [script, *here(container["args"])], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    probe = [script, *here(container["livenessProbe"]["exec"]["command"][1:])]
    try:
        deadline = time.monotonic() + ORPHANS_START_DEADLINE
        while subprocess.run(probe, capture_output=True, env=env, check=False).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"praesto-orphans not alive (exit {process.poll()}):\n{log_path.read_text()}"
                )
            time.sleep(0.2)  # poll interval, bounded by the deadline above
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def mount_config_map(config_map: Obj, directory: Path) -> Path:
    """What the kubelet makes of a ConfigMap volume: one file per key."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in (config_map.get("data") or {}).items():
        (directory / key).write_text(value)
    return directory
