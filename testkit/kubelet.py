"""The upstream kubelet as one real Node of the node tier.

It joins as `system:node:<name>` (client certificate from the tier's CA, group
`system:nodes`), so the API server's Node authorizer and NodeRestriction admission
decide what it may do, as on a real cluster. Its serving certificate comes from the same
CA, so `kubectl logs` through the API server works (the API server holds the kubelet
client certificate `controlplane.py` gives it).

KubeletConfiguration (`k8s.io/kubelet/config/v1beta1`, v0.37.2), what this machine needs:

* `failCgroupV1: false`: this VM is cgroup v1 (hybrid); kubelet 1.35+ refuses v1 unless told
  (KEP-5573). `cgroupDriver: cgroupfs`: there is no systemd managing cgroups here.
* `failSwapOn: false`: harmless where there is no swap, needed where there is.
* `address`/`--node-ip`: the tier's own address in TEST-NET-1 (`node_host.NODE_IP`) on a veth
  the tier creates; the kubelet refuses a loopback node IP, and the machine's external
  address is never used.
* everything the kubelet lets us place lives under the tier's work dir (root dir, pod
  logs, flexvolume dir); its fixed paths (`/var/lib/kubelet/device-plugins`,
  `/var/log/containers`, cgroups `/kubepods`) are checked clean by the teardown.
* image GC off (thresholds 100 %), and eviction thresholds low: the tier's images are
  imported once and must not be collected on a busy disk.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testkit.controlplane import Component, ControlPlane, write_kubeconfig
from testkit.pki import KeyPair
from testkit.ports import free_port

KUBELET_PORT = 10250


@dataclass
class Kubelet:
    plane: ControlPlane
    binaries: Path
    workdir: Path
    node_name: str
    node_ip: str
    runtime_endpoint: str
    register_with_taints: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root_dir = self.workdir / "root"
        self.config_path = self.workdir / "kubelet-config.yaml"
        client: KeyPair = self.plane.pki.issue(
            f"kubelet-{self.node_name}-client",
            common_name=f"system:node:{self.node_name}",
            organizations=("system:nodes",),
            client=True,
        )
        self.serving: KeyPair = self.plane.pki.issue(
            f"kubelet-{self.node_name}-serving",
            common_name=self.node_name,
            hosts=(self.node_ip, self.node_name),
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = write_kubeconfig(
            self.workdir / "kubelet.kubeconfig", self.plane.server, self.plane.ca_path, pair=client
        )
        self.healthz_port = free_port()
        self.component = self._component()

    @property
    def plugins_registry(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    def config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_path)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self.serving.cert_path),
            "tlsPrivateKeyFile": str(self.serving.key_path),
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.runtime_endpoint}",
            "registerNode": True,
            "registerWithTaints": self.register_with_taints,
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "clusterDomain": "cluster.local",
            "shutdownGracePeriod": "0s",
        }

    def _component(self) -> Component:
        return Component(
            f"kubelet/{self.node_name}",
            [
                str(self.binaries / "kubelet"),
                f"--config={self.config_path}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--node-ip={self.node_ip}",
                f"--hostname-override={self.node_name}",
                "--v=2",
            ],
            self.workdir / "kubelet.log",
        )

    def start(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config()))
        self.component.start()

    def stop(self) -> None:
        self.component.stop()

    def restart(self) -> None:
        """Stop and start the same kubelet: running Pods and their mounts stay (their shims do)."""
        self.stop()
        self.component = self._component()
        self.start()

    def remove_root(self) -> None:
        shutil.rmtree(self.root_dir, ignore_errors=True)
