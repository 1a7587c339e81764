"""Run mypy over the installed layout of the `praesto` distribution.

The top-level folders `hooks/`, `agent/` and `csi/` install as `praesto.hooks`
and friends through setuptools `package-dir` (setup.py's FOLDERS, read from there).
mypy cannot follow the editable install's import hook, so we give it a view of the
installed layout made of symlinks under build/typecheck and check the package from there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def folders() -> dict[str, str]:
    """Installed package -> folder, as setup.py maps them (its setup() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("praesto_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mapping: dict[str, str] = module.FOLDERS
    return mapping


def build_view() -> Path:
    view = ROOT / "build" / "typecheck"
    shutil.rmtree(view, ignore_errors=True)
    package = view / "praesto"
    package.mkdir(parents=True)
    for entry in (ROOT / "praesto").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in folders().items():
        if name != "praesto":
            (package / name.removeprefix("praesto.")).symlink_to(ROOT / folder, target_is_directory=True)
    return view


def main() -> int:
    view = build_view()
    env = dict(os.environ, MYPYPATH=str(view))
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "praesto"]
    extra = [
        str(p)
        for p in (ROOT / "testkit", ROOT / "tests", ROOT / "bench", ROOT / "e2e")
        if any(p.rglob("*.py"))
    ]
    first = subprocess.call(cmd, env=env, cwd=ROOT)
    second = (
        subprocess.call(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *extra],
            env=env,
            cwd=view,
        )
        if extra
        else 0
    )
    return first or second


if __name__ == "__main__":
    raise SystemExit(main())
