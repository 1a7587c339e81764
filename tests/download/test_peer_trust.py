"""Peers never choose the bytes of a file the origin gave no digest for (multi-tenant finding 3).

A file whose plan has no digest (gs://, az://, multipart or SSE-KMS S3 objects)
was taken from a peer first and published with a sha256 computed over whatever
the peer sent. Now such a file comes from the origin only, and the manifest
records what vouched for every file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path

from praesto.agent.download.api import PartSources, RemoteFile, Sink
from praesto.agent.download.digests import StoreDigest
from praesto.agent.download.fetch import download, plan

from praesto import names
from praesto.spec import Source
from testkit.hub import LocalHub
from tests.download.conftest import MiB, options_for, tree_of


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
    download(planned, dest, options, PartSources(peers=peer))
    assert tree_of(dest)["weights.bin"] == weights
    assert peer.asked == set()  # config.json has a git SHA-1 only: not enough either (item 11)
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    verified_by = {f["path"]: f["verifiedBy"] for f in manifest["files"]}
    assert verified_by == {"weights.bin": "origin-only", "config.json": "git-blob-sha1"}


def test_only_sha256_lets_a_peer_supply_a_file(hub: LocalHub, tmp_path: Path) -> None:
    """Issue 21 item 11: git's SHA-1 and MD5 can be collided on purpose, so a peer holding one of
    a crafted pair could pass the other off; only a file the origin vouches for by sha256 (an LFS
    pointer, or a store's x-amz-checksum-sha256) comes from peers, the rest from the origin."""
    files = {name: os.urandom(2 * MiB) for name in ("lfs.bin", "md5.bin", "sha1.bin", "store256.bin")}
    files["config.json"] = b'{"a": 1}'  # small: the hub lists its git blob SHA-1 only
    hub.add_repo("org/mixed", files)
    options = options_for(hub)
    planned = plan(Source("hf", "org/mixed", "main"), options)
    by_store = {"md5.bin": "md5", "sha1.bin": "sha1", "store256.bin": "sha256"}

    def as_listed(f: RemoteFile) -> RemoteFile:
        algorithm = by_store.get(f.path)
        if algorithm is None:
            return f
        value = hashlib.new(algorithm, files[f.path]).hexdigest()
        return dataclasses.replace(f, sha256=None, digest=StoreDigest(algorithm, value, "x-test-checksum"))

    planned = dataclasses.replace(planned, files=tuple(as_listed(f) for f in planned.files))
    peer = RecordingPeer()
    dest = tmp_path / "dest"
    download(planned, dest, options, PartSources(peers=peer))
    assert tree_of(dest) == files
    assert peer.asked == {"lfs.bin", "store256.bin"}


def test_a_small_file_known_by_git_sha1_is_reused_only_in_its_own_namespace(
    hub: LocalHub, tmp_path: Path
) -> None:
    """Item 11: the index from (source, revision, path, git id) to a verified blob is per namespace:
    bytes verified only by a collidable SHA-1 in one namespace are never linked into another."""
    files = {"config.json": b'{"a": 1}', "tokenizer.json": b'{"t": 2}'}
    hub.add_repo("org/small", files)
    blobs = tmp_path / "store" / ".praesto" / "blobs" / "sha256"
    source = Source("hf", "org/small", "main")
    for scope, dest in (("tenant-a", "a1"), ("tenant-b", "b1"), ("tenant-a", "a2")):
        hub.reset_counters()
        options = options_for(hub, blobs_dir=blobs, dedup_scope=scope)
        result = download(plan(source, options), tmp_path / "store" / scope / dest, options)
        reused = dest == "a2"
        assert result.bytes_deduplicated == (sum(map(len, files.values())) if reused else 0), dest
        assert hub.bytes_served == (0 if reused else sum(map(len, files.values()))), dest
