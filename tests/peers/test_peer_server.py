"""The peer server over real HTTP: signatures, manifest-only paths, Range, upload caps."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from praesto.agent.peers import auth
from praesto.agent.peers.server import Limits, PeerServer, file_path

from praesto import names
from praesto.store import StoreLayout

SECRET = b"s3cret-shared-by-every-agent-0123"
REV = "a" * 40
DATA = os.urandom(100_000)
FILES = {"model.bin": DATA, "sub/dir/tok en.json": b'{"x": 1}', "empty.txt": b""}


def make_cache(layout: StoreLayout, namespace: str = "team-a", cache: str = "m") -> Path:
    root = layout.cache_dir(namespace, cache)
    for path, data in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    (root / "not-listed.bin").write_bytes(b"on disk, not in the manifest")
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in FILES.items()]
    (root / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": REV, "files": entries}))
    (root / names.COMPLETE_FILE).write_text(REV + "\n")
    return root


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PeerServer]:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    (tmp_path / "secret-outside.txt").write_text("never served")
    srv = PeerServer(layout, SECRET, ("127.0.0.1", 0), Limits(max_uploads=2)).start()
    try:
        yield srv
    finally:
        srv.stop()


def get(
    srv: PeerServer, path: str, headers: dict[str, str] | None = None, *, secret: bytes | None = SECRET
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    try:
        sent = dict(headers or {})
        if secret is not None:
            sent.setdefault("Authorization", auth.sign(secret, "GET", path))
        conn.request("GET", path, headers=sent)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def url(path: str, cache: str = "m", rev: str = REV) -> str:
    return file_path("team-a", cache, rev, path)


def test_signed_request_gets_the_whole_file(server: PeerServer) -> None:
    status, headers, body = get(server, url("model.bin"))
    assert (status, body) == (200, DATA)
    assert headers["content-length"] == str(len(DATA)) and headers["accept-ranges"] == "bytes"
    status, _, body = get(server, url("sub/dir/tok%20en.json"))
    assert (status, body) == (200, FILES["sub/dir/tok en.json"])
    assert get(server, url("empty.txt"))[::2] == (200, b"")
    assert server.bytes_served == len(DATA) + len(FILES["sub/dir/tok en.json"])


# Headers are made when the test runs (not at import), so signatures are fresh
# and the test ids are the same in every xdist worker.
BAD_HEADERS: dict[str, Callable[[], str | None]] = {
    "missing": lambda: None,
    "bearer": lambda: "Bearer abc",
    "no-signature": lambda: "Praesto 123",
    "time-not-a-number": lambda: "Praesto notanumber." + "0" * 64,
    "other-clusters-secret": lambda: auth.sign(b"another-clusters-secret-xxxxxxxx", "GET", url("model.bin")),
    "signed-for-another-path": lambda: auth.sign(SECRET, "GET", url("empty.txt")),
    "signed-for-another-method": lambda: auth.sign(SECRET, "HEAD", url("model.bin")),
    "long-expired": lambda: auth.sign(SECRET, "GET", url("model.bin"), now=1_000_000),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_unauthenticated_or_badly_signed_is_401(server: PeerServer, case: str) -> None:
    header = BAD_HEADERS[case]()
    status, _, body = get(
        server, url("model.bin"), {"Authorization": header} if header else None, secret=None
    )
    assert status == 401
    assert DATA[:100] not in body and "peer secret" in json.loads(body)["error"]
    assert server.bytes_served == 0


def test_signatures_allow_clock_skew_within_the_window() -> None:
    path = url("model.bin")
    assert auth.verify(SECRET, auth.sign(SECRET, "GET", path, now=1000), "GET", path, now=1000 + auth.SKEW)
    assert not auth.verify(
        SECRET, auth.sign(SECRET, "GET", path, now=1000), "GET", path, now=1001 + auth.SKEW
    )
    assert auth.verify(SECRET, auth.sign(SECRET, "GET", path, now=1000 + auth.SKEW), "GET", path, now=1000)


@pytest.mark.parametrize(
    "path",
    [
        url("not-listed.bin"),
        url(names.MANIFEST_FILE),
        url(names.COMPLETE_FILE),
        url("../../secret-outside.txt"),
        url("%2e%2e/%2e%2e/secret-outside.txt"),
        url("sub/../model.bin"),
        url("/etc/passwd"),
        url("model.bin", rev="b" * 40),
        url("model.bin", cache="other"),
        file_path("..", "..", REV, "secret-outside.txt"),
        "/v1/caches/team-a/m/" + REV + "/model.bin",
        "/secret-outside.txt",
    ],
)
def test_only_manifest_files_of_complete_caches_are_served(server: PeerServer, path: str) -> None:
    status, _, body = get(server, path)
    assert status == 404, path
    assert b"never served" not in body and b"on disk" not in body


def test_incomplete_cache_is_not_served(server: PeerServer) -> None:
    server.layout.complete_marker("team-a", "m").unlink()
    assert get(server, url("model.bin"))[0] == 404


def test_a_file_changed_under_the_manifest_is_not_served(server: PeerServer) -> None:
    target = server.layout.cache_dir("team-a", "m") / "model.bin"
    target.write_bytes(DATA[:10])
    assert get(server, url("model.bin"))[0] == 404


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [("bytes=0-0", 0, 1), ("bytes=10-19", 10, 20), ("bytes=99990-", 99990, 100_000),
     ("bytes=-7", 100_000 - 7, 100_000), ("bytes=50000-999999", 50000, 100_000)],
)  # fmt: skip
def test_ranges(server: PeerServer, header: str, start: int, end: int) -> None:
    status, headers, body = get(server, url("model.bin"), {"Range": header})
    assert status == 206
    assert body == DATA[start:end]
    assert headers["content-range"] == f"bytes {start}-{end - 1}/{len(DATA)}"
    assert headers["content-length"] == str(end - start)


@pytest.mark.parametrize("header", ["bytes=100000-", "bytes=5-2", "bytes=-", "items=0-1", "bytes=0-1,4-5"])
def test_unsatisfiable_ranges_are_416(server: PeerServer, header: str) -> None:
    status, headers, _ = get(server, url("model.bin"), {"Range": header})
    assert status == 416 and headers["content-range"] == f"bytes */{len(DATA)}"


def test_upload_cap_answers_busy_with_retry_after(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    srv = PeerServer(layout, SECRET, ("127.0.0.1", 0), Limits(max_uploads=1, rate=20_000)).start()
    try:
        first = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
        first.request(
            "GET", url("model.bin"), headers={"Authorization": auth.sign(SECRET, "GET", url("model.bin"))}
        )
        resp = first.getresponse()
        assert resp.status == 200 and resp.read(100) == DATA[:100]  # in flight, paced at 20 kB/s
        status, headers, _ = get(srv, url("empty.txt"))
        assert (status, headers["retry-after"]) == (503, "1")
        first.close()
    finally:
        srv.stop()


def test_stop_cuts_transfers_in_flight(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path / "store")
    make_cache(layout)
    srv = PeerServer(layout, SECRET, ("127.0.0.1", 0), Limits(rate=20_000)).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=10)
    conn.request(
        "GET", url("model.bin"), headers={"Authorization": auth.sign(SECRET, "GET", url("model.bin"))}
    )
    resp = conn.getresponse()
    got = resp.read(100)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    with pytest.raises(http.client.IncompleteRead):
        got += resp.read()
    stopper.join(10)
    assert len(got) < len(DATA)
