"""OCI image layout archives written here, for `ctr images import`: no registry and no Docker.

One linux/amd64 image with one uncompressed layer, as an OCI image layout (oci-layout,
index.json, blobs/sha256/...) in a tar file. The layer is streamed: a file given by
`source` is read from disk while the archive is written, never held in memory, and the
layer's digest is computed on the way (its header is written as a placeholder and filled
in once the layer's size and digest are known), so an image of a few hundred MB costs one
sequential write. Same inputs, same bytes: every image digest is reproducible.

The config follows the OCI image spec's `config` object (image-spec v1.1 config.md):
Entrypoint, Cmd, Env, User, WorkingDir, Labels.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

EPOCH = 0  # the mtime of generated files and directories
BLOCK = tarfile.BLOCKSIZE
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class LayerFile:
    """One entry of the layer: a file (`data`, or streamed from `source`), a symlink, or a directory."""

    path: str  # relative to the image root, no leading slash
    data: bytes = b""
    mode: int = 0o755
    link_to: str = ""  # a symlink when set
    directory: bool = False
    source: Path | None = None  # the file's bytes are read from here (data is ignored)
    mtime: int = EPOCH  # a source's own mtime keeps its .pyc files valid in the image
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class ImageConfig:
    """The runtime defaults a container of the image gets (OCI image config `config`)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/bin",)
    user: str = ""
    working_dir: str = "/"
    labels: Mapping[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        config: dict[str, object] = {"Env": list(self.env), "WorkingDir": self.working_dir}
        for key, value in (("Entrypoint", list(self.entrypoint)), ("Cmd", list(self.cmd)),
                           ("User", self.user), ("Labels", dict(self.labels))):  # fmt: skip
            if value:
                config[key] = value
        return config


class _Digesting:
    """A write-only file that passes bytes on to `out` and keeps their sha256 and count."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256.hexdigest()


def _entries(files: Iterable[LayerFile]) -> list[LayerFile]:
    """`files` sorted, with a directory entry for every ancestor none of them names."""
    by_path: dict[str, LayerFile] = {}
    for item in files:
        if by_path.setdefault(item.path.strip("/"), item) != item:
            raise ValueError(f"two different layer entries for {item.path!r}")
    for path in list(by_path):
        for parent in PurePosixPath(path).parents:
            name = str(parent)
            if name == ".":
                break
            existing = by_path.setdefault(name, LayerFile(name, directory=True))
            if not existing.directory:
                raise ValueError(f"{name!r} is both a directory (of {path!r}) and a file or symlink")
    return [by_path[path] for path in sorted(by_path)]


def _tar_info(item: LayerFile) -> tarfile.TarInfo:
    info = tarfile.TarInfo(item.path.strip("/"))
    info.mtime, info.mode, info.uid, info.gid = item.mtime, item.mode, item.uid, item.gid
    if item.directory:
        info.type = tarfile.DIRTYPE
    elif item.link_to:
        info.type, info.linkname = tarfile.SYMTYPE, item.link_to
    elif item.source is not None:
        info.size = item.source.stat().st_size
    else:
        info.size = len(item.data)
    return info


def write_layer(out: _Digesting, files: Iterable[LayerFile]) -> None:
    """The layer tar of `files` (and their parent directories), written to `out`."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for item in _entries(files):
            info = _tar_info(item)
            if item.source is not None and info.isfile():
                with item.source.open("rb") as content:
                    tar.addfile(info, content)
            elif info.isfile():
                tar.addfile(info, _BytesReader(item.data))
            else:
                tar.addfile(info)


class _BytesReader:
    """Just enough of a file for tarfile.addfile, over bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.offset + size
        chunk, self.offset = self.data[self.offset : end], min(end, len(self.data))
        return chunk


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, EPOCH, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)  # one block: the layer's header is rewritten in place


def _pad(out: BinaryIO, size: int) -> None:
    out.write(b"\0" * (-size % BLOCK))


def _add_member(out: BinaryIO, name: str, data: bytes) -> None:
    out.write(_member_header(name, len(data)))
    out.write(data)
    _pad(out, len(data))


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def write_oci_archive(
    path: Path,
    reference: str,
    files: Iterable[LayerFile],
    entrypoint: Sequence[str] = (),
    config: ImageConfig | None = None,
) -> Path:
    """An OCI image layout archive at `path` holding one linux/amd64 image named `reference`.

    `entrypoint` alone keeps the defaults of a tool image (PATH=/bin, WorkingDir /);
    `config` sets every runtime default (its entrypoint, if any, wins)."""
    config = config or ImageConfig(entrypoint=entrypoint)
    if entrypoint and not config.entrypoint:
        config = ImageConfig(
            entrypoint, config.cmd, config.env, config.user, config.working_dir, config.labels
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        header_at = out.tell()
        out.write(_member_header(_blob_name("sha256:" + "0" * 64), 0))
        layer = _Digesting(out)
        write_layer(layer, files)
        _pad(out, layer.size)
        end = out.tell()
        out.seek(header_at)
        out.write(_member_header(_blob_name(layer.digest), layer.size))
        out.seek(end)

        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config.as_json(),
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        }
        config_blob = json.dumps(image_config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": _descriptor(CONFIG_MEDIA_TYPE, config_blob),
            "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size}],
        }
        manifest_blob = json.dumps(manifest, sort_keys=True).encode()
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [
                {
                    **_descriptor(MANIFEST_MEDIA_TYPE, manifest_blob),
                    "annotations": {"io.containerd.image.name": reference},
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        for blob in (config_blob, manifest_blob):
            _add_member(out, _blob_name("sha256:" + hashlib.sha256(blob).hexdigest()), blob)
        _add_member(out, "index.json", json.dumps(index, sort_keys=True).encode())
        _add_member(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        out.write(b"\0" * (2 * BLOCK))  # end of archive
    return path


def read_image(archive: Path) -> tuple[dict[str, Any], str]:
    """(the image config, the name of its layer member) of an archive written by write_oci_archive."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> Any:
            content = tar.extractfile(name)
            if content is None:
                raise ValueError(f"{archive} has no file {name!r}: not an OCI image layout archive")
            return json.load(content)

        (entry,) = member("index.json")["manifests"]
        manifest = member(_blob_name(entry["digest"]))
        config: dict[str, Any] = member(_blob_name(manifest["config"]["digest"]))
        (layer,) = manifest["layers"]
        return config, _blob_name(layer["digest"])


def extract_rootfs(archive: Path, destination: Path) -> Path:
    """The image's root filesystem unpacked under `destination` with its owners and modes (as root).

    By GNU tar, fed the layer from the archive: ten times faster than tarfile on a few hundred MB."""
    _config, layer_name = read_image(archive)
    destination.chmod(0o755)  # the image's /, which every user traverses
    untar = ["tar", "-x", "-p", "--numeric-owner", "-C", str(destination)]
    with tarfile.open(archive) as outer, subprocess.Popen(untar, stdin=subprocess.PIPE) as process:
        layer = outer.extractfile(layer_name)
        assert layer is not None and process.stdin is not None
        shutil.copyfileobj(layer, process.stdin, 1 << 20)
        process.stdin.close()
    if process.returncode != 0:
        raise RuntimeError(f"tar could not unpack the layer of {archive} ({process.returncode})")
    return destination
