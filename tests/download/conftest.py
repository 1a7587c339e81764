"""Fixtures for downloader tests: a started local hub and small generated repos."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download import Options

from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.model_tree import tree_of as tree_of  # re-exported: the download tests compare trees

MiB = 1 << 20


def sample_files() -> dict[str, bytes]:
    """Nested folders, LFS files spanning several parts, many small files, an empty file."""
    files = {f"tokenizer/part{i % 4}/vocab{i}.txt": f"token-{i}\n".encode() * (i + 1) for i in range(40)}
    files["config.json"] = b'{"model_type": "test"}'
    files["empty.txt"] = b""
    files["model-00001-of-00002.safetensors"] = os.urandom(3 * MiB + 123)
    files["model-00002-of-00002.safetensors"] = os.urandom(2 * MiB + 7)
    files["nested/deep/dir/weights.bin"] = os.urandom(300_000)
    return files


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LocalHub]:
    with LocalHub(tmp_path / "hub") as server:
        yield server


def options_for(hub: LocalHub, **kwargs: object) -> Options:
    """Small parts so a few MiB exercise ranges, resume and out-of-order hashing."""
    defaults: dict[str, object] = {"endpoint": hub.endpoint, "part_size": 1 * MiB, "concurrency": 4,
                                   "egress": LOOPBACK}  # the hub's CDN is another loopback origin  # fmt: skip
    defaults.update(kwargs)
    return Options(**defaults)  # type: ignore[arg-type]
