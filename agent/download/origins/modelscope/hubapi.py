"""ModelScope's hub API as its own client calls it, with every answer bounded before it is parsed.

Endpoints and fields, as `modelscope.snapshot_download` uses them (modelscope 1.40.2 delegates its
hub code to modelscope-hub 0.5.1; files named are in that package):

* the endpoint: `MODELSCOPE_ENDPOINT` (config.py `ENV_ENDPOINT`; `MODELSCOPE_DOMAIN` is its
  deprecated form), default https://modelscope.cn (constants.py `DEFAULT_ENDPOINT`); every API path
  is under `/api/v1` (constants.py `LEGACY_API_PREFIX`).
* the token: `Authorization: Bearer <token>` on every API call (_legacy_api.py `_headers`); the
  client also sets it as the `m_session_id` cookie for older endpoints (`_ensure_session_auth`).
* revisions: `GET /api/v1/models/{owner}/{name}/revisions` -> `Data.RevisionMap.{Branches,Tags}[]`
  with `Revision` (the name) (_legacy_api.py `list_revisions_detail`); the default is `master`
  (_download.py `download_repo`). The client passes a ref through unpinned; to pin one we read the
  ref's `CommitId` when the hub gives it (a field neither package reads), else the `Revision` every
  file entry at the ref names (plan.py `resolve`: each entry's own last commit, so it pins only when
  they all agree).
* the file list: `GET /api/v1/models/{owner}/{name}/repo/files?Revision=<rev>&Recursive=True` ->
  `Data.Files[]` with `Path`, `Type` ("tree" for folders), `Size`, `Sha256`
  (_legacy_api.py `_list_files_page`; _download.py `download_repo` reads exactly these), and
  `Revision`: the file's last commit (modelscope 1.40.2 hub/info.py `RepoSibling.sha`; its
  hub/utils/caching.py keys each cached file on Path + Revision, "# commit id"). The hub
  silently cuts a listing at 3000 entries (constants.py `REPO_FILES_TRUNCATION_LIMIT`).
* the bytes: `GET /api/v1/models/{owner}/{name}/repo?Revision=<rev>&FilePath=<path>` with `Range`
  (_legacy_api.py `get_download_url`, _download.py `_download_with_resume`); LFS files answer a
  302 to object storage (`_probe_redirect_url`, a HEAD without redirects).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

from praesto.agent.download.api import (
    LastingDownloadError,
    Options,
    TemporaryDownloadError,
    hub_refused_token,
)
from praesto.agent.download.http import Transient, Transport, redact

from praesto import names
from praesto.quantity import format_bytes

DEFAULT_ENDPOINT = "https://modelscope.cn"
API_PREFIX = "/api/v1"
DEFAULT_REVISION = "master"
LISTING_LIMIT = 3000  # entries per file list: the hub cuts there without saying so
MAX_LISTING_BYTES = 64 << 20  # a file list's body: MAX_FILES entries of ~400 bytes fit, a flood does not
MAX_REVISIONS_BYTES = 4 << 20  # a revisions answer: thousands of branches and tags
ENV_ENDPOINT = names.ENV_MODELSCOPE_ENDPOINT  # the client's own variable (config.py ENV_ENDPOINT)
ENV_TOKEN = names.ENV_MODELSCOPE_TOKEN  # MODELSCOPE_API_TOKEN: the client's token variable (config.py)


def endpoint_of(options: Options) -> str:
    """The hub to ask: MODELSCOPE_ENDPOINT as the process edge took it (`praesto-agent run
    --modelscope-endpoint`, chart downloader.modelscopeEndpoint; the download CLI's environment),
    else modelscope.cn: the download settings' typed field (`EngineSettings.modelscope_endpoint`)."""
    return (options.modelscope_endpoint or DEFAULT_ENDPOINT).rstrip("/")


def repo_url(endpoint: str, location: str, tail: str, **query: str) -> str:
    owner, _, name = location.partition("/")
    base = f"{endpoint}{API_PREFIX}/models/{quote(owner, safe='')}/{quote(name, safe='')}/{tail}"
    return f"{base}?{urlencode(query)}" if query else base


def file_url(endpoint: str, location: str, revision: str, path: str) -> str:
    """Where a file's bytes are (the client's `get_download_url`, quote_plus'd the same way)."""
    owner, _, name = location.partition("/")
    return (
        f"{endpoint}{API_PREFIX}/models/{quote(owner, safe='')}/{quote(name, safe='')}/repo"
        f"?Revision={quote_plus(revision)}&FilePath={quote_plus(path)}"
    )


def get_data(transport: Transport, url: str, uri: str, limit: int, options: Options) -> Any:
    """`Data` of one API answer, its body read up to `limit` bytes; errors as download reasons."""
    try:
        resp = transport.request("GET", url, authorized=True)
        try:
            body = resp.read(limit + 1)
        finally:
            resp.close()
    except Transient as error:
        raise TemporaryDownloadError(
            "SourceUnavailable", f"{uri}: the hub could not be reached ({error}); it will be retried"
        ) from None
    if resp.status != 200:
        raise _refusal(resp.status, uri, url, options)
    if len(body) > limit:
        raise LastingDownloadError(
            "SourceUnavailable",
            f"{uri}: the hub's answer at {redact(url)} is over {format_bytes(limit)}, more than any "
            "model's needs; check the endpoint (MODELSCOPE_ENDPOINT) is a ModelScope hub",
        )
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or "Data" not in payload:
        raise LastingDownloadError(
            "SourceUnavailable",
            f"{uri}: {redact(url)} did not answer ModelScope's JSON envelope (Data); check the endpoint",
        )
    return payload["Data"]


def _refusal(status: int, uri: str, url: str, options: Options) -> Exception:
    if status == 429 or status >= 500:
        return TemporaryDownloadError(
            "SourceUnavailable", f"{uri}: the hub answered HTTP {status}; it will be retried"
        )
    if status == 401:
        return hub_refused_token(uri, bool(options.token))
    if status == 403:
        return LastingDownloadError("Unauthorized", f"{uri}: access forbidden (HTTP 403); check the token")
    if status == 404:
        return LastingDownloadError(
            "RepoNotFound",
            f"{uri} (or the revision asked) does not exist, or this token cannot see it; "
            "check the repo name, revision and token",
        )
    return LastingDownloadError("SourceUnavailable", f"{uri}: {redact(url)} answered HTTP {status}")


__all__ = [
    "API_PREFIX",
    "DEFAULT_ENDPOINT",
    "DEFAULT_REVISION",
    "ENV_ENDPOINT",
    "ENV_TOKEN",
    "LISTING_LIMIT",
    "MAX_LISTING_BYTES",
    "MAX_REVISIONS_BYTES",
    "endpoint_of",
    "file_url",
    "get_data",
    "repo_url",
]
