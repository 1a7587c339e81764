"""CSI Node service: publish and unpublish model caches; everything else refused."""

from __future__ import annotations

from typing import NoReturn

import grpc
from praesto.csi.proto import csi_pb2
from praesto.csi.publisher import Publisher
from praesto.csi.rpc import rpc, unimplemented
from praesto.csi.volume import check_target_path, check_volume_id, parse_publish

NO_STAGING = "publishes directly (no STAGE_UNSTAGE_VOLUME capability)"


class NodeServicer:
    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.publisher.node_name)

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        # no STAGE_UNSTAGE_VOLUME: a bind mount needs no per-node staging
        return csi_pb2.NodeGetCapabilitiesResponse()

    @rpc
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        has_capability = request.HasField("volume_capability")
        access_type = request.volume_capability.WhichOneof("access_type") if has_capability else None
        req = parse_publish(
            request.volume_id,
            request.target_path,
            has_capability,
            access_type,
            request.readonly,
            dict(request.volume_context),
        )
        self.publisher.publish(req)
        return csi_pb2.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        target = check_target_path(request.target_path)
        self.publisher.unpublish(volume_id, target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "NodeStageVolume", NO_STAGING)

    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "NodeUnstageVolume", NO_STAGING)

    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "NodeGetVolumeStats", "does not report volume stats (no GET_VOLUME_STATS)")

    def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> NoReturn:
        unimplemented(context, "NodeExpandVolume", "serves read-only caches that cannot be expanded")
