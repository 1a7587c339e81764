"""The container images the node tier runs, built here: no registry is reachable.

* the **pause** image (the Pod sandbox), compiled from the Kubernetes module's own
  `build/pause/linux/pause.c` (`gcc -static`), as `registry.k8s.io/pause` is built upstream;
* a small **busybox** image from Debian's static busybox (`busybox-static`), with a link per
  applet, for test Pods (`sh`, `sha256sum`, `cat`, `sleep`, ...).

Each is written as an OCI image layout archive (oci-layout, index.json, blobs) with one
uncompressed layer, and imported by containerd's own client (`ctr images import`), so
containerd unpacks and stores it as it would a pulled image. Pods use them with
`imagePullPolicy: Never`.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "praesto.test/pause:3.10"
BUSYBOX_IMAGE = "praesto.test/busybox:1"
BUSYBOX = Path("/bin/busybox")
EPOCH = 0  # every file and blob is reproducible: the same image digest on every run


class ImageUnavailable(RuntimeError):
    """A build input (gcc, busybox-static, the Kubernetes module) is missing."""


@dataclass(frozen=True)
class LayerFile:
    path: str
    data: bytes = b""
    mode: int = 0o755
    link_to: str = ""  # a symlink when set
    directory: bool = False


def _layer(files: list[LayerFile]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({str(Path(f.path).parent) for f in files} - {"."})
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)
        for item in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(item.path)
            info.mtime, info.mode = EPOCH, item.mode
            if item.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif item.link_to:
                info.type, info.linkname = tarfile.SYMTYPE, item.link_to
                tar.addfile(info)
            else:
                info.size = len(item.data)
                tar.addfile(info, io.BytesIO(item.data))
    return buffer.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def write_oci_archive(path: Path, reference: str, files: list[LayerFile], entrypoint: list[str]) -> Path:
    """An OCI image layout archive holding one linux/amd64 image named `reference`."""
    blobs: dict[str, bytes] = {}
    layer = _layer(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(blobs, json.dumps(config, sort_keys=True).encode()),
        },
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                "annotations": {"io.containerd.image.name": reference},
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def pause_binary(kubernetes_module_dir: Path, workdir: Path) -> bytes:
    """Kubernetes' pause.c compiled static, as build/pause/Makefile does (gcc -Os -static)."""
    source = kubernetes_module_dir / "build" / "pause" / "linux" / "pause.c"
    if not source.exists() or shutil.which("gcc") is None:
        raise ImageUnavailable(f"cannot build the pause image: need gcc and {source}")
    out = workdir / "pause"
    subprocess.run(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.10-praesto", "-o", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(out)], check=True)
    return out.read_bytes()


def busybox_files() -> list[LayerFile]:
    if not BUSYBOX.exists():
        raise ImageUnavailable("the busybox image needs Debian's busybox-static (scripts/install.sh)")
    applets = subprocess.run([str(BUSYBOX), "--list"], check=True, capture_output=True, text=True).stdout
    links = [LayerFile(f"bin/{name}", link_to="busybox") for name in applets.split() if name != "busybox"]
    return [
        LayerFile("bin/busybox", BUSYBOX.read_bytes()),
        *links,
        LayerFile("tmp", mode=0o1777, directory=True),
    ]


def build_images(kubernetes_module_dir: Path, workdir: Path) -> dict[str, Path]:
    """Both images as OCI archives under `workdir`, by reference."""
    workdir.mkdir(parents=True, exist_ok=True)
    pause = [LayerFile("pause", pause_binary(kubernetes_module_dir, workdir))]
    return {
        PAUSE_IMAGE: write_oci_archive(workdir / "pause.tar", PAUSE_IMAGE, pause, ["/pause"]),
        BUSYBOX_IMAGE: write_oci_archive(
            workdir / "busybox.tar", BUSYBOX_IMAGE, busybox_files(), ["/bin/sh"]
        ),
    }
