"""CSI publish/unpublish latency vs a bare read-only bind mount, same run, same disk.

    sudo python -m bench.csi_bench [--iterations 300] [--workdir /tmp]

Runs `praesto-csi` as its own process (as on a node, where the kubelet is
another process) on a unix socket, and times NodePublishVolume followed by
NodeUnpublishVolume of a complete cache from a client, the kubelet's view.
Baselines, same number of iterations on the same directories:

* `mount` binary: mkdir, `mount --bind`, `mount -o remount,bind,ro`, `umount`,
  rmdir: what a shell-script or exec-based driver does per volume.
* raw syscalls: the same mount(2)/umount2(2) calls the driver makes, in this
  process: the floor, so the ratio shows what gRPC, validation, the mount
  table lookups and the records cost.

Prints p50/p99 in milliseconds and ratios (>1 = the driver is slower).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from praesto.csi import mounts
from praesto.csi.proto import csi_pb2, csi_pb2_grpc

from bench.common import ROUNDS, interleaved, print_table
from praesto import names, store

NAMESPACE, CACHE, NODE = "bench", "model", "bench-node"


def make_cache(layout: store.StoreLayout) -> Path:
    cache = layout.cache_dir(NAMESPACE, CACHE)
    cache.mkdir(parents=True)
    for index in range(20):
        (cache / f"shard-{index:02d}.bin").write_bytes(os.urandom(4096))
    (cache / names.COMPLETE_FILE).write_text("")
    return cache


def publish_request(volume_id: str, target: str) -> csi_pb2.NodePublishVolumeRequest:
    capability = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id,
        target_path=target,
        volume_capability=capability,
        readonly=True,
        volume_context={names.CSI_ATTR_CACHE_NAME: CACHE, names.CSI_ATTR_POD_NAMESPACE: NAMESPACE},
    )


def timed(iterations: int, once: Callable[[int], None]) -> list[float]:
    samples = []
    for index in range(iterations):
        start = time.perf_counter()
        once(index)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(iterations: int, workdir: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="csi-bench-", dir=workdir))
    layout = store.StoreLayout(root / "store")
    source = str(make_cache(layout))
    pods = root / "pods"
    pods.mkdir()
    socket_path = root / "csi.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "praesto.csi.cli", "--endpoint", f"unix://{socket_path}", "--node-name", NODE,
         "--base-path", str(layout.base), "--log-level", "WARNING"],
    )  # fmt: skip
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
        node = csi_pb2_grpc.NodeStub(channel)

        def driver(index: int) -> None:
            target = str(pods / f"d{index}" / "mount")
            node.NodePublishVolume(publish_request(f"csi-{index}", target), timeout=30)
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=f"csi-{index}", target_path=target), timeout=30
            )

        def mount_binary(index: int) -> None:
            target = pods / f"m{index}" / "mount"
            target.mkdir(parents=True)
            subprocess.run(["mount", "--bind", source, str(target)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro,nosuid,nodev", str(target)], check=True)
            subprocess.run(["umount", str(target)], check=True)
            target.rmdir()

        def syscalls(index: int) -> None:
            target = pods / f"s{index}" / "mount"
            target.mkdir(parents=True)
            mounts.bind_read_only(source, str(target))
            mounts.unmount(str(target))
            target.rmdir()

        for warm in range(10):  # imports, connection, page cache
            driver(10_000 + warm)
            mount_binary(10_000 + warm)
            syscalls(10_000 + warm)
        # Interleaved rounds: each round runs a slice of the iterations of every operation.
        per_round = max(1, iterations // ROUNDS)
        offsets = iter(range(0, 10**9, per_round))
        ops = {
            "praesto-csi publish+unpublish (gRPC)": driver,
            "mount --bind + remount,ro + umount": mount_binary,
            "raw mount(2)+remount+umount2(2)": syscalls,
        }

        def slice_of(op: Callable[[int], None]) -> Callable[[], list[float]]:
            def once() -> list[float]:
                base = next(offsets)  # fresh target directories for every round
                return timed(per_round, lambda i: op(base + i))

            return once

        rounds = interleaved({label: slice_of(op) for label, op in ops.items()})
        results = {label: [x for r in samples for x in r] for label, samples in rounds.items()}
        round_p50s = {label: [percentile(r, 0.5) for r in samples] for label, samples in rounds.items()}
    finally:
        channel.close()
        server.terminate()
        server.wait(timeout=30)
        for entry in sorted(mounts.read_mountinfo(), key=lambda e: -len(e.mount_point)):
            if mounts.is_within(entry.mount_point, str(root)):
                mounts.unmount(entry.mount_point, mounts.MNT_DETACH)
        shutil.rmtree(root, ignore_errors=True)

    print(f"{iterations} iterations each, cache of 20 files, {os.cpu_count()} CPUs")
    print(f"{'operation':40s} {'p50 ms':>8s} {'p99 ms':>8s} {'mean ms':>8s}")
    for label, samples in results.items():
        print(f"{label:40s} {percentile(samples, 0.5):8.2f} {percentile(samples, 0.99):8.2f} "
              f"{statistics.fmean(samples):8.2f}")  # fmt: skip
    print_table(
        f"CSI publish+unpublish of a cache of 20 files vs bind mounts: p50 of each of {ROUNDS} interleaved rounds",
        round_p50s,
        unit="ms",
    )
    ours = results["praesto-csi publish+unpublish (gRPC)"]
    for label, samples in list(results.items())[1:]:
        print(
            f"ratio praesto-csi / {label}: p50 {percentile(ours, 0.5) / percentile(samples, 0.5):.2f}x, "
            f"p99 {percentile(ours, 0.99) / percentile(samples, 0.99):.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("csi_bench: bind mounts need root (CAP_SYS_ADMIN)", file=sys.stderr)
        return 2
    run(args.iterations, args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
