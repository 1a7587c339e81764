"""praesto-csi registers itself with the kubelet: the test plays the kubelet's plugin watcher.

A real `praesto-csi` process, real gRPC over real unix sockets, and the
generated stubs of the kubelet's plugin-registration API (k8s.io/kubelet
v0.37.2). What the kubelet does and expects, read from k8s.io/kubernetes
v1.37.2: `operationexecutor/operation_generator.go` dials the socket found
in plugins_registry, calls GetInfo with a one-second deadline, and for a
`CSIPlugin` the `pkg/volume/csi/csi_plugin.go` RegistrationHandler accepts
supported versions of major 0 or 1, stores `endpoint` as the CSI socket and
calls NodeGetInfo there before it reports the outcome with
NotifyRegistrationStatus. The real kubelet is exercised by the node tier.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from praesto.csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

from praesto import names
from testkit.csi_driver import NODE, CliDriver, cli_driver, short_socket_dir

REGISTRATION_SOCKET = "csi.praesto.io-reg.sock"  # node-driver-registrar's "<driver name>-reg.sock"
KUBELET_GET_INFO_TIMEOUT = 1.0  # operation_generator.go: context.WithTimeout(ctx, time.Second)
KUBELET_NOTIFY_TIMEOUT = 5.0  # operation_generator.go: notifyTimeoutDuration


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory (socket paths stop at 107 bytes) holding the CSI socket and plugins_registry."""
    directory = short_socket_dir()
    (directory / "plugins_registry").mkdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def registration_args(sockets: Path, check_seconds: float = 10.0) -> list[str]:
    """The flags a DaemonSet (or a host process) gives praesto-csi; here the kubelet sees our paths as they are."""
    return [
        f"--registration-dir={sockets / 'plugins_registry'}",
        f"--kubelet-endpoint={sockets / 'csi.sock'}",
        f"--registration-check-seconds={check_seconds}",
    ]


class PluginWatcher:
    """The kubelet's side of the registration socket."""

    def __init__(self, registration_socket: Path) -> None:
        self.path = registration_socket
        self.channel = grpc.insecure_channel(f"unix://{registration_socket}")
        self.stub = pluginregistration_pb2_grpc.RegistrationStub(self.channel)
        # the plugin opens the registration socket only once its CSI socket answers
        grpc.channel_ready_future(self.channel).result(timeout=20)

    def get_info(self) -> pluginregistration_pb2.PluginInfo:
        return self.stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=KUBELET_GET_INFO_TIMEOUT)

    def notify(self, registered: bool, error: str = "") -> None:
        status = pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        self.stub.NotifyRegistrationStatus(status, timeout=KUBELET_NOTIFY_TIMEOUT)

    def close(self) -> None:
        self.channel.close()


def wait_for_exit(driver: CliDriver, timeout: float = 20.0) -> int:
    return driver.process.wait(timeout=timeout)


def run_cli(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """praesto-csi with flags it must refuse before serving anything."""
    return subprocess.run(
        [sys.executable, "-m", "praesto.csi.cli", "--node-name", NODE, "--base-path", str(base), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_get_info_answers_as_the_kubelet_requires(base: Path, sockets: Path) -> None:
    registration = sockets / "plugins_registry" / REGISTRATION_SOCKET
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets)) as driver:
        watcher = PluginWatcher(registration)
        info = watcher.get_info()
        assert info.type == "CSIPlugin"  # the kubelet's handler key (pluginregistration/v1 constants.go)
        assert info.name == names.CSI_DRIVER_NAME == "csi.praesto.io"
        assert list(info.supported_versions) == ["1.0.0"]
        # a bare path: the kubelet hands it to grpc.Dial with a unix dialer
        assert info.endpoint == str(sockets / "csi.sock")
        # what RegistrationHandler.RegisterPlugin does next: NodeGetInfo on that endpoint
        with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
            node = csi_pb2_grpc.NodeStub(channel).NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10)
        assert node.node_id == NODE
        assert stat.S_IMODE(registration.stat().st_mode) == 0o600  # only the kubelet (root) may talk to it
        watcher.close()
        assert driver.terminate() == 0


def test_registered_keeps_serving_and_stop_removes_both_sockets(base: Path, sockets: Path) -> None:
    registration = sockets / "plugins_registry" / REGISTRATION_SOCKET
    args = [*registration_args(sockets, check_seconds=0.01), "--log-level=INFO"]
    with cli_driver(base, sockets / "csi.sock", args) as driver:
        watcher = PluginWatcher(registration)
        watcher.get_info()
        watcher.notify(registered=True)
        # still registered and serving both sockets, across the socket checks that run meanwhile
        for _ in range(20):
            assert watcher.get_info().name == names.CSI_DRIVER_NAME
            assert driver.client.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
        watcher.close()
        assert driver.process.poll() is None
        assert driver.terminate() == 0  # SIGTERM, as the kubelet stops the container: not the refusal's 1
        logged = driver.stderr()
    assert f"registered with the kubelet as csi.praesto.io (CSI endpoint {sockets / 'csi.sock'})" in logged
    # the kubelet's watcher sees the delete and unregisters the driver
    assert not registration.exists()
    assert not (sockets / "csi.sock").exists()


def test_refusal_exits_non_zero_with_the_kubelet_error_logged(base: Path, sockets: Path) -> None:
    registration = sockets / "plugins_registry" / REGISTRATION_SOCKET
    kubelet_error = (
        "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver "
        'csi.praesto.io at endpoint /var/lib/kubelet/plugins/csi.praesto.io/csi.sock: ValidatePlugin for CSI driver "csi.praesto.io" failed'
    )
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets)) as driver:
        watcher = PluginWatcher(registration)
        watcher.get_info()
        watcher.notify(registered=False, error=kubelet_error)  # answered before the plugin stops
        watcher.close()
        assert wait_for_exit(driver) == 1  # non-zero: the DaemonSet restarts the container
        logged = driver.stderr()
    assert "the kubelet refused to register csi.praesto.io" in logged
    assert kubelet_error in logged
    assert not registration.exists()  # stopped cleanly all the same
    assert not (sockets / "csi.sock").exists()


def test_a_stale_registration_socket_is_replaced(base: Path, sockets: Path) -> None:
    registration = sockets / "plugins_registry" / REGISTRATION_SOCKET
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(registration))  # what a killed plugin leaves behind: a socket file nobody listens on
    dead.close()
    stale = sockets / "stale"
    os.link(registration, stale)  # keeps the stale inode allocated, so the new socket's number must differ
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets)) as driver:
        watcher = PluginWatcher(registration)
        assert watcher.get_info().name == names.CSI_DRIVER_NAME
        assert registration.stat().st_ino != stale.stat().st_ino
        watcher.close()
        driver.kill()  # a crash: both sockets stay behind
    assert registration.is_socket()
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets)) as again:
        watcher = PluginWatcher(registration)
        watcher.notify(registered=True)
        watcher.close()
        assert again.terminate() == 0


def test_a_second_plugin_does_not_take_over_a_live_registration(base: Path, sockets: Path) -> None:
    other_csi = sockets / "other.sock"
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets)) as driver:
        PluginWatcher(sockets / "plugins_registry" / REGISTRATION_SOCKET).close()
        second = run_cli(
            base,
            f"--endpoint=unix://{other_csi}",
            f"--registration-dir={sockets / 'plugins_registry'}",
            f"--kubelet-endpoint={other_csi}",
        )
        assert second.returncode == 2
        assert "--registration-dir: another process is serving on" in second.stderr
        assert not other_csi.exists()  # its CSI socket was stopped and removed again
        assert driver.process.poll() is None
        assert driver.terminate() == 0


def test_a_removed_registration_socket_makes_it_exit_to_register_again(base: Path, sockets: Path) -> None:
    registration = sockets / "plugins_registry" / REGISTRATION_SOCKET
    with cli_driver(base, sockets / "csi.sock", registration_args(sockets, check_seconds=0.1)) as driver:
        PluginWatcher(registration).close()
        os.unlink(registration)  # e.g. plugins_registry emptied: the kubelet unregistered the driver
        assert wait_for_exit(driver) == 1
        assert "was removed or replaced" in driver.stderr()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--registration-dir=/var/lib/kubelet/plugins_registry"], "--kubelet-endpoint is required"),
        (
            ["--kubelet-endpoint=/var/lib/kubelet/plugins/csi.praesto.io/csi.sock"],
            "--registration-dir is required",
        ),
        (
            ["--registration-dir=plugins_registry", "--kubelet-endpoint=/k/plugins/csi.praesto.io/csi.sock"],
            "--registration-dir: 'plugins_registry' must be an absolute path",
        ),
        (
            ["--registration-dir=/tmp", "--kubelet-endpoint=csi.sock"],
            "--kubelet-endpoint: 'csi.sock' is not a unix socket endpoint",
        ),
        (
            ["--registration-dir=/tmp", "--kubelet-endpoint=/k/csi.sock", "--registration-check-seconds=0"],
            "--registration-check-seconds: 0.0 must be positive",
        ),
    ],
)
def test_bad_registration_flags_are_refused_by_name(
    base: Path, sockets: Path, flags: list[str], message: str
) -> None:
    endpoint = sockets / "not-yet" / "csi.sock"
    result = run_cli(base, f"--endpoint=unix://{endpoint}", *flags)
    assert result.returncode == 2
    assert message in result.stderr
    assert not endpoint.parent.exists()  # refused before anything listened


def test_a_missing_registration_dir_is_refused_not_created(base: Path, sockets: Path) -> None:
    missing = sockets / "kubelet" / "plugins_registry"
    result = run_cli(
        base,
        f"--endpoint=unix://{sockets / 'csi.sock'}",
        f"--registration-dir={missing}",
        f"--kubelet-endpoint={sockets / 'csi.sock'}",
    )
    assert result.returncode == 2
    assert f"--registration-dir: {missing} is not a directory" in result.stderr
    assert "plugins_registry" in result.stderr
    assert not missing.exists()  # not created: a typo would be a directory no kubelet watches
    assert not (sockets / "csi.sock").exists()
