"""Shared PVC mode: one ReadWriteMany PVC plus a downloader Job that fills it.

Both are returned together from the first sync: with a `WaitForFirstConsumer`
StorageClass the PVC binds only once a Pod (the Job's) uses it, so waiting for
Bound before creating the Job would deadlock.

Unused TTL: when no consuming Pod has existed for `eviction.unusedTTL`
(counted from `status.lastUsedTime`, or creation when never used) the PVC and
Job are dropped (phase Evicted); a new consumer brings them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from praesto.hooks import pvc_pod, pvc_progress, views
from praesto.hooks.common import (
    READY,
    Obj,
    child_metadata,
    condition,
    consumer_pods,
    format_time,
    keep_observed,
    meta,
    parse_time,
    section,
)
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import (
    EXIT_SIGNATURE_INVALID,
    EXIT_TOO_LARGE,
    download_job,
    image_not_allowed,
    metadata_egress_policy,
    uses_identity,
)

from praesto import jobprogress, names, progress
from praesto.spec import ModelCacheSpec


def persistent_volume_claim(parent: Mapping[str, Any], spec: ModelCacheSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": child_metadata(parent, names.pvc_name(str(meta(parent)["name"]))),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": spec.storage_class_name,
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": spec.size}},
        },
    }


def _job_state(job: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(phase, reason, message) from the Job's status."""
    if job is None:
        return names.PHASE_PENDING, "Creating", "creating the PVC and the downloader Job"
    status = section(job, "status")
    for cond in status.get("conditions") or ():
        if not isinstance(cond, dict) or cond.get("status") != "True":
            continue
        if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return names.PHASE_READY, "DownloadComplete", "the downloader Job filled the PVC"
        if cond.get("type") in ("Failed", "FailureTarget"):
            reason = str(cond.get("reason") or "JobFailed")
            message = str(cond.get("message") or "the downloader Job failed")
            if reason == "PodFailurePolicy" and f"exit code {EXIT_TOO_LARGE}" in message:
                return (
                    names.PHASE_FAILED,
                    "SizeExceedsRequest",
                    "the source is larger than spec.storage.size, so the downloader refused before writing "
                    "(the PVC is not overfilled; its Pod log states both sizes); raise storage.size to at "
                    "least the model's size and recreate the ModelCache",
                )
            if reason == "PodFailurePolicy" and f"exit code {EXIT_SIGNATURE_INVALID}" in message:
                return (
                    names.PHASE_FAILED,
                    names.REASON_SIGNATURE_INVALID,
                    "the model's signature is missing, invalid or does not match its files "
                    "(spec.verification), so the downloader published nothing; its Pod log names the file "
                    "and the cause; fix the model or the trust material, then delete the Job to retry",
                )
            return (
                names.PHASE_FAILED,
                reason,
                f"downloader Job failed: {message}; see its Pod logs, then delete the Job to retry",
            )
    if isinstance(status.get("succeeded"), int) and status["succeeded"] > 0:
        return names.PHASE_READY, "DownloadComplete", "the downloader Job filled the PVC"
    return names.PHASE_DOWNLOADING, "Downloading", "the downloader Job is downloading into the PVC"


def _last_used(
    before: Mapping[str, Any], consumers: int, config: HooksConfig, now: datetime
) -> datetime | None:
    """Previous lastUsedTime, advanced to `now` only in steps of the configured granularity."""
    last = parse_time(before.get("lastUsedTime"))
    if consumers and (last is None or (now - last).total_seconds() >= config.last_used_granularity_seconds):
        return now.replace(microsecond=0)
    return last


def pvc_pass(request: views.SyncRequest, spec: ModelCacheSpec, config: HooksConfig, now: datetime) -> Obj:
    """The PVC-mode pass: the volume, its download Job and what they say, from the request's view."""
    parent = request.parent.obj
    before = request.parent.before
    cache = request.parent.name
    consumers = len(consumer_pods(request.related.pods, parent))
    last_used = _last_used(before, consumers, config, now)
    jobs = request.children.jobs
    pvcs = request.children.pvcs
    job = jobs[0] if jobs else None
    pvc = pvcs[0] if pvcs else None

    resync = 0.0
    evicted = False
    downloaded: dict[str, Any] = {}
    if spec.unused_ttl_seconds:
        if consumers:
            # Re-check while in use so lastUsedTime stays fresh even if no event arrives.
            resync = max(float(config.last_used_granularity_seconds), spec.unused_ttl_seconds / 4)
        else:
            since = last_used or parse_time(meta(parent).get("creationTimestamp")) or now
            expiry = since + timedelta(seconds=spec.unused_ttl_seconds)
            evicted = expiry <= now
            if not evicted:
                resync = max(1.0, (expiry - now).total_seconds())

    # A Job that already exists was allowed when it was made (the spec is immutable): keep it,
    # so narrowing the allow-list later never deletes a filled volume's Job and its Ready state.
    not_allowed = image_not_allowed(spec, config) if job is None else None
    if not_allowed:
        # Fails a security check the validator makes too (it may fail open): nothing new is made;
        # an existing volume (the allow-list narrowed after its Job was deleted) is kept as it is.
        children: list[Obj] = [keep_observed(p) for p in pvcs]
        phase, reason, message = (
            names.PHASE_FAILED,
            "DownloaderImageNotAllowed",
            f"spec.downloader.image: {not_allowed}",
        )
    elif evicted:
        children = []
        phase, reason = names.PHASE_EVICTED, "UnusedTTLExpired"
        message = (
            f"no Pod used the cache for {spec.unused_ttl}; the PVC and Job were removed and "
            "come back when a Pod uses the cache again"
        )
    else:
        desired_job = download_job(parent, spec, config)
        children = [persistent_volume_claim(parent, spec), desired_job]
        egress = metadata_egress_policy(parent, spec, config)
        if egress is not None:
            children.append(egress)
        phase, reason, message = _job_state(job)
        namespace = request.parent.namespace
        pods = pvc_pod.job_pods(request.related.pods, namespace, names.download_job_name(cache))
        if phase == names.PHASE_READY:
            downloaded = pvc_pod.report(pods)
        elif phase != names.PHASE_FAILED:
            account = config.downloader_service_account if uses_identity(namespace, spec, config) else ""
            # while the Job runs, its Pod may write its progress on it: granted to the account the Job
            # really runs as (the observed one: a Job's template is immutable), hooks/pvc_progress.py
            children.extend(pvc_progress.grant(parent, pvc_progress.job_account(job or desired_job)))
            no_account = pvc_pod.missing_service_account(request.related.service_accounts, namespace, account)
            problem = ("WaitingForServiceAccount", no_account) if no_account else pvc_pod.stuck(pods)
            if problem is not None:
                phase, (reason, message) = names.PHASE_PENDING, problem
        if phase != names.PHASE_FAILED and section(pvc or {}, "status").get("phase") == "Lost":
            phase, reason = names.PHASE_FAILED, "VolumeLost"
            message = (
                f"the PVC lost its PersistentVolume; delete the PVC {names.pvc_name(cache)} and the Job "
                f"{names.download_job_name(cache)} to download again (Pods using the old claim must restart)"
            )

    status: Obj = {
        "observedGeneration": request.parent.generation,
        "phase": phase,
        "mode": names.MODE_PVC,
        "readyNodes": 1 if phase == names.PHASE_READY else 0,
        "totalNodes": 1,
        "downloadingNodes": 1 if phase == names.PHASE_DOWNLOADING else 0,
        "failedNodes": 1 if phase == names.PHASE_FAILED else 0,
        "pendingNodes": 1 if phase in (names.PHASE_PENDING, names.PHASE_EVICTED) else 0,
        # the model's real size once the downloader reported it (before: the request)
        "sizeBytes": downloaded.get("sizeBytes") or before.get("sizeBytes") or spec.size_bytes,
    }
    if phase == names.PHASE_READY and downloaded.get("sizeBytes"):
        size = downloaded["sizeBytes"]
        status["progress"] = {
            progress.BYTES_DONE: size,
            progress.BYTES_TOTAL: size,
            progress.SUMMARY: progress.summary(size, size),
        }
    live = pvc_progress.live_progress(job, spec.size_bytes, now) if phase == names.PHASE_DOWNLOADING else None
    if live is not None:
        status["progress"] = live
        # a writer that went quiet (its Pod hung or gone) must lose its rate: look again once stale
        resync = min(resync or jobprogress.STALE_SECONDS, jobprogress.STALE_SECONDS)
    if not evicted:
        status["pvcName"] = names.pvc_name(cache)
    if any(child["kind"] == "Job" for child in children):
        status["downloadJobName"] = names.download_job_name(cache)
    if spec.source.pinned:
        status["resolvedRevision"] = spec.source.revision
    elif downloaded.get("resolvedRevision") or before.get("resolvedRevision"):
        status["resolvedRevision"] = downloaded.get("resolvedRevision") or before.get("resolvedRevision")
    if last_used:
        status["lastUsedTime"] = format_time(last_used)
    status["conditions"] = [
        condition(before, READY, phase == names.PHASE_READY, reason, message, now, request.parent.generation)
    ]
    response: Obj = {"status": status, "children": children}
    if resync:
        response["resyncAfterSeconds"] = resync
    return response
