"""Identity, capabilities, UNIMPLEMENTED RPCs and the socket lifecycle, over a real unix socket."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import grpc
import pytest
from praesto.csi.proto import csi_pb2
from praesto.csi.publisher import Publisher
from praesto.csi.server import CsiServer
from praesto.csi.sockets import EndpointError

import praesto
from praesto import names, store
from testkit.csi_driver import NODE, Client, InProcessDriver, rpc_error, short_socket_dir


def test_plugin_info_and_node_only_capabilities(driver: InProcessDriver) -> None:
    info = driver.client.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert (info.name, info.vendor_version) == (names.CSI_DRIVER_NAME, praesto.__version__)
    caps = driver.client.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert list(caps.capabilities) == []
    node = driver.client.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert node.node_id == NODE
    node_caps = driver.client.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert list(node_caps.capabilities) == []  # no STAGE_UNSTAGE_VOLUME


def test_probe_is_ready_only_with_a_usable_base(driver: InProcessDriver, base: Path) -> None:
    assert driver.client.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    moved = base.with_name("moved")
    base.rename(moved)
    try:
        response = driver.client.identity.Probe(csi_pb2.ProbeRequest())
        assert response.HasField("ready") and response.ready.value is False
    finally:
        moved.rename(base)


def test_other_rpcs_are_unimplemented(driver: InProcessDriver) -> None:
    node, controller = driver.client.node, driver.client.controller
    calls = [
        lambda: node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(volume_id="v")),
        lambda: node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id="v")),
        lambda: node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id="v")),
        lambda: node.NodeExpandVolume(csi_pb2.NodeExpandVolumeRequest(volume_id="v")),
        lambda: controller.CreateVolume(csi_pb2.CreateVolumeRequest(name="x")),
        lambda: controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="v")),
        lambda: controller.ControllerPublishVolume(csi_pb2.ControllerPublishVolumeRequest(volume_id="v")),
        lambda: controller.ControllerUnpublishVolume(csi_pb2.ControllerUnpublishVolumeRequest(volume_id="v")),
        lambda: controller.ValidateVolumeCapabilities(
            csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id="v")
        ),
        lambda: controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest()),
    ]
    for call in calls:
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
        assert names.CSI_DRIVER_NAME in (err.details() or "")
    # a CSI method this driver does not even declare
    list_volumes = driver.client.channel.unary_unary(
        "/csi.v1.Controller/ListVolumes", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    assert rpc_error(lambda: list_volumes(b"")).code() == grpc.StatusCode.UNIMPLEMENTED


def test_stale_socket_is_replaced_and_removed_on_stop(base: Path) -> None:
    sock_dir = short_socket_dir()
    path = sock_dir / "csi.sock"
    try:
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(path))  # bound, never listening, closed: what a killed driver leaves
        dead.close()
        assert path.is_socket()
        server = CsiServer(f"unix://{path}", Publisher(store.StoreLayout(base), NODE))
        server.start()
        client = Client(path)
        client.wait_ready()
        assert client.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
        client.close()
        server.stop(grace=1.0)
        assert not path.exists()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_refuses_a_live_socket_and_a_non_socket(driver: InProcessDriver, base: Path) -> None:
    with pytest.raises(EndpointError, match="another process is serving"):
        CsiServer(f"unix://{driver.socket}", Publisher(store.StoreLayout(base), NODE)).start()
    plain = driver.socket_dir / "plain"
    plain.write_text("not a socket")
    with pytest.raises(EndpointError, match="not a socket"):
        CsiServer(f"unix://{plain}", Publisher(store.StoreLayout(base), NODE)).start()
    assert plain.read_text() == "not a socket"


def test_endpoint_must_be_a_unix_socket(base: Path) -> None:
    with pytest.raises(EndpointError, match="unix socket endpoint"):
        CsiServer("tcp://127.0.0.1:1", Publisher(store.StoreLayout(base), NODE))
