"""The container images the node tier runs, built here: no registry is reachable.

* the **pause** image (the Pod sandbox), compiled from the Kubernetes module's own
  `build/pause/linux/pause.c` (`gcc -static`), as `registry.k8s.io/pause` is built upstream;
* a small **busybox** image from Debian's static busybox (`busybox-static`), with a link per
  applet, for test Pods (`sh`, `sha256sum`, `cat`, `sleep`, ...).

Each is written as an OCI image layout archive (`testkit/oci_archive.py`, one
uncompressed layer, reproducible), and imported by containerd's own client (`ctr images import`), so
containerd unpacks and stores it as it would a pulled image. Pods use them with
`imagePullPolicy: Never`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from testkit.oci_archive import LayerFile, write_oci_archive

PAUSE_IMAGE = "praesto.test/pause:3.10"
BUSYBOX_IMAGE = "praesto.test/busybox:1"
BUSYBOX = Path("/bin/busybox")


class ImageUnavailable(RuntimeError):
    """A build input (gcc, busybox-static, the Kubernetes module) is missing."""


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
