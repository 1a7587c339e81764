"""What a model folder holds, as tests compare it: relative path -> bytes.

Praesto's own bookkeeping (`.praesto*` files the store keeps beside a copy) is
left out, so a downloaded copy compares equal to the files the test served.
"""

from __future__ import annotations

from pathlib import Path


def tree_of(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` but Praesto's own records, keyed by its path relative to `root`."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".praesto")
    }
