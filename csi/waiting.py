"""What to answer while a cache is not on the node yet.

The kubelet retries NodePublishVolume on any error and copies the message
into the Pod's events, so the message is the user's progress bar. Pure: the
caller reads the progress file and says how long it has been waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from praesto import names
from praesto.progress import summary
from praesto.quantity import format_bytes
from praesto.store import Progress


@dataclass(frozen=True)
class Waiting:
    code: grpc.StatusCode
    message: str


def waiting_answer(
    namespace: str,
    name: str,
    node: str,
    progress: Progress | None,
    waited_seconds: float,
    unassigned_after: float,
) -> Waiting:
    """The status for a cache without its complete marker.

    UNAVAILABLE ("try again later") while the agent works on it or may still
    pick it up. FAILED_PRECONDITION when the agent reports Failed, or when no
    agent answered the request for `unassigned_after` seconds: both need a
    person to act (fix the source or token, or the ModelCache's nodeSelector),
    and the code says so in `kubectl describe pod` while the kubelet keeps
    retrying and succeeds once the cause is fixed.
    """
    cache = f"model cache {namespace}/{name}"
    if progress is None:
        if waited_seconds >= unassigned_after:
            return Waiting(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{cache} is not assigned to node {node}: no node agent answered for "
                f"{waited_seconds:.0f}s, so no {names.MODELCACHENODE_KIND} is scheduled for this node; "
                "check the ModelCache's nodeSelector and that the praesto node agent runs on this node",
            )
        return Waiting(
            grpc.StatusCode.UNAVAILABLE,
            f"{cache} is not on node {node} yet: waiting for the node agent to start downloading it",
        )
    phase = progress.phase
    if phase == names.PHASE_FAILED:
        detail = progress.message or "no reason given"
        return Waiting(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{cache} failed to download on node {node}: {detail}; "
            "fix the cause (see the ModelCache's status); the mount is retried automatically",
        )
    if phase == names.PHASE_DOWNLOADING:
        amount = summary(progress.bytes_done, progress.bytes_total, eta=progress.eta_seconds) or (
            f"{format_bytes(progress.bytes_done)} so far"
        )
        if progress.message.startswith(names.SCRUB_REPAIR_PROGRESS):  # a Ready copy taken out by the scrub
            return Waiting(grpc.StatusCode.UNAVAILABLE, f"{cache} on node {node}: {progress.message}")
        return Waiting(grpc.StatusCode.UNAVAILABLE, f"{cache} is downloading on node {node}: {amount}")
    if phase == names.PHASE_EVICTED:
        return Waiting(
            grpc.StatusCode.UNAVAILABLE,
            f"{cache} was evicted from node {node} after being unused; the node agent was asked to "
            "download it again",
        )
    if phase == names.PHASE_READY:
        return Waiting(
            grpc.StatusCode.UNAVAILABLE,
            f"{cache} is being published on node {node}: its files are verified, the complete "
            "marker is not written yet",
        )
    why = f"{progress.message}; " if progress.message else ""  # e.g. the scrub found bad files
    return Waiting(
        grpc.StatusCode.UNAVAILABLE,
        f"{cache} is not ready on node {node} (phase {phase or 'Pending'}): {why}waiting for the node agent",
    )
