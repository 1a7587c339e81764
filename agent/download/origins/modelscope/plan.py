"""Resolve a ModelScope source to one commit and the exact files to fetch, each with its sha256.

The revision is pinned first (a 40-hex commit as it is; a branch or tag through the hub's
revisions list, or the commit its file list names: `resolve`), then the file list is read at that
commit, so every node that is handed the commit lists and fetches the same bytes. The file list is tenant-influenced input (the repo's
owner writes it, the endpoint may be any hub): its body, entry count, paths, sizes and digests are
checked here before a plan exists, as the Hugging Face planner checks the Hub's tree.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable
from typing import Any

from praesto.agent.download.api import (
    SUMMARY,
    LastingDownloadError,
    Options,
    Plan,
    RemoteFile,
    check_file_count,
)
from praesto.agent.download.http import Transport
from praesto.agent.download.origin import http_transport
from praesto.agent.download.origins.modelscope.hubapi import (
    DEFAULT_REVISION,
    LISTING_LIMIT,
    MAX_LISTING_BYTES,
    MAX_REVISIONS_BYTES,
    endpoint_of,
    get_data,
    repo_url,
)
from praesto.agent.download.repopath import check_repo_path

from praesto.kinds import COMMIT_PATTERN as COMMIT
from praesto.spec import Source

log = logging.getLogger("praesto.download")

SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
MAX_PATH_CHARS = 1024  # a repo path; each of its names at most NAME_MAX bytes
NAME_MAX = 255
MAX_FILE_SIZE = 1 << 50  # 1 PiB: a size past it is a hostile listing, not a model
FEWER_FILES = "select fewer files with --allow / --ignore"
MAX_LISTING_REQUESTS = 2000  # a walked list: each answer holds up to LISTING_LIMIT entries


def plan(source: Source, options: Options) -> Plan:
    """The commit `source.revision` (default `master`) points to and every file to fetch."""
    endpoint = endpoint_of(options)
    ref = source.revision or DEFAULT_REVISION
    transport = http_transport(endpoint, options.token, options)  # the configured hub is trusted as is
    try:
        commit, at_ref = resolve(transport, endpoint, source, ref, options)
        entries = list_files(transport, endpoint, source, commit, options)
    finally:
        transport.close()
    if at_ref is not None and _content(at_ref) != _content(entries):
        raise LastingDownloadError(
            "RevisionNotFound",
            f"{source.uri}: the files at {ref!r} differ from those at {commit[:12]}, the commit its file "
            f"list names (the ref moved, or its last commit only removed files), so it cannot be pinned "
            f"for every node; give a 40-hex commit instead (ms://{source.location}:<commit>)",
        )
    files = select(entries, source)
    check_file_count(source.uri, len(files), options.max_files, FEWER_FILES)
    log.info(
        "planned source=%s revision=%s commit=%s files=%d",
        source.uri, ref, commit, len(files), extra=SUMMARY,
    )  # fmt: skip
    return Plan(source=source.with_revision(ref), revision=commit.lower(), files=tuple(files))


def resolve(
    transport: Transport, endpoint: str, source: Source, ref: str, options: Options
) -> tuple[str, list[Any] | None]:
    """`ref` as a commit, and the file list read at `ref` when that was needed to find it.

    A 40-hex commit is itself. A branch or tag is the ref's `CommitId` in the revisions list when
    the hub gives one (a field the client never reads: hubapi.py); else the commit every file entry
    of the list at the ref names as its `Revision`. That field is each file's *last* commit (the
    client's own reading: modelscope 1.40.2 hub/info.py `RepoSibling.sha`, "The file's latest
    commit SHA"; hub/utils/caching.py keys its cache on it per file), so it names the ref's commit
    only when one commit wrote every file; entries that disagree, or carry no 40-hex one, are
    refused, and `plan` checks the files at that commit are the ref's. Asking the revisions list
    first also tells a missing or hidden repo from a missing revision."""
    data = get_data(
        transport, repo_url(endpoint, source.location, "revisions"), source.uri, MAX_REVISIONS_BYTES, options
    )
    revision_map = data.get("RevisionMap") if isinstance(data, dict) else None
    refs: list[Any] = []
    if isinstance(revision_map, dict):
        for group in ("Branches", "Tags"):
            found = revision_map.get(group)
            refs.extend(found if isinstance(found, list) else [])
    named = next((r for r in refs if isinstance(r, dict) and r.get("Revision") == ref), None)
    if named is None:
        if COMMIT.match(ref):
            return ref, None
        raise LastingDownloadError(
            "RevisionNotFound", f"{source.uri} has no branch, tag or commit {ref!r}; fix the revision"
        )
    commit = named.get("CommitId")
    if commit is not None:
        if not isinstance(commit, str) or not COMMIT.match(commit):
            raise _unpinned(source, ref, f"the hub names {str(commit)[:80]!r} as its CommitId, not a commit")
        return commit, None
    at_ref = list_files(transport, endpoint, source, ref, options)
    return _shared_revision(at_ref, source, ref), at_ref


def _shared_revision(entries: list[Any], source: Source, ref: str) -> str:
    """The one 40-hex `Revision` every file entry names (folders carry none on the hub)."""
    files = [e for e in entries if e.get("Type") != "tree"]
    named = {r if isinstance(r := e.get("Revision"), str) else None for e in files}
    if not files:
        cause = "its file list is empty"
    elif None in named:
        cause = "a file entry names no Revision"
    elif len(named) > 1:
        cause = f"its files name {len(named)} different commits (each file its own last one)"
    else:
        only = str(named.pop())
        if COMMIT.match(only):
            return only
        cause = f"its files name {only[:80]!r}, not a 40-hex commit"
    raise _unpinned(source, ref, f"the revisions list gives no CommitId and {cause}")


def _unpinned(source: Source, ref: str, cause: str) -> LastingDownloadError:
    return LastingDownloadError(
        "RevisionNotFound",
        f"{source.uri}: {ref!r} cannot be pinned to one commit for every node ({cause}); "
        f"give a 40-hex commit instead (ms://{source.location}:<commit>)",
    )


def _content(entries: list[Any]) -> set[tuple[str, str]]:
    """What a list says the files are: each file's path and sha256."""
    return {(str(e.get("Path")), str(e.get("Sha256")).lower()) for e in entries if e.get("Type") != "tree"}


def list_files(
    transport: Transport, endpoint: str, source: Source, commit: str, options: Options
) -> list[Any]:
    """Every entry of the file list at `commit`. The hub cuts each answer at LISTING_LIMIT entries
    without saying so, so an answer that long is walked folder by folder, as the client's
    `_walk_repo_files` does (a subtree whole; cut again: its direct children, then each folder).
    Bounded: entries by `options.max_files`, requests by MAX_LISTING_REQUESTS, and every folder
    walked lies strictly under the one listed (paths are checked, so depth is bounded too)."""
    found: dict[str, Any] = {}
    roots, requests = [""], 0

    def listing(root: str, recursive: bool) -> list[Any]:
        nonlocal requests
        requests += 1
        if requests > MAX_LISTING_REQUESTS:
            raise LastingDownloadError(
                "SourceUnavailable", f"{source.uri}: the file list took over {MAX_LISTING_REQUESTS} requests"
            )
        query = {"Revision": commit, "Recursive": str(recursive)} | ({"Root": root} if root else {})
        url = repo_url(endpoint, source.location, "repo/files", **query)
        return entries_of(get_data(transport, url, source.uri, MAX_LISTING_BYTES, options), source.uri)

    while roots:
        root = roots.pop()
        entries = listing(root, True)
        if len(entries) >= LISTING_LIMIT:  # cut: its direct children, then each folder whole
            entries = listing(root, False)
            if len(entries) >= LISTING_LIMIT:
                raise LastingDownloadError(
                    "SourceUnavailable",
                    f"{source.uri}: folder {root or '/'!r} holds at least {LISTING_LIMIT} entries, more than "
                    "the hub lists at once, so its list cannot be read whole",
                )
            roots.extend(_subfolders(entries, root, source.uri))
        answer: set[str] = set()
        for (
            entry
        ) in entries:  # across answers a path may repeat (a folder and its own listing), within one not
            path = str(entry.get("Path"))
            if path in answer:
                raise _invalid(source.uri, f"lists {path[:80]!r} twice", "a path names one file")
            answer.add(path)
            found[path] = entry
        check_file_count(source.uri, len(found), options.max_files, FEWER_FILES)
    return list(found.values())


def _subfolders(entries: list[Any], root: str, uri: str) -> list[str]:
    """The folders of a shallow answer, each strictly under `root` (so a walk always goes deeper)."""
    out = []
    for entry in entries:
        path = entry.get("Path")
        if entry.get("Type") != "tree":
            continue
        if not isinstance(path, str) or not path.startswith(root + "/" if root else "") or path == root:
            raise _invalid(
                uri, f"names folder {str(path)[:80]!r} outside {root or '/'!r}", "check the endpoint"
            )
        out.append(check_repo_path(path))
    return out


def entries_of(listing: Any, uri: str) -> list[Any]:
    """One answer's entries (Data.Files, or Data itself as a list): a list of objects."""
    entries = listing.get("Files") if isinstance(listing, dict) else listing
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _invalid(uri, "is not a list of entries (Data.Files)", "check the endpoint is a ModelScope hub")
    return entries


def select(entries: Iterable[dict[str, Any]], source: Source) -> list[RemoteFile]:
    """Every file (not folder) the patterns keep, each checked: a safe path, a size, a sha256."""
    out: dict[str, RemoteFile] = {}
    for entry in entries:
        kind, path = entry.get("Type"), entry.get("Path")
        if kind == "tree":
            continue
        if kind != "blob":
            raise _invalid(source.uri, f"has an entry of type {str(kind)[:40]!r}", "files are 'blob'")
        if not isinstance(path, str) or len(path) > MAX_PATH_CHARS:
            raise _invalid(
                source.uri, "has a path that is not text or is too long", f"at most {MAX_PATH_CHARS}"
            )
        check_repo_path(path)
        if any(len(part.encode()) > NAME_MAX for part in path.split("/")):
            raise _invalid(source.uri, f"names {path[:80]!r}, a name over {NAME_MAX} bytes", "rename it")
        if not _wanted(path, source):
            continue
        size, sha256 = entry.get("Size"), entry.get("Sha256")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_SIZE:
            raise _invalid(source.uri, f"gives {path!r} no valid size", "sizes are whole byte counts")
        if not isinstance(sha256, str) or not SHA256.match(sha256):
            raise _invalid(
                source.uri, f"gives {path!r} no sha256", "every file needs its Sha256 to be verified"
            )
        out[path] = RemoteFile(path, size, sha256=sha256.lower())
    return sorted(out.values(), key=lambda f: f.path)


def _wanted(path: str, source: Source) -> bool:
    """--allow / --ignore, as the Hub's filter reads them (a trailing / matches a whole folder)."""

    def matches(patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)

    if source.allow_patterns and not matches(source.allow_patterns):
        return False
    return not (source.ignore_patterns and matches(source.ignore_patterns))


def _invalid(uri: str, what: str, fix: str) -> LastingDownloadError:
    return LastingDownloadError("InvalidRepoFile", f"{uri}: the hub's file list {what}; {fix}")


__all__ = ["entries_of", "list_files", "plan", "resolve", "select"]
