"""Test support for the CSI node plugin: a real server on a real unix socket.

`InProcessDriver` runs praesto.csi's gRPC server in this process (fast, and
lets a test reach the Publisher); `CliDriver` runs the `praesto-csi` entry
point as a child process (for crash/restart tests). Both speak to the test
only over the unix socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import grpc
from praesto.csi import mounts
from praesto.csi.proto import csi_pb2, csi_pb2_grpc
from praesto.csi.publisher import Publisher
from praesto.csi.server import CsiServer

from praesto import names, store

NODE = "n1"
NEEDS_ROOT = "bind mounts need root (CAP_SYS_ADMIN); run the CSI mount tests as root"


def make_cache(
    layout: store.StoreLayout, namespace: str, name: str, complete: bool = True, content: str = "weights"
) -> Path:
    """A published cache directory the way the agent leaves it."""
    cache = layout.cache_dir(namespace, name)
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "config.json").write_text(json.dumps({"model": name}))
    (cache / "model.safetensors").write_text(content)
    (cache / names.MANIFEST_FILE).write_text("{}")
    if complete:
        (cache / names.COMPLETE_FILE).write_text("")
    return cache


def publish_request(
    volume_id: str,
    target: str,
    cache: str = "tinyllama",
    namespace: str | None = "default",
    readonly: bool = True,
    access_type: str = "mount",
    extra: dict[str, str] | None = None,
) -> csi_pb2.NodePublishVolumeRequest:
    """What the kubelet sends for an ephemeral inline volume with podInfoOnMount."""
    context = {names.CSI_ATTR_CACHE_NAME: cache, names.CSI_ATTR_EPHEMERAL: "true"}
    if namespace is not None:
        context[names.CSI_ATTR_POD_NAMESPACE] = namespace
        context[names.CSI_ATTR_POD_NAME] = "app-0"
        context[names.CSI_ATTR_POD_UID] = "0b6a2d4e-1111-2222-3333-444455556666"
    context.update(extra or {})
    capability = csi_pb2.VolumeCapability(
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        )
    )
    if access_type == "mount":
        capability.mount.SetInParent()
    elif access_type == "block":
        capability.block.SetInParent()
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id,
        target_path=target,
        volume_capability=capability,
        readonly=readonly,
        volume_context=context,
    )


def mounts_under(path: Path) -> list[mounts.MountInfo]:
    return [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(path))]


def unmount_all_under(path: Path) -> None:
    """Lazily detach every mount below path, deepest first: teardown must never leave mounts."""
    for entry in sorted(mounts_under(path), key=lambda e: e.mount_point.count("/"), reverse=True):
        with contextlib.suppress(OSError):
            mounts.unmount(entry.mount_point, mounts.MNT_DETACH)


def short_socket_dir() -> Path:
    """Unix socket paths stop at 107 bytes; pytest's tmp_path can be longer."""
    return Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))


class Client:
    """The kubelet's side: gRPC stubs on a unix socket."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)

    def wait_ready(self, timeout: float = 20.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def publish(self, request: csi_pb2.NodePublishVolumeRequest) -> None:
        self.node.NodePublishVolume(request, timeout=20)

    def unpublish(self, volume_id: str, target: str) -> None:
        self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target), timeout=20
        )

    def close(self) -> None:
        self.channel.close()


def rpc_error(call: object) -> grpc.RpcError:
    """The RpcError a zero-argument callable raises (fails the test if it does not)."""
    assert callable(call)
    try:
        call()
    except grpc.RpcError as err:
        return err
    raise AssertionError("expected a gRPC error, the call succeeded")


class InProcessDriver:
    def __init__(self, base: Path, unassigned_after: float = 3600.0) -> None:
        self.layout = store.StoreLayout(base)
        self.socket_dir = short_socket_dir()
        self.socket = self.socket_dir / "csi.sock"
        self.publisher = Publisher(self.layout, NODE, unassigned_after=unassigned_after)
        self.server = CsiServer(f"unix://{self.socket}", self.publisher, workers=16)
        self.client = Client(self.socket)

    def __enter__(self) -> InProcessDriver:
        self.server.start()
        self.client.wait_ready()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.client.close()
        self.server.stop(grace=1.0)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


class CliDriver:
    """`python -m praesto.csi.cli` as a child process, as the DaemonSet runs it."""

    def __init__(self, base: Path, socket: Path, extra_args: Sequence[str] = ()) -> None:
        self.socket = socket
        env = dict(os.environ, CSI_ENDPOINT=f"unix://{socket}", NODE_NAME=NODE)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "praesto.csi.cli",
                "--base-path",
                str(base),
                "--log-level",
                "WARNING",
                *extra_args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.client = Client(socket)
        try:
            self.client.wait_ready()
        except grpc.FutureTimeoutError:
            self.kill()
            raise AssertionError(f"praesto-csi did not start: {self.stderr()}") from None

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace") if self.process.poll() is not None else ""

    def kill(self) -> None:
        """SIGKILL: a crash, leaving the socket file and any mounts behind."""
        self.client.close()
        self.process.kill()
        self.process.wait(timeout=20)

    def terminate(self) -> int:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=20)


@contextlib.contextmanager
def cli_driver(base: Path, socket: Path, extra_args: Sequence[str] = ()) -> Iterator[CliDriver]:
    driver = CliDriver(base, socket, extra_args)
    try:
        yield driver
    finally:
        if driver.process.poll() is None:
            driver.kill()
