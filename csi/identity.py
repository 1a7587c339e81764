"""CSI Identity service: who the plugin is and whether it can serve."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
from google.protobuf import wrappers_pb2
from praesto.csi.proto import csi_pb2

import praesto
from praesto import names


def base_path_usable(base: Path) -> bool:
    """The driver reads caches and writes records under the base path; both need a usable directory."""
    return base.is_dir() and os.access(base, os.R_OK | os.W_OK | os.X_OK)


class IdentityServicer:
    def __init__(self, base: Path) -> None:
        self.base = base

    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=names.CSI_DRIVER_NAME, vendor_version=praesto.__version__)

    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        # no CONTROLLER_SERVICE: node plugin only, for ephemeral inline volumes
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        # not ready (rather than an error) while the base path is missing: the
        # agent may still be creating it, and the process itself is healthy
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=base_path_usable(self.base)))
