"""Pure validation of NodePublish/NodeUnpublish requests.

Turns a request into the few facts the node plugin acts on, or raises
CsiError with a gRPC code and a message naming the field, the cause and the
fix. No filesystem access here: what is on disk is checked by the caller.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from praesto import names
from praesto.coldstart_record import valid_pod


class CsiError(Exception):
    """A refusal the servicer turns into a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    target_path: str
    namespace: str
    name: str
    # kubelet-set pod info, only for cold-start accounting (praesto.coldstart_record); "" when absent or malformed
    pod_name: str = ""
    pod_uid: str = ""


def _invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def check_volume_id(volume_id: str) -> str:
    if not volume_id:
        raise _invalid("volume_id: required; the kubelet sets it for every CSI volume")
    if "\x00" in volume_id or len(volume_id) > 1024:
        raise _invalid("volume_id: must be at most 1024 characters without NUL bytes")
    return volume_id


def check_target_path(target_path: str, field: str = "target_path") -> str:
    """An absolute, already-normalised path (the kubelet never sends `..` or `//`)."""
    if not target_path:
        raise _invalid(f"{field}: required; the kubelet sets it to the Pod's volume directory")
    if "\x00" in target_path or not os.path.isabs(target_path):
        raise _invalid(f"{field}: {target_path!r} must be an absolute path")
    clean = os.path.normpath(target_path)
    if clean != target_path.rstrip("/") or clean == "/":
        raise _invalid(
            f"{field}: {target_path!r} is not a normalised path (no '..', '.', '//' and not '/'); "
            "pass the directory the kubelet created for the volume"
        )
    return clean


def check_capability(has_capability: bool, access_type: str | None) -> None:
    if not has_capability:
        raise _invalid("volume_capability: required; the kubelet sets it for every CSI volume")
    if access_type != "mount":
        raise _invalid(
            f"volume_capability: access type {access_type or 'unset'!r} is not supported; "
            f"{names.CSI_DRIVER_NAME} serves a directory, use a filesystem (mount) volume"
        )


def resolve_cache(context: Mapping[str, str]) -> tuple[str, str]:
    """(namespace, name) of the ModelCache a volume asks for.

    The namespace comes only from the kubelet-set pod info: a Pod author
    writes volumeAttributes but cannot forge `csi.storage.k8s.io/*` keys (the
    kubelet overwrites them), so this is what keeps one namespace's Pods away
    from another namespace's caches.
    """
    name = context.get(names.CSI_ATTR_CACHE_NAME, "")
    if not name:
        raise _invalid(
            f"volume_attributes.{names.CSI_ATTR_CACHE_NAME}: required; set it to the name of a "
            "ModelCache in the Pod's namespace"
        )
    if not names.is_dns_label(name):
        raise _invalid(
            f"volume_attributes.{names.CSI_ATTR_CACHE_NAME}: {name[:80]!r} is not a valid ModelCache name "
            "(lowercase letters, digits and '-', at most 63 characters)"
        )
    namespace = context.get(names.CSI_ATTR_POD_NAMESPACE, "")
    if not namespace:
        raise _invalid(
            f"volume_context[{names.CSI_ATTR_POD_NAMESPACE}]: missing, so the Pod's namespace is unknown; "
            f"set `podInfoOnMount: true` on the CSIDriver {names.CSI_DRIVER_NAME} (the Praesto chart does)"
        )
    if not names.is_dns_label(namespace):
        raise _invalid(
            f"volume_context[{names.CSI_ATTR_POD_NAMESPACE}]: {namespace[:80]!r} is not a namespace name"
        )
    legacy = context.get(names.CSI_ATTR_LEGACY_NAMESPACE)
    if legacy is not None and legacy != namespace:
        raise CsiError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"volume_attributes.{names.CSI_ATTR_LEGACY_NAMESPACE}: {legacy[:80]!r} differs from the Pod's "
            f"namespace {namespace!r}; a Pod can only mount ModelCaches of its own namespace, "
            f"remove {names.CSI_ATTR_LEGACY_NAMESPACE} or create the ModelCache in {namespace!r}",
        )
    return namespace, name


def parse_publish(
    volume_id: str,
    target_path: str,
    has_capability: bool,
    access_type: str | None,
    readonly: bool,
    context: Mapping[str, str],
) -> PublishRequest:
    """Validate a NodePublishVolume request, cheapest and most basic checks first."""
    check_volume_id(volume_id)
    target = check_target_path(target_path)
    check_capability(has_capability, access_type)
    if not readonly:
        raise _invalid(
            "readonly: must be true; model caches are shared and mounted read-only, "
            "set `readOnly: true` on the csi volume in the Pod spec"
        )
    namespace, name = resolve_cache(context)
    pod_name = context.get(names.CSI_ATTR_POD_NAME, "")
    pod_uid = context.get(names.CSI_ATTR_POD_UID, "")
    if not valid_pod(pod_name, pod_uid):  # accounting only: never a reason to refuse a mount
        pod_name = pod_uid = ""
    return PublishRequest(volume_id, target, namespace, name, pod_name, pod_uid)
