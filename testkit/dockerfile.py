"""The Dockerfile read as data: its stages, and what its builder stage copies into the build context.

No Docker here, so tests check the image recipe by parsing it, and the wheel tests
build from exactly the files the builder stage copies (`builder_sources`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from testkit.helm_chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"


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


# The image's ENV that names its own filesystem (the venv on PATH, HOME=/tmp): not for a process here.
IMAGE_LAYOUT_ENV = frozenset({"PATH", "HOME"})


def image_env() -> dict[str, str]:
    """The final stage's ENV a process of the image runs with (MALLOC_ARENA_MAX...), minus its layout:
    the tiers give it to the processes they start from the wheel, so they run as in the image."""
    env: dict[str, str] = {}
    for keyword, rest in stages()[-1]:
        if keyword == "ENV":
            for pair in rest.split():
                key, equals, value = pair.partition("=")
                if equals:
                    env[key] = value
    return {k: v for k, v in env.items() if k not in IMAGE_LAYOUT_ENV}


def build_args() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)


def builder_sources() -> list[str]:
    """The paths the builder stage COPYs from the build context, in order."""
    sources: list[str] = []
    for keyword, rest in stages()[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            *copied, _destination = rest.split()
            sources += copied
    return sources


def copy_build_context(root: Path, context: Path) -> Path:
    """Copy from `root` what the builder stage copies (no caches), as `docker build` would see it."""
    context.mkdir(parents=True, exist_ok=True)
    for source in builder_sources():
        src = root / source
        if src.is_dir():
            shutil.copytree(
                src, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            )
        else:
            shutil.copy2(src, context / source)
    return context
