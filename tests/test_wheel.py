"""The wheel that ships: built from `git archive HEAD` as the Dockerfile's builder stage builds it,
then installed into a clean venv (runtime dependencies only).

`.venv`'s editable install imports the working tree, so it cannot show a module the
wheel leaves out: the image once shipped without `praesto.agent.budget` and the node
agent could not start, while every test passed (issue 20). Here every module of the
four folders must be inside the wheel and import from the install, and every console
script must start.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from testkit.helm_chart import ROOT
from testkit.installed_wheel import InstalledCommit, clean_env, installed_commit, pyproject

# The layout design.md fixes: each top-level folder installs as this package.
PACKAGES = {"praesto": "praesto", "hooks": "praesto.hooks", "agent": "praesto.agent", "csi": "praesto.csi"}
PACKAGE_DATA = ("praesto/py.typed", "praesto/csi/proto/csi.proto", "praesto/csi/proto/csi_pb2.pyi")
# Each console script, and `praesto-agent run` (its parser imports the daemon only for that subcommand).
STARTS = (("praesto-agent", "run", "--help"), ("praesto", "render", "--help"))

IMPORT_ALL = """
import importlib, json, sys
venv = sys.argv[1]
failed = {}
for name in sys.argv[2:]:
    try:
        module = importlib.import_module(name)
    except BaseException as err:  # noqa: BLE001 - report every module, not the first failure
        failed[name] = f"{type(err).__name__}: {err}"
    else:
        if not module.__file__.startswith(venv):
            failed[name] = f"imported from {module.__file__}, not from the install"
print(json.dumps(failed))
"""


def head_commit() -> str:
    """HEAD's full hash; skips when there is no git checkout to archive."""
    try:
        top = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("git is not installed: the shipped wheel is built from `git archive HEAD`")
    lines = top.stdout.split()
    if top.returncode != 0 or Path(lines[0]) != ROOT:
        pytest.skip(f"{ROOT} is not a git checkout: the shipped wheel is built from `git archive HEAD`")
    return lines[1]


def modules(tree: Path) -> dict[str, str]:
    """Every .py file of the four folders in `tree`, by the dotted name it installs as."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((tree / folder).rglob("*.py")):
            parts = path.relative_to(tree / folder).with_suffix("").parts
            dotted = ".".join([package, *parts[: -1 if parts[-1] == "__init__" else None]])
            found[dotted] = "/".join([*package.split("."), *path.relative_to(tree / folder).parts])
    return found


@pytest.fixture(scope="module")
def shipped() -> InstalledCommit:
    """HEAD's wheel, installed clean (cached per commit under build/wheel, so xdist workers share it)."""
    return installed_commit(head_commit())


def test_every_module_and_its_data_is_in_the_wheel(shipped: InstalledCommit) -> None:
    with zipfile.ZipFile(shipped.install.wheel) as wheel:
        names = set(wheel.namelist())
    expected = modules(shipped.tree)
    assert set(PACKAGES.values()) <= set(expected), sorted(expected)  # the four folders were found
    missing = sorted(dotted for dotted, path in expected.items() if path not in names)
    assert not missing, f"modules missing from {shipped.install.wheel.name}: {missing}"
    assert not [data for data in PACKAGE_DATA if data not in names]
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"praesto"}, top_level


def test_every_module_imports_from_the_clean_venv(shipped: InstalledCommit) -> None:
    install = shipped.install
    done = subprocess.run(
        [str(install.python), "-I", "-c", IMPORT_ALL, str(install.venv), *modules(shipped.tree)],
        cwd=install.venv,  # not the checkout: nothing may come from the working tree
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_every_console_script_starts(shipped: InstalledCommit) -> None:
    scripts = pyproject(shipped.tree)["project"]["scripts"]
    assert {"praesto", "praesto-hooks", "praesto-agent", "praesto-csi"} <= set(scripts)
    for argv in [(name, "--help") for name in scripts] + list(STARTS):
        done = subprocess.run(
            [shipped.install.script(argv[0]), *argv[1:]],
            cwd=shipped.install.venv,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}"
        assert "usage" in done.stdout.lower(), done.stdout
