"""Which caches the cluster-wide credentials may serve: one rule for the node agent, the hooks and the chart.

The platform admin opts namespaces in (chart credentials.namespaces) and may narrow the
sources to URI prefixes (credentials.sources), so an opted-in namespace still cannot read
everything the organisation's credential can. A cache that names its own Secret never
gets the cluster's credentials at all (README "Security model"). The agent (local mode)
and the hooks (the PVC-mode Job's ServiceAccount and identity env) both ask `entitled`;
the chart creates the downloader ServiceAccount only in opted-in namespaces and refuses
`credentials.identity.downloaderNamespaces` outside them (tests/chart check it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ENV_NAMESPACES = "PRAESTO_CREDENTIALS_NAMESPACES"  # comma-separated
ENV_SOURCES = "PRAESTO_CREDENTIALS_SOURCES"  # comma-separated URI prefixes
ENV_IDENTITY = "PRAESTO_WORKLOAD_IDENTITY"  # "true": this process may use the cluster's workload identity
# What a workload identity reads from a process environment, per store: a process not entitled
# to the cluster's identity (origins/objstore/creds.py store_config, the PVC-mode Job's env) gets none of these.
IDENTITY_ENV = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_FEDERATED_TOKEN_FILE",
    ENV_IDENTITY,
)
# Every variable origins/objstore/creds.py store_config (and its client_options) reads from a process
# environment: the identity above, the region and account defaults, the CA files and the proxies. The
# edge keeps only these (download/api.py StoreEnvironment.of), so nothing below it holds the whole
# environment; tests/download/test_store_environment.py checks creds.py reads no other name.
STORE_ENV = (
    *IDENTITY_ENV,
    "AWS_REGION",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "PRAESTO_CA_BUNDLE",  # names.ENV_CA_BUNDLE
    "SSL_CERT_FILE",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
)
# Characters that end a whole segment of a source URI: a path separator, or the
# revision separator of hf://org/name:revision. A prefix matches only up to one of them.
SEGMENT_ENDS = ("/", ":")


def split_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def source_within(uri: str, prefixes: Iterable[str]) -> bool:
    """True when no prefixes are set, or `uri` lies inside one of them by whole segments.

    `s3://models` covers `s3://models` and `s3://models/llama`, never `s3://models-private`;
    a prefix that ends in "/" (`hf://my-org/`) covers what is below it.
    """
    listed = tuple(prefixes)
    return not listed or any(_within(uri, prefix) for prefix in listed)


def _within(uri: str, prefix: str) -> bool:
    if not prefix or not uri.startswith(prefix):
        return False
    rest = uri[len(prefix) :]
    return not rest or prefix.endswith(SEGMENT_ENDS) or rest.startswith(SEGMENT_ENDS)


@dataclass(frozen=True)
class CredentialScope:
    """The chart's credentials.namespaces and credentials.sources."""

    namespaces: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CredentialScope:
        return cls(split_list(env.get(ENV_NAMESPACES, "")), split_list(env.get(ENV_SOURCES, "")))

    def entitled(self, namespace: str, uri: str) -> bool:
        """Whether a cache of `namespace` without a secretRef may use the cluster's Secret or identity
        for source `uri`. No namespace is entitled unless the platform admin listed it."""
        return namespace in self.namespaces and source_within(uri, self.sources)
