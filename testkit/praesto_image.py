"""Praesto's container image for the node tier, assembled from this machine: no registry, no Docker.

The node tier runs our own processes in real Pods (the shared-PVC mode's download Job runs
`praesto-agent download` as uid 65532 on a read-only root), so it needs an image holding
the installed wheel. It is built the way the Dockerfile's runtime stage lays it out:

* the venv at /opt/praesto (the Dockerfile's `COPY --from=builder /opt/praesto`): a
  `pyvenv.cfg`, `bin/python` linking to the interpreter, the site-packages of the
  installed wheel and its runtime dependencies (with their .pyc files: without them every
  start compiles the kubernetes client again, ~4x slower), and the wheel's console scripts
  with their shebang on the image's python;
* the interpreter that venv was made from, at its own path on this machine (its RUNPATH
  and prefix are absolute): the binary, libpython and the standard library without test
  suites, idle/tkinter, ensurepip, lib2to3 and the static library; ELF files from it are
  copied without debug info;
* the shared-library closure (`ldd` of the interpreter and of every shipped extension
  module, dynamic loader included) at the same paths, with the symlinks on the way
  (/lib -> usr/lib, ...), and libgcc_s, which glibc loads itself for pthread_exit;
* /tmp (1777), /etc/passwd and /etc/group naming 65532 `nonroot` (distroless' user),
  /etc/nsswitch.conf, and the system CA bundle when there is one;
* the config (Env, User, WorkingDir, Cmd, Entrypoint, Labels) read from the Dockerfile's
  runtime stage, on top of what its base image (python:slim) sets.

Written with testkit/oci_archive.py as `praesto.test/praesto:dev`, cached under
build/images/ by the wheel's contents, the interpreter, the dependency venv and this
builder's own sources; one build serves every process (made under an exclusive lock,
used under a shared one, archives of other keys pruned when no process holds them).

    image = praesto_image()                  # PraestoImage, built on first call
    containerd.import_image(image.archive)   # Pods then run image.reference
"""

from __future__ import annotations

import configparser
import fcntl
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testkit import dockerfile
from testkit.helm_chart import ROOT
from testkit.installed_wheel import _HELD, InstalledWheel, _lock, _unused, installed_wheel
from testkit.oci_archive import ImageConfig, LayerFile, write_oci_archive

PRAESTO_IMAGE = "praesto.test/praesto:dev"
IMAGE_DIR = ROOT / "build" / "images"
VENV = "/opt/praesto"  # where the Dockerfile's builder stage makes the venv its runtime stage copies
NONROOT = 65532  # distroless' nonroot, the Dockerfile's USER and the download Job's runAsUser
# What python:3.11-slim (the Dockerfile's base) sets; the runtime stage's ENV builds on it.
BASE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Parts of the standard library no Praesto process imports.
STDLIB_SKIPPED_DIRS = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                       "site-packages", "__phello__"}  # fmt: skip
STDLIB_SKIPPED_FILES = re.compile(r"^(_test|_ctypes_test|_xxtestfuzz|xxlimited|_tkinter|xxsubtype)")
DLOPENED = ("libgcc_s.so.1",)  # glibc loads it at pthread_exit/cancel, ldd cannot see that
ELF_NAME = re.compile(r"\.so($|\.)")
ETC = {
    "etc/passwd": f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/tmp:/sbin/nologin\n",
    "etc/group": f"root:x:0:\nnonroot:x:{NONROOT}:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
PROBE = """
import json, os, ssl, sys, sysconfig
print(json.dumps({
    "base_prefix": sys.base_prefix,
    "executable": os.path.realpath(sys._base_executable),
    "version": sys.version,
    "stdlib": sysconfig.get_path("stdlib"),
    "cache_tag": sys.implementation.cache_tag,
    "site_dirs": [p for p in sys.path if p.endswith("site-packages") and not p.startswith(sys.base_prefix)],
    "purelib": sysconfig.get_path("purelib"),
    "cafile": ssl.get_default_verify_paths().openssl_cafile,
}))
"""


class ImageBuildError(RuntimeError):
    """The machine lacks something the image needs (ldd), or the Dockerfile no longer matches the layout."""


@dataclass(frozen=True)
class Interpreter:
    """What the installed wheel's venv runs on, as its own python reports it."""

    base_prefix: str
    executable: str
    version: str
    stdlib: str
    cache_tag: str
    site_dirs: list[str]  # the venv's own first, then the dependencies' (through a .pth)
    purelib: str
    cafile: str

    @property
    def image_site_packages(self) -> str:
        return f"{VENV}/{os.path.relpath(self.purelib, Path(self.purelib).parents[2])}"


@dataclass(frozen=True)
class PraestoImage:
    reference: str
    archive: Path
    config: ImageConfig

    @property
    def python(self) -> str:
        return f"{VENV}/bin/python"


def probe(install: InstalledWheel) -> Interpreter:
    out = subprocess.run([str(install.python), "-c", PROBE], capture_output=True, text=True, check=True)
    return Interpreter(**json.loads(out.stdout))


def runtime_config() -> ImageConfig:
    """Env, User, WorkingDir, Cmd, Entrypoint and Labels of the Dockerfile's runtime (last) stage."""
    env, labels = dict(BASE_ENV), dict[str, str]()
    user, workdir = "", "/"
    cmd: list[str] = []
    entrypoint: list[str] = []

    def expand(value: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)

    for keyword, rest in dockerfile.stages()[-1]:
        if keyword in ("ENV", "LABEL"):
            pairs = dict(token.split("=", 1) for token in shlex.split(rest))
            (env if keyword == "ENV" else labels).update({k: expand(v) for k, v in pairs.items()})
        elif keyword == "USER":
            user = expand(rest)
        elif keyword == "WORKDIR":
            workdir = expand(rest)
        elif keyword in ("CMD", "ENTRYPOINT"):
            (cmd if keyword == "CMD" else entrypoint)[:] = json.loads(rest)
    if f"{VENV}/bin" not in env["PATH"].split(":"):
        raise ImageBuildError(f"the Dockerfile's runtime PATH {env['PATH']!r} no longer holds {VENV}/bin")
    return ImageConfig(entrypoint, cmd, [f"{k}={v}" for k, v in env.items()], user, workdir, labels)


def _file(path: str, source: Path) -> LayerFile:
    """A host file in the image at `path`, readable by every user, with its own mtime and mode."""
    stat = source.stat()
    return LayerFile(path.lstrip("/"), source=source, mode=(stat.st_mode & 0o7777) | 0o444,
                     mtime=int(stat.st_mtime))  # fmt: skip


def _host_path(path: str, depth: int = 0) -> Iterator[LayerFile]:
    """The host file at `path` at the same path in the image, with each symlink on the way to it."""
    if depth > 20:
        raise ImageBuildError(f"too many symlinks resolving {path}")
    current = Path("/")
    parts = Path(path).parts[1:]
    for index, part in enumerate(parts):
        candidate = current / part
        if candidate.is_symlink():
            target = os.readlink(candidate)
            yield LayerFile(str(candidate).lstrip("/"), link_to=target, mode=0o777)
            resolved = os.path.normpath(os.path.join(current, target))
            yield from _host_path(os.path.join(resolved, *parts[index + 1 :]), depth + 1)
            return
        current = candidate
    yield _file(str(current), current)


def _stdlib(interpreter: Interpreter) -> Iterator[Path]:
    """The standard library's files worth shipping: sources, this interpreter's .pyc, extension modules."""
    tag = f".{interpreter.cache_tag}.pyc"
    for directory, subdirs, names in os.walk(interpreter.stdlib):
        subdirs[:] = [d for d in subdirs if d not in STDLIB_SKIPPED_DIRS and not d.startswith("config-")]
        in_cache = directory.endswith("__pycache__")
        for name in names:
            if (in_cache and not name.endswith(tag)) or STDLIB_SKIPPED_FILES.match(name):
                continue
            yield Path(directory, name)


def _site_packages(interpreter: Interpreter) -> dict[str, Path]:
    """Relative path -> host file, over every site dir of the install (the first one wins).

    A .pth naming a host site dir (how the install sees its cached dependencies) is dropped:
    in the image those files sit in the one site-packages."""
    tag = f".{interpreter.cache_tag}.pyc"
    files: dict[str, Path] = {}
    for site in interpreter.site_dirs:
        for directory, _subdirs, names in os.walk(site):
            in_cache = directory.endswith("__pycache__")
            for name in names:
                host = Path(directory, name)
                if in_cache and not name.endswith(tag):
                    continue
                if name.endswith(".pth") and any(s in host.read_text() for s in interpreter.site_dirs):
                    continue
                files.setdefault(os.path.relpath(host, site), host)
    return files


def _ldd(paths: Iterable[Path | str]) -> set[str]:
    """The libraries `paths` load, by `ldd` (one run for all of them), the dynamic loader included."""
    if shutil.which("ldd") is None:
        raise ImageBuildError("the image's shared-library closure needs ldd (libc-bin)")
    out = subprocess.run(["ldd", *map(str, paths)], capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        match = re.match(r"\s+(?:\S+ => )?(/\S+) \(0x", line)
        if match:
            found.add(match.group(1))
    return found


def _ldconfig_paths(names: Iterable[str]) -> set[str]:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    wanted = set(names)
    return {
        m.group(2)
        for m in re.finditer(r"^\s+(\S+) \(libc6,x86-64\) => (\S+)$", out, re.M)
        if m.group(1) in wanted
    }


def _stripped(files: list[LayerFile], interpreter: Interpreter, staging: Path) -> list[LayerFile]:
    """The interpreter's own ELF files (binary, libpython, lib-dynload) as copies without debug info."""
    if shutil.which("strip") is None:
        return files
    out: list[LayerFile] = []
    to_strip: list[Path] = []
    for item in files:
        source = item.source
        if (
            source is not None
            and str(source).startswith(interpreter.base_prefix + "/")
            and (ELF_NAME.search(source.name) or str(source) == interpreter.executable)
        ):
            copy = staging / item.path
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
            to_strip.append(copy)
            item = LayerFile(item.path, source=copy, mode=item.mode, mtime=item.mtime)
        out.append(item)
    if to_strip:
        subprocess.run(["strip", "--strip-debug", *map(str, to_strip)], check=True, capture_output=True)
    return out


def _console_scripts(install: InstalledWheel, interpreter: Interpreter) -> list[LayerFile]:
    """The wheel's console scripts (its entry_points.txt), their shebang on the image's python."""
    (entry_points,) = Path(interpreter.purelib).glob("praesto-*.dist-info/entry_points.txt")
    parser = configparser.ConfigParser()
    parser.read(entry_points)
    scripts = []
    for name in parser["console_scripts"]:
        _shebang, body = Path(install.script(name)).read_text().split("\n", 1)
        scripts.append(LayerFile(f"{VENV.lstrip('/')}/bin/{name}", f"#!{VENV}/bin/python\n{body}".encode()))
    return scripts


def rootfs(install: InstalledWheel, interpreter: Interpreter, staging: Path) -> list[LayerFile]:
    """Every entry of the image's root filesystem."""
    host: dict[str, LayerFile] = {}
    stdlib = list(_stdlib(interpreter))
    site = _site_packages(interpreter)
    extensions = [p for p in [*stdlib, *site.values()] if ELF_NAME.search(p.name)]
    libraries = _ldd([interpreter.executable, *extensions]) | _ldconfig_paths(DLOPENED)
    libraries = {lib for lib in libraries if not any(lib.startswith(s + "/") for s in interpreter.site_dirs)}
    certificates = {
        p for p in (interpreter.cafile, "/etc/ssl/certs/ca-certificates.crt") if os.path.exists(p)
    }
    for path in sorted({interpreter.executable, *map(str, stdlib), *libraries, *certificates}):
        for item in _host_path(path):
            host[item.path] = item
    venv = VENV.lstrip("/")
    site_packages = interpreter.image_site_packages.lstrip("/")
    home = Path(interpreter.executable).parent
    version = interpreter.version.split()[0]
    pyvenv_cfg = f"home = {home}\ninclude-system-site-packages = false\nversion = {version}\n"
    return [
        *_stripped(list(host.values()), interpreter, staging),
        *(_file(f"{site_packages}/{relative}", source) for relative, source in site.items()),
        *_console_scripts(install, interpreter),
        LayerFile(f"{venv}/bin/python", link_to=interpreter.executable, mode=0o777),
        LayerFile(f"{venv}/bin/python3", link_to="python", mode=0o777),
        LayerFile(f"{venv}/lib64", link_to="lib", mode=0o777),
        LayerFile(f"{venv}/pyvenv.cfg", pyvenv_cfg.encode(), mode=0o644),
        *(LayerFile(path, text.encode(), mode=0o644) for path, text in ETC.items()),
        LayerFile("tmp", mode=0o1777, directory=True),
        *(LayerFile(d, directory=True) for d in ("dev", "proc", "sys", "root")),
    ]


def _wheel_digest(wheel: Path) -> str:
    """The wheel's contents (names and bytes), not its zip timestamps."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name))
    return digest.hexdigest()


def cache_key(install: InstalledWheel, interpreter: Interpreter) -> str:
    builder = [Path(__file__), ROOT / "testkit" / "oci_archive.py", dockerfile.DOCKERFILE]
    identity = [
        _wheel_digest(install.wheel),
        interpreter.executable,
        interpreter.version,
        interpreter.site_dirs[1:],  # the dependency venvs, named by their requirement list
        [hashlib.sha256(p.read_bytes()).hexdigest() for p in builder],
    ]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def _prune(keep: Path) -> None:
    for lock in IMAGE_DIR.glob("praesto-*.lock"):
        if lock.with_suffix(".tar") != keep and (fd := _unused(lock)) is not None:
            lock.with_suffix(".tar").unlink(missing_ok=True)
            lock.unlink()
            os.close(fd)


@functools.cache
def praesto_image(install: InstalledWheel | None = None) -> PraestoImage:
    """The image of `install` (default: this process's installed wheel), built once per key."""
    install = install or installed_wheel()
    interpreter = probe(install)
    config = runtime_config()
    archive = IMAGE_DIR / f"praesto-{cache_key(install, interpreter)}.tar"
    lock = archive.with_suffix(".lock")
    while True:
        fd = _lock(lock, fcntl.LOCK_SH)  # held until this process exits: no pruner removes the archive
        if archive.exists():
            break
        fcntl.flock(fd, fcntl.LOCK_EX)  # converting is not atomic: check again once exclusive
        if not archive.exists():
            staging = archive.with_suffix(".staging")
            shutil.rmtree(staging, ignore_errors=True)
            partial = archive.with_suffix(".partial")
            write_oci_archive(partial, PRAESTO_IMAGE, rootfs(install, interpreter, staging), config=config)
            os.rename(partial, archive)
            shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)  # retake it shared; a pruner may have won in between, so loop
    _HELD.append(fd)
    _prune(archive)
    return PraestoImage(PRAESTO_IMAGE, archive, config)
