"""The names a source may give its files: plain relative paths, none under Praesto's own markers.

Every origin's planner checks each file's path here before it enters a plan, and unpack.py each
archive member's, so no source of any kind can escape the destination or spoof a marker.
"""

from __future__ import annotations

from praesto.agent.download.api import LastingDownloadError

RESERVED_PREFIX = ".praesto"  # marker files and staging live at the top of a cache


def check_repo_path(path: str) -> str:
    """Refuse names that could escape the destination or spoof our markers."""
    parts = path.split("/")
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or any(p in ("", ".", "..") for p in parts)
        or parts[0].startswith(RESERVED_PREFIX)
    )
    if bad:
        raise LastingDownloadError(
            "InvalidRepoFile",
            f"repo file {path!r} would escape the destination or replace a Praesto marker; "
            "remove or rename it in the repo (plain relative names only)",
        )
    return path
