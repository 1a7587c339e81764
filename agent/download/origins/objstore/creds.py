"""Object-store credentials: (scheme, Secret keys, environment) -> the store client's settings.

Pure: the node agent passes a Secret's data and annotations (`settings_from_secret`), the
PVC-mode Job and users pass environment variables and files (`settings_from_env`); both
end in `store_config()`, so the Secret contract is written once (README "Credentials").

Key contract (Secret data keys; in the agent, annotations too):
* S3: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` [+ `AWS_SESSION_TOKEN`]; optional
  `AWS_ENDPOINT_URL` (or `S3_ENDPOINT` host[:port] with `S3_USE_HTTPS`), `AWS_REGION`,
  `S3_VERIFY_SSL` ("0" turns TLS verification off), `S3_VIRTUAL_HOSTED_STYLE` ("1"; path
  style is the default, what S3-compatible stores expect), `S3_VERIFY_ETAG_MD5` ("0" for
  SSE-KMS/SSE-C buckets, whose ETags are not MD5s). KServe's Secret annotations
  `serving.kserve.io/s3-{endpoint,region,usehttps,verifyssl}` and the same under
  `praesto.io/` are read by the agent (data keys win; the PVC Job only sees data keys).
* GCS: `gcloud-application-credentials.json` (a service-account key file); optional
  `GOOGLE_BASE_URL` (an http(s) URL: a GCS-compatible endpoint or emulator, e.g.
  fake-gcs-server; a key file's own `gcs_base_url` works too).
* Azure: `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCESS_KEY`, or with
  `AZURE_CLIENT_ID` + `AZURE_TENANT_ID` + `AZURE_CLIENT_SECRET` (a service principal;
  `AZURE_SUBSCRIPTION_ID` is accepted and not needed); optional `AZURE_STORAGE_ENDPOINT`.

No credential at all (no Secret, no workload identity) means anonymous requests
(`skip_signature`), never the cloud metadata endpoints: a refusal then becomes
`WaitingForCredentials`. Values are never part of any message or repr.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from praesto.agent.download.api import LastingDownloadError

from praesto import credscope, names

GCS_KEY_FILE = "gcloud-application-credentials.json"
ENV_IDENTITY = credscope.ENV_IDENTITY  # "true": the chart configured credentials.identity
ENV_CA_FILE = names.ENV_CA_BUNDLE  # extra CA bundle (PEM) every download trusts

S3_SETTINGS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "S3_ENDPOINT",
    "S3_USE_HTTPS",
    "S3_VERIFY_SSL",
    "S3_VIRTUAL_HOSTED_STYLE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "S3_VERIFY_ETAG_MD5",
)
AZURE_SETTINGS = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_SUBSCRIPTION_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_ENDPOINT",
)
GCS_SETTINGS = (GCS_KEY_FILE, "GOOGLE_BASE_URL")
SETTINGS = (*S3_SETTINGS, *AZURE_SETTINGS, *GCS_SETTINGS, "HF_TOKEN")

# Secret annotations -> setting; praesto.io/ entries are applied after (and win over) KServe's.
ANNOTATIONS: tuple[tuple[str, str], ...] = tuple(
    (f"{prefix}/{suffix}", setting)
    for prefix in ("serving.kserve.io", "praesto.io")
    for suffix, setting in (
        ("s3-endpoint", "S3_ENDPOINT"),
        ("s3-region", "AWS_REGION"),
        ("s3-usehttps", "S3_USE_HTTPS"),
        ("s3-verifyssl", "S3_VERIFY_SSL"),
        ("s3-virtual-hosted-style", "S3_VIRTUAL_HOSTED_STYLE"),
        ("s3-verify-etag-md5", "S3_VERIFY_ETAG_MD5"),
        ("azure-storage-account", "AZURE_STORAGE_ACCOUNT_NAME"),
    )
)
FALSE = ("0", "false", "no", "off")


def settings_from_secret(data: Mapping[str, str], annotations: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's decoded data over its annotations: data keys win."""
    out = {setting: annotations[key] for key, setting in ANNOTATIONS if annotations and key in annotations}
    out.update({k: v.strip() if k != GCS_KEY_FILE else v for k, v in data.items() if k in SETTINGS})
    return out


def settings_from_env(env: Mapping[str, str], directory: Path | None = None) -> dict[str, str]:
    """The download CLI's settings: known environment variables, then files of a mounted Secret."""
    out = {k: env[k] for k in SETTINGS if env.get(k)}
    if directory is not None:
        for key in SETTINGS:
            path = directory / key
            if path.is_file():
                out[key] = path.read_text() if key == GCS_KEY_FILE else path.read_text().strip()
    return out


@dataclass(frozen=True)
class StoreConfig:
    """What `obstore` needs to open one bucket; `credentialed` is False for anonymous access."""

    scheme: str
    bucket: str
    config: dict[str, Any] = field(repr=False)
    client_options: dict[str, Any] = field(repr=False)
    credentialed: bool
    described: str  # where the credential came from, for messages (never its value)
    etag_md5: bool = False  # S3: a single-part ETag is the MD5 (not with SSE-KMS/SSE-C: set "0")
    # URLs the settings name that the store client will contact (an endpoint, a key file's
    # token_uri): the tenant's, so objplan checks them under the egress rule before opening the store.
    contacts: tuple[str, ...] = ()

    @property
    def retry(self) -> dict[str, Any]:
        # Few store-level retries: the engine retries transient failures itself, with resume.
        return {"max_retries": 2, "retry_timeout": timedelta(seconds=30)}


def _need(settings: Mapping[str, str], keys: tuple[str, ...], where: str) -> None:
    have = [k for k in keys if settings.get(k)]
    if have and len(have) < len(keys):
        missing = ", ".join(k for k in keys if k not in have)
        raise LastingDownloadError(
            "WaitingForCredentials",
            f"{where} has {', '.join(have)} but not {missing}; add {missing} to it",
        )


def client_options(endpoint_http: bool, verify: bool, env: Mapping[str, str]) -> dict[str, Any]:
    """TLS trust, proxies and timeouts shared by every store (chart: downloads.caBundle, proxy)."""
    opts: dict[str, Any] = {"connect_timeout": timedelta(seconds=10), "timeout": timedelta(seconds=300)}
    if endpoint_http:
        opts["allow_http"] = True
    if not verify:
        opts["allow_invalid_certificates"] = True
    ca_file = env.get(ENV_CA_FILE) or env.get("SSL_CERT_FILE")
    if ca_file and os.path.isfile(ca_file):
        opts["root_certificate"] = Path(ca_file).read_text()
    proxy = env.get("HTTPS_PROXY") or env.get("https_proxy") or env.get("HTTP_PROXY") or env.get("http_proxy")
    if proxy:
        opts["proxy_url"] = proxy
        excludes = env.get("NO_PROXY") or env.get("no_proxy")
        if excludes:
            opts["proxy_excludes"] = excludes
    return opts


def _url(value: str, key: str, where: str, example: str) -> str:
    """An endpoint setting, checked: http(s) only (the client would fail later, less clearly)."""
    if value and not value.startswith(("http://", "https://")):
        raise LastingDownloadError(
            "SourceUnavailable", f"{where}: {key} must be an http(s) URL; e.g. {example}"
        )
    return value.rstrip("/")


ENDPOINT_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "S3_ENDPOINT",
    "GOOGLE_BASE_URL",
    "AZURE_STORAGE_ENDPOINT",
)
IDENTITY_ENV = credscope.IDENTITY_ENV
STORE_ENV = credscope.STORE_ENV  # every name `env` below is read for (the edge keeps only these)


def store_config(
    scheme: str,
    bucket: str,
    settings: Mapping[str, str],
    env: Mapping[str, str],
    where: str,
    *,
    identity_allowed: bool = True,
) -> StoreConfig:
    """Map settings (from `where`, e.g. "Secret ns/name") to a store config; raises DownloadError.

    The cluster's workload identity is used only when `identity_allowed` (the cache
    named no Secret of its own) and never together with an endpoint that `settings`
    name: a Secret's endpoint gets that Secret's credential or none, so a tenant
    cannot point the cluster's credentials at a server of theirs.
    """
    if not identity_allowed or any(settings.get(k) for k in ENDPOINT_KEYS):
        env = {k: v for k, v in env.items() if k not in IDENTITY_ENV}
    identity = env.get(ENV_IDENTITY, "").lower() == "true"
    if scheme == "s3":
        return _s3(bucket, settings, env, where, identity)
    if scheme == "gs":
        return _gcs(bucket, settings, env, where, identity)
    if scheme == "az":
        return _azure(bucket, settings, env, where, identity)
    raise LastingDownloadError(
        "SourceUnavailable", f"{scheme}:// is not an object store; use s3://, gs:// or az://"
    )


def _s3(bucket: str, s: Mapping[str, str], env: Mapping[str, str], where: str, identity: bool) -> StoreConfig:
    _need(s, ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), where)
    config: dict[str, Any] = {
        "region": s.get("AWS_REGION") or s.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
        "virtual_hosted_style_request": s.get("S3_VIRTUAL_HOSTED_STYLE", "").lower() in ("1", "true", "yes"),
    }
    endpoint = s.get("AWS_ENDPOINT_URL_S3") or s.get("AWS_ENDPOINT_URL") or ""
    if not endpoint and s.get("S3_ENDPOINT"):
        host = s["S3_ENDPOINT"]
        secure = s.get("S3_USE_HTTPS", "1").lower() not in FALSE
        endpoint = host if "://" in host else f"{'https' if secure else 'http'}://{host}"
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise LastingDownloadError(
                "SourceUnavailable",
                f"{where}: the S3 endpoint must be an http(s) URL or host[:port]; e.g. https://minio.example:9000",
            )
        config["endpoint"] = endpoint.rstrip("/")
    described = where
    if s.get("AWS_ACCESS_KEY_ID"):
        config["access_key_id"] = s["AWS_ACCESS_KEY_ID"]
        config["secret_access_key"] = s["AWS_SECRET_ACCESS_KEY"]
        if s.get("AWS_SESSION_TOKEN"):
            config["session_token"] = s["AWS_SESSION_TOKEN"]
        credentialed = True
    elif env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        config["web_identity_token_file"] = env["AWS_WEB_IDENTITY_TOKEN_FILE"]
        config["role_arn"] = env["AWS_ROLE_ARN"]
        credentialed, described = True, "the workload identity (IRSA)"
    elif identity or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        credentialed, described = True, "the workload identity"  # EKS Pod Identity: the store's own chain
    else:
        config["skip_signature"] = True
        credentialed, described = False, "no credentials"
    verify = s.get("S3_VERIFY_SSL", "1").lower() not in FALSE
    http = endpoint.startswith("http://") or s.get("AWS_ALLOW_HTTP", "").lower() == "true"
    md5 = s.get("S3_VERIFY_ETAG_MD5", "1").lower() not in FALSE
    opts = client_options(http, verify, env)
    return StoreConfig("s3", bucket, config, opts, credentialed, described, md5, _contacts(endpoint))


def _gcs(
    bucket: str, s: Mapping[str, str], env: Mapping[str, str], where: str, identity: bool
) -> StoreConfig:
    config: dict[str, Any] = {}
    contacts: tuple[str, ...] = ()
    endpoint = _url(s.get("GOOGLE_BASE_URL", ""), "GOOGLE_BASE_URL", where, "https://gcs.example:4443")
    if endpoint:
        config["base_url"] = endpoint
    key = s.get(GCS_KEY_FILE)
    if key:
        try:
            parsed = json.loads(key)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict) or "private_key" not in parsed:
            raise LastingDownloadError(
                "WaitingForCredentials",
                f"{where}: {GCS_KEY_FILE} is not a service-account key file (JSON with private_key); "
                "store the key file Google issued under that key",
            )
        config["service_account_key"] = key
        endpoint = endpoint or str(parsed.get("gcs_base_url") or "")  # the key file may name its endpoint
        contacts += (str(parsed.get("token_uri") or ""),)  # where the client trades the key for a token
        credentialed, described = True, where
    elif identity or env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        credentialed, described = True, "the workload identity"
    else:
        config["skip_signature"] = True
        credentialed, described = False, "no credentials"
    opts = client_options(endpoint.startswith("http://"), True, env)
    return StoreConfig(
        "gs", bucket, config, opts, credentialed, described, contacts=_contacts(endpoint, *contacts)
    )


def _azure(
    bucket: str, s: Mapping[str, str], env: Mapping[str, str], where: str, identity: bool
) -> StoreConfig:
    _need(s, ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"), where)
    account = s.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise LastingDownloadError(
            "WaitingForCredentials",
            f"az://{bucket} needs the storage account name: add AZURE_STORAGE_ACCOUNT_NAME to {where} "
            "(or the annotation praesto.io/azure-storage-account)",
        )
    config: dict[str, Any] = {"account_name": account}
    example = "http://127.0.0.1:10000/devstoreaccount1 (Azurite)"
    endpoint = _url(s.get("AZURE_STORAGE_ENDPOINT", ""), "AZURE_STORAGE_ENDPOINT", where, example)
    if endpoint:
        config["endpoint"] = endpoint
    described = where
    if s.get("AZURE_STORAGE_ACCESS_KEY"):
        config["account_key"] = s["AZURE_STORAGE_ACCESS_KEY"]
        credentialed = True
    elif s.get("AZURE_CLIENT_SECRET"):
        config.update(
            client_id=s["AZURE_CLIENT_ID"],
            tenant_id=s["AZURE_TENANT_ID"],
            client_secret=s["AZURE_CLIENT_SECRET"],
        )
        credentialed = True
    elif env.get("AZURE_FEDERATED_TOKEN_FILE") and env.get("AZURE_CLIENT_ID"):
        config.update(
            federated_token_file=env["AZURE_FEDERATED_TOKEN_FILE"],
            client_id=env["AZURE_CLIENT_ID"],
            tenant_id=env.get("AZURE_TENANT_ID", ""),
        )
        credentialed, described = True, "the workload identity"
    else:
        config["skip_signature"] = True
        credentialed, described = False, "no credentials"
    opts = client_options(endpoint.startswith("http://"), True, env)
    return StoreConfig("az", bucket, config, opts, credentialed, described, contacts=_contacts(endpoint))


def _contacts(*urls: str) -> tuple[str, ...]:
    return tuple(u for u in urls if u)
