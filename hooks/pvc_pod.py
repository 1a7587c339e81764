"""What the PVC-mode download Pod says: why it cannot start, and what it downloaded.

The Job's status only changes when its Pod ends, so a Pod that can never start
(a missing Secret, image or ServiceAccount) would show `Downloading` until the
Job's deadline. The customize hook relates the Job's Pods (and, with workload
identity, the downloader's ServiceAccount), and these pure functions turn them
into a reason and a message within one sync. When the Pod succeeds, the
downloader's termination message (`praesto-agent download`, env
`PRAESTO_TERMINATION_LOG`) carries the resolved commit and the model's size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from praesto.hooks.common import meta, section

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its Pods
TERMINATION_LOG = "/dev/termination-log"
CONFIG_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def job_pods(
    related_pods: Iterable[Mapping[str, Any]], namespace: str, job_name: str
) -> list[Mapping[str, Any]]:
    """The download Job's Pods among the related Pods, newest first."""
    pods = [
        p
        for p in related_pods
        if meta(p).get("namespace") == namespace
        and (meta(p).get("labels") or {}).get(JOB_NAME_LABEL) == job_name
    ]
    return sorted(pods, key=lambda p: str(meta(p).get("creationTimestamp") or ""), reverse=True)


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = section(pod, "status")
    return [
        s
        for key in ("initContainerStatuses", "containerStatuses")
        for s in status.get(key) or ()
        if isinstance(s, dict)
    ]


def stuck(pods: list[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when the newest download Pod cannot start its container."""
    if not pods:
        return None
    pod = pods[0]
    for container in _statuses(pod):
        waiting = section(section(container, "state"), "waiting")
        reason = waiting.get("reason")
        if reason in CONFIG_ERRORS | IMAGE_ERRORS:
            detail = str(waiting.get("message") or reason)[:500]
            fix = (
                "create what it names in the cache's namespace (a token Secret and its key, the CA bundle ConfigMap)"
                if reason in CONFIG_ERRORS
                else "check the downloader image (spec.downloader.image or the chart's downloader.image)"
            )
            return str(reason), f"download Pod {meta(pod).get('name')}: {detail}; {fix}"
    return None


def missing_service_account(
    accounts: Iterable[Mapping[str, Any]], namespace: str, name: str | None
) -> str | None:
    """The message when the downloader's ServiceAccount (workload identity, among the related `accounts`)
    does not exist."""
    if not name:
        return None
    for account in accounts:
        if meta(account).get("name") == name and meta(account).get("namespace") == namespace:
            return None
    return (
        f"ServiceAccount {namespace}/{name} does not exist, so the download Job cannot create its Pod; "
        "create it with the workload-identity annotations (the chart creates it in the namespaces listed "
        "in credentials.identity.downloaderNamespaces)"
    )


def report(pods: list[Mapping[str, Any]]) -> dict[str, Any]:
    """`resolvedRevision` and `sizeBytes` from the download container's termination message."""
    for pod in pods:
        for container in _statuses(pod):
            terminated = section(section(container, "state"), "terminated")
            if terminated.get("exitCode") != 0:
                continue
            try:
                data = json.loads(str(terminated.get("message") or ""))
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            out: dict[str, Any] = {}
            if isinstance(data.get("resolvedRevision"), str):
                out["resolvedRevision"] = data["resolvedRevision"]
            size = data.get("sizeBytes")
            if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                out["sizeBytes"] = size
            return out
    return {}
