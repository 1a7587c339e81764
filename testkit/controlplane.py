"""The upstream Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Binaries come from `scripts/build_cluster.sh` (built from the Kubernetes Go
modules, see tests/cluster/go.mod). The API server runs as a production one
would: TLS everywhere, client-certificate and ServiceAccount-token
authentication, the Node and RBAC authorizers, and an admission chain that
includes OwnerReferencesPermissionEnforcement, PodSecurity, NodeRestriction,
the webhook plugins and ValidatingAdmissionPolicy. The controller-manager runs
each controller under its own ServiceAccount (`--use-service-account-credentials`),
as kubeadm sets it up. The control-plane tier has no kubelet: tests create Node
objects themselves, so the node lifecycle controller (which would mark
kubelet-less Nodes unreachable) is left off there; the node tier
(`with_kubelets=True`) runs it beside a real kubelet.

Identities: `admin` (system:masters) sets up fixtures; everything under test
authenticates with a ServiceAccount token from the TokenRequest API
(`token_kubeconfig`), so RBAC decides every call it makes.

A little over 400 lines: each component's flags are spelled out in full, as an operator would
read them, rather than generated.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from testkit.pki import CertificateAuthority, KeyPair, signing_key
from testkit.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "scripts" / "build_cluster.sh"
STARTUP_DEADLINE = 120.0
STOP_DEADLINE = 20.0
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "ServiceAccount",
    "NodeRestriction",
    "OwnerReferencesPermissionEnforcement",
    "PodSecurity",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ResourceQuota",
)
# The Service range, and the ClusterIP the API server gives `default/kubernetes` (its first
# address): Pods of the node tier reach the API server there (testkit/kubernetes_service.py).
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
# Every default controller except the two that need signing keys a test cluster has no use
# for (legacy token Secrets, CSRs), and, where no kubelet posts heartbeats (the control-plane
# tier's Node objects are written by tests), the node lifecycle one, which would mark those
# Nodes unreachable. The node tier runs a real kubelet and needs it: it lifts the
# `node.kubernetes.io/not-ready` taint the kubelet registers with.
NO_SIGNING_CONTROLLERS = ("-serviceaccount-token-controller", "-certificatesigningrequest-signing-controller")


def controllers_flag(*, with_kubelets: bool) -> str:
    lifecycle = () if with_kubelets else ("-node-lifecycle-controller",)
    return ",".join(("*", *lifecycle, *NO_SIGNING_CONTROLLERS))


class ControlPlaneUnavailable(RuntimeError):
    """The binaries cannot be built here (no Go toolchain): a reason to skip outside CI."""


def build_binaries(module: str = "tests/cluster") -> Path:
    """The directory holding the module's binaries, built on first use (cached by content)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT), module], capture_output=True, text=True, check=False)
    if result.returncode == 3:
        raise ControlPlaneUnavailable(result.stderr.strip())
    if result.returncode != 0:
        raise RuntimeError(f"building the control plane failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def write_kubeconfig(
    path: Path, server: str, ca: Path, *, token: str = "", pair: KeyPair | None = None
) -> Path:
    user: dict[str, str] = {"token": token} if token else {}
    if pair is not None:
        user = {"client-certificate": str(pair.cert_path), "client-key": str(pair.key_path)}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # added to this process's environment

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_DEADLINE)

    def kill(self) -> None:
        """SIGKILL, no graceful shutdown: for a throwaway server whose state nobody reads again."""
        process = self.process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_DEADLINE)

    def check_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise RuntimeError(f"{self.name} exited ({code}):\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def wait_for(what: str, check: Callable[[], bool], deadline_s: float, *, interval: float = 0.1) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)  # poll interval, bounded by the deadline
    raise TimeoutError(f"timed out after {deadline_s:.0f}s waiting for {what}")


@dataclass
class ControlPlane:
    """A running control plane; `admin` is a cluster-admin client for fixtures only."""

    workdir: Path
    binaries: Path
    with_kubelets: bool = False
    with_controllers: bool = True  # False: etcd and kube-apiserver alone (testkit/kube_real.py)
    components: dict[str, Component] = field(default_factory=dict)
    server: str = ""

    def __post_init__(self) -> None:
        self.pki = CertificateAuthority(self.workdir / "pki", "cluster-ca")
        self.ca_path = self.pki.cert_path
        self.sa_key = signing_key(self.workdir / "pki" / "sa.key")
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        serving = self.pki.issue(
            "apiserver",
            common_name="kube-apiserver",
            hosts=("127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc", KUBERNETES_SERVICE_IP),
        )
        self._admin_pair = self.pki.issue(
            "admin", common_name="praesto-test-admin", organizations=("system:masters",), client=True
        )
        self.admin_kubeconfig = write_kubeconfig(
            self.workdir / "admin.kubeconfig", self.server, self.ca_path, pair=self._admin_pair
        )
        # The API server presents this client certificate to every webhook (WebhookAdmission
        # kubeConfigFile, user "*"), signed by a CA of its own, as an admin sets it up for a
        # webhook that checks its caller (praesto-hooks --client-ca-file).
        self.webhook_client_ca = CertificateAuthority(
            self.workdir / "pki-webhook-client", "webhook-client-ca"
        )
        admission_config = self._webhook_admission_config(
            self.webhook_client_ca.issue(
                "kube-apiserver-webhook-client", common_name="kube-apiserver", client=True
            )
        )
        # The API server's client certificate towards kubelets (logs, exec), as kubeadm issues it.
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            client=True,
        )
        etcd_port, etcd_peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.components["etcd"] = Component(
            "etcd",
            [
                str(self.binaries / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-url={self.etcd_url}",
                f"--listen-peer-url=http://127.0.0.1:{etcd_peer}",
            ],
            logs / "etcd.log",
        )
        self.components["kube-apiserver"] = Component(
            "kube-apiserver",
            [
                str(self.binaries / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The kubernetes Service would point at loopback, which the endpoint reconciler refuses.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving.cert_path}",
                f"--tls-private-key-file={serving.key_path}",
                f"--client-ca-file={self.ca_path}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={self.sa_key.cert_path}",
                f"--service-account-signing-key-file={self.sa_key.key_path}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                f"--admission-control-config-file={admission_config}",
                f"--kubelet-client-certificate={kubelet_client.cert_path}",
                f"--kubelet-client-key={kubelet_client.key_path}",
                f"--kubelet-certificate-authority={self.ca_path}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=10m",
                "--v=1",
                # A webhook named by Service (the chart's, installed by helm) is called at a ready
                # endpoint of it, a Pod's address the node routes to (cmd/kube-apiserver/app/server.go
                # buildServiceResolver at v1.37.2), instead of its ClusterIP: no kube-proxy runs here.
                *(["--enable-aggregator-routing=true"] if self.with_kubelets else []),
            ],
            logs / "kube-apiserver.log",
        )
        self._client_component(
            "kube-controller-manager",
            "system:kube-controller-manager",
            "--use-service-account-credentials=true",
            f"--root-ca-file={self.ca_path}",
            f"--controllers={controllers_flag(with_kubelets=self.with_kubelets)}",
            "--concurrent-gc-syncs=5",
            # Its FlexVolume prober would create /usr/libexec/kubernetes/... on the machine.
            f"--flex-volume-plugin-dir={self.workdir / 'flex-volume-plugins'}",
        )
        self._client_component("kube-scheduler", "system:kube-scheduler")

    def _webhook_admission_config(self, pair: KeyPair) -> Path:
        kubeconfig = self.workdir / "webhook-client.kubeconfig"
        user = {"client-certificate": str(pair.cert_path), "client-key": str(pair.key_path)}
        kubeconfig.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
        )
        webhook = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        plugins = [
            {"name": name, "configuration": webhook}
            for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ]
        path = self.workdir / "admission-config.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": plugins,
                }
            )
        )
        return path

    def _client_component(self, name: str, user: str, *flags: str) -> None:
        """A component that reaches the API server with its own client certificate, as kubeadm sets it up."""
        pair = self.pki.issue(name, common_name=user, client=True)
        self.components[name] = Component(
            name,
            [
                str(self.binaries / name),
                f"--kubeconfig={self._kubeconfig(name, pair)}",
                *flags,
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
            self.workdir / "logs" / f"{name}.log",
        )

    def _kubeconfig(self, name: str, pair: KeyPair) -> Path:
        return write_kubeconfig(self.workdir / f"{name}.kubeconfig", self.server, self.ca_path, pair=pair)

    # ---- lifecycle -------------------------------------------------------

    def controllers(self) -> list[str]:
        """The controller-manager and scheduler, where this build has them (compat builds do not)."""
        if not self.with_controllers:
            return []
        return [n for n in ("kube-controller-manager", "kube-scheduler") if (self.binaries / n).exists()]

    def start(self) -> None:
        self.components["etcd"].start()
        self.start_apiserver()
        for name in self.controllers():
            self.components[name].start()
        for name in self.controllers():
            self.components[name].check_running()

    def start_apiserver(self) -> None:
        apiserver = self.components["kube-apiserver"]
        apiserver.start()

        def ready() -> bool:
            for component in ("etcd", "kube-apiserver"):
                self.components[component].check_running()
            return self._get("/readyz") == 200

        try:
            wait_for("kube-apiserver /readyz", ready, STARTUP_DEADLINE, interval=0.25)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{apiserver.log_tail()}") from None

    def stop_apiserver(self) -> None:
        self.components["kube-apiserver"].stop()

    def compact_etcd(self) -> None:
        """Write a key outside /registry straight to etcd, then compact its history up to that write.

        Every watch position taken before this is then gone for good: a watch resumed
        from one gets 410 Gone from the API server, on demand rather than by luck
        (the API server compacts on its own only every five minutes).
        """
        put = {"key": base64.b64encode(b"/praesto-tests/compaction-mark").decode(), "value": ""}
        revision = int(self._etcd("/v3/kv/put", put)["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})

    def _etcd(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        for name in [*reversed(self.controllers()), "kube-apiserver", "etcd"]:
            self.components[name].stop()

    def _get(self, path: str) -> int:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(str(self._admin_pair.cert_path), str(self._admin_pair.key_path))
        try:
            with urllib.request.urlopen(self.server + path, timeout=5, context=context) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except (urllib.error.URLError, OSError):
            return 0

    # ---- clients ---------------------------------------------------------

    @property
    def admin_pair(self) -> KeyPair:
        """The admin's client certificate (system:masters), e.g. for a proxy's default identity."""
        return self._admin_pair

    def admin(self) -> client.ApiClient:
        """Cluster-admin: for fixtures (namespaces, Nodes, the chart's objects), never for code under test."""
        return config.new_client_from_config(config_file=str(self.admin_kubeconfig))

    def version(self) -> str:
        info: Any = client.VersionApi(self.admin()).get_code()
        return str(info.git_version)

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        seconds: int = 3600,
        bound_object: dict[str, str] | None = None,
    ) -> str:
        """A token from the TokenRequest API, as the kubelet would project it into the Pod."""
        spec: dict[str, Any] = {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": seconds}
        if bound_object:
            spec["boundObjectRef"] = bound_object
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        core = client.CoreV1Api(self.admin())
        response = core.create_namespaced_service_account_token(name, namespace, body)
        return str(response.status.token)

    def token_kubeconfig(self, namespace: str, name: str, *, suffix: str = "", **token_args: Any) -> Path:
        """A kubeconfig authenticating as ServiceAccount `namespace/name` (`suffix` keeps several apart)."""
        token = self.service_account_token(namespace, name, **token_args)
        path = self.workdir / f"sa-{namespace}-{name}{'-' + suffix if suffix else ''}.kubeconfig"
        return write_kubeconfig(path, self.server, self.ca_path, token=token)

    def client_as(self, namespace: str, name: str, **token_args: Any) -> client.ApiClient:
        return config.new_client_from_config(
            config_file=str(self.token_kubeconfig(namespace, name, **token_args))
        )


def start_control_plane(
    workdir: Path, module: str = "tests/cluster", *, with_kubelets: bool = False
) -> ControlPlane:
    if workdir.exists():
        shutil.rmtree(workdir)
    plane = ControlPlane(workdir, build_binaries(module), with_kubelets=with_kubelets)
    try:
        plane.start()
    except BaseException:
        plane.stop()
        raise
    return plane
