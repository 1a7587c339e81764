"""Resolve a Hugging Face source to one commit and the exact files to fetch.

Metadata goes through `huggingface_hub` (the Hub's own client, so its URL and error
conventions are not re-implemented here): `model_info` resolves the revision to a
commit, `list_repo_tree(recursive=True)` at that commit lists every file with its
size, git blob id and, for LFS files, sha256. Bytes never go through it (see engine).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import httpx2
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._paths import filter_repo_objects
from praesto.agent.download.api import (
    SUMMARY,
    DownloadError,
    LastingDownloadError,
    Options,
    Plan,
    RemoteFile,
    TemporaryDownloadError,
    check_file_count,
    hub_refused_token,
)
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressRefused
from praesto.agent.download.origins.huggingface import hubclient
from praesto.agent.download.origins.huggingface.endpoint import endpoint_of
from praesto.agent.download.repopath import check_repo_path

from praesto.spec import Source

log = logging.getLogger("praesto.download")

# The agent reports nothing to the Hub. With telemetry on, huggingface_hub 2.4 builds each
# user agent by fetching huggingface.co/api/agent-harnesses once per process
# (utils/_detect_agent.py `_fetch_registry`, from `constants.ENDPOINT`, not the HfApi's
# endpoint): behind a mirror the first plan waited on a host nobody configured (3 s, plus
# DNS), and an air-gapped cluster's nodes reached for huggingface.co. Set here, where the
# library is imported, so the CLI and the agent both get it; read at call time
# (utils/_headers.py `_http_user_agent`).
constants.HF_HUB_DISABLE_TELEMETRY = True
hubclient.install()  # its connections under the egress rule of the plan on each thread (hubclient.py)
FEWER_HUB_FILES = "select fewer with spec.source.huggingface.allowPatterns or ignorePatterns"


def plan(source: Source, options: Options) -> Plan:
    """The commit `source.revision` points to and every file to fetch (after patterns)."""
    if source.scheme != "hf":
        raise LastingDownloadError(
            "SourceUnavailable",
            f"{source.uri}: not a Hugging Face source; praesto.agent.download.fetch.plan() plans object stores",
        )
    endpoint = endpoint_of(options)
    revision = source.revision or "main"
    api = HfApi(endpoint=endpoint, token=options.token or False, library_name="praesto")
    # the Hub the platform configured is trusted as it is; where it redirects is checked
    with hubclient.applied(options.egress.trusting(endpoint)):
        return _plan_at(api, endpoint, source, revision, options)


def _plan_at(api: HfApi, endpoint: str, source: Source, revision: str, options: Options) -> Plan:
    try:
        info = api.model_info(source.location, revision=revision)
        commit = info.sha
        if not commit:
            raise LastingDownloadError("SourceUnavailable", f"{endpoint} returned no commit for {source.uri}")
        entries = [
            e
            for e in api.list_repo_tree(source.location, recursive=True, revision=commit)
            if isinstance(e, RepoFile)
        ]
        files = _select(entries, source, xet=options.xet)
        check_file_count(source.uri, len(files), options.max_files, FEWER_HUB_FILES)
        if info.gated and files:
            _probe_access(api, source, commit, files[0].path)
    except DownloadError:
        raise
    except Exception as error:  # every metadata failure becomes one reason
        raise translate_error(error, source, revision, options) from None
    log.info(
        "planned source=%s revision=%s commit=%s files=%d",
        source.uri, revision, commit, len(files), extra=SUMMARY,
    )  # fmt: skip
    return Plan(source=source.with_revision(revision), revision=commit, files=tuple(files))


def _xet_hash(entry: RepoFile) -> str | None:
    """The tree entry's `xetHash` (huggingface_hub hf_api.py `RepoFile.xet_hash`), when it is one:
    64 hex digits, as huggingface_hub's `is_valid_xet_hash` wants; it goes into the CAS's URL path,
    so anything else is dropped here (the file then comes through resolve/)."""
    value = entry.xet_hash
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return value.lower()
    return None


def _select(entries: Iterable[RepoFile], source: Source, *, xet: bool = False) -> list[RemoteFile]:
    chosen = filter_repo_objects(
        entries,
        allow_patterns=list(source.allow_patterns) or None,
        ignore_patterns=list(source.ignore_patterns) or None,
        key=lambda e: e.path,
    )
    out = []
    for entry in chosen:
        path = check_repo_path(entry.path)
        if entry.lfs is not None:
            xet_hash = _xet_hash(entry) if xet else None
            out.append(RemoteFile(path, int(entry.lfs.size), sha256=entry.lfs.sha256, xet_hash=xet_hash))
        else:
            out.append(RemoteFile(path, int(entry.size), git_sha1=entry.blob_id))
    return sorted(out, key=lambda f: f.path)


def _probe_access(api: HfApi, source: Source, commit: str, path: str) -> None:
    """Gated repos list their files to anyone; only a file fetch tells whether we may read them."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(source.location, path, revision=commit, endpoint=api.endpoint)
    get_hf_file_metadata(url, token=api.token, endpoint=api.endpoint)


def translate_error(error: BaseException, source: Source, revision: str, options: Options) -> DownloadError:
    """Hub client errors as the reasons the agent puts on conditions (never with the token)."""
    uri = source.uri
    if isinstance(error, EgressRefused):
        return LastingDownloadError(REASON_EGRESS_REFUSED, f"{uri}: {error}")
    status = error.response.status_code if isinstance(error, HfHubHTTPError) else None
    if isinstance(error, GatedRepoError):
        return LastingDownloadError(
            "GatedRepo",
            f"{uri} is gated and {'this token has' if options.token else 'no token was given, so we have'} "
            "not been granted access; accept the repo's conditions on the Hub with the token's account "
            "and reference that token",
        )
    if isinstance(error, RevisionNotFoundError):
        return LastingDownloadError(
            "RevisionNotFound", f"{uri} has no branch, tag or commit {revision!r}; fix the revision"
        )
    if isinstance(error, RepositoryNotFoundError) or status == 401:
        if status == 401:
            return hub_refused_token(uri, bool(options.token))
        return LastingDownloadError(
            "RepoNotFound",
            f"{uri} does not exist or this token cannot see it; check the repo name and the token's access",
        )
    if status == 403:
        return LastingDownloadError(
            "Unauthorized", f"{uri}: access forbidden (HTTP 403); check the token's permissions"
        )
    if isinstance(error, HfHubHTTPError | httpx2.HTTPError | OSError):
        detail = f"HTTP {status}" if status else type(error).__name__
        return TemporaryDownloadError(
            "SourceUnavailable",
            f"{uri}: the Hub at {endpoint_of(options)} could not be reached ({detail}); it will be retried",
        )
    return LastingDownloadError(
        "SourceUnavailable", f"{uri}: unexpected metadata error {type(error).__name__}"
    )
