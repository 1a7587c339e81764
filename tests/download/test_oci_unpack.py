"""Archive layers unpack into the tree, and nothing unsafe ever lands there (agent/download/unpack.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import zstandard
from praesto.agent.download import unpack
from praesto.agent.download.api import Archive, LastingDownloadError, Plan, RemoteFile
from praesto.agent.download.origins.oci.plan import ARCHIVE_DIR
from praesto.agent.download.unpack import ENTRY_BYTES, MAX_HEADER_BYTES, unpack_layers

from praesto.spec import Source

SOURCE = Source("oci", "127.0.0.1:5000/team/model", "1.0")


def _tar(members: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
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
    "hard link in": [_file("a", b"x"), _special("b", tarfile.LNKTYPE, "a")],
    "device": [_special("dev", tarfile.CHRTYPE)],
    "block device": [_special("disk", tarfile.BLKTYPE)],
    "fifo": [_special("fifo", tarfile.FIFOTYPE)],
    "file under a file": [_file("a", b"x"), _file("a/b", b"y")],
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
    assert not (tree / "b").exists() and not (tree / "a" / "b").exists()


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


# ---- how much a layer may put on disk (issue #37, 2) ---------------------------------------------
MiB = 1 << 20


def _landed(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["tar+gzip", "tar+zstd"])
def test_a_layer_that_says_nothing_stops_as_it_crosses_the_bound(tmp_path: Path, kind: str) -> None:
    """A few KB expanding to 4 MiB, against a 1 MiB storage.size: the member that would cross is
    refused before its first byte, so the tree holds no more than the bound when it stops."""
    tree = tmp_path / "tree"
    shards = [_file(f"w/shard-{n}.bin", bytes(256 << 10)) for n in range(16)]  # 16 x 256 KiB of zeros
    layer = _stage(tree, _encode(_tar(shards), kind), kind)
    assert layer.size < 64 << 10
    with pytest.raises(LastingDownloadError) as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None, bound=MiB)
    assert refused.value.reason == "SizeExceedsRequest"
    assert "member 'w/shard-3.bin'" in refused.value.message  # the layer + 3 shards fit, the 4th does not
    assert "spec.storage.size 1.0 MiB (1048576 bytes)" in refused.value.message
    assert "unpacking stopped" in refused.value.message
    assert layer.size + 3 * (256 << 10) == _landed(tree) <= MiB


def test_the_bound_counts_the_whole_copy_not_each_layer(tmp_path: Path) -> None:
    """Two layers each within the bound but together over it, beside a raw file."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "config.json").write_bytes(b"{}")
    raw = RemoteFile("config.json", 2, sha256=hashlib.sha256(b"{}").hexdigest())
    first = _stage(tree, gzip.compress(_tar([_file("a.bin", bytes(600 << 10))])), "tar+gzip", path="a")
    second = _stage(tree, gzip.compress(_tar([_file("b.bin", bytes(600 << 10))])), "tar+gzip", path="b")
    with pytest.raises(LastingDownloadError, match=r"member 'b\.bin'") as refused:
        unpack_layers(Plan(SOURCE, "r", (raw, first, second)), tree, {}, None, bound=MiB)
    assert refused.value.reason == "SizeExceedsRequest" and _landed(tree) <= MiB


def test_a_copy_within_the_bound_unpacks(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    blob = gzip.compress(_tar([_file("w.bin", bytes(MiB - 4096))]))
    layer = _stage(tree, blob, "tar+gzip")
    bound = MiB - 4096 + len(blob)  # exactly the layer and what it unpacks to
    result = unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None, bound=bound)
    assert [f.path for f in result.files] == ["w.bin"]


def test_many_empty_files_are_bounded_by_entries(tmp_path: Path) -> None:
    """Inodes, not bytes: one entry per ENTRY_BYTES of the bound."""
    tree = tmp_path / "tree"
    allowed = MiB // ENTRY_BYTES
    layer = _stage(tree, gzip.compress(_tar([_file(f"e{n}", b"") for n in range(allowed + 1)])), "tar+gzip")
    with pytest.raises(LastingDownloadError, match=f"is entry {allowed + 1}") as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None, bound=MiB)
    assert refused.value.reason == "SizeExceedsRequest"
    # The unpacked e<n> files only: the staged layer is named by its digest, which may start with "e".
    assert sum(1 for p in tree.iterdir() if re.fullmatch(r"e\d+", p.name)) == allowed


def test_folders_a_path_implies_count_as_entries(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    deep = "/".join(["d"] * 300) + "/w.bin"  # one member, 300 folders made for it
    layer = _stage(tree, _tar([_file(deep, b"x")]), "tar")
    with pytest.raises(LastingDownloadError, match="is entry 301") as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None, bound=MiB)
    assert refused.value.reason == "SizeExceedsRequest" and not (tree / "d").exists()


def test_without_a_bound_entries_still_stop_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unpack, "MAX_ENTRIES", 50)  # 100,000 in the product: the same rule, faster
    tree = tmp_path / "tree"
    layer = _stage(tree, _tar([_file(f"e{n}", b"") for n in range(51)]), "tar")
    with pytest.raises(LastingDownloadError, match="at most 50") as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None)
    assert refused.value.reason == "InvalidRepoFile"


def test_a_huge_pax_header_is_refused_before_it_is_read_into_memory(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    info, data = _file("w.bin", b"x")
    info.pax_headers = {"comment": "c" * (MAX_HEADER_BYTES + 1)}
    layer = _stage(tree, gzip.compress(_tar([(info, data)])), "tar+gzip")
    with pytest.raises(LastingDownloadError, match="header record of") as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None)
    assert refused.value.reason == "InvalidRepoFile" and not (tree / "w.bin").exists()


@pytest.mark.parametrize("cut", ["gzip stream", "tar member"])
def test_a_truncated_layer_is_refused_as_invalid(tmp_path: Path, cut: str) -> None:
    tree = tmp_path / "tree"
    whole = _tar([_file("w.bin", bytes(200_000))])
    if cut == "gzip stream":
        blob, kind = gzip.compress(whole)[:-40], "tar+gzip"
    else:  # the header says 200,000 bytes, the layer ends long before
        blob, kind = whole[:2048], "tar"
    layer = _stage(tree, blob, kind)
    with pytest.raises(LastingDownloadError, match="not a valid") as refused:
        unpack_layers(Plan(SOURCE, "r", (layer,)), tree, {}, None, bound=MiB)
    assert refused.value.reason == "InvalidRepoFile"


def test_a_member_yielding_more_than_its_header_said_stops_before_writing_it(tmp_path: Path) -> None:
    """The second count, as bytes land: a reader that gives more than the size counted is cut off."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(LastingDownloadError, match="more bytes than its header's 5"):
        unpack._write(io.BytesIO(b"x" * 10), tree, "w.bin", 5, "sha256:" + "0" * 64, "layer")
    assert (tree / "w.bin").stat().st_size == 0
