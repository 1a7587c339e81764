"""containerd for the node tier: the upstream daemon with its CRI plugin, runc from Debian, CNI bridge.

Configuration (containerd v2.4 config `version = 3`, plugin sections as in containerd's
`internal/cri/config/config.go` at v2.4.2):

* every path of its own under the tier's work dir (root, state, sockets), except those
  containerd fixes itself: shim sockets under `/run/containerd/s` and CNI network
  namespaces under `/run/netns` (the node tier is one per machine, and its teardown
  checks that none is left);
* `restrict_oom_score_adj = true`: root in this VM lacks CAP_SYS_RESOURCE, and runc fails
  to start any sandbox that would lower its OOM score (`failed to update
  /proc/self/oom_score_adj: Permission denied`);
* the CRI plugin's sandbox image is the locally built pause image (no registry here);
* one CNI network: a bridge with host-local IPAM in TEST-NET-2 (198.51.100.0/24, a
  documentation range that belongs to the tier and routes nowhere); Pods get one route, to
  the node's own address through the bridge (a download Job's Pod reaches the tier's hub
  there) and one to the `kubernetes` Service's ClusterIP (testkit/kubernetes_service.py), no
  default route and no masquerade; IPAM state in the work dir. The bridge plugin
  turns on ip_forward for its gateway; the node's teardown puts it back.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit.controlplane import KUBERNETES_SERVICE_IP, Component, wait_for
from testkit.node_host import NODE_IP

STARTUP_DEADLINE = 60.0
CNI_BIN_DIR = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"
POD_SUBNET = "198.51.100.0/24"
BRIDGE = "praesto-cni0"
K8S_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps Kubernetes' images in


@dataclass
class Containerd:
    """One containerd daemon; `address` is its CRI socket for the kubelet."""

    binaries: Path
    workdir: Path
    pause_image: str

    def __post_init__(self) -> None:
        self.address = str(self.workdir / "containerd.sock")
        self.config_path = self.workdir / "config.toml"
        self.cni_conf_dir = self.workdir / "net.d"
        self.component = Component(
            "containerd",
            [str(self.binaries / "containerd"), f"--config={self.config_path}"],
            self.workdir / "containerd.log",
        )

    def write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cni_conf_dir.mkdir(exist_ok=True)
        (self.cni_conf_dir / "10-praesto.conflist").write_text(json.dumps(self._cni_network(), indent=2))
        shim_path = self.binaries / "containerd-shim-runc-v2"
        self.config_path.write_text(
            f"""version = 3
root = "{self.workdir / "root"}"
state = "{self.workdir / "state"}"

[grpc]
  address = "{self.address}"

[ttrpc]
  address = "{self.address}.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{self.pause_image}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{self.cni_conf_dir}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim_path}"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
"""
        )

    def _cni_network(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "praesto-node-tier",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        # via the bridge, no default route: the node's address, and the API
                        # server's ClusterIP (testkit/kubernetes_service.py)
                        "routes": [{"dst": f"{NODE_IP}/32"}, {"dst": f"{KUBERNETES_SERVICE_IP}/32"}],
                        "dataDir": str(self.workdir / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }

    def start(self) -> None:
        self.write_config()
        self.component.start()

        def serving() -> bool:
            self.component.check_running()
            return self.ctr("version", check=False).returncode == 0

        wait_for("containerd serving its socket", serving, STARTUP_DEADLINE, interval=0.2)

    def stop(self) -> None:
        self.component.stop()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's own client against this daemon, in the CRI plugin's namespace."""
        argv = [
            str(self.binaries / "ctr"),
            f"--address={self.address}",
            f"--namespace={K8S_NAMESPACE}",
            *args,
        ]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)

    def import_image(self, archive: Path) -> None:
        """`ctr images import`: containerd stores and unpacks it as it would a pulled image."""
        self.ctr("images", "import", "--snapshotter=overlayfs", "--platform=linux/amd64", str(archive))

    def version(self) -> str:
        return self.ctr("version").stdout
