"""The PVC-mode downloader Job: the node agent's own download code, run once into the PVC.

The Job runs `praesto-agent download <uri> --dest /cache --max-bytes <storage.size>
[--revision R] [--allow-pattern P]... [--ignore-pattern P]...`. The downloader writes the
model's files at the PVC root and `.praesto-complete` last, and refuses a source larger
than the volume before writing (SizeExceedsRequest). Each kind's Secret reaches it in the
shape its row of praesto/kinds.py names: a hub token only as env (`HF_TOKEN`,
`MODELSCOPE_API_TOKEN`) through `secretKeyRef`; a registry login or an object-store credentials
Secret is mounted read-only as files (`--credentials-dir`: keys such as
gcloud-application-credentials.json are not environment variable names). No credential is ever in the Job spec, its args or
any status. The chart's proxies/identity env, workload-identity ServiceAccount and pod
labels, and the extra CA bundle (an optional ConfigMap in the cache's namespace) apply.
spec.verification's trust Secret or ConfigMap is mounted read-only as one file (`TRUST_FILE`) that
the `--signature-*` flags name; the check is the node agent's own (agent/download/signature.py).
The download container alone gets an API token, projected, good for one thing: writing its live
progress on this Job (hooks/pvc_progress.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from praesto.hooks import pvc_progress
from praesto.hooks.common import Obj, child_metadata, meta
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_pod import TERMINATION_LOG

from praesto import credscope, kinds, names
from praesto.privileges import privilege_errors
from praesto.spec import ModelCacheSpec

DEST = "/cache"
CONTAINER_NAME = "download"
NON_ROOT_UID = 65532  # distroless "nonroot"
EXIT_TOO_LARGE = names.DOWNLOAD_EXIT_TOO_LARGE
EXIT_SIGNATURE_INVALID = names.DOWNLOAD_EXIT_SIGNATURE_INVALID
# The Job controller's own failure reasons this Job can end with (its backoffLimit and
# activeDeadlineSeconds below), passed through to the ModelCache's Ready condition by
# hooks/pvc.py; its PodFailurePolicy failures are translated there. Source: k8s.io/api
# batch/v1/types.go (JobReasonBackoffLimitExceeded, JobReasonDeadlineExceeded) at v0.37.2.
JOB_FAILURE_REASONS = frozenset({"BackoffLimitExceeded", "DeadlineExceeded"})
TRUST_DIR = "/etc/praesto/trust"  # spec.verification's trust material (a public key or CA certificates)
TRUST_FILE = f"{TRUST_DIR}/trust.pem"
CREDENTIALS_DIR = "/var/run/secrets/praesto/credentials"
CA_DIR = "/etc/praesto/ca"
CA_FILE = f"{CA_DIR}/ca.crt"

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


def _security_context(overrides: Mapping[str, Any]) -> Obj:
    """The restricted context with the author's tightening applied; never anything that raises
    privileges (the parser refuses those already: this is the second line)."""
    merged: Obj = {**CONTAINER_SECURITY_CONTEXT, **overrides}
    return merged if not privilege_errors(merged) else dict(CONTAINER_SECURITY_CONTEXT)


def download_args(spec: ModelCacheSpec) -> list[str]:
    source = spec.source
    args = ["download", source.uri, "--dest", DEST, "--max-bytes", spec.size]
    if source.revision:
        args += ["--revision", source.revision]
    for pattern in source.allow_patterns:
        args += ["--allow-pattern", pattern]
    for pattern in source.ignore_patterns:
        args += ["--ignore-pattern", pattern]
    return args + signature_args(spec)


def signature_args(spec: ModelCacheSpec) -> list[str]:
    """spec.verification as `praesto-agent download` flags; the trust material is a mounted file."""
    wanted = spec.verification
    if wanted is None:
        return []
    args = ["--signature-path", wanted.path]
    if wanted.method == "publicKey":
        return [*args, "--signature-public-key", TRUST_FILE]
    if wanted.method == "certificate":
        return [*args, "--signature-certificate", TRUST_FILE]
    return [*args, "--signature-identity", wanted.identity, "--signature-oidc-issuer", wanted.oidc_issuer]


def _env(spec: ModelCacheSpec, config: HooksConfig, identity: bool) -> tuple[list[Obj], list[Obj]]:
    env: list[Obj] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
        # the downloader reports the resolved commit and the size here (hooks/pvc_pod.py)
        {"name": names.ENV_TERMINATION_LOG, "value": TERMINATION_LOG},
    ]
    env_from: list[Obj] = []
    if config.hf_endpoint:
        env.append({"name": names.ENV_HF_ENDPOINT, "value": config.hf_endpoint})
    if config.modelscope_endpoint:
        env.append({"name": names.ENV_MODELSCOPE_ENDPOINT, "value": config.modelscope_endpoint})
    # Identity settings come from the entitlement alone: a Job not entitled to the cluster's identity
    # gets `false` (over anything its image sets), so its store client has every default chain off
    # (instance metadata, GCE metadata, Azure managed identity) and goes anonymous (issue 21 item 1).
    env.extend(
        {"name": k, "value": v}
        for k, v in sorted(config.downloader_env.items())
        if k not in credscope.IDENTITY_ENV
    )
    env.append({"name": credscope.ENV_IDENTITY, "value": "true" if identity else "false"})
    if config.ca_bundle_configmap is not None:
        env += [{"name": names.ENV_CA_BUNDLE, "value": CA_FILE}, {"name": "SSL_CERT_FILE", "value": CA_FILE},
                {"name": "REQUESTS_CA_BUNDLE", "value": CA_FILE}]  # fmt: skip
    ref, credential = spec.source.secret_ref, spec.source.kind.credential
    if ref is not None:
        if credential.shape == kinds.TOKEN:
            key = ref.key or credential.default_key
            env.append(
                {"name": credential.env, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": key}}}
            )
        else:
            env.append({"name": names.ENV_CREDENTIALS_DIR, "value": CREDENTIALS_DIR})
    return env, env_from


def _volumes(spec: ModelCacheSpec, config: HooksConfig) -> tuple[list[Obj], list[Obj]]:
    """(volumes, mounts) for the credentials Secret and the CA bundle, when there are any."""
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    ref, credential = spec.source.secret_ref, spec.source.kind.credential
    if ref is not None and credential.shape == kinds.FILE:  # e.g. a registry login, at the name the CLI reads
        items = [{"key": ref.key or credential.default_key, "path": credential.file}]
        secret = {"secretName": ref.name, "defaultMode": 0o440, "items": items}
        volumes.append({"name": "credentials", "secret": secret})
        mounts.append({"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True})
    elif ref is not None and credential.shape == kinds.KEYS:
        volumes.append({"name": "credentials", "secret": {"secretName": ref.name, "defaultMode": 0o440}})
        mounts.append({"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True})
    trust = spec.verification
    if trust is not None and trust.cluster_trust:  # the Pod's own annotation (cluster_trust_annotations)
        field = {"fieldPath": f"metadata.annotations['{names.ANNOTATION_SIGNATURE_TRUST}']"}
        volumes.append(
            {"name": "trust", "downwardAPI": {"items": [{"path": "trust.pem", "fieldRef": field}]}}
        )
        mounts.append({"name": "trust", "mountPath": TRUST_DIR, "readOnly": True})
    elif trust is not None and (trust.secret_ref or trust.config_map_ref):
        if trust.secret_ref is not None:
            items = [{"key": str(trust.secret_ref.key), "path": "trust.pem"}]
            volumes.append({"name": "trust", "secret": {"secretName": trust.secret_ref.name, "items": items}})
        elif trust.config_map_ref is not None:
            items = [{"key": str(trust.config_map_ref.key), "path": "trust.pem"}]
            volumes.append(
                {"name": "trust", "configMap": {"name": trust.config_map_ref.name, "items": items}}
            )
        mounts.append({"name": "trust", "mountPath": TRUST_DIR, "readOnly": True})
    if config.ca_bundle_configmap is not None:
        name, key = config.ca_bundle_configmap
        items = [{"key": key, "path": "ca.crt"}]
        volumes.append({"name": "ca-bundle", "configMap": {"name": name, "items": items, "optional": True}})
        mounts.append({"name": "ca-bundle", "mountPath": CA_DIR, "readOnly": True})
    return volumes, mounts


def uses_identity(namespace: str, spec: ModelCacheSpec, config: HooksConfig) -> bool:
    """Whether the Job runs as the workload-identity ServiceAccount. Never for a cache that names its
    own Secret (that Secret only), nor outside the chart's credentials.namespaces and .sources: the
    rule the node agent applies too (praesto/credscope.py)."""
    return (
        bool(config.downloader_service_account)
        and spec.source.secret_ref is None
        and config.credential_scope.entitled(namespace, spec.source.uri)
    )


def image_not_allowed(spec: ModelCacheSpec, config: HooksConfig) -> str | None:
    """Why spec.downloader.image may not run, or None. The Job mounts the cache's Secret and
    writes the shared volume, so its image is the platform admin's choice, not the cache author's:
    the validating webhook refuses it, and the sync hook never emits it (defence in depth)."""
    image = spec.downloader.get("image")
    if not image or config.downloader_image_allowed(str(image)):
        return None
    return (
        f"image {str(image)[:200]!r} is not in the chart's allow-list of downloader images; "
        "omit spec.downloader.image to use the chart's downloader, or ask the platform admin to add it "
        "to downloader.allowedImages"
    )


def _pod_labels(cache: str, config: HooksConfig, identity: bool) -> dict[str, str]:
    return {
        **(config.downloader_pod_labels if identity else {}),  # e.g. Azure's: only with the identity
        names.LABEL_MODEL_CACHE: cache,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
    }


def metadata_egress_policy(
    parent: Mapping[str, Any], spec: ModelCacheSpec, config: HooksConfig
) -> Obj | None:
    """A NetworkPolicy denying the download Pods egress to the cloud metadata addresses, for a Job
    not entitled to the cluster's identity (chart downloader.metadataEgress); None otherwise.

    Everything else stays reachable (the origin, proxies, DNS and other in-cluster Pods). A Job that
    runs as the identity keeps the metadata address: GKE serves workload identity there. NetworkPolicy
    rules add up, so another policy in the namespace that allows all egress to these Pods wins.
    """
    namespace = str(meta(parent).get("namespace") or "")
    if not config.denied_egress or uses_identity(namespace, spec, config):
        return None
    cache = str(meta(parent)["name"])
    peers: list[Obj] = [{"namespaceSelector": {}}]  # in-cluster peers, whatever their addresses
    for everything, family in (("0.0.0.0/0", 4), ("::/0", 6)):
        denied = [c for c in config.denied_egress if ipaddress.ip_network(c).version == family]
        peers.append({"ipBlock": {"cidr": everything, **({"except": denied} if denied else {})}})
    selector = _pod_labels(cache, config, False)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(parent, names.download_job_name(cache)),
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Egress"],
            "egress": [{"to": peers}],
        },
    }


def _fail_at_once(spec: ModelCacheSpec) -> list[Obj]:
    """Exits that fail the same way every time: a too-large source, and (with spec.verification) a
    refused signature. Each is its own FailJob rule; the second only for a cache that verifies."""
    codes = [EXIT_TOO_LARGE, *([EXIT_SIGNATURE_INVALID] if spec.verification is not None else [])]
    return [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "In", "values": [code]},
        }
        for code in codes
    ]


def cluster_trust_annotations(spec: ModelCacheSpec, config: HooksConfig) -> dict[str, str]:
    """The platform's trust (chart verification.trust) a cache names, on the download Pod's template:
    public material, in the Job Metacontroller owns, never in an object of the tenant's namespace
    that the tenant could edit. A downward-API volume turns it into the file the flags name."""
    name = spec.verification.cluster_trust if spec.verification else ""
    entry = config.trust_policy.trust.get(name) if name else None
    return {names.ANNOTATION_SIGNATURE_TRUST: entry.pem.decode()} if entry else {}


def _annotations(spec: ModelCacheSpec, config: HooksConfig) -> dict[str, dict[str, str]]:
    found = cluster_trust_annotations(spec, config)
    return {"annotations": found} if found else {}


def download_job(parent: Mapping[str, Any], spec: ModelCacheSpec, config: HooksConfig) -> Obj:
    cache = str(meta(parent)["name"])
    namespace = str(meta(parent).get("namespace") or "")
    overrides = spec.downloader
    identity = uses_identity(namespace, spec, config)
    env, env_from = _env(spec, config, identity)
    extra_volumes, extra_mounts = _volumes(spec, config)
    # live progress: this container alone gets a token, for one annotation on its Job (pvc_progress.py)
    progress_env, progress_volume, progress_mount = pvc_progress.pod_parts(
        namespace, names.download_job_name(cache)
    )
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": overrides.get("image") or config.downloader_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["praesto-agent"],
        "args": download_args(spec),
        "env": [*env, progress_env],
        "resources": overrides.get("resources") or config.downloader_resources,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _security_context(overrides.get("containerSecurityContext") or {}),
        "volumeMounts": [
            {"name": "cache", "mountPath": DEST},
            {"name": "tmp", "mountPath": "/tmp"},
            *extra_mounts,
            progress_mount,
        ],
    }
    if env_from:
        container["envFrom"] = env_from
    labels = _pod_labels(cache, config, identity)
    pod_spec: Obj = {
        "restartPolicy": "Never",
        # workload-identity webhooks project their own token; ours is the progress volume's, one container
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(POD_SECURITY_CONTEXT),
        "containers": [container],
        "volumes": [
            {"name": "cache", "persistentVolumeClaim": {"claimName": names.pvc_name(cache)}},
            {"name": "tmp", "emptyDir": {}},
            *extra_volumes,
            progress_volume,
        ],
    }
    if identity:
        pod_spec["serviceAccountName"] = config.downloader_service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(parent, names.download_job_name(cache)),
        "spec": {
            "backoffLimit": config.job_backoff_limit,
            "podFailurePolicy": {"rules": _fail_at_once(spec)},
            "activeDeadlineSeconds": config.job_active_deadline_seconds,
            "template": {"metadata": {"labels": labels, **_annotations(spec, config)}, "spec": pod_spec},
        },
    }
