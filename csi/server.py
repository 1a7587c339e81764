"""The gRPC server on a unix socket, and its lifecycle."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
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
from praesto.csi.registration import Registrar, RegistrationOptions
from praesto.csi.sockets import listen_unix, remove_stale_socket, socket_path

from praesto import store

log = logging.getLogger(__name__)


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
        listen_unix(self._server, self.path)
        self._server.start()
        log.info("serving CSI on unix://%s", self.path)

    def stop(self, grace: float = 5.0) -> None:
        """Finish in-flight calls (a half-done mount would be retried anyway), then remove the socket."""
        self._server.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def serve(
    endpoint: str,
    node_name: str,
    base: Path,
    unassigned_after: float,
    registration: RegistrationOptions | None = None,
) -> None:
    """Run until SIGTERM or SIGINT; with registration, also register with the kubelet.

    Raises RegistrationFailed when the kubelet refuses the plugin or its
    registration socket is lost, after stopping cleanly: the caller exits
    non-zero so that the container restarts and registers again.
    """
    publisher = Publisher(store.StoreLayout(base), node_name, unassigned_after=unassigned_after)
    server = CsiServer(endpoint, publisher)
    stop = threading.Event()
    registrar = Registrar(registration, stop) if registration is not None else None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    failure = None
    try:
        if registrar is None:
            stop.wait()
        else:
            registrar.start()  # only now: registering, the kubelet calls NodeGetInfo on the CSI socket
            failure = registrar.wait()
    finally:
        if registrar is not None:
            registrar.stop()
        server.stop()
    if failure is not None:
        raise failure
