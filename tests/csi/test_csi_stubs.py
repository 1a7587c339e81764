"""The committed stubs are exactly what the generator makes, and the wire facts match CSI v1 and the kubelet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

from praesto.csi.proto import csi_pb2, pluginregistration_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = tuple(
    f"{stem}_pb2{kind}"
    for stem in ("csi", "pluginregistration")
    for kind in (".py", ".pyi", "_grpc.py", "_grpc.pyi")
)


def test_regenerating_gives_byte_identical_stubs(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_csi_stubs.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        committed = (ROOT / "csi" / "proto" / name).read_bytes()
        assert (tmp_path / name).read_bytes() == committed, f"{name} differs: run scripts/gen_csi_stubs.py"


def test_grpc_stub_imports_messages_package_relative() -> None:
    for stem in ("csi", "pluginregistration"):
        text = (ROOT / "csi" / "proto" / f"{stem}_pb2_grpc.py").read_text()
        assert f"from praesto.csi.proto import {stem}_pb2 as {stem}__pb2" in text
        assert f"\nimport {stem}_pb2" not in text


def _numbers(message: str, module: ModuleType = csi_pb2) -> dict[str, int]:
    return {f.name: f.number for f in module.DESCRIPTOR.message_types_by_name[message].fields}


def test_field_numbers_are_the_csi_v1_wire_numbers() -> None:
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert _numbers("NodePublishVolumeRequest") == {
        "volume_id": 1,
        "publish_context": 2,
        "staging_target_path": 3,
        "target_path": 4,
        "volume_capability": 5,
        "readonly": 6,
        "secrets": 7,
        "volume_context": 8,
    }
    assert _numbers("NodeUnpublishVolumeRequest") == {"volume_id": 1, "target_path": 2}
    assert _numbers("VolumeCapability") == {"block": 1, "mount": 2, "access_mode": 3}
    assert _numbers("GetPluginInfoResponse") == {"name": 1, "vendor_version": 2, "manifest": 3}
    assert _numbers("GetPluginCapabilitiesResponse") == {"capabilities": 1}
    assert _numbers("ProbeResponse") == {"ready": 1}
    assert _numbers("NodeGetInfoResponse") == {
        "node_id": 1,
        "max_volumes_per_node": 2,
        "accessible_topology": 3,
    }
    assert _numbers("NodeExpandVolumeRequest") == {
        "volume_id": 1,
        "volume_path": 2,
        "capacity_range": 3,
        "staging_target_path": 4,
        "volume_capability": 5,
        "secrets": 6,
    }
    mode = csi_pb2.VolumeCapability.AccessMode
    assert (mode.SINGLE_NODE_WRITER, mode.MULTI_NODE_READER_ONLY, mode.SINGLE_NODE_MULTI_WRITER) == (1, 3, 7)
    rpc_type = csi_pb2.NodeServiceCapability.RPC
    assert (rpc_type.STAGE_UNSTAGE_VOLUME, rpc_type.EXPAND_VOLUME, rpc_type.VOLUME_MOUNT_GROUP) == (1, 3, 6)


def test_services_declare_the_spec_rpcs() -> None:
    services = {s.name: [m.name for m in s.methods] for s in csi_pb2.DESCRIPTOR.services_by_name.values()}
    assert services["Identity"] == ["GetPluginInfo", "GetPluginCapabilities", "Probe"]
    assert services["Node"] == [
        "NodeStageVolume",
        "NodeUnstageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeGetVolumeStats",
        "NodeExpandVolume",
        "NodeGetCapabilities",
        "NodeGetInfo",
    ]
    assert "ControllerGetCapabilities" in services["Controller"]


def test_plugin_registration_is_the_kubelets_wire_format() -> None:
    """k8s.io/kubelet v0.37.2 pkg/apis/pluginregistration/v1/api.proto: package `pluginregistration`."""
    assert pluginregistration_pb2.DESCRIPTOR.package == "pluginregistration"
    service = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert _numbers("PluginInfo", pluginregistration_pb2) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _numbers("RegistrationStatus", pluginregistration_pb2) == {"plugin_registered": 1, "error": 2}
    assert _numbers("InfoRequest", pluginregistration_pb2) == {}
    assert _numbers("RegistrationStatusResponse", pluginregistration_pb2) == {}
