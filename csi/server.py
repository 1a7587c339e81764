"""The gRPC server on a unix socket, and its lifecycle."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import stat
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType

import grpc
from praesto.csi.controller import ControllerServicer
from praesto.csi.identity import IdentityServicer
from praesto.csi.node import NodeServicer
from praesto.csi.proto import csi_pb2_grpc
from praesto.csi.publisher import Publisher

from praesto import store

log = logging.getLogger(__name__)


class EndpointError(ValueError):
    pass


def socket_path(endpoint: str) -> str:
    """`unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a bare absolute path -> the path."""
    path = endpoint
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    if not path.startswith("/"):
        raise EndpointError(
            f"--endpoint: {endpoint!r} is not a unix socket endpoint; use unix:///csi/csi.sock (an absolute path)"
        )
    if len(path.encode()) > 107:
        raise EndpointError(f"--endpoint: {path!r} is longer than a unix socket path may be (107 bytes)")
    return path


def remove_stale_socket(path: str) -> None:
    """Remove a socket left by a dead driver; refuse if one still answers or the path is no socket.

    The kubelet's plugin watcher recreates nothing: after a crash the old
    socket file stays and bind() would fail with EADDRINUSE.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EndpointError(f"--endpoint: {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
    else:
        raise EndpointError(f"--endpoint: another process is serving on {path}; stop it first")
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("removed stale socket %s", path)


class CsiServer:
    """Identity, Node and Controller services on one unix socket."""

    def __init__(self, endpoint: str, publisher: Publisher, workers: int = 8) -> None:
        self.path = socket_path(endpoint)
        self.publisher = publisher
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="csi"))
        csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(publisher.layout.base), self._server)
        csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(publisher), self._server)
        csi_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(), self._server)

    def start(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(self.path)
        self.publisher.recover()
        if self._server.add_insecure_port(f"unix://{self.path}") == 0:
            raise EndpointError(f"--endpoint: cannot listen on {self.path}")
        self._server.start()
        log.info("serving CSI on unix://%s", self.path)

    def stop(self, grace: float = 5.0) -> None:
        """Finish in-flight calls (a half-done mount would be retried anyway), then remove the socket."""
        self._server.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def serve(endpoint: str, node_name: str, base: Path, unassigned_after: float) -> None:
    """Run until SIGTERM or SIGINT."""
    publisher = Publisher(store.StoreLayout(base), node_name, unassigned_after=unassigned_after)
    server = CsiServer(endpoint, publisher)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    stop.wait()
    server.stop()
