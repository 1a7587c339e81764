"""Registering the CSI plugin with the kubelet, in place of the node-driver-registrar sidecar.

The kubelet's plugin watcher watches `<kubelet root>/plugins_registry` for
unix sockets; for each one it dials the socket, calls `GetInfo` (with a one
second timeout), validates the answer and then calls
`NotifyRegistrationStatus` with the outcome. For a `CSIPlugin` it stores
`endpoint` as the driver's CSI socket and calls `NodeGetInfo` there before
reporting success. So the CSI socket must already answer when the
registration socket appears, and must be named as the kubelet sees it (a
host path, not the container's). Authorities (read for this module):

* k8s.io/kubelet v0.37.2 `pkg/apis/pluginregistration/v1/api.proto`
  (vendored as csi/proto/pluginregistration.proto) and `constants.go`
  (`CSIPlugin`);
* k8s.io/kubernetes v1.37.2 `pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go`
  (socket files whose name starts with "." are ignored; deleting the socket
  unregisters the plugin), `pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`
  (10 s dial, 1 s GetInfo, 5 s NotifyRegistrationStatus; an empty endpoint
  would mean the registration socket itself), `pkg/volume/csi/csi_plugin.go`
  `RegistrationHandler` (supported_versions must hold a version of major 0 or
  1, "1.0.0" here; a driver already registered under the same name with an
  equal or higher version makes a second registration fail, so a restarted
  plugin replaces the socket file: the reconciler then unregisters the old
  registration before it registers the new one);
* kubernetes-csi/node-driver-registrar v2.17.0 `cmd/csi-node-driver-registrar/main.go`
  and `node_register.go`: the socket is `<driver name>-reg.sock`, a stale one
  is removed at start and the socket on SIGTERM, supported versions are
  ["1.0.0"], and `registered=false` makes it exit 1 so that its container
  restarts and registers afresh; its optional `/healthz` fails once the
  registration socket is gone. Where we differ: a socket that still answers
  is refused, not replaced (two plugins of one name on a node would fight),
  and a lost socket makes the process exit instead of failing a probe.

Checked once by hand against the kubelet's own plugin manager (watcher,
reconciler, operation executor) and the CSI handler's ValidatePlugin from
k8s.io/kubernetes v1.37.2: registered, NodeGetInfo answered, unregistered on
SIGTERM, exit 1 on refusal. The node tier runs the real kubelet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from praesto.csi.proto import pluginregistration_pb2, pluginregistration_pb2_grpc
from praesto.csi.sockets import EndpointError, listen_unix, remove_stale_socket, socket_path

from praesto import names

log = logging.getLogger(__name__)

PLUGIN_TYPE = "CSIPlugin"  # registerapi.CSIPlugin, k8s.io/kubelet pluginregistration/v1 constants.go
SUPPORTED_VERSIONS = ("1.0.0",)  # CSI spec versions; node-driver-registrar reports the same
SOCKET_NAME = f"{names.CSI_DRIVER_NAME}-reg.sock"
DIR_FLAG = "--registration-dir"
ENDPOINT_FLAG = "--kubelet-endpoint"


class RegistrationFailed(RuntimeError):
    """The kubelet refused the plugin, or the registration socket was removed under it."""


@dataclasses.dataclass(frozen=True)
class RegistrationOptions:
    """Where to register and what to tell the kubelet (the praesto-csi flags of the same names)."""

    registration_dir: Path  # the kubelet's <root dir>/plugins_registry
    kubelet_endpoint: str  # the CSI socket's path as the kubelet sees it
    check_seconds: float = 10.0  # how often to check that the registration socket is still there


def registration_socket(registration_dir: Path) -> Path:
    return registration_dir / SOCKET_NAME


class RegistrationServicer:
    """The Registration service: what the kubelet's plugin watcher asks and tells."""

    def __init__(self, kubelet_endpoint: str, on_refused: Callable[[str], None]) -> None:
        self.kubelet_endpoint = kubelet_endpoint
        self.on_refused = on_refused

    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        log.info("kubelet asked for plugin info; CSI endpoint %s", self.kubelet_endpoint)
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=names.CSI_DRIVER_NAME,
            endpoint=self.kubelet_endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info(
                "registered with the kubelet as %s (CSI endpoint %s)",
                names.CSI_DRIVER_NAME,
                self.kubelet_endpoint,
            )
        else:
            self.on_refused(request.error or "the kubelet gave no reason")
        return pluginregistration_pb2.RegistrationStatusResponse()


class Registrar:
    """Serves the Registration service on `<registration dir>/csi.praesto.io-reg.sock`.

    Its own small gRPC server, so CSI calls that are busy mounting never
    delay the kubelet's GetInfo past its one-second deadline. Start it after
    the CSI socket answers and stop it before the CSI socket goes: the
    kubelet calls NodeGetInfo on registration, and unregisters the driver
    when this socket is deleted.
    """

    def __init__(self, options: RegistrationOptions, stop: threading.Event) -> None:
        """Check the options before anything listens.

        stop is the plugin's: a signal handler sets it, and so does a refusal from the kubelet.
        """
        if not options.registration_dir.is_absolute():
            raise EndpointError(f"{DIR_FLAG}: {str(options.registration_dir)!r} must be an absolute path")
        if options.check_seconds <= 0:
            raise EndpointError(f"--registration-check-seconds: {options.check_seconds} must be positive")
        self.options = options
        self.path = socket_path(str(registration_socket(options.registration_dir)), DIR_FLAG)
        # The kubelet hands `endpoint` to grpc.Dial with a unix dialer
        # (pkg/volume/csi/csi_client.go newGrpcConn), like node-driver-registrar's
        # --kubelet-registration-path: a bare path, so a unix:// form loses its scheme.
        self.kubelet_endpoint = socket_path(options.kubelet_endpoint, ENDPOINT_FLAG)
        self.stop_event = stop
        self.refusal: RegistrationFailed | None = None
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="registration")
        )
        servicer = RegistrationServicer(self.kubelet_endpoint, self._refused)
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(servicer, self._server)
        self._identity: tuple[int, int] | None = None

    def _refused(self, message: str) -> None:
        log.error(
            "the kubelet refused to register %s: %s; exiting so that the plugin restarts and registers again",
            names.CSI_DRIVER_NAME,
            message,
        )
        if self.refusal is None:
            self.refusal = RegistrationFailed(f"the kubelet refused the registration: {message}")
        self.stop_event.set()

    def start(self) -> None:
        """Listen on a fresh socket (a stale one is removed): its appearance makes the kubelet register us."""
        directory = self.options.registration_dir
        if not directory.is_dir():
            raise EndpointError(
                f"{DIR_FLAG}: {directory} is not a directory; give the kubelet's plugins_registry "
                "directory (<kubelet root dir>/plugins_registry, which the kubelet creates when it starts)"
            )
        remove_stale_socket(self.path, DIR_FLAG)
        listen_unix(self._server, self.path, DIR_FLAG)
        # only the kubelet (root) talks to it: node-driver-registrar listens under umask 077
        os.chmod(self.path, 0o600)
        info = os.lstat(self.path)
        self._identity = (info.st_dev, info.st_ino)
        self._server.start()
        log.info(
            "serving plugin registration on unix://%s for the kubelet (CSI endpoint %s)",
            self.path,
            self.kubelet_endpoint,
        )

    def wait(self) -> RegistrationFailed | None:
        """Block until the plugin is told to stop or registration fails; return the failure, if any.

        The kubelet unregisters a plugin whose socket is deleted and never
        looks for it again, so a lost socket is as final as a refusal.
        """
        while not self.stop_event.wait(self.options.check_seconds):
            if not self._socket_is_ours():
                log.error(
                    "registration socket %s was removed or replaced; exiting to register again", self.path
                )
                return RegistrationFailed(f"registration socket {self.path} was removed or replaced")
        return self.refusal

    def _socket_is_ours(self) -> bool:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == self._identity

    def stop(self, grace: float = 2.0) -> None:
        """Delete our socket first, so the kubelet unregisters the driver, then finish in-flight calls."""
        if self._identity is not None and self._socket_is_ours():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._identity = None
        self._server.stop(grace).wait()
