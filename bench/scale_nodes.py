"""GPU-shaped Node objects for the scale bench, written as a real cluster writes them.

A GPU node as the API server returns it is ~26 KB: the kubelet registers it (labels,
providerID) and reports its status (capacity, conditions, nodeInfo, and the 50 largest
images, `--node-status-max-images` default), Node Feature Discovery adds ~80
`feature.node.kubernetes.io/*` and `nvidia.com/*` labels with its own annotation listing
them, the CNI (Calico here) adds its annotations and the NetworkUnavailable condition, and
kube-controller-manager assigns the Pod CIDR and lifts the startup taint. Each writes with
its own field manager, so the managedFields are what a server writes for four writers.
Heartbeats are the kubelet's status-only patches of its conditions.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

Obj = dict[str, Any]
POOL_LABEL = "scale.praesto.io/pool"
POOL = "gpu"
CPU_FLAGS = (  # noqa: SIM905 (56 names read better as one string)
    "ADX AESNI AVX AVX2 AVX512BF16 AVX512BITALG AVX512BW AVX512CD AVX512DQ AVX512F AVX512FP16 AVX512IFMA "
    "AVX512VBMI AVX512VBMI2 AVX512VL AVX512VNNI AVX512VPOPCNTDQ AVXVNNI AMXBF16 AMXINT8 AMXTILE CETIBT CETSS "
    "CLDEMOTE CMPXCHG8 FMA3 FSRM FXSR FXSROPT GFNI HLE HYPERVISOR IBPB LAHF MOVBE MOVDIR64B MOVDIRI MPX "
    "OSXSAVE RTM SERIALIZE SHA STIBP SYSCALL SYSEE TSXLDTRK VAES VMX VPCLMULQDQ WAITPKG X87 XGETBV1 XSAVE "
    "XSAVEC XSAVEOPT XSAVES"
).split()
GPU_LABELS = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.driver.rev": "07",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/gfd.timestamp": "1733500000",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.deploy.driver": "true",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.machine": "PowerEdge-XE9680",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "single",
    "feature.node.kubernetes.io/kernel-version.full": "6.8.0-49-generic",
    "feature.node.kubernetes.io/kernel-version.major": "6",
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/storage-nonrotationaldisk": "true",
}


def nfd_labels() -> dict[str, str]:
    labels = {f"feature.node.kubernetes.io/cpu-cpuid.{flag}": "true" for flag in CPU_FLAGS}
    return {**labels, **GPU_LABELS}


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def images(node: int) -> list[Obj]:
    """50 images, largest first, as the kubelet reports them (digest and tag names)."""
    out = []
    for i in range(50):
        repo = f"registry.example.com/ml-platform/team-{i % 7}/serving-image-{i}"
        out.append(
            {
                "names": [f"{repo}@sha256:{_digest(i)}", f"{repo}:v1.{i}.{node % 3}"],
                "sizeBytes": 9_000_000_000 - i * 150_000_000,
            }
        )
    return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(message: str = "kubelet is posting ready status") -> list[Obj]:
    now = _now()
    pressure = [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
    ]
    pressure.append(("PIDPressure", "KubeletHasSufficientPID"))
    out = [
        {"type": t, "status": "False", "reason": r, "message": f"kubelet has {r[10:]}", "lastHeartbeatTime": now,
         "lastTransitionTime": now}
        for t, r in pressure
    ]  # fmt: skip
    out.append(
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": message, "lastHeartbeatTime": now,
         "lastTransitionTime": now}
    )  # fmt: skip
    return out


def kubelet_status(name: str, index: int) -> Obj:
    address = f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}"
    resources = {
        "cpu": "192", "memory": "2113407928Ki", "ephemeral-storage": "7440663472Ki", "pods": "110",
        "nvidia.com/gpu": "8", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
    }  # fmt: skip
    return {
        "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        "capacity": resources,
        "allocatable": {**resources, "cpu": "191500m", "memory": "2112281528Ki"},
        "conditions": conditions(),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": _digest("machine", name)[:32], "systemUUID": _digest("uuid", name)[:32],
            "bootID": _digest("boot", name)[:32], "kernelVersion": "6.8.0-49-generic",
            "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.24",
            "kubeletVersion": "v1.37.2", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "images": images(index),
    }  # fmt: skip


def node_name(index: int) -> str:
    return f"gpu-{index:05d}"


class NodeWriter:
    """Writes Nodes as their four writers would, from a few threads (each its own connection pool)."""

    def __init__(self, configuration: client.Configuration, threads: int = 8) -> None:
        self.configuration, self.threads = configuration, threads
        self._local = threading.local()

    def _core(self) -> client.CoreV1Api:
        if not hasattr(self._local, "core"):
            self._local.core = client.CoreV1Api(client.ApiClient(configuration=self.configuration))
        return self._local.core

    def register(self, index: int) -> None:
        core, name = self._core(), node_name(index)
        labels = {
            "kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/region": "us-east-1",
            "topology.kubernetes.io/zone": f"us-east-1{'abc'[index % 3]}", POOL_LABEL: POOL,
        }  # fmt: skip
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
            "spec": {"providerID": f"aws:///us-east-1a/i-{_digest('i', name)[:17]}"},
        }
        core.create_node(body, field_manager="kubelet")
        core.patch_node_status(name, {"status": kubelet_status(name, index)}, field_manager="kubelet")
        nfd = nfd_labels()
        nfd_meta = {
            "labels": nfd,
            "annotations": {
                "nfd.node.kubernetes.io/feature-labels": ",".join(k.split("/", 1)[1] for k in sorted(nfd)),
                "nfd.node.kubernetes.io/master.version": "v0.16.6",
                "nfd.node.kubernetes.io/worker.version": "v0.16.6",
            },
        }
        core.patch_node(name, {"metadata": nfd_meta}, field_manager="nfd-master")
        cni_meta = {
            "annotations": {
                "projectcalico.org/IPv4Address": f"10.0.{index // 256 % 256}.{index % 256}/16",
                "projectcalico.org/IPv4VXLANTunnelAddr": f"192.168.{index % 256}.0",
            }
        }
        core.patch_node(name, {"metadata": cni_meta}, field_manager="calico-node")
        network = {"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp",
                   "message": "Calico is running on this node", "lastHeartbeatTime": _now(),
                   "lastTransitionTime": _now()}  # fmt: skip
        core.patch_node_status(name, {"status": {"conditions": [network]}}, field_manager="calico-node")
        cidr = f"10.{128 + index // 256 % 128}.{index % 256}.0/24"
        core.patch_node(
            name,
            {
                "metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": None},
            },
            field_manager="kube-controller-manager",
        )

    def register_all(self, indexes: Iterable[int]) -> None:
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self.register, indexes))

    def heartbeat(self, index: int) -> None:
        """The kubelet's periodic status patch: the conditions' heartbeat times."""
        self._core().patch_node_status(
            node_name(index), {"status": {"conditions": conditions()}}, field_manager="kubelet"
        )

    def delete_all(self, indexes: Iterable[int]) -> None:
        def delete(index: int) -> None:
            self._core().delete_node(node_name(index))

        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(delete, indexes))


class Heartbeats:
    """`count` kubelets beating every `period` seconds, spread evenly, until stopped."""

    def __init__(self, writer: NodeWriter, indexes: list[int], period: float) -> None:
        self.writer, self.indexes, self.period = writer, indexes, period
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        gap = self.period / max(1, len(self.indexes))
        while not self._stop.is_set():
            for index in self.indexes:
                started = time.monotonic()
                self.writer.heartbeat(index)
                self.sent += 1
                if self._stop.wait(max(0.0, gap - (time.monotonic() - started))):
                    return
