"""Shared bits of the ModelScope tests: sample repositories and reading a tree back."""

from __future__ import annotations

from pathlib import Path


def sample_files() -> dict[str, bytes]:
    """Small files served inline and large ones (past testkit/hub.py LFS_THRESHOLD) sent to "OSS"."""
    return {
        "configuration.json": b'{"framework": "pytorch"}',
        "README.md": b"# a model\n",
        "model.safetensors": bytes(range(256)) * 300,
        "sub/dir/tokenizer.json": b'{"v": 1}' * 400,
    }


def tree_of(root: Path) -> dict[str, bytes]:
    """Every regular file under `root`, by its relative POSIX path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
