"""Settings the hooks need that are not in the ModelCache: chart defaults and identities.

Built once from the environment (the chart sets these variables on the hooks
Deployment) and passed to the pure hook functions as an argument, so the hooks
stay pure and tests build any configuration they like without touching the
process environment.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import praesto
from praesto import credscope, names, quota, trustpolicy
from praesto.names import is_dns_label

ENV_DOWNLOADER_IMAGE = "PRAESTO_DOWNLOADER_IMAGE"
ENV_DOWNLOADER_ALLOWED_IMAGES = "PRAESTO_DOWNLOADER_ALLOWED_IMAGES"  # JSON list of refs or "prefix*"
ENV_DOWNLOADER_RESOURCES = "PRAESTO_DOWNLOADER_RESOURCES"  # JSON ResourceRequirements
ENV_JOB_BACKOFF_LIMIT = "PRAESTO_JOB_BACKOFF_LIMIT"
ENV_JOB_ACTIVE_DEADLINE_SECONDS = "PRAESTO_JOB_ACTIVE_DEADLINE_SECONDS"
ENV_AGENT_SERVICE_ACCOUNT = "PRAESTO_AGENT_SERVICE_ACCOUNT"
# praesto-hooks' own ServiceAccount: the per-cache grants bind it, for the credentials broker (hooks/broker.py)
ENV_HOOKS_SERVICE_ACCOUNT = "PRAESTO_HOOKS_SERVICE_ACCOUNT"
ENV_NAMESPACE = "PRAESTO_NAMESPACE"
ENV_HF_ENDPOINT = "PRAESTO_HF_ENDPOINT"
ENV_MODELSCOPE_ENDPOINT = "PRAESTO_MODELSCOPE_ENDPOINT"
ENV_LAST_USED_GRANULARITY = "PRAESTO_LAST_USED_GRANULARITY_SECONDS"
# Chart-wide download settings the PVC-mode Job needs (issue 7): proxies and identity as env,
# the workload-identity ServiceAccount and pod labels, the extra CA bundle's ConfigMap.
ENV_DOWNLOADER_ENV = "PRAESTO_DOWNLOADER_ENV"  # JSON object {NAME: value}
ENV_DOWNLOADER_SERVICE_ACCOUNT = "PRAESTO_DOWNLOADER_SERVICE_ACCOUNT"
ENV_DOWNLOADER_POD_LABELS = "PRAESTO_DOWNLOADER_POD_LABELS"  # JSON object
ENV_CA_BUNDLE_CONFIGMAP = "PRAESTO_CA_BUNDLE_CONFIGMAP"  # "name/key"
# chart downloader.metadataEgress: CIDRs a downloader Pod without the identity may not reach
ENV_DOWNLOADER_DENIED_EGRESS = "PRAESTO_DOWNLOADER_DENIED_EGRESS"  # comma-separated CIDRs
# Admission (hooks/admission): the wait init container's image and the API lookups (lookup.py)
ENV_IMAGE = "PRAESTO_IMAGE"
ENV_ADMISSION_LOOKUPS = "PRAESTO_ADMISSION_LOOKUPS"  # "off" (or false, 0, disabled): no API access
ENV_LOOKUP_WATCH_TIMEOUT = "PRAESTO_LOOKUP_WATCH_TIMEOUT"
ENV_LOOKUP_MAX_STALENESS = "PRAESTO_LOOKUP_MAX_STALENESS"
ENV_LOOKUP_COLD_WAIT = "PRAESTO_LOOKUP_COLD_WAIT"
LOOKUPS_OFF = ("off", "false", "0", "disabled")

DEFAULT_IMAGE_REPOSITORY = "ghcr.io/praesto/praesto"
DEFAULT_IMAGE = f"{DEFAULT_IMAGE_REPOSITORY}:{praesto.__version__}"
DEFAULT_DOWNLOADER_RESOURCES: Mapping[str, Any] = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


class ConfigError(ValueError):
    """A bad environment variable: names it, says what is wrong and what to set."""


def _default_resources() -> dict[str, Any]:
    return json.loads(json.dumps(DEFAULT_DOWNLOADER_RESOURCES))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class HooksConfig:
    """The hooks process's settings (sync hooks and admission), one field per environment variable.

    The chart sets the variables on the hooks Deployment (templates/hooks-deployment.yaml);
    tests/test_settings_inventory.py checks the two against each other.
    """

    downloader_image: str = DEFAULT_IMAGE
    downloader_resources: dict[str, Any] = field(default_factory=_default_resources)
    job_backoff_limit: int = 4
    # No ttlSecondsAfterFinished: the finished Job is what says a PVC-mode cache is
    # Ready, and Metacontroller would recreate a Job the TTL controller deleted.
    job_active_deadline_seconds: int = 6 * 3600
    agent_service_account: str = "praesto-node-agent"
    # Who reads a cache's Secrets for the agents: the per-cache grant binds this account, and the
    # broker route (hooks/broker.py) hands a copy's objects only to the agent of that copy's node.
    hooks_service_account: str = "praesto-hooks"
    namespace: str = "praesto-system"
    hf_endpoint: str = ""  # passed to the downloader Job as HF_ENDPOINT when set
    modelscope_endpoint: str = ""  # passed to the downloader Job as MODELSCOPE_ENDPOINT when set
    # lastUsedTime only moves forward in steps this long: a fresh `now` on every
    # sync would change status each time and make Metacontroller resync forever.
    last_used_granularity_seconds: int = 60
    downloader_env: dict[str, str] = field(default_factory=dict)
    downloader_service_account: str = ""  # credentials.identity: a ServiceAccount in each cache namespace
    downloader_pod_labels: dict[str, str] = field(default_factory=dict)  # e.g. azure.workload.identity/use
    ca_bundle_configmap: tuple[str, str] | None = None  # (name, key), mounted optional in the cache namespace
    # Images a ModelCache may name in spec.downloader.image besides downloader_image:
    # exact references, or prefixes ending in "*" (the chart's downloader.allowedImages).
    allowed_downloader_images: tuple[str, ...] = ()
    # chart credentials.namespaces and .sources: who may use the workload identity for what
    # (praesto/credscope.py, the same rule the node agent applies)
    credential_scope: credscope.CredentialScope = field(default_factory=credscope.CredentialScope)
    # The cloud metadata addresses: a downloader Job without the identity gets a NetworkPolicy that
    # denies its Pods egress to them (hooks/pvc_job.py metadata_egress_policy); empty: none.
    denied_egress: tuple[str, ...] = ()
    # chart namespaceQuota: the sync hook enforces it too, in creation order (hooks/modelcache.py)
    quotas: quota.Quotas = field(default_factory=quota.Quotas)
    # PRAESTO_IMAGE: the PVC-mode wait init container the mutating webhook injects: our own image
    image: str = DEFAULT_IMAGE
    # PRAESTO_ADMISSION_LOOKUPS=off: no API access (local development; every lookup then reports
    # itself unavailable)
    admission_lookups: bool = True
    # PRAESTO_LOOKUP_WATCH_TIMEOUT: seconds an admission lookup's watch stays open
    lookup_watch_timeout: int = 300
    # PRAESTO_LOOKUP_MAX_STALENESS: seconds the API may go unanswered before lookups refuse
    lookup_max_staleness: float = 60.0
    # PRAESTO_LOOKUP_COLD_WAIT: seconds a request waits for a freshly started worker's first list
    lookup_cold_wait: float = 2.0
    # PRAESTO_TRUST_DIR, PRAESTO_SIGNATURE_REQUIRED_IN: the platform's signing trust (chart
    # verification.trust, mounted) and the namespaces that accept only signed models (praesto/trustpolicy.py)
    trust_policy: trustpolicy.TrustPolicy = field(default_factory=trustpolicy.TrustPolicy)

    def downloader_image_allowed(self, image: str) -> bool:
        """The downloader Job runs with the cache's Secrets: only images the platform admin chose."""
        if image == self.downloader_image:
            return True
        return any(
            image.startswith(entry[:-1]) if entry.endswith("*") else image == entry
            for entry in self.allowed_downloader_images
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HooksConfig:
        env = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        if env.get(ENV_DOWNLOADER_IMAGE):
            kwargs["downloader_image"] = env[ENV_DOWNLOADER_IMAGE].strip()
        if env.get(ENV_IMAGE):
            kwargs["image"] = env[ENV_IMAGE]
        kwargs["admission_lookups"] = env.get(ENV_ADMISSION_LOOKUPS, "").lower() not in LOOKUPS_OFF
        if env.get(ENV_LOOKUP_WATCH_TIMEOUT):
            kwargs["lookup_watch_timeout"] = _integer(env, ENV_LOOKUP_WATCH_TIMEOUT, 1)
        for name, key in (
            (ENV_LOOKUP_MAX_STALENESS, "lookup_max_staleness"),
            (ENV_LOOKUP_COLD_WAIT, "lookup_cold_wait"),
        ):
            if env.get(name):
                kwargs[key] = _seconds(env, name)
        if env.get(ENV_DOWNLOADER_RESOURCES):
            kwargs["downloader_resources"] = _json_object(env, ENV_DOWNLOADER_RESOURCES)
        for name, key, minimum in (
            (ENV_JOB_BACKOFF_LIMIT, "job_backoff_limit", 0),
            (ENV_JOB_ACTIVE_DEADLINE_SECONDS, "job_active_deadline_seconds", 1),
            (ENV_LAST_USED_GRANULARITY, "last_used_granularity_seconds", 1),
        ):
            if env.get(name):
                kwargs[key] = _integer(env, name, minimum)
        for name, key in (
            (ENV_AGENT_SERVICE_ACCOUNT, "agent_service_account"),
            (ENV_HOOKS_SERVICE_ACCOUNT, "hooks_service_account"),
            (ENV_NAMESPACE, "namespace"),
        ):
            if env.get(name):
                value = env[name].strip()
                if not is_dns_label(value):
                    raise ConfigError(
                        f"{name}: Invalid value: {value!r}: must be a DNS label; "
                        "set it to the name the chart installed"
                    )
                kwargs[key] = value
        for name, key, example in (
            (ENV_HF_ENDPOINT, "hf_endpoint", "https://hf-mirror.example.com"),
            (ENV_MODELSCOPE_ENDPOINT, "modelscope_endpoint", "https://modelscope-mirror.example.com"),
        ):
            if env.get(name):
                endpoint = env[name].strip()
                if not endpoint.startswith(("http://", "https://")):
                    raise ConfigError(
                        f"{name}: Invalid value: {endpoint!r}: must be an http(s) URL; e.g. {example}"
                    )
                kwargs[key] = endpoint
        for name, key in (
            (ENV_DOWNLOADER_ENV, "downloader_env"),
            (ENV_DOWNLOADER_POD_LABELS, "downloader_pod_labels"),
        ):
            if env.get(name):
                kwargs[key] = _string_map(env, name)
        kwargs["credential_scope"] = credscope.CredentialScope.from_env(env)
        try:
            kwargs["quotas"] = quota.from_env(env)
        except quota.QuotaError as error:
            raise ConfigError(str(error)) from None
        if env.get(ENV_DOWNLOADER_DENIED_EGRESS):
            kwargs["denied_egress"] = _cidrs(env, ENV_DOWNLOADER_DENIED_EGRESS)
        if env.get(ENV_DOWNLOADER_ALLOWED_IMAGES):
            kwargs["allowed_downloader_images"] = _string_list(env, ENV_DOWNLOADER_ALLOWED_IMAGES)
        if env.get(ENV_DOWNLOADER_SERVICE_ACCOUNT):
            kwargs["downloader_service_account"] = env[ENV_DOWNLOADER_SERVICE_ACCOUNT].strip()
        if env.get(ENV_CA_BUNDLE_CONFIGMAP):
            name, _, key = env[ENV_CA_BUNDLE_CONFIGMAP].strip().partition("/")
            if not is_dns_label(name) or not key:
                raise ConfigError(
                    f"{ENV_CA_BUNDLE_CONFIGMAP}: Invalid value: {env[ENV_CA_BUNDLE_CONFIGMAP]!r}: "
                    "must be <configmap>/<key>; e.g. corporate-ca/ca.crt"
                )
            kwargs["ca_bundle_configmap"] = (name, key)
        try:
            trust = trustpolicy.load_trust_dir(env.get(names.ENV_TRUST_DIR))
        except (ValueError, OSError) as error:
            raise ConfigError(f"{names.ENV_TRUST_DIR}: {error}") from None
        required = tuple(
            n.strip() for n in env.get(names.ENV_SIGNATURE_REQUIRED_IN, "").split(",") if n.strip()
        )
        kwargs["trust_policy"] = trustpolicy.TrustPolicy(trust, required)
        return cls(**kwargs)


def _json(env: Mapping[str, str], name: str, example: str) -> Any:
    try:
        return json.loads(env[name])
    except json.JSONDecodeError as err:
        raise ConfigError(f"{name}: is not JSON ({err.msg}); set {example}") from None


def _string_map(env: Mapping[str, str], name: str) -> dict[str, str]:
    value = _json(env, name, 'an object such as {"HTTPS_PROXY": "..."}')
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{name}: must be a JSON object of strings")
    return value


def _string_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    value = _json(env, name, 'a list such as ["registry.example.com/praesto/*"]')
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{name}: must be a JSON list of non-empty strings")
    return tuple(v.strip() for v in value)


def _cidrs(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    out = []
    for item in credscope.split_list(env[name]):
        try:
            out.append(str(ipaddress.ip_network(item, strict=True)))
        except ValueError:
            raise ConfigError(
                f"{name}: Invalid value: {item[:80]!r}: must be a CIDR such as 169.254.169.254/32"
            ) from None
    return tuple(out)


def _integer(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env[name].strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: Invalid value: {raw!r}: must be an integer; e.g. 4") from None
    if value < minimum:
        raise ConfigError(f"{name}: Invalid value: {value}: must be at least {minimum}")
    return value


def _seconds(env: Mapping[str, str], name: str) -> float:
    raw = env[name].strip()
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: Invalid value: {raw!r}: must be a number of seconds; e.g. 60") from None
    if not value >= 0:
        raise ConfigError(f"{name}: Invalid value: {raw!r}: must be at least 0 seconds")
    return value


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any]:
    value = _json(env, name, 'a ResourceRequirements object such as {"requests": {"cpu": "250m"}}')
    if not isinstance(value, dict) or not set(value) <= {"requests", "limits", "claims"}:
        raise ConfigError(
            f"{name}: must be a Kubernetes ResourceRequirements object with requests and/or limits"
        )
    return value


def environment() -> dict[str, str]:
    """The process environment, taken once by an edge of this package that builds its own settings
    from it (praesto-orphans: hooks/orphans/settings.py); read here, the hooks' settings module."""
    return dict(os.environ)
