"""A registry that lies or floods (issue 37): what the planner reads of it is bounded and checked.

The real registry (tests/registry, distribution v3.1.2) refuses to store what these answers are
(a manifest over 4 MiB, one whose bytes differ from its digest), so a tenant's own registry plays
it here: a loopback HTTP server that answers the distribution API as a hostile host would, and
counts what it managed to send before the planner hung up.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from praesto.agent.download import LastingDownloadError, Options
from praesto.agent.download.fetch import plan
from praesto.agent.download.origins.oci.auth import MAX_TOKEN_ANSWER_BYTES
from praesto.agent.download.origins.oci.plan import MAX_MANIFEST_BYTES

from praesto.spec import Source, parse_uri
from testkit.controlplane import wait_for
from testkit.egress import LOOPBACK

REPOSITORY = "team/model"
FLOOD_BYTES = 64 << 20  # what each flooding answer claims and tries to send
CHUNK = 64 << 10
Answer = Callable[["_Handler"], None]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Registry
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.server.answers[self.path.split("?")[0]](self)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Registry(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: dict[str, Answer] = {}
        self.seen: list[tuple[str, str | None]] = []
        self.sent = 0  # bytes of a flood written before the client hung up
        self.flood_over = threading.Event()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def flood(self, handler: _Handler, head: bytes = b"") -> None:
        """200 claiming FLOOD_BYTES, then bytes until the client hangs up."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(FLOOD_BYTES))
        handler.end_headers()
        try:
            handler.wfile.write(head)
            self.sent = len(head)
            while self.sent < FLOOD_BYTES:
                handler.wfile.write(b" " * CHUNK)
                self.sent += CHUNK
        except OSError:
            handler.close_connection = True
        finally:
            self.flood_over.set()


@pytest.fixture
def registry() -> Iterator[_Registry]:
    server = _Registry()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _plan(registry: _Registry, reference: str) -> Any:
    source, errors = parse_uri(f"oci://{registry.host}/{REPOSITORY}{reference}")
    assert isinstance(source, Source) and not errors
    return plan(source, Options(plain_http=True, egress=LOOPBACK))


def _manifest_path(reference: str) -> str:
    return f"/v2/{REPOSITORY}/manifests/{reference}"


def _flood_was_cut(registry: _Registry) -> None:
    wait_for("the flooding answer to end", registry.flood_over.is_set, 10)
    assert registry.sent < FLOOD_BYTES // 2, registry.sent  # the planner hung up long before its end


def test_a_token_service_answering_a_huge_body_is_cut_at_its_bound(registry: _Registry) -> None:
    realm = f"http://{registry.host}/token"

    def challenge(handler: _Handler) -> None:
        handler.send_response(401)
        handler.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="hostile"')
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    registry.answers[_manifest_path("v1")] = challenge
    registry.answers["/token"] = lambda handler: registry.flood(handler, b'{"token": "')
    with pytest.raises(LastingDownloadError) as info:
        _plan(registry, ":v1")
    assert info.value.reason == "SourceUnavailable"
    assert str(info.value) == (
        f"the token service {realm} answered more than 64.0 KiB, which is no token answer; "
        "check the registry's token realm"
    )
    assert MAX_TOKEN_ANSWER_BYTES == 64 << 10
    _flood_was_cut(registry)
    assert all(auth is None for _, auth in registry.seen), registry.seen  # no token was ever sent


def test_a_manifest_over_4_mib_is_refused_without_reading_it_whole(registry: _Registry) -> None:
    registry.answers[_manifest_path("v1")] = registry.flood
    with pytest.raises(LastingDownloadError) as info:
        _plan(registry, ":v1")
    assert info.value.reason == "InvalidRepoFile"
    assert "the manifest is larger than 4 MiB; not a model" in str(info.value)
    assert MAX_MANIFEST_BYTES == 4 << 20
    _flood_was_cut(registry)


def test_a_manifest_whose_bytes_differ_from_the_digest_reference_is_refused(registry: _Registry) -> None:
    served = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}'
    asked = "sha256:" + hashlib.sha256(b"the manifest the author pinned").hexdigest()
    got = "sha256:" + hashlib.sha256(served).hexdigest()

    def lying(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        handler.send_header("Docker-Content-Digest", got)  # true of the bytes: only the reference catches it
        handler.send_header("Content-Length", str(len(served)))
        handler.end_headers()
        handler.wfile.write(served)

    registry.answers[_manifest_path(asked)] = lying
    with pytest.raises(LastingDownloadError) as info:
        _plan(registry, f"@{asked}")
    assert info.value.reason == "ChecksumMismatch"
    assert f"served a manifest whose digest is {got}, not {asked}" in str(info.value)


def test_a_401_answering_a_huge_body_is_cut_at_the_token_answers_bound(registry: _Registry) -> None:
    """The registry's 401 body is drained only up to the token answer's bound (64 KiB), then the
    connection is dropped: the planner asks again, with the token, on a new one."""
    realm = f"http://{registry.host}/token"
    asked: list[int] = []

    def manifest(handler: _Handler) -> None:
        asked.append(1)
        if len(asked) > 1:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        handler.send_response(401)
        handler.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="hostile"')
        handler.send_header("Content-Length", str(FLOOD_BYTES))
        handler.end_headers()
        try:
            while registry.sent < FLOOD_BYTES:
                handler.wfile.write(b" " * CHUNK)
                registry.sent += CHUNK
        except OSError:
            handler.close_connection = True
        finally:
            registry.flood_over.set()

    def token(handler: _Handler) -> None:
        body = b'{"token": "t0k3n"}'
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    registry.answers[_manifest_path("v1")] = manifest
    registry.answers["/token"] = token
    with pytest.raises(LastingDownloadError):
        _plan(registry, ":v1")  # the tag is not there (404), once asked with the token
    _flood_was_cut(registry)
    manifests = [auth for path, auth in registry.seen if path.startswith(_manifest_path("v1"))]
    assert manifests == [None, "Bearer t0k3n"], registry.seen
