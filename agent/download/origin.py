"""What the download engine needs from one source kind: the `Origin` protocol (issue 39 item 1).

A kind (Hugging Face, object stores, OCI registries, ModelScope, ...) lives in one package under
`praesto.agent.download.origins`, whose `__init__.py` is the table mapping each URI scheme to it.
This protocol sits in the download core, beside access.py, so the kinds build on the core alone:
the table imports the kinds, the kinds import the core, and nothing points back. Nothing else in the agent names a kind: the engine (engine.py), the dispatcher
(fetch/), the credential policy (agent/credentials.py), the download CLI and the origin
budget ask an `Origin` through that table. An origin package exposes `origin() -> Origin`.

What an origin answers, and who asks:

* `plan(source, options) -> Plan`: the exact revision and every file with its size and the digest
  the origin publishes before a byte is fetched (`RemoteFile.sha256`, else `git_sha1`/`digest`);
  no bytes yet, so capacity is checked first (fetch.plan). Raise `LastingDownloadError` /
  `TemporaryDownloadError` with a reason from `api.REASONS`.
* `open(plan, options) -> Access`: how one download reaches its files' bytes: the byte source that
  serves ranges (`ByteSource`: its connections, headers and credential, under the egress rule),
  the URL (or key) each file's bytes are at, and optionally a whole-file route (Xet). `Access`
  and `WholeFileRoute` live in access.py (re-exported here). The engine
  fetches ranges, resumes, dedups, asks peers and verifies; the origin budget wraps the byte
  source; the origin never sees staging.
* `host(plan, options) -> str`: what the cluster-wide origin budget's `perHost` and Retry-After
  count by (agent/budget/origin_budget.py): one host or bucket-at-endpoint per real origin.
* `credential`: the shape of this kind's credential (`CredentialShape`), which says how a
  credentials Secret (the cache's own secretRef, or the chart's credentials Secret) and the
  download CLI's inputs become the `Options.token` / `Options.credentials` the origin reads.

Egress: the origin builds its byte source with `options.egress.trusting(<the endpoint the
platform configured>)` (`http_transport` does), so redirects and tenant-chosen hosts stay checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from praesto.agent.download.access import Access, WholeFileRoute
from praesto.agent.download.api import Options, Plan
from praesto.agent.download.http import Transport

from praesto import kinds
from praesto.spec import Source

# The forms a kind's credential takes (`CredentialShape.form`): the control plane's words for the
# same shapes (praesto/kinds.py `Credential.shape`), so both sides of a kind say it alike.
# A bearer token in one Secret key (Hugging Face); the CLI: --token-file / $HF_TOKEN.
TOKEN = kinds.TOKEN
# Client settings, one per Secret key (object stores); the CLI: the environment, --credentials-dir.
SETTINGS = kinds.KEYS
# A Docker config JSON (OCI); the CLI: --registry-config, else the mounted Secret's key.
REGISTRY_LOGIN = kinds.FILE
CREDENTIAL_FORMS = (TOKEN, SETTINGS, REGISTRY_LOGIN)

SecretSettings = Callable[[Mapping[str, str], "Mapping[str, str] | None"], dict[str, str]]
EnvSettings = Callable[[Mapping[str, str], "Path | None"], dict[str, str]]


@dataclass(frozen=True)
class CredentialShape:
    """How this kind's credential is read; agent/credentials.py and the download CLI follow it.

    TOKEN: the cache's own Secret gives `Options.token` from key `secretRef.key`, else `key`, else
    (key None) HF_TOKEN then token (KubeApi.read_token); the chart's credentials Secret from
    `cluster_key`. SETTINGS: every key `from_secret` knows (Secret data over its annotations) goes
    to `Options.credentials`; the CLI reads them with `from_env` (environment, --credentials-dir).
    REGISTRY_LOGIN: the Docker config JSON in key `secretRef.key`, else `key`, as
    `Options.credentials[cluster_key]`; the chart's Secret's `cluster_key` likewise.
    """

    form: str  # one of CREDENTIAL_FORMS
    key: str | None = None  # TOKEN / REGISTRY_LOGIN: the Secret key when the secretRef names none
    cluster_key: str = ""  # TOKEN / REGISTRY_LOGIN: the key of the chart's credentials Secret
    from_secret: SecretSettings | None = None  # SETTINGS: (data, annotations) -> settings
    from_env: EnvSettings | None = None  # SETTINGS: (environment, --credentials-dir) -> settings

    def __post_init__(self) -> None:
        assert self.form in CREDENTIAL_FORMS, self.form
        assert self.form != SETTINGS or (self.from_secret is not None and self.from_env is not None)


class Origin(Protocol):
    """One source kind, as the downloader asks it (module docstring)."""

    credential: CredentialShape

    def plan(self, source: Source, options: Options) -> Plan:
        """`source` at its revision: the exact revision and every file to fetch (after patterns)."""
        ...

    def open(self, plan: Plan, options: Options) -> Access:
        """The byte source, file locations and whole-file route for one download of `plan`."""
        ...

    def host(self, plan: Plan, options: Options) -> str:
        """What the origin budget counts `plan`'s origin requests by (perHost, Retry-After)."""
        ...


def http_transport(
    endpoint: str, token: str | None, options: Options, *, egress_trusting: str = ""
) -> Transport:
    """The engine's HTTP byte source for an origin at `endpoint` (keep-alive ranged GETs; `token` as
    `Authorization: Bearer` to that origin only, never to a redirect's host), under the process's CA
    bundle, proxies and egress rule, with `egress_trusting` (default `endpoint`) trusted as configured."""
    return Transport(
        endpoint, token, ca_bundle=options.ca_bundle, proxies=options.proxies,
        egress=options.egress.trusting(egress_trusting or endpoint),
    )  # fmt: skip


__all__ = [
    "CREDENTIAL_FORMS",
    "REGISTRY_LOGIN",
    "SETTINGS",
    "TOKEN",
    "Access",
    "CredentialShape",
    "Origin",
    "WholeFileRoute",
    "http_transport",
]
