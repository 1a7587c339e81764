"""PVC mode's live progress: what the sync hook adds so a running download Job can say how far it got.

The Job's status changes only when its Pod ends, so while it runs the Pod itself writes one
annotation on its own Job (praesto/jobprogress.py: the value; agent/job_progress.py: the writer);
the Job's change makes Metacontroller sync the ModelCache, and `live_progress` reads it. What that
takes, least privilege, all pure:

* a Role allowing only `patch` on that one Job (`resourceNames`) and a RoleBinding to the
  ServiceAccount the Pod runs as, returned only while the Job runs (the grant goes with it);
* a projected token for that ServiceAccount (default audience: the API server's; the shortest
  lifetime the API server issues; rotated by the kubelet) mounted in the download container only,
  in place of the automounted one (the Pod keeps `automountServiceAccountToken: false`);
* the chart's ValidatingAdmissionPolicy (templates/download-progress-policy.yaml), which lets that
  identity change nothing on the Job but the annotation, and only with a token bound to a Pod
  named like the Job's.

The Pod runs code a tenant can influence (its source, its data), so the annotation is display
only: validated, size-capped and clamped by jobprogress.decode, never used for a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from praesto.hooks.common import Obj, meta, role_and_binding, section

from praesto import jobprogress, names
from praesto.rbac import DOWNLOADER_PROGRESS_GRANT

VOLUME = "progress-token"
TOKEN_SECONDS = 600  # the shortest expirationSeconds the API server accepts; the kubelet renews it
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"  # published in every namespace by kube-controller-manager
DEFAULT_SERVICE_ACCOUNT = "default"  # what a Pod naming no ServiceAccount runs as


def pod_parts(namespace: str, job_name: str) -> tuple[Obj, Obj, Obj]:
    """(env, volume, mount) for the download container: which Job to report on, and the token."""
    env = {"name": names.ENV_PROGRESS_JOB, "value": f"{namespace}/{job_name}"}
    sources = [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
        {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]
    volume = {"name": VOLUME, "projected": {"defaultMode": 0o440, "sources": sources}}
    mount = {"name": VOLUME, "mountPath": names.PROGRESS_CREDENTIALS_DIR, "readOnly": True}
    return env, volume, mount


def job_account(job: Mapping[str, Any]) -> str:
    """The ServiceAccount a Job's Pods run as: the one the grant and the chart's policy both name."""
    pod_spec = section(section(section(job, "spec"), "template"), "spec")
    return str(pod_spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT)


def grant(parent: Mapping[str, Any], account: str) -> list[Obj]:
    """Role (patch on the cache's download Job only) + RoleBinding to the Pod's ServiceAccount."""
    cache = str(meta(parent)["name"])
    rule = {
        "apiGroups": [DOWNLOADER_PROGRESS_GRANT.group],
        "resources": [DOWNLOADER_PROGRESS_GRANT.resource],
        "resourceNames": [names.download_job_name(cache)],
        "verbs": list(DOWNLOADER_PROGRESS_GRANT.verbs),
    }
    namespace = str(meta(parent).get("namespace") or "")
    return role_and_binding(parent, names.download_progress_role_name(cache), [rule], account, namespace)


def live_progress(job: Mapping[str, Any] | None, size_limit: int, now: datetime) -> dict[str, Any] | None:
    """status.progress from the running Job's annotation, or None when there is none worth showing."""
    annotations = meta(job or {}).get("annotations")
    if not isinstance(annotations, dict):
        return None
    return jobprogress.decode(annotations.get(names.ANNOTATION_DOWNLOAD_PROGRESS), size_limit, now)
