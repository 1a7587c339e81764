"""The image recipe: no Docker here, so the Dockerfile's invariants are checked by parsing it,
and the wheel it installs is built for real to prove it carries every entry point and the CSI stubs."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.helm_chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|python3-dev|libc6-dev|cargo|rustc)\b")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def build_args() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)


def test_multi_stage_with_a_digest_pinned_base() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    args = build_args()
    for stage in all_stages:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"unpinned base {image}"


def test_runtime_stage_is_non_root_and_has_no_build_tools() -> None:
    final = stages()[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert not COMPILERS.search(runs), runs
    assert "pip install" not in runs
    assert "util-linux" in runs and " mount" in runs  # the CSI plugin's mount(8)
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies), "runtime copies only the built venv"


def test_builder_copies_the_packages_including_the_csi_stubs() -> None:
    builder = stages()[0]
    copied = " ".join(rest for keyword, rest in builder if keyword == "COPY")
    for folder in ("praesto", "hooks", "agent", "csi"):
        assert re.search(rf"\b{folder} ", copied), folder
    assert (ROOT / "csi" / "proto" / "csi_pb2.py").is_file()
    assert (ROOT / "csi" / "proto" / "csi_pb2_grpc.py").is_file()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches a path's parents."""
    verdict = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pat == "**" or any(
            fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "*/")) for p in prefixes
        ):
            verdict = not negate
    return verdict


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (
        "pyproject.toml",
        "README.md",
        "praesto/names.py",
        "hooks/server.py",
        "csi/proto/csi_pb2.py",
    ):
        assert not _ignored(needed, patterns), needed
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/chart/test_dockerfile.py",
        "e2e/run.sh",
        "bench/x.py",
    ):
        assert _ignored(unwanted, patterns), unwanted


def test_the_wheel_the_image_installs_has_every_entry_point_and_the_stubs(tmp_path: Path) -> None:
    """Build the wheel as the builder stage does, from exactly what the Dockerfile copies, offline."""
    context = tmp_path / "context"
    context.mkdir()
    for keyword, rest in stages()[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                src = ROOT / source
                if src.is_dir():
                    shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "--wheel-dir",
                str(wheels),
                str(context),
            ],
            check=True,
            capture_output=True,
            timeout=240,
        )
    except subprocess.CalledProcessError as err:
        pytest.fail(f"building the wheel failed: {err.stderr.decode()[-2000:]}")
    wheel = next(wheels.glob("praesto-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for module in (
        "praesto/csi/proto/csi_pb2.py",
        "praesto/csi/proto/csi_pb2_grpc.py",
        "praesto/hooks/server.py",
    ):
        assert module in names, module
    for script in ("praesto-hooks", "praesto-agent", "praesto-csi"):
        assert f"{script} =" in entry_points, script
    assert not any(n.startswith(("tests/", "bench/", "e2e/")) for n in names)
