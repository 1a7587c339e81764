"""A lying peer costs a bounded delay, never the download (issue 21 item 10).

A real HTTP peer that claims every part in `/parts` and then lies in each way the
protocol allows: "not yet" with a written count that keeps moving (or stands
still), "busy" forever, bytes trickled slower than any deadline, a short body,
wrong bytes, or silence. The real downloader (`download` with `PeerSource`, the
local hub as origin) must finish with the origin's bytes and drop the liar.
Before the fix, "not yet" with a moving count held a range forever.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.download import PartSources
from praesto.agent.download.fetch import download, plan
from praesto.agent.peers.protocol import NOT_YET, WRITTEN_HEADER
from praesto.agent.peers.source import PeerSource, Tuning

from praesto.spec import Source
from testkit.hub import LocalHub
from tests.download.conftest import MiB, hub, options_for, tree_of
from tests.peers.conftest import SERVER, Peers

FILES = {"model.safetensors": os.urandom(3 * MiB + 123)}  # LFS: sha256, so peers are asked
__all__ = ["hub"]  # the local hub fixture, shared with the download tests
LIES = ["moving-not-yet", "still-not-yet", "busy", "trickle", "short-body", "wrong-bytes", "silent"]


class Liar(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, lie: str) -> None:
        super().__init__(("127.0.0.1", 0), _LiarHandler)
        self.lie = lie
        self.written = itertools.count(1)
        self.answers = 0
        self.stop = threading.Event()


class _LiarHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Liar

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.answers += 1
        if self.path.endswith("/parts"):  # it holds everything, it says
            return self._send(200, json.dumps({"complete": True, "busy": 0}).encode())
        lie = self.server.lie
        data = FILES["model.safetensors"]
        start, end = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        if lie == "moving-not-yet":
            return self._send(
                NOT_YET, b"{}", {WRITTEN_HEADER: str(next(self.server.written)), "Retry-After": "1"}
            )
        if lie == "still-not-yet":
            return self._send(NOT_YET, b"{}", {WRITTEN_HEADER: "7", "Retry-After": "1"})
        if lie == "busy":
            return self._send(503, b"{}", {"Retry-After": "1"})
        if lie == "silent":
            self.server.stop.wait(30)
            return None
        body = data[start : end + 1]
        if lie == "wrong-bytes":
            body = bytes(len(body))
        head = {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
        if lie == "short-body":
            return self._send(206, body[:1], head, length=len(body))
        self._send(206, b"", head, length=len(body))
        if lie == "trickle":
            for i in range(len(body)):
                if self.server.stop.wait(0.2):
                    return None
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
            return None
        self.wfile.write(body)
        return None

    def _send(
        self, status: int, body: bytes, headers: dict[str, str] | None = None, *, length: int = -1
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length < 0 else length))
        self.end_headers()
        self.wfile.write(body)
        if length >= 0 and length != len(body):
            self.close_connection = True


@pytest.fixture(params=LIES)
def liar(request: pytest.FixtureRequest) -> Iterator[Liar]:
    server = Liar(request.param)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def test_a_peer_lying_in_any_way_is_dropped_and_the_origin_serves(
    liar: Liar, hub: LocalHub, peers: Peers, tmp_path: Path
) -> None:
    hub.add_repo("org/lied-about", FILES)
    options = options_for(hub, concurrency=2)
    planned = plan(Source("hf", "org/lied-about", "main"), options)
    address = f"127.0.0.1:{liar.server_port}"
    tuning = Tuning(min_seconds=0.5, timeout=1.0, stall_seconds=1.0, not_yet_pause=0.05, offer_seconds=0.05)
    source = PeerSource({address: SERVER}, peers.credentials(), "team-a", "m", planned.revision, tuning)
    finished: list[object] = []

    def run() -> None:
        try:
            finished.append(download(planned, tmp_path / "dest", options, PartSources(peers=source)))
        except BaseException as error:  # shown by the assertion below
            finished.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)  # a liveness bound, generous for a loaded machine: before the fix, never
    if worker.is_alive():
        options.cancel.set()
        worker.join(30)
        pytest.fail(f"the download was still waiting on a peer lying with {liar.lie!r} after 120 s")
    assert finished and not isinstance(finished[0], BaseException), finished
    assert tree_of(tmp_path / "dest") == FILES
    assert address in source.dropped, source.dropped
    assert hub.bytes_by_path["model.safetensors"] > 0  # the origin took what the liar held back
