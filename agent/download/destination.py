"""Where `praesto-agent download --dest` may publish, checked before a byte is fetched.

A download stages beside `dest` (or inside it, when it is an existing folder: the PVC mode,
publish.py) and publishes there. A destination it cannot write used to fail only after every
byte was fetched, as a disk error (temporary, exit 75) that failed the same way again; a folder
of the user's own files was filled in place, same-named files replaced. Both are refused here
as usage errors, so nothing is fetched and no staging is left.

A folder is Praesto's when it holds a marker or staging (names starting `.praesto-`: a copy, or
one being written); an empty one, or a fresh volume's `lost+found` alone, is free to fill.
"""

from __future__ import annotations

import os
from pathlib import Path

PRAESTO_PREFIX = ".praesto-"  # names.MARKER_FILES, their .tmp files, publish.STAGING_IN_DEST (a test checks)
FRESH_VOLUME_ENTRIES = frozenset({"lost+found"})  # what mkfs.ext4 leaves on a new PVC
ALLOW_EXISTING_FLAG = "--allow-existing-files"


def foreign_entries(folder: Path) -> list[str]:
    """The entries of `folder` Praesto did not write, sorted; none when it holds a Praesto marker
    or staging (the files beside them are a copy's)."""
    entries = sorted(os.listdir(folder))
    if any(e.startswith(PRAESTO_PREFIX) for e in entries):
        return []
    return [e for e in entries if e not in FRESH_VOLUME_ENTRIES]


def _writable_folder(path: Path, flag: str) -> str | None:
    """`path`, or the nearest folder above it that exists (what will hold it), must be a writable
    folder. access(2) answers for the read-only filesystem too (EROFS), even to root."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is below {existing}, a file"
        return f"{flag} {path} {what}, not a directory; give a directory path (created if missing)"
    if not os.access(existing, os.W_OK | os.X_OK):
        cause = (
            "is on a read-only filesystem"
            if os.statvfs(existing).f_flag & os.ST_RDONLY
            else f"is not writable by this user (uid {os.geteuid()})"
        )
        return f"{flag} {path}: {existing} {cause}; give a directory this user may write"
    return None


def destination_problem(dest: Path, staging_dir: Path | None, allow_existing_files: bool) -> str | None:
    """Why `dest` (and `staging_dir`, when given) cannot take a download, with the fix; None if it can."""
    problem = _writable_folder(dest, "--dest")
    if problem is None and staging_dir is not None:
        problem = _writable_folder(staging_dir, "--staging-dir")
    if problem is not None or allow_existing_files or not dest.is_dir():
        return problem
    try:
        foreign = foreign_entries(dest)
    except OSError as error:
        return f"--dest {dest}: cannot list it ({error.strerror}); give a directory this user may read"
    if not foreign:
        return None
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return (
        f"--dest {dest} holds files Praesto did not write ({shown}); give a new or empty directory, "
        f"or add {ALLOW_EXISTING_FLAG} to write the model among them (same-named files are replaced)"
    )
