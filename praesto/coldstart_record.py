"""Per-Pod cold-start records: what the CSI driver saw when a Pod mounted a cache.

The CSI driver (no API access) writes one record per (Pod, cache) under
`<base>/.praesto/pods/`: when the kubelet first asked to mount, whether the
cache was complete then (a hit) and when the mount succeeded. The node agent
reads the finished ones, reports them (Event on the Pod, metrics, the
ModelCacheNode's `status.podStarts`) and removes them. This module is the
record's one definition, shared by both sides.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from praesto import names

_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def valid_pod(pod_name: str, pod_uid: str) -> bool:
    """Kubelet-set pod info in the shape Kubernetes gives it (a DNS subdomain, a UUID)."""
    return len(pod_name) <= 253 and bool(_POD_NAME.match(pod_name)) and bool(_UID.match(pod_uid))


@dataclass(frozen=True)
class PodStart:
    pod_uid: str
    pod_name: str
    namespace: str
    name: str  # the ModelCache
    first_attempt_at: float  # wall clock of the first NodePublish for this Pod and cache
    hit: bool  # the cache was complete on the node at that first attempt
    mounted_at: float | None = None  # wall clock of the successful mount; None while waiting

    @property
    def file_name(self) -> str:
        return record_name(self.pod_uid, self.namespace, self.name)

    @property
    def wait_seconds(self) -> float:
        """First attempt to successful mount (0 while still waiting: not reported then)."""
        return max(0.0, (self.mounted_at or self.first_attempt_at) - self.first_attempt_at)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record_name(pod_uid: str, namespace: str, name: str) -> str:
    """File name of a record: a hash, so nothing a Pod controls becomes a path."""
    return names.short_hash(f"{pod_uid}/{namespace}/{name}", 32) + ".json"


def from_json(data: dict[str, Any] | None) -> PodStart | None:
    """A record parsed from its JSON; None when malformed (a reader never trusts the file)."""
    if not data:
        return None
    try:
        mounted = data.get("mounted_at")
        record = PodStart(
            str(data["pod_uid"]),
            str(data["pod_name"]),
            str(data["namespace"]),
            str(data["name"]),
            float(data["first_attempt_at"]),
            bool(data["hit"]),
            None if mounted is None else float(mounted),
        )
    except (KeyError, TypeError, ValueError):
        return None
    ok = valid_pod(record.pod_name, record.pod_uid)
    return record if ok and names.is_dns_label(record.namespace) and names.is_dns_label(record.name) else None
