"""A local Hugging Face Hub on loopback, faithful enough for the real `huggingface_hub` client.

It speaks the endpoints `huggingface_hub` 2.x calls (`/api/models/<repo>[/revision/<rev>]`,
`/api/models/<repo>/tree/<rev>` with cursor pagination, `HEAD|GET /<repo>/resolve/<rev>/<path>`)
and, like the real Hub, redirects LFS files (302) to a separate "CDN" origin that serves the
bytes with Range support. `huggingface_hub` follows same-origin redirects only, so the CDN
listens on its own port; `cdn_base` may point LFS redirects at nginx instead (benchmark).

Tests create repos (branches, tags, private, gated), then inject faults (corrupt bytes,
dropped connections, 5xx/429 with Retry-After, a per-connection rate) and read the byte
counters to see what a client actually fetched. `responses` cannot intercept httpx2, hence
a real server.

Near 500 lines: the Hub's endpoints share one repository model and one fault table, and the
ModelScope and Xet doubles (modelscope_hub.py, hub_xet.py) build on it; the CDN and the fault
injection are what make it long, and each is a few small methods on the same state.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

if TYPE_CHECKING:
    from testkit.hub_xet import HubXet

LFS_THRESHOLD = 1024  # bytes; larger files are stored as LFS (like a 10 MB threshold, scaled down)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    oid: str  # git blob id (of the pointer file for LFS files)
    sha256: str
    lfs: bool
    data: bytes | None  # small files live in memory; LFS bytes in <root>/blobs/<sha256>


@dataclass
class HubRepo:
    repo_id: str
    private: bool = False
    gated: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass(frozen=True)
class Span:
    """One request as the server saw it: when it arrived and when its answer was sent."""

    start: float
    end: float
    method: str
    path: str
    cdn: bool

    @property
    def bytes(self) -> bool:
        """A file's bytes or the request resolving them, not the metadata API."""
        return self.cdn or "/resolve/" in self.path


@dataclass
class Faults:
    """Knobs a test turns; each counter decrements as the fault fires."""

    corrupt: dict[str, int] = field(default_factory=dict)  # path -> responses to corrupt
    drop_after: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (bytes, times)
    fail_status: int = 503
    fail_first: int = 0  # next K byte requests (resolve or CDN) answer fail_status
    retry_after: str | None = None
    rate: int = 0  # bytes/s per response; 0 = unlimited


class LocalHub:
    """Start with `with LocalHub(tmp_path) as hub:`; `hub.endpoint` is what HF_ENDPOINT takes."""

    def __init__(
        self, root: Path, *, page_size: int = 1000, cdn_base: str | None = None, host: str = "127.0.0.1"
    ) -> None:
        """`host`: the address both servers listen on and the endpoints name (the node tier uses
        the node's own address, which its Pods reach too)."""
        self.root = root
        self.host = host
        self.blobs = root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, HubRepo] = {}
        self.tokens: set[str] = set()  # valid tokens: read every private repo
        self.gated_access: set[str] = set()  # tokens whose owners accepted the gate
        self.page_size = page_size
        self.cdn_base = cdn_base
        self.faults = Faults()
        self.lock = threading.Lock()
        self.bytes_served = 0
        self.bytes_by_path: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) log
        self.spans: list[Span] = []  # every request's wall-clock start and end (origin budget tests)
        self.xet: HubXet | None = None  # files a Xet CAS double holds (testkit/hub_xet.py); None: no Xet
        self._api = _Server((host, 0), self, cdn=False)
        self._cdn = _Server((host, 0), self, cdn=True)
        self._threads: list[threading.Thread] = []

    # ---- lifecycle -----------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self._api.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        return self.cdn_base or f"http://{self.host}:{self._cdn.server_address[1]}"

    def __enter__(self) -> LocalHub:
        for server in (self._api, self._cdn):
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._api, self._cdn):
            server.shutdown()
            server.server_close()

    # ---- content -------------------------------------------------------------------
    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, private: bool = False, gated: bool = False
    ) -> str:
        """Create a repo whose `main` holds `files`; returns the commit id."""
        self.repos[repo_id] = HubRepo(repo_id, private=private, gated=gated)
        return self.commit(repo_id, files, branch="main")

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        repo = self.repos[repo_id]
        tree = {path: self._store(path, data) for path, data in files.items()}
        listing = "\n".join(f"{p} {f.oid}" for p, f in sorted(tree.items()))
        commit = hashlib.sha1(f"{repo_id}\n{len(repo.commits)}\n{listing}".encode()).hexdigest()
        repo.commits[commit] = tree
        repo.refs[branch] = commit
        return commit

    def add_large_file(self, repo_id: str, path: str, source: Path, *, branch: str = "main") -> None:
        """Add an on-disk file (benchmark shards) without holding it in memory."""
        digest = hashlib.sha256()
        with source.open("rb") as handle:
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
        sha256, size = digest.hexdigest(), source.stat().st_size
        target = self.blobs / sha256
        if not target.exists():
            source.rename(target)
        pointer = _pointer(sha256, size)
        repo = self.repos[repo_id]
        commit = repo.refs[branch]
        repo.commits[commit][path] = HubFile(path, size, git_blob_sha1(pointer), sha256, True, None)

    def tag(self, repo_id: str, tag: str, commit: str) -> None:
        self.repos[repo_id].refs[tag] = commit

    def _store(self, path: str, data: bytes) -> HubFile:
        sha256 = hashlib.sha256(data).hexdigest()
        if len(data) <= LFS_THRESHOLD:
            return HubFile(path, len(data), git_blob_sha1(data), sha256, False, data)
        (self.blobs / sha256).write_bytes(data)
        return HubFile(path, len(data), git_blob_sha1(_pointer(sha256, len(data))), sha256, True, None)

    def lfs_bytes(self, sha256: str) -> Path:
        return self.blobs / sha256

    def reset_counters(self) -> None:
        with self.lock:
            self.bytes_served = 0
            self.bytes_by_path.clear()
            self.requests.clear()
            self.spans.clear()


def _pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], hub: LocalHub, *, cdn: bool) -> None:
        super().__init__(address, _Handler)
        self.hub = hub
        self.cdn = cdn


_REPO_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?/?$")
_TREE_API = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
_XET_TOKEN = re.compile(r"^/api/models/([^/]+/[^/]+)/xet-read-token/([^/]+)$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    @property
    def hub(self) -> LocalHub:
        return self.server.hub

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # ---- routing -----------------------------------------------------------------
    def _dispatch(self, *, head: bool) -> None:
        started = time.time()
        try:
            self._route(head=head)
        finally:
            span = Span(started, time.time(), self.command, urlsplit(self.path).path, self.server.cdn)
            with self.hub.lock:
                self.hub.spans.append(span)

    def _route(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        with self.hub.lock:
            self.hub.requests.append((self.command, url.path))
        if self.server.cdn:
            return self._cdn(path, head)
        if m := _XET_TOKEN.match(url.path):
            return self._xet_token(unquote(m[1]), unquote(m[2]))
        if m := _REPO_API.match(url.path):
            return self._repo_info(unquote(m[1]), unquote(m[2] or "main"), query)
        if m := _TREE_API.match(url.path):
            return self._tree(unquote(m[1]), unquote(m[2]), unquote(m[3] or ""), query)
        if m := _RESOLVE.match(url.path):
            return self._resolve(unquote(m[1]), unquote(m[2]), unquote(m[3]), head)
        return self._error(404, "EntryNotFound", f"no route for {path}")

    def _error(self, status: int, code: str | None, message: str, **headers: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: Any, **headers: str) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def _repo(self, repo_id: str, *, content: bool) -> HubRepo | None:
        """The repo if this caller may see it, else an error already sent (like the Hub)."""
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if token is not None and token not in self.hub.tokens:
            self._error(401, None, "Invalid credentials in Authorization header")
            return None
        if repo is None or (repo.private and token is None):
            status = 401 if token is None else 404
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and content and token not in self.hub.gated_access:
            status = 401 if token is None else 403
            self._error(status, "GatedRepo", "Access to model is restricted; accept the conditions first")
            return None
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> str | None:
        commit = repo.resolve(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # ---- API ---------------------------------------------------------------------
    def _repo_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, content=False)
        if repo is None or (commit := self._commit(repo, revision)) is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in repo.commits[commit].values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=f.oid)
                if f.lfs:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(sibling)
        gated: Any = "manual" if repo.gated else False
        self._json(
            {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.private,
             "gated": gated, "disabled": False, "tags": [], "siblings": siblings,
             "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"}
        )  # fmt: skip

    def _tree(self, repo_id: str, revision: str, folder: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, content=False)
        if repo is None or (commit := self._commit(repo, revision)) is None:
            return
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries = _tree_entries(repo.commits[commit], folder.strip("/"), recursive, self.hub.xet)
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start : start + self.hub.page_size]
        headers = {}
        if start + len(page) < len(entries):
            nxt = f"{self.hub.endpoint}{urlsplit(self.path).path}?recursive={str(recursive).lower()}"
            headers["Link"] = f'<{nxt}&cursor={start + len(page)}>; rel="next"'
        self._json(page, **headers)

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, content=True)
        if repo is None or (commit := self._commit(repo, revision)) is None:
            return None
        f = repo.commits[commit].get(path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist at {revision}")
        if self._injected_failure():
            return None
        common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if f.lfs and self.hub.xet is not None:
            token_url = f"{self.hub.endpoint}/api/models/{repo_id}/xet-read-token/{commit}"
            common |= self.hub.xet.file_headers(f.sha256, token_url)
        if f.lfs:
            location = f"{self.hub.cdn_endpoint}/{f.sha256}" + (
                "" if self.hub.cdn_base else f"?path={quote(path)}"
            )
            self.send_response(302)
            for key, value in common.items():
                self.send_header(key, value)
            self.send_header("Location", location)
            self.send_header("ETag", f'"{f.oid}"')
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        assert f.data is not None
        return self._send_bytes(path, f.data, f'"{f.oid}"', head, common)

    def _xet_token(self, repo_id: str, revision: str) -> None:
        """A Xet read token for a repo the caller may read (testkit/hub_xet.py)."""
        repo = self._repo(repo_id, content=True)
        if repo is None or self._commit(repo, revision) is None:
            return None
        if self.hub.xet is None:
            return self._error(404, None, "this Hub stores no file in Xet")
        with self.hub.lock:
            body, headers = self.hub.xet.token_answer()
        return self._json(body, **headers)

    # ---- bytes -------------------------------------------------------------------
    def _cdn(self, path: str, head: bool) -> None:
        sha256 = path.strip("/")
        blob = self.hub.blobs / sha256
        if not re.fullmatch(r"[0-9a-f]{64}", sha256) or not blob.is_file():
            return self._error(404, None, "no such object")
        if self._injected_failure():
            return None
        repo_path = parse_qs(urlsplit(self.path).query).get("path", [sha256])[0]
        return self._send_bytes(repo_path, blob.read_bytes(), f'"{sha256}"', head, {"Accept-Ranges": "bytes"})

    def _injected_failure(self) -> bool:
        faults = self.hub.faults
        with self.hub.lock:
            if faults.fail_first <= 0:
                return False
            faults.fail_first -= 1
        extra = {"Retry-After": faults.retry_after} if faults.retry_after else {}
        self._error(faults.fail_status, None, "injected failure", **extra)
        return True

    def _send_bytes(self, path: str, data: bytes, etag: str, head: bool, headers: dict[str, str]) -> None:
        start, end = 0, len(data) - 1
        status = 200
        if (rng := self.headers.get("Range")) and (m := _RANGE.match(rng.strip())):
            if m[1]:
                start, end = int(m[1]), min(int(m[2]) if m[2] else end, end)
            else:
                start = max(0, len(data) - int(m[2]))
            if start > end:
                self._error(416, None, "range not satisfiable", Content_Range=f"bytes */{len(data)}")
                return
            status = 206
        body = data[start : end + 1]
        if not head:
            body = self._maybe_corrupt(path, body)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if head:
            return
        limit = len(body)
        with self.hub.lock:
            drop = self.hub.faults.drop_after.get(path)
            if drop and drop[1] > 0 and drop[0] < len(body):
                limit = drop[0]
                self.hub.faults.drop_after[path] = (drop[0], drop[1] - 1)
        for chunk in self._paced(memoryview(body)[:limit]):
            self.wfile.write(chunk)
            with self.hub.lock:
                self.hub.bytes_served += len(chunk)
                self.hub.bytes_by_path[path] = self.hub.bytes_by_path.get(path, 0) + len(chunk)
        if limit < len(body):
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    def _maybe_corrupt(self, path: str, body: bytes) -> bytes:
        with self.hub.lock:
            left = self.hub.faults.corrupt.get(path, 0)
            if left <= 0 or not body:
                return body
            self.hub.faults.corrupt[path] = left - 1
        return bytes([body[0] ^ 0xFF]) + body[1:]

    def _paced(self, body: memoryview) -> Iterator[memoryview]:
        rate = self.hub.faults.rate
        step = max(1024, rate // 20) if rate else 1 << 20
        started = time.monotonic()
        for offset in range(0, len(body), step):
            yield body[offset : offset + step]
            # Server-side pacing (a slow origin, not a test waiting on time), between chunks only:
            # a pause after the last one made the request's Span end after the client had all its
            # bytes (test_origin_budget then saw a third node "at once", 20 ms into the next one's).
            if rate and offset + step < len(body):
                ahead = (offset + step) / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def _tree_entries(
    files: dict[str, HubFile], folder: str, recursive: bool, xet: HubXet | None = None
) -> list[dict[str, Any]]:
    prefix = folder + "/" if folder else ""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :].split("/")
        for depth in range(1, len(rest)):
            sub = prefix + "/".join(rest[:depth])
            if recursive or depth == 1:
                out.setdefault(sub, {"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "size": 0, "path": sub})  # fmt: skip
        if recursive or len(rest) == 1:
            f = files[path]
            entry: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.size, "path": path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                if xet is not None and (xet_hash := xet.hash_of(f.sha256)):
                    entry["xetHash"] = xet_hash
            out[path] = entry
    return list(out.values())
