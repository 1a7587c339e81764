"""The chart installed by the real `helm` CLI on the node tier, and what plays the parts no Pod can.

* `HelmCli` runs a command line exactly as the chart README prints it (`bash -c`), with the built
  helm (tests/tools, v4.3.2) and kubectl (tests/node) first on PATH, KUBECONFIG the tier's admin,
  Helm's own folders in the test's directory, in a folder whose `charts/praesto` is a copy of the
  chart with the metacontroller-helm stand-in as its dependency (testkit/metacontroller_subchart.py):
  Helm refuses a chart whose declared dependency is missing from charts/, whatever its condition
  (v4.3.2 pkg/cmd/install.go and upgrade.go call action.CheckDependencies, pkg/action/install.go,
  before the condition is looked at), and ghcr.io cannot be reached.
* `ReleaseOnNode` is the release as NodeDaemons (tests/node/node_daemons.py) needs it to run the
  DaemonSet's agent and CSI plugin as host processes from the installed wheel: the DaemonSet as
  Helm applied it (`helm get manifest`), its placeholder Pod kept out of the DaemonSet's sight (no
  selector labels, no nodeSelector), since the release's DaemonSet selects no node of the tier.
* `ServiceHookClient` is how the Metacontroller stand-in calls the hooks: the URL the
  CompositeController names (`https://<service>.<namespace>.svc/...`), sent to a ready endpoint of
  that Service (the hooks Deployment's Pod, run by the kubelet), TLS checked against the Service's
  DNS name, as cluster DNS and kube-proxy would make it for the real Metacontroller.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes import client

from testkit.controlplane import ControlPlane, wait_for
from testkit.helm_chart import one
from testkit.kube_apply import Kube
from testkit.metacontroller_base import HookClient, HookError
from testkit.real_node import node_binaries
from testkit.tools import tool

Obj = dict[str, Any]
HELM_DEADLINE = 360.0  # above helm's own --timeout default (5m), which bounds its waits for hooks


@dataclass
class HelmCli:
    workdir: Path
    kubeconfig: Path

    @property
    def cwd(self) -> Path:
        """Where the README's relative chart path `charts/praesto` resolves."""
        return self.workdir / "repo"

    def env(self) -> dict[str, str]:
        path = f"{tool('helm').parent}:{node_binaries()}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        homes = {
            f"HELM_{k}_HOME": str(self.workdir / "helm-home" / k.lower()) for k in ("CACHE", "CONFIG", "DATA")
        }
        return {**os.environ, "PATH": path, "KUBECONFIG": str(self.kubeconfig), **homes}

    def start(self, line: str) -> subprocess.Popen[str]:
        """The line running in the background (e.g. an uninstall that waits on the cluster)."""
        return subprocess.Popen(["bash", "-c", line], cwd=self.cwd, env=self.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def run(self, line: str, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """`bash -c line`; with `ok`, an AssertionError showing its output unless it exits 0."""
        done = subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.env(), text=True,
                              capture_output=True, timeout=HELM_DEADLINE, check=False)  # fmt: skip
        if ok:
            assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def manifest(self, release: str, namespace: str) -> list[Obj]:
        """The objects of the release's current revision, as Helm applied them."""
        text = self.run(f"helm get manifest {release} --namespace {namespace}").stdout
        return [d for d in yaml.safe_load_all(text) if d]

    def status(self, release: str, namespace: str) -> Obj:
        out: Obj = json.loads(self.run(f"helm status {release} --namespace {namespace} -o json").stdout)
        return out


@dataclass
class ReleaseOnNode:
    """What NodeDaemons reads of an installed chart (tests/node/node_daemons.py ChartOnCluster)."""

    plane: ControlPlane
    admin: Kube
    trust_dir: Path
    objects: list[Obj] = field(default_factory=list)

    def rendered(self, kind: str, name: str | None = None) -> Obj:
        found = one(self.objects, kind, name)
        return placeholder_template(found) if kind == "DaemonSet" else found


def placeholder_template(daemonset: Obj) -> Obj:
    """The DaemonSet with a Pod template its controller does not own and the kubelet admits anywhere.

    The placeholder Pod (tests/node/daemonset.py) copies the template: with the selector's labels
    the DaemonSet controller would adopt it and, the node not being selected, delete it; with the
    nodeSelector the kubelet would refuse it (NodeAffinity). Neither matters to the host processes."""
    out = copy.deepcopy(daemonset)
    out["spec"]["template"]["metadata"]["labels"] = {
        "praesto.test/placeholder-of": daemonset["metadata"]["name"]
    }
    out["spec"]["template"]["spec"].pop("nodeSelector", None)
    out["spec"]["template"]["spec"].pop("affinity", None)
    return out


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to `address`, the certificate checked against the URL's host name (SNI too)."""

    def __init__(self, host: str, port: int, address: str, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


@dataclass
class ServiceHookClient(HookClient):
    """HookClient whose calls go to a ready endpoint of the Service the hook URL names."""

    kube: Kube | None = None

    def endpoint(self, service: str, namespace: str, port: int) -> tuple[str, int]:
        assert self.kube is not None
        discovery = client.DiscoveryV1Api(self.kube.api)
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}"
        ).items
        core = client.CoreV1Api(self.kube.api)
        target = next(
            p for p in core.read_namespaced_service(service, namespace).spec.ports if p.port == port
        )
        for piece in slices:
            ports = {p.name: p.port for p in piece.ports or []}
            for ep in piece.endpoints or []:
                if ep.conditions and ep.conditions.ready:
                    return ep.addresses[0], ports.get(target.name, target.target_port)
        raise HookError(f"Service {namespace}/{service} has no ready endpoint")

    def call(self, webhook: Obj, body: Obj, allowed: frozenset[str]) -> Obj:
        url = urlsplit(webhook["url"])
        assert url.hostname is not None
        service, namespace = url.hostname.split(".")[:2]
        address, port = self.endpoint(service, namespace, url.port or 443)
        context = ssl.create_default_context(cafile=str(self.ca_path))
        connection = _PinnedHTTPS(url.hostname, port, address, context, self.timeout)
        try:
            connection.request("POST", url.path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise HookError(f"{url.path}: HTTP {response.status}: {payload[:200]!r}")
        answer = json.loads(payload)
        if not isinstance(answer, dict):
            raise HookError(f"{url.path}: response is not an object")
        unknown = sorted(set(answer) - allowed)
        if unknown:
            raise HookError(f"{url.path}: strict decoding failed: unknown fields {unknown}")
        return answer


def rolled_out(admin: Kube, name: str, namespace: str) -> bool:
    """`kubectl rollout status`: the Deployment's new Pods all ready, no old one left."""
    got = client.AppsV1Api(admin.api).read_namespaced_deployment(name, namespace)
    status, want = got.status, got.spec.replicas
    return bool(
        (status.observed_generation or 0) >= got.metadata.generation
        and status.updated_replicas == want
        and status.ready_replicas == want
        and status.replicas == want
    )


def wait_rolled_out(admin: Kube, name: str, namespace: str, deadline: float = 180) -> None:
    wait_for(
        f"Deployment {namespace}/{name} rolled out", lambda: rolled_out(admin, name, namespace), deadline
    )


def still_there(admin: Kube, objects: list[Obj]) -> list[str]:
    """`Kind namespace/name` of each object that the API server still has."""
    left = []
    for obj in objects:
        meta = obj["metadata"]
        if admin.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")) is not None:
            left.append(f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}")
    return left
