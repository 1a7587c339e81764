"""Drive the real hf_xet client (PyPI hf-xet, pinned) against a XetDouble, in a child process.

A child process because hf_xet keeps process-wide state (its tokio runtime, its cache root read
from HF_XET_CACHE, its log directory): each call gets its own cache folder and environment, so
tests under pytest-xdist share nothing. The child uses the XetSession API the way
huggingface_hub 2.4.0 does (`_commit_api.py` upload, `file_download.py` `xet_get`), signatures
from hf_xet/src/py_xet_session.rs: `new_upload_commit` / `new_file_download_group` with
`endpoint`, `token`, `token_expiry_unix_secs`, `token_refresh_url`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from testkit.xet.server import XetDouble

CHILD = r"""
import json, sys
import hf_xet
job = json.load(sys.stdin)
session = hf_xet.XetSession()
auth = dict(endpoint=job["endpoint"], token=job["token"], token_expiry_unix_secs=job["exp"],
            token_refresh_url=job["token_url"])
out = []
if job["op"] == "upload":
    with session.new_upload_commit(**auth) as commit:
        handles = [commit.start_upload_file(p, sha256=hf_xet.COMPUTE_SHA256) for p in job["paths"]]
    for p, h in zip(job["paths"], handles):
        info = h.result().xet_info
        out.append({"path": p, "hash": info.hash, "size": info.file_size, "sha256": info.sha256})
else:
    with session.new_file_download_group(**auth) as group:
        for f in job["files"]:
            group.start_download_file(hf_xet.XetFileInfo(f["hash"], f["size"]), f["dest"])
    out = [f["dest"] for f in job["files"]]
json.dump(out, sys.stdout)
"""


@dataclass(frozen=True)
class Uploaded:
    path: str
    hash: str
    size: int
    sha256: str


class HfXet:
    """The real client pointed at `double`, caching under `cache` (one folder per client "machine")."""

    def __init__(self, double: XetDouble, cache: Path, token_ttl: float = 3600.0) -> None:
        self.double, self.cache, self.token_ttl = double, cache, token_ttl

    def _run(self, job: dict[str, object]) -> list[object]:
        token, exp = self.double.token(self.token_ttl)
        job |= {"endpoint": self.double.url, "token": token, "exp": exp, "token_url": self.double.token_url}
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HF_", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"))
        }
        env |= {
            "HF_XET_CACHE": str(self.cache),
            "HF_HOME": str(self.cache / "hf-home"),
            "HF_XET_TELEMETRY_ENABLED": "false",
            "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0",  # every download really fetches from the double
            "NO_PROXY": "127.0.0.1,localhost",
        }
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
        if done.returncode != 0:
            raise RuntimeError(f"hf_xet {job['op']} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        result: list[object] = json.loads(done.stdout)
        return result

    def upload(self, paths: list[Path]) -> list[Uploaded]:
        rows = self._run({"op": "upload", "paths": [str(p) for p in paths]})
        return [Uploaded(**r) for r in rows if isinstance(r, dict)]

    def download(self, files: list[tuple[str, int, Path]]) -> None:
        self._run({"op": "download", "files": [{"hash": h, "size": s, "dest": str(d)} for h, s, d in files]})
