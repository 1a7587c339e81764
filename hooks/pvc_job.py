"""The PVC-mode downloader Job: the node agent's own download code, run once into the PVC.

The Job runs `praesto-agent download <uri> --dest /cache [--revision R]
[--allow-pattern P]... [--ignore-pattern P]...`. The downloader writes the
model's files at the PVC root and `.praesto-complete` last. A Hugging Face
token reaches it only as env `HF_TOKEN` through `secretKeyRef`, so the token
is never in the Job spec, its args or any status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from praesto.hooks.common import Obj, child_metadata, meta
from praesto.hooks.config import HooksConfig

from praesto import names
from praesto.spec import ModelCacheSpec

DEST = "/cache"
CONTAINER_NAME = "download"
NON_ROOT_UID = 65532  # distroless "nonroot"

POD_SECURITY_CONTEXT: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": NON_ROOT_UID,
    "runAsGroup": NON_ROOT_UID,
    "fsGroup": NON_ROOT_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def download_args(spec: ModelCacheSpec) -> list[str]:
    source = spec.source
    args = ["download", source.uri, "--dest", DEST]
    if source.revision:
        args += ["--revision", source.revision]
    for pattern in source.allow_patterns:
        args += ["--allow-pattern", pattern]
    for pattern in source.ignore_patterns:
        args += ["--ignore-pattern", pattern]
    return args


def _env(spec: ModelCacheSpec, config: HooksConfig) -> tuple[list[Obj], list[Obj]]:
    env: list[Obj] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
    ]
    env_from: list[Obj] = []
    if config.hf_endpoint:
        env.append({"name": "HF_ENDPOINT", "value": config.hf_endpoint})
    ref = spec.source.secret_ref
    if ref is not None:
        if spec.source.scheme == "hf" and ref.key:
            env.append(
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            )
        else:
            # Object-store credentials use the store's standard variable names as keys.
            env_from.append({"secretRef": {"name": ref.name}})
    return env, env_from


def download_job(parent: Mapping[str, Any], spec: ModelCacheSpec, config: HooksConfig) -> Obj:
    cache = str(meta(parent)["name"])
    overrides = spec.downloader
    env, env_from = _env(spec, config)
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": overrides.get("image") or config.downloader_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["praesto-agent"],
        "args": download_args(spec),
        "env": env,
        "resources": overrides.get("resources") or config.downloader_resources,
        "securityContext": {
            **CONTAINER_SECURITY_CONTEXT,
            **(overrides.get("containerSecurityContext") or {}),
        },
        "volumeMounts": [
            {"name": "cache", "mountPath": DEST},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if env_from:
        container["envFrom"] = env_from
    labels = {names.LABEL_MODEL_CACHE: cache, names.LABEL_MANAGED_BY: names.MANAGED_BY}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(parent, names.download_job_name(cache)),
        "spec": {
            "backoffLimit": config.job_backoff_limit,
            "activeDeadlineSeconds": config.job_active_deadline_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": dict(POD_SECURITY_CONTEXT),
                    "containers": [container],
                    "volumes": [
                        {"name": "cache", "persistentVolumeClaim": {"claimName": names.pvc_name(cache)}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
