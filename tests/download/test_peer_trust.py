"""Peers never choose the bytes of a file the origin gave no digest for (multi-tenant finding 3).

A file whose plan has no digest (gs://, az://, multipart or SSE-KMS S3 objects)
was taken from a peer first and published with a sha256 computed over whatever
the peer sent. Now such a file comes from the origin only, and the manifest
records what vouched for every file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

from praesto.agent.download import download, plan
from praesto.agent.download.api import RemoteFile, Sink

from praesto import names
from praesto.spec import Source
from tests.download.conftest import MiB, options_for, tree_of
from tests.support.hub import LocalHub


class RecordingPeer:
    """A peer that records which files it is asked for (and delivers nothing: the origin serves all).

    Whether a lying peer is caught for files that have a digest is tested with four real
    agents in tests/peers/test_peer_cluster.py; here the question is which files a peer is
    asked for at all."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        self.asked.add(file.path)
        return 0

    def blame(self, file: RemoteFile) -> bool:
        return False


def test_a_file_without_an_origin_digest_never_comes_from_a_peer(hub: LocalHub, tmp_path: Path) -> None:
    weights = os.urandom(2 * MiB)
    hub.add_repo("org/store-like", {"weights.bin": weights, "config.json": b'{"a": 1}'})
    options = options_for(hub)
    planned = plan(Source("hf", "org/store-like", "main"), options)
    # As an object store lists a multipart object: a size and an ETag, no content digest.
    undigested = [
        dataclasses.replace(f, sha256=None, git_sha1=None, digest=None) if f.path == "weights.bin" else f
        for f in planned.files
    ]
    planned = dataclasses.replace(planned, files=tuple(undigested))
    peer = RecordingPeer()
    dest = tmp_path / "dest"
    download(planned, dest, dataclasses.replace(options, peers=peer))
    assert tree_of(dest)["weights.bin"] == weights
    assert peer.asked == {"config.json"}  # the file with the origin's digest only
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    verified_by = {f["path"]: f["verifiedBy"] for f in manifest["files"]}
    assert verified_by == {"weights.bin": "origin-only", "config.json": "git-blob-sha1"}
