"""OCI models through Praesto's store versus through the container runtime (issue #26 item 5).

The same model files are pushed to a local CNCF distribution registry by the ORAS CLI twice:
as a ModelPack artifact with raw layers (what Praesto reads), and as the OCI image an image
volume (Kubernetes 1.31+, GA in 1.36) would mount: one uncompressed tar layer. Then, interleaved,
for `--rounds` rounds:

* praesto: `praesto-agent download oci://...` into an empty store (its blob area beside it);
* containerd: `ctr images pull` into a fresh containerd (the node tier's build, overlayfs), which
  fetches the layer into its content store and unpacks it into a snapshot, as the kubelet's pull
  for an image volume does.

Printed: time to a usable copy (s, min/median/max), and the disk each keeps afterwards (`du`
of everything it wrote, hard links counted once). Needs root (containerd's overlayfs snapshots).
`python -m bench.oci_bench [--size-mib 1024] [--rounds 3]`
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.common import ROUNDS, interleaved, print_table, ratio, timed_child
from testkit.controlplane import build_binaries
from testkit.oci_artifacts import Layer, digest_of, push_modelpack
from testkit.registry import Registry

CONFIG = b'{"model_type": "llama", "hidden_size": 4096}'


def disk_bytes(*paths: Path) -> int:
    """Bytes allocated under `paths`, each inode once (du with several arguments)."""
    out = subprocess.run(["du", "-s", "--block-size=1", "-c", *map(str, paths)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return int(out.strip().splitlines()[-1].split()[0])


def push_image(registry: Registry, files: dict[str, bytes], workdir: Path) -> str:
    """The files as a one-layer OCI image (what an image volume mounts); its manifest digest."""
    workdir.mkdir(parents=True, exist_ok=True)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    (workdir / "model.tar").write_bytes(layer.getvalue())
    diff_id = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [diff_id]},
              "config": {}}  # fmt: skip
    (workdir / "config.json").write_text(json.dumps(config))
    out = registry.oras(
        "push", registry.reference("bench/model-image", "1.0"),
        "--config", "config.json:application/vnd.oci.image.config.v1+json",
        "model.tar:application/vnd.oci.image.layer.v1.tar", cwd=workdir,
    )  # fmt: skip
    return digest_of(out)


class ContainerdRun:
    """One fresh containerd (its own root) that pulls the image once."""

    def __init__(self, binaries: Path, workdir: Path) -> None:
        self.binaries, self.workdir = binaries, workdir
        self.address = str(workdir / "containerd.sock")

    def __enter__(self) -> ContainerdRun:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        (self.workdir / "config.toml").write_text(
            f'version = 3\nroot = "{self.workdir / "root"}"\nstate = "{self.workdir / "state"}"\n'
            f'[grpc]\n  address = "{self.address}"\n[ttrpc]\n  address = "{self.address}.ttrpc"\n'
        )
        log = open(self.workdir / "containerd.log", "wb")
        self.process = subprocess.Popen(
            [str(self.binaries / "containerd"), f"--config={self.workdir / 'config.toml'}"],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 30
        while self.ctr("version").returncode != 0:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError((self.workdir / "containerd.log").read_text()[-2000:])
            time.sleep(0.1)
        return self

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binaries / "ctr"), f"--address={self.address}", "--namespace=k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)

    def pull_argv(self, reference: str) -> list[str]:
        return [str(self.binaries / "ctr"), f"--address={self.address}", "--namespace=k8s.io", "images", "pull",
                "--plain-http", "--snapshotter=overlayfs", "--platform=linux/amd64", reference]  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        for snapshot in self.ctr("snapshots", "--snapshotter=overlayfs", "ls").stdout.splitlines()[1:]:
            self.ctr("snapshots", "--snapshotter=overlayfs", "rm", snapshot.split()[0])
        self.process.terminate()
        self.process.wait(30)
        subprocess.run(["umount", "-R", str(self.workdir / "root")], capture_output=True, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="the weights file (default 1024)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("oci_bench: needs root (containerd's overlayfs snapshots)", file=sys.stderr)
        return 2
    node = build_binaries("tests/node")
    files = {"model.safetensors": os.urandom(args.size_mib << 20), "config.json": CONFIG}
    model_bytes = sum(len(v) for v in files.values())
    work = Path(tempfile.mkdtemp(prefix="praesto-oci-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    agent = str(Path(sys.executable).parent / "praesto-agent")
    disk: dict[str, list[float]] = {"praesto": [], "containerd": []}
    try:
        with Registry(work / "registry") as registry:
            layers = [Layer(path, data) for path, data in files.items()]
            push_modelpack(registry, "bench/model", "1.0", layers, work / "modelpack")
            push_image(registry, files, work / "image")
            store = work / "praesto"

            def praesto() -> float:
                argv = [agent, "download", f"oci://{registry.reference('bench/model', '1.0')}",
                        "--dest", str(store / "model"), "--blobs-dir", str(store / "blobs"), "--plain-http", "--quiet"]  # fmt: skip
                seconds, _ = timed_child(argv, os.environ, fresh=store)
                disk["praesto"].append(disk_bytes(store))
                return seconds

            def containerd() -> float:
                with ContainerdRun(node, work / "containerd") as run:
                    seconds, _ = timed_child(
                        run.pull_argv(registry.reference("bench/model-image", "1.0")), os.environ
                    )
                    disk["containerd"].append(disk_bytes(run.workdir / "root"))
                return seconds

            times = interleaved({"praesto": praesto, "containerd": containerd}, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"model: {model_bytes / 2**20:.0f} MiB in 2 files, local registry (distribution v3.1.2), page cache warm"
    )
    model = f"a {model_bytes / 2**20:.0f} MiB OCI model image from a local registry, praesto vs containerd"
    print_table(f"{model}: time to a usable copy (s)", times)
    print_table(f"{model}: disk kept afterwards (MiB)", disk, scale=1 / 2**20, unit="MiB", digits=0)
    print(f"containerd keeps {ratio(disk['containerd'], disk['praesto']):.2f}x the disk of praesto; "
          f"praesto takes {ratio(times['praesto'], times['containerd']):.2f}x containerd's time")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
