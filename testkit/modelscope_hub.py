"""A local ModelScope hub on loopback, faithful enough for the real `modelscope` client.

It speaks what `modelscope.snapshot_download` (modelscope 1.40.2, which delegates to
modelscope-hub 0.5.1) calls, read from that client's source:

* `GET /api/v1/models/<owner>/<name>/repo/files?Revision=<rev>&Recursive=True[&Root=<dir>]`
  answers `{"Code": 200, "Data": {"Files": [...]}, "Success": true}`; each entry has `Path`,
  `Name`, `Type` (`blob`/`tree`), `Size`, `Sha256`, `IsLFS`, and files a `Revision` (modelscope_hub
  _legacy_api.py `_list_files_page`, `_json_data`; _download.py `download_repo` reads
  Path/Type/Sha256/Size). A file's `Revision` is its last commit, as modelscope 1.40.2 reads it
  (hub/info.py `RepoSibling.sha`: "The file's latest commit SHA"; hub/utils/caching.py keys each
  cached file on it): `entry_revisions` also gives the listed commit, 8 hex digits, or none.
  A listing is cut at `files_limit` entries (3000 on the real hub, constants.py
  `REPO_FILES_TRUNCATION_LIMIT`), as the real one silently does.
* `HEAD|GET /api/v1/models/<owner>/<name>/repo?Revision=<rev>&FilePath=<path>` serves a file
  with Range support (_legacy_api.py `get_download_url`, `download_stream`); LFS files answer 302
  to a separate "OSS" origin, as the client's `_probe_redirect_url` (HEAD, no redirects) expects.
* `GET /api/v1/models/<owner>/<name>/revisions` lists branches and tags (`RevisionMap`), which
  the compat `HubApi.get_valid_revision_detail` reads (`Revision`, `CreatedAt`); each names its
  `CommitId` unless `commit_ids` is off (no client reads it, so the real hub may not send it).
* The token arrives as `Authorization: Bearer <t>` and as the `m_session_id` cookie
  (_legacy_api.py `_headers`, `_ensure_session_auth`); either is accepted.
* `/api/v1/repos/internalAccelerationInfo` (the client's intra-cloud probe) answers 404.

Storage, faults (corrupt, drop, fail_first), byte counters and the "CDN" are the Hugging Face
double's (testkit/hub.py); only the routes differ. Default branch: `master`.
"""

from __future__ import annotations

import json
import re
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from testkit.hub import HubFile, HubRepo, LocalHub, _Handler, _Server

DEFAULT_BRANCH = "master"  # modelscope_hub _download.py: `effective_revision = revision or "master"`
FILES_LIMIT = 3000  # modelscope_hub constants.py REPO_FILES_TRUNCATION_LIMIT
SESSION_COOKIE = "m_session_id"
# a file entry's `Revision`: its last commit (the hub's), the commit listed, 8 hex digits of its
# last commit (as some answers carry), or no field at all
EntryRevisions = Literal["last-change", "listed", "short", "none"]

_FILES = re.compile(r"^/api/v1/models/([^/]+/[^/]+)/repo/files/?$")
_FILE = re.compile(r"^/api/v1/models/([^/]+/[^/]+)/repo/?$")
_REVISIONS = re.compile(r"^/api/v1/models/([^/]+/[^/]+)/revisions/?$")


class ModelScopeHub(LocalHub):
    """`with ModelScopeHub(tmp_path) as hub:`; `hub.endpoint` is what MODELSCOPE_ENDPOINT takes."""

    def __init__(self, root: Path, *, host: str = "127.0.0.1", files_limit: int = FILES_LIMIT) -> None:
        super().__init__(root, host=host)
        for server in (self._api, self._cdn):  # the Hugging Face routes' sockets: not ours
            server.server_close()
        self._api = _MsServer((host, 0), self, cdn=False)
        self._cdn = _MsServer((host, 0), self, cdn=True)
        self.files_limit = files_limit
        self.listing_extra: dict[str, list[dict[str, Any]]] = {}  # repo -> raw entries appended (hostile)
        self.commit_ids = True  # False: the revisions list names no CommitId (a hub that does not say)
        self.entry_revisions: EntryRevisions = "last-change"
        self.parents: dict[str, str | None] = {}  # commit -> the branch head it was made on
        self.cdn_credentials = 0  # requests to "OSS" that carried a token (header or cookie): must stay 0

    def __enter__(self) -> ModelScopeHub:
        super().__enter__()
        return self

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, private: bool = False, gated: bool = False
    ) -> str:
        """A repo whose `master` holds `files`; returns the commit id."""
        self.repos[repo_id] = HubRepo(repo_id, private=private, gated=gated)
        return self.commit(repo_id, files, branch=DEFAULT_BRANCH)

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = DEFAULT_BRANCH) -> str:
        parent = self.repos[repo_id].refs.get(branch)
        made = super().commit(repo_id, files, branch=branch)
        self.parents.setdefault(made, parent if parent != made else None)
        return made

    def entry_revision(self, repo: HubRepo, commit: str, path: str) -> str | None:
        """What the list at `commit` gives `path` as its `Revision` (see `entry_revisions`)."""
        if self.entry_revisions == "none":
            return None
        if self.entry_revisions == "listed":
            return commit
        last, oid = commit, repo.commits[commit][path].oid
        while (parent := self.parents.get(last)) and getattr(
            repo.commits[parent].get(path), "oid", None
        ) == oid:
            last = parent
        return last[:8] if self.entry_revisions == "short" else last


class _MsServer(_Server):
    def __init__(self, address: tuple[str, int], hub: LocalHub, *, cdn: bool) -> None:
        ThreadingHTTPServer.__init__(self, address, _MsHandler)
        self.hub = hub
        self.cdn = cdn


class _MsHandler(_Handler):
    @property
    def ms(self) -> ModelScopeHub:
        assert isinstance(self.hub, ModelScopeHub)
        return self.hub

    def _route(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        with self.hub.lock:
            self.hub.requests.append((self.command, url.path))
        if self.server.cdn:
            if self._token() is not None:
                with self.hub.lock:
                    self.ms.cdn_credentials += 1
            return self._cdn(unquote(url.path), head)
        if m := _FILES.match(url.path):
            return self._files(unquote(m[1]), query)
        if m := _FILE.match(url.path):
            return self._file(unquote(m[1]), query, head)
        if m := _REVISIONS.match(url.path):
            return self._revisions(unquote(m[1]))
        return self._error(404, None, f"no route for {url.path}")

    # ---- answers in the hub's envelope -----------------------------------------------
    def _error(self, status: int, code: str | None, message: str, **headers: str) -> None:
        body = json.dumps(
            {"Code": status, "Message": message, "RequestId": uuid.uuid4().hex, "Success": False}
        ).encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _data(self, data: Any) -> None:
        self._json({"Code": 200, "Data": data, "Message": "success", "RequestId": uuid.uuid4().hex,
                    "Success": True})  # fmt: skip

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[7:]
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == SESSION_COOKIE and value:
                return value
        return None

    def _repo(self, repo_id: str, *, content: bool) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if token is not None and token not in self.hub.tokens:
            self._error(401, None, "invalid access token")
            return None
        if repo is None or (repo.private and token is None):
            self._error(404 if token else 401, None, f"model {repo_id} not found or not visible")
            return None
        return repo

    def _commit_of(self, repo: HubRepo, query: dict[str, list[str]]) -> str | None:
        revision = query.get("Revision", [DEFAULT_BRANCH])[0] or DEFAULT_BRANCH
        commit = repo.resolve(revision)
        if commit is None:
            self._error(404, None, f"revision {revision} not found")
        return commit

    # ---- API -------------------------------------------------------------------------
    def _files(self, repo_id: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, content=False)
        if repo is None or (commit := self._commit_of(repo, query)) is None:
            return
        recursive = query.get("Recursive", ["False"])[0].lower() == "true"
        root = query.get("Root", [""])[0].strip("/")
        entries = _entries(repo.commits[commit], root, recursive)
        for entry in entries:
            if entry["Type"] == "blob" and (rev := self.ms.entry_revision(repo, commit, entry["Path"])):
                entry["Revision"] = rev
        entries += self.ms.listing_extra.get(repo_id, [])
        self._data({"Files": entries[: self.ms.files_limit], "LatestCommitter": {"Id": commit}})

    def _file(self, repo_id: str, query: dict[str, list[str]], head: bool) -> None:
        repo = self._repo(repo_id, content=True)
        if repo is None or (commit := self._commit_of(repo, query)) is None:
            return None
        path = query.get("FilePath", [""])[0]
        f = repo.commits[commit].get(path)
        if f is None:
            return self._error(404, None, f"file {path} not found")
        if self._injected_failure():
            return None
        if f.lfs:  # the real hub sends LFS objects to OSS
            self.send_response(302)
            self.send_header("Location", f"{self.hub.cdn_endpoint}/{f.sha256}?path={quote(path)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        assert f.data is not None
        return self._send_bytes(path, f.data, f'"{f.oid}"', head, {"Accept-Ranges": "bytes"})

    def _revisions(self, repo_id: str) -> None:
        repo = self._repo(repo_id, content=False)
        if repo is None:
            return
        branches = [{"Revision": ref, "CommitId": c, "CreatedAt": 0} for ref, c in sorted(repo.refs.items())
                    if ref == DEFAULT_BRANCH or ref.startswith("branch-")]  # fmt: skip
        names = {b["Revision"] for b in branches}
        tags = [{"Revision": ref, "CommitId": c, "CreatedAt": 0} for ref, c in sorted(repo.refs.items())
                if ref not in names]  # fmt: skip
        if not self.ms.commit_ids:
            for ref in (*branches, *tags):
                ref.pop("CommitId")
        self._data({"RevisionMap": {"Branches": branches, "Tags": tags}})


def _entries(files: dict[str, HubFile], root: str, recursive: bool) -> list[dict[str, Any]]:
    """The `Files` list as the hub writes it: directories (`tree`) and files (`blob`) under `root`."""
    prefix = root + "/" if root else ""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :].split("/")
        for depth in range(1, len(rest)):
            sub = prefix + "/".join(rest[:depth])
            if recursive or depth == 1:
                out.setdefault(sub, {"Name": sub.rsplit("/", 1)[-1], "Path": sub, "Type": "tree", "Size": 0,
                                     "Sha256": "", "IsLFS": False, "Mode": "16384"})  # fmt: skip
        if recursive or len(rest) == 1:
            f = files[path]
            out[path] = {"Name": rest[-1], "Path": path, "Type": "blob", "Size": f.size, "Sha256": f.sha256,
                         "IsLFS": f.lfs, "Mode": "33188"}  # fmt: skip
    return list(out.values())
