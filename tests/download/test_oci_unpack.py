"""Archive layers unpack into the tree, and nothing unsafe ever lands there (agent/download/unpack.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest
import zstandard
from praesto.agent.download.api import Archive, LastingDownloadError, Plan, RemoteFile
from praesto.agent.download.ociplan import ARCHIVE_DIR
from praesto.agent.download.unpack import unpack_layers

from praesto.spec import Source

SOURCE = Source("oci", "127.0.0.1:5000/team/model", "1.0")


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def _encode(tar: bytes, kind: str) -> bytes:
    if kind == "tar+gzip":
        return gzip.compress(tar)
    if kind == "tar+zstd":
        return zstandard.ZstdCompressor().compress(tar)
    return tar


def _stage(tree: Path, blob: bytes, kind: str, limit: int | None = None, path: str = "weights") -> RemoteFile:
    hex_ = hashlib.sha256(blob).hexdigest()
    layer = RemoteFile(f"{ARCHIVE_DIR}/{hex_}", len(blob), sha256=hex_, archive=Archive(kind, path, limit))
    (tree / layer.path).parent.mkdir(parents=True, exist_ok=True)
    (tree / layer.path).write_bytes(blob)
    return layer


@pytest.mark.parametrize("kind", ["tar", "tar+gzip", "tar+zstd"])
def test_each_archive_kind_unpacks_hashed_and_shared_with_the_blob_area(tmp_path: Path, kind: str) -> None:
    tree, blobs = tmp_path / "tree", tmp_path / "blobs"
    weights = b"w" * 300_000
    blob = _encode(
        _tar([_file("model/weights.safetensors", weights), _file("model/config.json", b"{}")]), kind
    )
    layer = _stage(tree, blob, kind, limit=300_002)
    raw = RemoteFile("README.md", 5, sha256=hashlib.sha256(b"hello").hexdigest())
    (tree / "README.md").write_bytes(b"hello")
    sha256 = {raw.path: str(raw.sha256), layer.path: str(layer.sha256)}

    result = unpack_layers(Plan(SOURCE, "sha256:" + "a" * 64, (raw, layer)), tree, sha256, blobs)

    assert [f.path for f in result.files] == ["README.md", "model/config.json", "model/weights.safetensors"]
    assert result.layers == (layer,)
    assert (tree / "model/weights.safetensors").read_bytes() == weights
    assert sha256["model/weights.safetensors"] == hashlib.sha256(weights).hexdigest()
    assert layer.path not in sha256 and not (tree / ARCHIVE_DIR).exists()  # the archive is gone
    assert all(f.layer == f"sha256:{layer.sha256}" for f in result.files if f.path.startswith("model/"))
    blob_copy = blobs / hashlib.sha256(weights).hexdigest()
    assert blob_copy.stat().st_ino == (tree / "model/weights.safetensors").stat().st_ino


def test_bytes_already_in_the_blob_area_are_linked_not_kept_twice(tmp_path: Path) -> None:
    tree, blobs = tmp_path / "tree", tmp_path / "blobs"
    weights = b"x" * 100_000
    blobs.mkdir()
    (blobs / hashlib.sha256(weights).hexdigest()).write_bytes(weights)
    layer = _stage(tree, _tar([_file("w.bin", weights)]), "tar")
    unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, blobs)
    assert (tree / "w.bin").stat().st_ino == (blobs / hashlib.sha256(weights).hexdigest()).stat().st_ino


HOSTILE: dict[str, list[tuple[tarfile.TarInfo, bytes | None]]] = {
    "dot-dot": [_file("../escape", b"x")],
    "absolute": [_file("/etc/passwd", b"x")],
    "marker": [_file(".praesto-complete", b"x")],
    "symlink out": [_special("model/link", tarfile.SYMTYPE, "/etc/shadow")],
    "symlink in": [_file("a", b"x"), _special("b", tarfile.SYMTYPE, "a")],
    "hard link out": [_special("model/hard", tarfile.LNKTYPE, "../../outside")],
    "device": [_special("dev", tarfile.CHRTYPE)],
    "fifo": [_special("fifo", tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused_naming_the_layer_and_member(tmp_path: Path, case: str) -> None:
    tree = tmp_path / "tree"
    layer = _stage(tree, _tar(HOSTILE[case]), "tar")
    with pytest.raises(LastingDownloadError) as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None)
    assert refused.value.reason == "InvalidRepoFile"
    assert f"sha256:{layer.sha256}" in refused.value.message and "member" in refused.value.message
    assert not (tmp_path / "escape").exists() and not (tree / "model" / "link").exists()


def test_more_bytes_than_the_metadata_allows_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    layer = _stage(tree, gzip.compress(_tar([_file("big.bin", b"z" * 50_000)])), "tar+gzip", limit=1_000)
    with pytest.raises(LastingDownloadError, match=r"\(1000 bytes\)"):
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None)
    assert not (tree / "big.bin").exists()


def test_a_file_two_layers_write_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree).mkdir()
    (tree / "config.json").write_bytes(b"{}")
    raw = RemoteFile("config.json", 2, sha256=hashlib.sha256(b"{}").hexdigest())
    layer = _stage(tree, _tar([_file("config.json", b"{ }")]), "tar")
    with pytest.raises(LastingDownloadError, match="another layer"):
        unpack_layers(Plan(SOURCE, "r", (raw, layer)), tree, {}, None)
    assert (tree / "config.json").read_bytes() == b"{}"


def test_a_corrupt_archive_is_refused_not_crashed(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    layer = _stage(tree, b"\x1f\x8b\x08\x00garbage" * 10, "tar+gzip")
    with pytest.raises(LastingDownloadError, match="not a valid tar\\+gzip"):
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None)
