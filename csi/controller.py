"""CSI Controller service: declared and refused.

Praesto is a node-only driver (ephemeral inline volumes, no attach, no
provisioning), and says so in GetPluginCapabilities. The service is still
served so that a sidecar or a person probing it gets a clear UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from praesto.csi.proto import csi_pb2
from praesto.csi.rpc import unimplemented

WHY = "is a node-only driver for ephemeral inline volumes and has no controller service"


class ControllerServicer:
    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext) -> NoReturn:
        unimplemented(context, "CreateVolume", WHY)

    def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext) -> NoReturn:
        unimplemented(context, "DeleteVolume", WHY)

    def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "ControllerPublishVolume", WHY)

    def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "ControllerUnpublishVolume", WHY)

    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "ValidateVolumeCapabilities", WHY)

    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "ControllerGetCapabilities", WHY)
