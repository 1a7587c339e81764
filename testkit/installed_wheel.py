"""The installed wheel: the bytes a user gets, built and installed the way the image does it.

`.venv` holds an editable install that imports the working tree, so a module the
wheel leaves out stays invisible to every test run from it (issue 20: the image
shipped without `praesto.agent.budget` while 858 tests passed). Tests that start
Praesto processes run them from here instead:

    wheel = installed_wheel()                  # once per process
    subprocess.run([wheel.script("praesto-agent"), "run", ...])

The wheel is built from what the Dockerfile's builder stage copies, by the same
backend and command (`pip wheel --no-deps --no-build-isolation` in a venv holding
`[build-system].requires`); `installed_wheel()` takes those files from the working
tree, so uncommitted edits are what runs (in CI the fresh clone equals HEAD).

Everything lives under build/wheel/ (not committed):

* `builder-<key>/`: a venv with `[build-system].requires`, keyed by that list.
* `deps-<key>/`: a venv with `[project].dependencies` only, keyed by that list and the
  interpreter; made once from PyPI (or pip's cache), then only read.
* `commit-<key>/`: the wheel of one commit (`git archive`) installed the same way, for
  tests/test_wheel.py; made once per commit.
* `sessions/<id>/`: one per process: an empty venv that sees `deps-<key>` through a
  `.pth` file and gets only the praesto wheel (`--no-deps`), so a rebuild costs one
  wheel build and one install. Removed at exit, or by a later process if its owner died.

Concurrency: cached venvs are made under an exclusive `flock` and used under a shared
one, so a process pruning the venvs of an older dependency list never removes one in
use; each session holds the lock of its own directory for its lifetime.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.dockerfile import copy_build_context
from testkit.helm_chart import ROOT

WHEEL_DIR = ROOT / "build" / "wheel"
SESSIONS = WHEEL_DIR / "sessions"
STEP_TIMEOUT = 900.0  # seconds for one pip step; a cold dependency install on 2 busy cores takes minutes
_HELD: list[int] = []  # lock file descriptors held for the life of this process


def pyproject(root: Path = ROOT) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


@dataclass(frozen=True)
class InstalledWheel:
    """A praesto wheel installed into a venv of its own (runtime dependencies, nothing else)."""

    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def script(self, name: str) -> str:
        """The console script `name` as this install put it on disk."""
        path = self.venv / "bin" / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{self.wheel.name} installed no console script {name!r} into {self.venv}"
            )
        return str(path)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH: a path to the checkout would let the install import
    the working tree (and pip would take its praesto.egg-info for an installed praesto)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **extra}


def _run(argv: list[str | Path], what: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1"),
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({done.returncode}): {' '.join(map(str, argv))}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _key(items: list[str]) -> str:
    """Names a cached venv: the requirement list and the interpreter it was made for."""
    identity = [*items, sys.version, os.path.realpath(getattr(sys, "_base_executable", sys.executable))]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def _lock(path: Path, mode: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, mode)
    return fd


def _unused(lock: Path) -> int | None:
    """An exclusive hold on `lock` if no process holds it (then what it guards may go), else None."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _prune(kind: str, keep: Path) -> None:
    """Remove the `kind` venvs of other keys that no process uses."""
    for lock in WHEEL_DIR.glob(f"{kind}-*.lock"):
        if lock.with_suffix("") != keep and (fd := _unused(lock)) is not None:
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
            os.close(fd)


def _cached_venv(kind: str, requirements: list[str], populate: Callable[[Path], None]) -> Path:
    """The venv `kind-<key>`, made once by `populate`; held with a shared lock until this process exits."""
    venv = WHEEL_DIR / f"{kind}-{_key(requirements)}"
    complete = venv / ".complete"
    lock_path = venv.with_name(venv.name + ".lock")
    while True:
        fd = _lock(lock_path, fcntl.LOCK_SH)
        if complete.exists():
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # converting is not atomic: check again once exclusive
            if not complete.exists():
                shutil.rmtree(venv, ignore_errors=True)  # half made by a process that died or failed
                _run([sys.executable, "-m", "venv", "--without-pip", venv], f"creating {venv}")
                populate(venv)
                complete.touch()
        finally:
            os.close(fd)  # then retake it shared (a pruner may win in between, hence the loop)
    _HELD.append(fd)
    _prune(kind, venv)
    return venv


def _pip_into(venv: Path, *args: str | Path) -> None:
    """This interpreter's pip, installing into `venv` (which has no pip of its own)."""
    _run(
        [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", *args],
        f"pip into {venv}",
    )


def builder_venv(requires: list[str]) -> Path:
    """A venv holding the build backend, as the builder stage installs it before `pip wheel`."""
    return _cached_venv("builder", requires, lambda venv: _pip_into(venv, "pip", *requires))


def deps_venv(dependencies: list[str]) -> Path:
    """A venv holding the runtime dependencies only."""
    return _cached_venv("deps", dependencies, lambda venv: _pip_into(venv, *dependencies))


def _purelib(venv: Path) -> str:
    return _run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], "purelib"
    ).strip()


def build_wheel(source_root: Path, workdir: Path) -> Path:
    """The praesto wheel built from what the Dockerfile copies out of `source_root`, as its builder stage does."""
    context = copy_build_context(source_root, workdir / "context")
    builder = builder_venv(pyproject(context)["build-system"]["requires"])
    dist = workdir / "dist"
    _run(
        [
            builder / "bin" / "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            dist,
            context,
        ],
        "building the praesto wheel",
        cwd=workdir,
    )
    (wheel,) = dist.glob("praesto-*.whl")
    return wheel


def _install_into(venv: Path, wheel: Path, dependencies: list[str]) -> InstalledWheel:
    """`wheel` alone installed into the empty `venv`, which sees the cached runtime dependencies."""
    (Path(_purelib(venv)) / "praesto_runtime_deps.pth").write_text(
        f"import site; site.addsitedir({_purelib(deps_venv(dependencies))!r})\n"
    )
    _pip_into(venv, "--no-deps", wheel)
    return InstalledWheel(wheel, venv)


def install_clean(wheel: Path, venv: Path, dependencies: list[str]) -> InstalledWheel:
    """`wheel` installed into a new venv at `venv` that sees only the cached runtime dependencies."""
    _run([sys.executable, "-m", "venv", "--without-pip", venv], f"creating {venv}")
    return _install_into(venv, wheel, dependencies)


def git_archive(commit: str, destination: Path) -> Path:
    """The files of `commit` as `git archive` gives them: no untracked file, no uncommitted edit."""
    destination.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive.stdout, check=True)
    return destination


@dataclass(frozen=True)
class InstalledCommit:
    tree: Path  # the commit's files, as archived
    install: InstalledWheel


def installed_commit(commit: str) -> InstalledCommit:
    """The wheel of `commit` (a full hash), installed clean; made once per commit and shared by processes."""

    def populate(venv: Path) -> None:
        tree = git_archive(commit, venv / "source")
        _install_into(venv, build_wheel(tree, venv / "build"), pyproject(tree)["project"]["dependencies"])

    venv = _cached_venv("commit", [commit], populate)
    tree = venv / "source"
    deps_venv(pyproject(tree)["project"]["dependencies"])  # made again if a newer dependency list pruned it
    (wheel,) = (venv / "build" / "dist").glob("praesto-*.whl")
    return InstalledCommit(tree, InstalledWheel(wheel, venv))


def _session_dir() -> Path:
    """This process's directory under build/wheel/sessions, locked until exit; dead sessions' dirs removed."""
    SESSIONS.mkdir(parents=True, exist_ok=True)
    name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staged = SESSIONS / f".{name}.staged"
    fd = _lock(staged, fcntl.LOCK_EX)
    os.rename(staged, SESSIONS / f"{name}.lock")  # visible to pruners only once locked
    _HELD.append(fd)
    for lock in SESSIONS.glob("*.lock"):
        if (other := _unused(lock)) is not None:  # its process is gone
            shutil.rmtree(lock.with_suffix(""), ignore_errors=True)
            lock.unlink(missing_ok=True)
            os.close(other)
    directory = SESSIONS / name
    directory.mkdir()

    def remove() -> None:
        shutil.rmtree(directory, ignore_errors=True)
        (SESSIONS / f"{name}.lock").unlink(missing_ok=True)

    atexit.register(remove)
    return directory


@functools.cache
def installed_wheel() -> InstalledWheel:
    """The working tree's wheel, installed into this process's own clean venv (built on first call)."""
    session = _session_dir()
    wheel = build_wheel(ROOT, session)
    return install_clean(wheel, session / "venv", pyproject()["project"]["dependencies"])
