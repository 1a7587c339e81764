"""A local Xet CAS on loopback that the real hf_xet client uploads to and downloads from.

Endpoints (hf-xet 1.8.0, xet_client/src/cas_client/remote_client.rs; https://huggingface.co/docs/xet/api):
* `POST /v1/xorb-grants/default/<hash>` -> 404: "the server does not offer upload grants", so
  the client uploads through `POST /v1/xorbs/default/<hash>` (`upload_xorb_through_grants`).
* `POST /v1/xorbs/default/<hash>` -> `{"was_inserted": bool}` (`UploadXorbResponse`).
* `POST /v2/shards` -> 404, so the client falls back to `POST /v1/shards` ->
  `{"result": 0|1}` (`upload_shard_with_version_override`, `UploadShardResponse`).
* `GET /v1|v2/reconstructions/<file hash>` (optional `Range: bytes=a-b` of the file) -> terms and
  per-xorb fetch URLs + byte ranges (cas_types/mod.rs); 416 past the end (`with_expected_416`).
* `GET /v1/chunks/default-merkledb/<chunk hash>` -> 404 (global dedup not offered: the client
  then dedups against its own shard cache only, `query_dedup_api` treats 404 as "not found").
* `GET /xorb/<hash>?exp=..&sig=..` with Range -> the "presigned" xorb bytes (206); an expired or
  wrong signature -> 403, which makes the client ask for the reconstruction again.
* `GET /token` -> `{"accessToken", "exp", "casUrl"}`, what a `token_refresh_url` answers
  (hf_xet/src/py_xet_session.rs, xet_client/src/hub_client/types.rs `CasJWTInfo`).
* `POST /v1/telemetry` -> 200.
Every `/v1`, `/v2` request needs `Authorization: Bearer <token>` of an unexpired token, else 401.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from testkit.xet.formats import parse_shard
from testkit.xet.store import CasStore

HASH = r"([0-9a-f]{64})"
URL_TTL = 3600


class XetDouble:
    """The CAS plus its token service; `url` is its endpoint (http://127.0.0.1:<free port>)."""

    def __init__(self) -> None:
        self.store = CasStore()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.token_ttl = 3600.0

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    def token(self, ttl: float | None = None) -> tuple[str, int]:
        return self.store.issue_token(self.token_ttl if ttl is None else ttl)

    def reconstruction(
        self, file_hash: str, version: int = 2, byte_range: tuple[int, int] | None = None
    ) -> Any:
        with self.store.lock:
            segments = self.store.files.get(file_hash)
            if segments is None:
                return None
            size = sum(s.unpacked for s in segments)
            first, last = byte_range or (0, size - 1)
            if first >= size:
                return "416"
            last = min(last, size - 1)
            terms: list[dict[str, Any]] = []
            fetches: dict[str, list[dict[str, Any]]] = {}
            offset, skip = 0, 0
            for seg in segments:
                seg_start, offset = offset, offset + seg.unpacked
                if offset <= first or seg_start > last:
                    continue
                if not terms:
                    skip = first - seg_start
                terms.append(
                    {
                        "hash": seg.xorb,
                        "unpacked_length": seg.unpacked,
                        "range": {"start": seg.start, "end": seg.end},
                    }
                )
                bounds = self.store.boundaries[seg.xorb]
                exp = int(time.time()) + URL_TTL
                url = f"{self.url}/xorb/{seg.xorb}?exp={exp}&sig={self.store.sign(seg.xorb, exp)}"
                byte_span = {"start": bounds[seg.start], "end": bounds[seg.end] - 1}
                chunks = {"start": seg.start, "end": seg.end}
                entry: dict[str, Any]
                if version == 1:
                    entry = {"range": chunks, "url": url, "url_range": byte_span}
                else:
                    entry = {"url": url, "ranges": [{"chunks": chunks, "bytes": byte_span}]}
                if entry not in fetches.setdefault(seg.xorb, []):
                    fetches[seg.xorb].append(entry)
        key = "fetch_info" if version == 1 else "xorbs"
        return {"offset_into_first_range": skip, "terms": terms, key: fetches}


def _handler(double: XetDouble) -> type[BaseHTTPRequestHandler]:
    store = double.store

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, doc: Any) -> None:
            self._send(status, json.dumps(doc).encode(), {"Content-Type": "application/json"})

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _authorized(self) -> bool:
            if store.token_ok(self.headers.get("Authorization")):
                return True
            self._body() if self.command == "POST" else None
            self._json(401, {"error": "token missing or expired"})
            return False

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            if path == "/v1/telemetry":
                self._body()
                self._send(200)
                return
            if not self._authorized():
                return
            if m := re.fullmatch(rf"/v1/xorbs/default/{HASH}", path):
                try:
                    inserted = store.put_xorb(m.group(1), self._body())
                except ValueError as err:
                    self._json(400, {"error": str(err)})
                    return
                self._json(200, {"was_inserted": inserted})
            elif path == "/v1/shards":
                try:
                    store.put_shard(parse_shard(self._body()))
                except ValueError as err:
                    self._json(400, {"error": str(err)})
                    return
                self._json(200, {"result": 1})
            else:
                self._body()
                if not path.startswith(("/v1/xorb-grants/", "/v2/shards")):
                    store.unexpected.append(f"POST {path}")
                self._json(404, {"error": "not offered"})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/token":
                token, exp = double.token()
                self._json(200, {"accessToken": token, "exp": exp, "casUrl": double.url})
                return
            if store.faults.status and re.match(r"/(xorb|v[12]/reconstructions)/", url.path):
                self._json(store.faults.status, {"error": "injected failure"})
                return
            if m := re.fullmatch(rf"/xorb/{HASH}", url.path):
                self._xorb_range(m.group(1), parse_qs(url.query))
                return
            if not self._authorized():
                return
            if m := re.fullmatch(rf"/v([12])/reconstructions/{HASH}", url.path):
                with store.lock:
                    store.counters.reconstructions += 1
                rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                doc = double.reconstruction(
                    m.group(2), int(m.group(1)), (int(rng[1]), int(rng[2])) if rng else None
                )
                if doc is None:
                    self._json(404, {"error": "no such file"})
                elif doc == "416":
                    self._send(416)
                else:
                    self._json(200, doc)
            elif url.path.startswith("/v1/chunks/"):
                with store.lock:
                    store.counters.dedup_queries += 1
                self._json(404, {"error": "global dedup not offered"})
            else:
                store.unexpected.append(f"GET {url.path}")
                self._json(404, {"error": "unknown endpoint"})

        def _xorb_range(self, xorb: str, query: dict[str, list[str]]) -> None:
            exp, sig = (query.get("exp") or ["0"])[0], (query.get("sig") or [""])[0]
            if not exp.isdigit() or not store.signature_ok(xorb, int(exp), sig):
                self._json(403, {"error": "signature invalid or expired"})
                return
            with store.lock:
                data = store.xorbs.get(xorb)
            if data is None:
                self._send(404)
                return
            rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
            if rng is None:
                self._send(200, data)
                return
            first, last = int(rng[1]), int(rng[2])
            if first >= len(data) or last < first:
                self._send(416, headers={"Content-Range": f"bytes */{len(data)}"})
                return
            last = min(last, len(data) - 1)
            with store.lock:
                store.counters.range_requests += 1
                store.counters.range_bytes_served += last - first + 1
            body, headers = data[first : last + 1], {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
            if (stall := store.faults.stall) is not None:
                self._stall(body, headers, stall)
                return
            self._send(206, body, headers)

        def _stall(self, body: bytes, headers: dict[str, str], release: threading.Event) -> None:
            """Half the body, then nothing until the test releases it (xet-core #883's stall)."""
            self.send_response(206)
            for k, v in (headers | {"Content-Length": str(len(body))}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            release.wait(60)
            self.close_connection = True

    return Handler


@contextmanager
def running_double() -> Iterator[XetDouble]:
    """A XetDouble serving on its own thread until the block ends."""
    double = XetDouble()
    thread = threading.Thread(
        target=double.server.serve_forever, name=f"xet-double-{double.url}", daemon=True
    )
    thread.start()
    try:
        yield double
    finally:
        double.server.shutdown()
        double.server.server_close()
        thread.join(timeout=10)
